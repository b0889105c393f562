"""Tests for dp2fedsam_jax.models: parameter counts, the split API, and that every conv
lowering / pooling variant computes the same function and gradients (also under vmap
with per-client weights, which is how the engine runs clients).

These tests are compile-bound on CPU, so random inputs and most params come from numpy
(eager jax ops and `init` each cost an XLA compile) and each check runs under one jit.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dp2fedsam_jax.models import (Conv2D, SplitModel, count_params, get_model,
                                  max_pool_2x2, resolve_conv_impl)

TOL = dict(rtol=1e-5, atol=1e-5)
LOWERINGS = ('xla', 'im2col')
NUM_CLASSES = 5
# Small but valid inputs (cifar_cnn at its real size: its Dense layer sizes assume it).
SHAPES = {'cifar_cnn': (32, 32, 3), 'emnist_cnn': (20, 20, 1), 'mlp': (6, 6, 2)}


def _assert_trees_close(a, b, **tol):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


def _loss(model, params, x, y):
  logits = model.apply(params, x)
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def _data(seed, shape, batch, lead=()):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((*lead, batch, *shape)).astype(np.float32)
  y = rng.integers(0, NUM_CLASSES, (*lead, batch)).astype(np.int32)
  return jnp.asarray(x), jnp.asarray(y)


def _random_like(tree, seed, lead=()):
  """Fan-in-scaled random params with the shapes of `tree` (nonzero biases too)."""
  rng = np.random.default_rng(seed)

  def one(s):
    fan_in = int(np.prod(s.shape[:-1])) if len(s.shape) > 1 else 10
    a = rng.standard_normal((*lead, *s.shape)) / np.sqrt(fan_in)
    return jnp.asarray(a.astype(np.float32))
  return jax.tree.map(one, tree)


def _model_and_params(name, impl='xla', seed=0):
  model = get_model(name, NUM_CLASSES, SHAPES[name], conv_impl=impl)
  return model, _random_like(jax.eval_shape(model.init, jax.random.key(0)), seed)


# --- parameter counts and the split API -------------------------------------------

def test_cifar_cnn_param_count():
  model = get_model('cifar_cnn', 10, (32, 32, 3))
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  assert count_params(shapes) == 667_402
  assert count_params(shapes['head']) == 128 * 10 + 10
  assert count_params(shapes['extractor']) + count_params(shapes['head']) == 667_402
  assert jax.tree.map(lambda s: s.shape, shapes['head']) == {'kernel': (128, 10), 'bias': (10,)}
  assert model.feature_dim == 128


def test_pfl_cifar_cnn_is_pfl_researchs_benchmark_cnn():
  """pfl-research's CIFAR-10 simple_cnn: conv 32 3x3, conv 64 3x3, one pool, Dense 128, head 10."""
  model = get_model('pfl_cifar_cnn', 10, (32, 32, 3))
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  layers = jax.tree.map(lambda s: s.shape, shapes)
  assert layers['extractor'] == {'conv0': {'kernel': (3, 3, 3, 32), 'bias': (32,)},
                                 'conv1': {'kernel': (3, 3, 32, 64), 'bias': (64,)},
                                 'fc0': {'kernel': (14 * 14 * 64, 128), 'bias': (128,)}}
  assert layers['head'] == {'kernel': (128, 10), 'bias': (10,)}  # the personal head
  assert count_params(shapes) == 1_626_442 and model.feature_dim == 128
  x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  assert jax.eval_shape(model.apply, shapes, x).shape == (2, 10)


def test_emnist_cnn_and_mlp_shapes():
  emnist = get_model('emnist_cnn', 62, (28, 28, 1))
  shapes = jax.eval_shape(emnist.init, jax.random.key(0))
  # conv 5x5x1x32, conv 5x5x32x64, Dense 4*4*64 -> 512, head 512 -> 62.
  expected = (25 * 32 + 32) + (25 * 32 * 64 + 64) + (1024 * 512 + 512) + (512 * 62 + 62)
  assert count_params(shapes) == expected
  assert emnist.feature_dim == 512
  mlp = get_model('mlp', 3, (4, 4, 1), hidden=7)
  assert mlp.feature_dim == 7
  assert count_params(jax.eval_shape(mlp.init, jax.random.key(0))) == 16 * 7 + 7 + 7 * 3 + 3


