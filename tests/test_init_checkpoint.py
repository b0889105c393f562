"""config.init_checkpoint: the extractor comes from the file, the head is kept only if it fits."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax.config import ConfigError, validate_config
from dp2fedsam_jax.models import get_model, read_params, restore_from_checkpoint, save_params
from dp2fedsam_jax.train import build_experiment

SHAPE = (8, 8, 1)  # the tiny config's synthetic images (4 classes)


def _assert_tree_equal(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _params(num_classes, hidden=64, seed=7):
  """Random params of the mlp from numpy (cheaper than compiling `model.init`)."""
  shapes = jax.eval_shape(get_model('mlp', num_classes, SHAPE, hidden=hidden).init, jax.random.key(0))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), shapes)


def _saved(tmp_path, num_classes, hidden=64, seed=7):
  params = _params(num_classes, hidden, seed)
  path = str(tmp_path / f'pretrained_{num_classes}_{hidden}.msgpack')
  save_params(path, params)
  return path, params


def test_save_and_read_round_trip(tmp_path):
  path, params = _saved(tmp_path, 10)
  _assert_tree_equal(read_params(path), params)


def test_ten_class_checkpoint_into_five_class_model(tmp_path):
  path, saved = _saved(tmp_path, 10)
  fresh = _params(5, seed=0)
  out = restore_from_checkpoint(fresh, path)
  _assert_tree_equal(out['extractor'], saved['extractor'])
  _assert_tree_equal(out['head'], fresh['head'])  # re-initialised, the new size
  assert out['head']['kernel'].shape == (64, 5) and out['head']['bias'].shape == (5,)
  # A head of the model's own size is kept.
  same_path, same = _saved(tmp_path, 5)
  _assert_tree_equal(restore_from_checkpoint(fresh, same_path), same)


def test_experiment_starts_from_the_checkpoint(tmp_path):
  path, saved = _saved(tmp_path, 10)
  exp = build_experiment(tiny_config(init_checkpoint=path))
  state = exp.init_state()
  fresh = exp.model.init(exp.init_key)  # what a run without the checkpoint starts from
  _assert_tree_equal(state.shared['extractor'], saved['extractor'])
  assert not np.array_equal(saved['extractor']['fc0']['kernel'], fresh['extractor']['fc0']['kernel'])
  # Every client's head: the fresh 4-class head.
  assert state.personal['head']['kernel'].shape == (exp.data.num_clients, 64, 4)
  for i in range(exp.data.num_clients):
    _assert_tree_equal(jax.tree.map(lambda p, i=i: p[i], state.personal['head']), fresh['head'])


def test_errors_name_the_field(tmp_path):
  with pytest.raises(ConfigError, match=r'config.init_checkpoint=.*no such file.*save_params'):
    build_experiment(tiny_config(init_checkpoint=str(tmp_path / 'missing.msgpack')))
  wrong, _ = _saved(tmp_path, 4, hidden=32)  # another extractor
  with pytest.raises(ValueError,
                     match=r'does not fit config.model.*fc0/kernel: model \(64, 64\) vs file \(64, 32\)'):
    restore_from_checkpoint(_params(4, seed=0), wrong)
  junk = tmp_path / 'junk.msgpack'
  junk.write_bytes(b'not msgpack at all')
  with pytest.raises(ValueError, match='init_checkpoint'):
    read_params(str(junk))


def test_local_only_refuses_a_start_from_a_file(tmp_path):
  """local_only's row is reported at epsilon 0: it must never start from a (federated) model."""
  path, _ = _saved(tmp_path, 4)
  with pytest.raises(ConfigError, match=r'^config\.init_checkpoint=.*method local_only.*epsilon 0.*'
                                        r'leave config\.init_checkpoint unset'):
    validate_config(tiny_config(method='local_only', init_checkpoint=path))
  validate_config(tiny_config(method='fedavg', init_checkpoint=path))  # a federated method may
