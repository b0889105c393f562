"""The character LSTMs: parameter counts against the reference model, int token inputs, the
extractor/head split over the time axis, and that a few SGD steps learn a toy sequence."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dp2fedsam_jax.models import count_params, get_model, model_names
from dp2fedsam_jax.models.registry import is_token_model

VOCAB = 90  # data/shakespeare.py: pad, BOS, EOS, 86 characters, OOV


@pytest.mark.parametrize('name, total, head, features', [
    # McMahan et al. 2017 / TFF / fedjax: Embed 720 + LSTM 271,360 + LSTM 525,312 + Dense 23,130.
    ('char_lstm', 820_522, 23_130, 256),
    ('char_lstm_small', 82_474, 11_610, 128),
])
def test_param_counts_match_the_reference(name, total, head, features):
  model = get_model(name, VOCAB, (80,))
  params = jax.eval_shape(model.init, jax.random.key(0))
  assert count_params(params) == total and count_params(params['head']) == head
  assert model.feature_dim == features and model.input_dtype == 'int32'
  assert name in model_names() and is_token_model(name) and not is_token_model('mlp')


def test_extractor_then_head_is_the_model_at_every_time_step():
  model = get_model('char_lstm_small', VOCAB, (12,), hidden=(16,))
  params = model.init(jax.random.key(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (3, 12)), jnp.uint8)  # the data's dtype

  @jax.jit
  def outputs(params, tokens):
    feats = model.features(params['extractor'], tokens)
    changed = model.features(params['extractor'], tokens.at[:, 6:].set(5))
    return feats, model.apply(params, tokens), model.logits_from_features(params['head'], feats), changed

  feats, logits, from_feats, changed = outputs(params, tokens)
  assert feats.shape == (3, 12, 16) and logits.shape == (3, 12, VOCAB)
  np.testing.assert_allclose(from_feats, logits, rtol=1e-6)
  # Causal: the features at step t do not depend on later tokens.
  np.testing.assert_allclose(changed[:, :6], feats[:, :6], rtol=1e-6)
  assert params['head']['kernel'].shape == (16, VOCAB)


def test_cells_and_unroll_give_the_same_function():
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, VOCAB, (2, 6)), jnp.int32)
  base, unrolled, optimized, lstm = (get_model('char_lstm', VOCAB, (6,), hidden=(8, 8), **kw)
                                     for kw in ({}, {'unroll': 2}, {'cell': 'optimized'},
                                                {'cell': 'lstm'}))
  assert base.extractor.cell == 'fused'
  params = base.init(jax.random.key(1))
  assert jax.tree.map(jnp.shape, lstm.init(jax.random.key(1))) == jax.tree.map(jnp.shape, params)
  want, *others = jax.jit(lambda p, t: [m.apply(p, t) for m in (base, unrolled, optimized, lstm)])(
      params, tokens)
  for got in others:
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _assert_close(got, want, rtol=1e-5):
  """Within rtol of the largest entry of each array: float32 rounding of sums in another order."""
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=0, atol=rtol * float(np.max(np.abs(w))) + 1e-30)


@pytest.mark.parametrize('name, hidden', [('char_lstm_small', (32,)), ('char_lstm', (24, 16))])
def test_fused_layer_is_flax_optimized_cell_with_the_same_params(name, hidden):
  """The fused layer (hoisted input projection, custom backward pass) against flax's
  OptimizedLSTMCell under nn.RNN: the same parameter tree and initial values (checkpoints load
  either way), the same features, logits and gradients of every parameter to float32 rounding,
  for one client and vmapped over clients with their own weights (the vmap executor)."""
  fused, optimized = (get_model(name, VOCAB, (20,), hidden=hidden, cell=c)
                      for c in ('fused', 'optimized'))
  params = optimized.init(jax.random.key(2))
  assert jax.tree.structure(fused.init(jax.random.key(2))) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, fused.init(jax.random.key(2)), params)
  rng = np.random.default_rng(3)
  # Trained-looking weights: larger than the initialisation, so every gate saturates somewhere.
  params = jax.tree.map(lambda p: p + 0.3 * jnp.asarray(rng.standard_normal(p.shape), p.dtype),
                        params)
  tokens = jnp.asarray(rng.integers(0, VOCAB, (5, 20)), jnp.uint8)
  labels = jnp.asarray(rng.integers(0, VOCAB, (5, 20)), jnp.int32)

  def outputs(model, p, t):
    loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
        model.apply(p, t), labels).mean()
    return model.features(p['extractor'], t), model.apply(p, t), jax.grad(loss)(p)

  want = jax.jit(lambda p: outputs(optimized, p, tokens))(params)
  got = jax.jit(lambda p: outputs(fused, p, tokens))(params)
  _assert_close(got, want)
  assert float(jnp.max(jnp.abs(want[0]))) > 0.5  # the comparison is not of near-zero features
  # Three clients with their own weights and rows, as the vmap executor runs them.
  stacked = jax.tree.map(lambda p: jnp.stack([p, 0.9 * p, 1.1 * p]), params)
  rows = jnp.stack([tokens, tokens[::-1], (tokens + 7) % VOCAB])
  per_client = lambda model: jax.jit(jax.vmap(lambda p, t: outputs(model, p, t)))(stacked, rows)
  _assert_close(per_client(fused), per_client(optimized))


def test_sgd_steps_learn_a_toy_sequence():
  model = get_model('char_lstm_small', VOCAB, (16,), hidden=(32,))
  params = model.init(jax.random.key(0))
  x = jnp.asarray(np.tile(np.arange(3, 11), (4, 2)), jnp.int32)  # 3..10 repeated: next = +1 mod 8
  y = jnp.roll(x, -1, axis=1)

  def loss(p):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

  def steps(p):  # 30 SGD steps in one compiled loop
    step = lambda p, _: (jax.tree.map(lambda a, g: a - 0.5 * g, p, jax.grad(loss)(p)), None)
    return loss(p), loss(jax.lax.scan(step, p, None, length=30)[0])

  before, after = jax.jit(steps)(params)
  assert float(after) < 0.5 * float(before)


def test_token_models_refuse_image_shapes_and_image_models_keep_float_inputs():
  with pytest.raises(ValueError, match=r'input_shape must be \(T,\)'):
    get_model('char_lstm', VOCAB, (28, 28, 1))
  with pytest.raises(ValueError, match='bad keyword'):
    get_model('char_lstm', VOCAB, (80,), layers=3)
  mlp = get_model('mlp', 4, (8, 8, 1))
  assert mlp.input_dtype == 'float32' and mlp.init(jax.random.key(0))['head']['kernel'].shape == (64, 4)