def test_emnist_cnn_other_input_sizes():
  for shape in [(16, 16, 1), (17, 19, 3), (28, 28, 1)]:
    for impl in LOWERINGS:
      model = get_model('emnist_cnn', 10, shape, conv_impl=impl)
      params = jax.eval_shape(model.init, jax.random.key(0))
      x = jax.ShapeDtypeStruct((2, *shape), jnp.float32)
      assert jax.eval_shape(model.apply, params, x).shape == (2, 10)
  with pytest.raises(ValueError, match='cannot take inputs'):
    get_model('emnist_cnn', 10, (12, 12, 1))


@pytest.mark.parametrize('name', ['emnist_cnn', 'mlp'])
def test_init_is_deterministic_and_split(name):
  model = get_model(name, NUM_CLASSES, SHAPES[name])
  init = jax.jit(lambda k: (model.init(k), model.init(k), model.init(jax.random.key(9))))
  a, b, c = init(jax.random.key(1))
  assert set(a) == {'extractor', 'head'}
  assert set(a['head']) == {'kernel', 'bias'}
  _assert_trees_close(a, b, rtol=0, atol=0)
  assert not np.allclose(a['head']['kernel'], c['head']['kernel'])
  assert jax.tree.map(jnp.shape, a) == jax.tree.map(
      lambda s: s.shape, jax.eval_shape(model.init, jax.random.key(0)))


@pytest.mark.parametrize('name', sorted(SHAPES))
def test_apply_is_head_of_features(name):
  model, params = _model_and_params(name, impl='im2col')
  x, _ = _data(2, SHAPES[name], 3)

  @jax.jit
  def both(params, x):
    feats = model.features(params['extractor'], x)
    return feats, model.apply(params, x), model.logits_from_features(params['head'], feats)
  feats, logits, split_logits = both(params, x)
  assert feats.shape == (3, model.feature_dim)
  assert logits.shape == (3, NUM_CLASSES) and logits.dtype == jnp.float32
  np.testing.assert_array_equal(logits, split_logits)


def test_split_model_is_a_frozen_dataclass():
  model = get_model('mlp', NUM_CLASSES, SHAPES['mlp'])
  assert isinstance(model, SplitModel) and isinstance(model.head, nn.Dense)
  with pytest.raises(dataclasses.FrozenInstanceError):
    model.num_classes = 3


# --- errors ---------------------------------------------------------------------

def test_unknown_names_raise_with_field_name():
  with pytest.raises(ValueError, match=r"config\.model='resnet9000'.*cifar_cnn"):
    get_model('resnet9000', 10, (32, 32, 3))
  with pytest.raises(ValueError, match=r"config\.conv_impl='cudnn'.*im2col"):
    get_model('cifar_cnn', 10, (32, 32, 3), conv_impl='cudnn')
  with pytest.raises(ValueError, match='hidden'):
    get_model('cifar_cnn', 10, (32, 32, 3), hidden=3)
  with pytest.raises(ValueError, match='input_shape'):
    get_model('mlp', 10, (32, 32))


def test_auto_lowering_follows_backend(monkeypatch):
  assert resolve_conv_impl('xla') == 'xla'
  assert resolve_conv_impl('im2col') == 'im2col'
  monkeypatch.setattr(jax, 'default_backend', lambda: 'cpu')
  assert resolve_conv_impl('auto') == 'im2col'
  assert get_model('cifar_cnn', 10, (32, 32, 3)).conv_impl == 'im2col'
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  assert resolve_conv_impl('auto') == 'xla'
  # One table decides, per backend; a backend outside it gets the native convolution.
  from dp2fedsam_jax.models import AUTO_CONV_IMPL
  assert all(resolve_conv_impl('auto', b) == impl for b, impl in AUTO_CONV_IMPL.items())
  assert resolve_conv_impl('auto', 'some_plugin') == 'xla'
  swapped = get_model('cifar_cnn', 10, (32, 32, 3), conv_impl='im2col').with_conv_impl('xla')
  assert swapped.conv_impl == 'xla' and swapped.extractor.conv_impl == 'xla'
  assert get_model('mlp', 10, (4, 4, 1)).with_conv_impl('auto').conv_impl == 'xla'


