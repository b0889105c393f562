"""The paper backbones: exact parameter counts, layouts, and that they train (finite gradients,
same function under both conv lowerings and under vmap with per-client weights).

Counts come from `jax.eval_shape` (no compile); the few forward/backward checks use small inputs
(ResNet-18 is slow on CPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dp2fedsam_jax.models import count_params, get_model
from dp2fedsam_jax.models.resnet import BasicBlock


def _shapes(model):
  return jax.eval_shape(model.init, jax.random.key(0))


def _loss(model, params, x, y):
  logits = model.apply(params, x)
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


@pytest.mark.parametrize('name, num_classes, input_shape, expected', [
    # The DP²-FedSAM paper's ResNet-18 count = torchvision resnet18(num_classes=10).
    ('resnet18_gn', 10, (32, 32, 3), 11_181_642),
    # 1-channel stem (7*7*64 fewer) and a 62-class head (52*513 more).
    ('resnet18_gn', 62, (28, 28, 1), 11_181_642 - 2 * 49 * 64 + 52 * 513),
    ('resnet20', 10, (32, 32, 3), 269_722),  # He et al.'s option-A ResNet-20 (0.27M)
    ('emnist_cnn_fedavg', 10, (28, 28, 1), 1_663_370),  # McMahan et al. 2017
    ('emnist_cnn_fedavg', 62, (28, 28, 1), 1_690_046),
    ('emnist_cnn_tff', 62, (28, 28, 1), 1_206_590),  # TFF's EMNIST conv model
])
def test_param_counts(name, num_classes, input_shape, expected):
  model = get_model(name, num_classes, input_shape)
  shapes = _shapes(model)
  assert count_params(shapes) == expected
  f = model.feature_dim
  assert jax.tree.map(lambda s: s.shape, shapes['head']) == {'kernel': (f, num_classes),
                                                            'bias': (num_classes,)}


def test_resnet20_shortcut_b_adds_two_projections():
  a = count_params(_shapes(get_model('resnet20', 10, (32, 32, 3), shortcut='A')))
  b = count_params(_shapes(get_model('resnet20', 10, (32, 32, 3), shortcut='B')))
  assert b - a == (16 * 32 + 2 * 32) + (32 * 64 + 2 * 64)  # 1x1 conv + GroupNorm, twice


def test_resnet18_layout():
  ext = _shapes(get_model('resnet18_gn', 10, (32, 32, 3)))['extractor']
  assert ext['conv_stem'] == {'kernel': jax.ShapeDtypeStruct((7, 7, 3, 64), jnp.float32)}
  assert set(ext['norm_stem']) == {'scale', 'bias'}
  blocks = sorted(k for k in ext if k.startswith('stage'))
  assert blocks == sorted(f'stage{s}_block{b}' for s in range(1, 5) for b in range(2))
  # Downsample (1x1 conv + norm) exactly where the shape changes; no conv has a bias.
  for k in blocks:
    has_down = 'downsample_conv' in ext[k]
    assert has_down == (k.endswith('block0') and k != 'stage1_block0'), k
    assert all(set(ext[k][c]) == {'kernel'} for c in ext[k] if 'conv' in c)
  assert ext['stage4_block0']['downsample_conv']['kernel'].shape == (1, 1, 256, 512)


def _random_like(tree, seed, lead=()):
  """Fan-in-scaled random params from numpy: `model.init` of a ResNet costs a long XLA compile."""
  rng = np.random.default_rng(seed)

  def one(s):
    fan_in = int(np.prod(s.shape[:-1])) if len(s.shape) > 1 else 4
    return jnp.asarray((rng.standard_normal((*lead, *s.shape)) / np.sqrt(fan_in)).astype(np.float32))
  return jax.tree.map(one, tree)


def test_option_a_shortcut_is_subsample_and_zero_channels():
  """With zero conv kernels the block's output is relu(shortcut): check option A's shortcut."""
  block = BasicBlock(8, strides=2, shortcut='A', num_groups=2)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 6, 6, 4)), jnp.float32)
  shapes = jax.eval_shape(block.init, jax.random.key(0), x)['params']
  assert not any('downsample' in k for k in shapes)
  params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  out = jax.jit(block.apply)({'params': params}, x)
  expected = jnp.pad(jax.nn.relu(x[:, ::2, ::2, :]), ((0, 0), (0, 0), (0, 0), (2, 2)))
  np.testing.assert_allclose(out, expected, atol=1e-6)


@pytest.mark.parametrize('shortcut', ['A', 'B'])
def test_block_lowerings_agree_with_per_client_params(shortcut):
  """A strided BasicBlock (the unit of both ResNets) gives the same output and gradients under xla
  and im2col, vmapped over 2 clients' own params (how the engine runs clients)."""
  blocks = [BasicBlock(8, strides=2, shortcut=shortcut, conv_impl=impl) for impl in ('xla', 'im2col')]
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 3, 6, 6, 4)), jnp.float32)
  shapes = jax.eval_shape(blocks[0].init, jax.random.key(0), x[0])['params']
  params = _random_like(shapes, 1, lead=(2,))

  @jax.jit
  def run(params, x):
    outs = []
    for b in blocks:
      f = lambda p, xx, b=b: jnp.sum(jnp.sin(b.apply({'params': p}, xx)))
      outs.append(jax.vmap(jax.value_and_grad(f))(params, x))
    return outs

  (val_a, grad_a), (val_b, grad_b) = run(params, x)
  np.testing.assert_allclose(val_a, val_b, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(grad_a), jax.tree_util.tree_leaves(grad_b)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  assert abs(float(val_a[0] - val_a[1])) > 1e-6  # the vmap really is per client


@pytest.mark.parametrize('name, input_shape', [('emnist_cnn_tff', (12, 12, 1))])
def test_whole_model_lowerings_agree(name, input_shape):
  models = [get_model(name, 5, input_shape, conv_impl=impl) for impl in ('xla', 'im2col')]
  params = _random_like(_shapes(models[0]), 2)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((3, *input_shape)), jnp.float32)
  logits = jax.jit(lambda p, x: [m.apply(p, x) for m in models])(params, x)
  assert logits[0].shape == (3, 5)
  np.testing.assert_allclose(logits[0], logits[1], rtol=1e-4, atol=1e-5)


def test_resnet18_forward_backward():
  model = get_model('resnet18_gn', 10, (32, 32, 3), conv_impl='xla')
  params = _random_like(_shapes(model), 0)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 32, 32, 3)), jnp.float32)
  y = jnp.asarray([3, 7], jnp.int32)

  @jax.jit
  def step(params, x, y):
    feats = model.features(params['extractor'], x)
    loss, grads = jax.value_and_grad(lambda p: _loss(model, p, x, y))(params)
    return feats, loss, grads

  feats, loss, grads = step(params, x, y)
  assert feats.shape == (2, 512)
  assert np.isfinite(float(loss))
  leaves = jax.tree_util.tree_leaves(grads)
  assert len(leaves) == len(jax.tree_util.tree_leaves(params))
  # Every parameter gets a finite, nonzero gradient: nothing is disconnected.
  assert all(np.all(np.isfinite(g)) and float(jnp.abs(g).sum()) > 0 for g in leaves)