# --- Conv2D is nn.Conv -----------------------------------------------------------

def test_conv2d_init_matches_flax_conv():
  x = jnp.zeros((1, 6, 6, 3))
  init = jax.jit(lambda k: [m.init(k, x) for m in (
      nn.Conv(4, (3, 2)), Conv2D(4, (3, 2), impl='xla'), Conv2D(4, (3, 2), impl='im2col'))])
  ref, *ours = init(jax.random.key(1))
  # Same names, shapes and initial values: checkpoints are interchangeable.
  for p in ours:
    _assert_trees_close(ref, p, rtol=0, atol=0)


@pytest.mark.parametrize('kernel,strides,padding', [
    ((3, 3), (1, 1), 'VALID'), ((3, 3), (2, 2), 'SAME'), ((5, 3), (2, 1), 'VALID'),
    ((1, 1), (1, 1), 'SAME'), ((3, 3), (1, 1), ((1, 2), (0, 1))),
])
def test_conv2d_matches_flax_conv(kernel, strides, padding):
  x, _ = _data(0, (9, 8, 3), 2)
  modules = [nn.Conv(4, kernel, strides=strides, padding=padding)] + [
      Conv2D(4, kernel, strides=strides, padding=padding, impl=i) for i in LOWERINGS]
  params = _random_like(jax.eval_shape(modules[0].init, jax.random.key(0), x), 1)

  @jax.jit
  def run(p, x):
    outs = []
    for m in modules:
      y, vjp = jax.vjp(m.apply, p, x)
      outs.append((y, vjp(jnp.cos(y))))
    return outs
  ref, *ours = run(params, x)
  for out in ours:
    _assert_trees_close(out, ref, **TOL)


@pytest.mark.parametrize('shape', [(2, 8, 6, 3), (2, 13, 13, 4), (1, 5, 4, 2)])
def test_pool_variants_agree(shape):
  x = jnp.asarray(np.random.default_rng(0).standard_normal(shape), jnp.float32)  # no ties

  @jax.jit
  def run(x):
    outs = {}
    for impl in ('reshape', 'reduce_window'):
      y, vjp = jax.vjp(lambda x, impl=impl: max_pool_2x2(x, impl), x)
      outs[impl] = (y, vjp(jnp.sin(y)))
    return outs, nn.max_pool(x, (2, 2), (2, 2), 'VALID')
  outs, ref = run(x)
  np.testing.assert_array_equal(outs['reshape'][0], ref)
  _assert_trees_close(outs['reshape'], outs['reduce_window'], rtol=0, atol=0)


# --- all lowerings compute the same function and gradients --------------------------

@pytest.mark.parametrize('name', sorted(SHAPES))
def test_lowerings_agree(name):
  _, p = _model_and_params(name, seed=3)
  x, y = _data(4, SHAPES[name], 3)
  models = [get_model(name, NUM_CLASSES, SHAPES[name], conv_impl=i) for i in LOWERINGS]

  @jax.jit
  def run(p, x, y):
    return [(m.apply(p, x), jax.value_and_grad(lambda p, m=m: _loss(m, p, x, y))(p))
            for m in models]
  ref, other = run(p, x, y)
  _assert_trees_close(ref, other, **TOL)


@pytest.mark.parametrize('name', ['cifar_cnn', 'emnist_cnn'])
def test_lowerings_agree_under_vmap_with_per_client_params(name):
  n_clients = 3
  model = get_model(name, NUM_CLASSES, SHAPES[name])
  # Each client its own extractor and head, as in the engine's SAM phase.
  stacked = _random_like(jax.eval_shape(model.init, jax.random.key(0)), 5, lead=(n_clients,))
  x, y = _data(6, SHAPES[name], 2, lead=(n_clients,))
  models = [get_model(name, NUM_CLASSES, SHAPES[name], conv_impl=i) for i in LOWERINGS]

  @jax.jit
  def run(ps, xs, ys):
    return [jax.vmap(jax.value_and_grad(lambda p, x, y, m=m: _loss(m, p, x, y)))(ps, xs, ys)
            for m in models]
  ref, other = run(stacked, x, y)
  assert ref[0].shape == (n_clients,)
  _assert_trees_close(ref, other, **TOL)
