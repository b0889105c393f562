"""Local pieces that methods compose: regularizers on the local update, and DSU's masked forward pass.

All functions are pure and see one client. `received` is the shared part the client got this round;
`trainable` is its current value; the local update is trainable - received.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from dp2fedsam_jax import trees
from dp2fedsam_jax.errors import ConfigError
from dp2fedsam_jax.privacy import sparsify


def _norm(tree) -> jax.Array:
  # sqrt(x + tiny) keeps the gradient finite (zero) at a zero update, where the regularizers start.
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)) + 1e-24)


def _delta(trainable, received, mask=None):
  delta = jax.tree.map(jnp.subtract, trainable, received)
  return delta if mask is None else trees.apply_mask(delta, mask)


@dataclasses.dataclass(frozen=True)
class Regularizer:
  """(kind, lam, clip_norm) -> penalty(trainable, received, mask)."""
  kind: str
  lam: float
  clip_norm: float

  def __call__(self, trainable, received, mask=None) -> jax.Array:
    if self.kind == 'none':
      return jnp.zeros((), jnp.float32)
    if self.kind == 'blur':
      # BLUR (Cheng et al., 2022): penalise only the part of ||Delta|| that clipping would cut off,
      # so updates inside the ball are untouched and larger ones are pulled back to it.
      excess = jax.nn.relu(_norm(_delta(trainable, received)) - self.clip_norm)
      return 0.5 * self.lam * jnp.square(excess)
    if self.kind == 'adaptive_norm':
      # DP-pFedDSU eq. (10): (lam/2) | ||(theta - theta0) * M|| - C |.
      return 0.5 * self.lam * jnp.abs(_norm(_delta(trainable, received, mask)) - self.clip_norm)
    if self.kind == 'proximal':
      # Mean-regularized multi-task learning as the CENTAUR reference code writes it:
      # lam ||theta - theta_mean||^2 (no 1/2).
      return self.lam * jnp.square(_norm(_delta(trainable, received)))
    raise ValueError(f'unknown regularizer {self.kind!r}')


def kernel_layer_paths(model) -> tuple[tuple[str, ...], ...]:
  """Paths (in the extractor's params) of the layers with a kernel, in forward-pass order.

  Found by intercepting module calls during an abstract forward pass, so it works for any flax
  extractor without a per-model list.
  """
  params = jax.eval_shape(lambda: model.init(jax.random.key(0)))['extractor']
  paths: list[tuple[str, ...]] = []

  def record(next_fun, args, kwargs, context):
    path = tuple(context.module.path)
    node = params
    for part in path:
      node = node.get(part, {}) if isinstance(node, dict) else {}
    if context.method_name == '__call__' and isinstance(node, dict) and 'kernel' in node:
      if path not in paths:
        paths.append(path)
    return next_fun(*args, **kwargs)

  x = jax.ShapeDtypeStruct((1, *model.input_shape), jnp.float32)
  with nn.intercept_methods(record):
    jax.eval_shape(model.features, params, x)
  return tuple(paths)


def dsu_mask(shared, layer_paths, masked_layers: int, sparsity: float):
  """DP-pFedDSU eqs. (6), (8): in the last `masked_layers` kernel layers of the extractor, keep the
  `sparsity` fraction of largest-magnitude entries of each kernel; biases and every other layer are
  kept whole (TopKAST / DSU sparsify weights, not biases)."""
  masked = set(layer_paths[-masked_layers:]) if masked_layers > 0 else set()

  def build(tree, path):
    if isinstance(tree, dict):
      return {k: build(v, path + (k,)) for k, v in tree.items()}
    if path[:-1] in masked and path[-1] == 'kernel':
      return sparsify.leafwise_topk_mask(jax.lax.stop_gradient(tree), sparsity)
    return jnp.ones(tree.shape, jnp.float32)

  return {k: (build(v, ()) if k == 'extractor' else trees.ones_like(v)) for k, v in shared.items()}


@dataclasses.dataclass(frozen=True)
class WeightMask:
  """The forward-pass mask of a method (DSU: theta * M, M from the current weights), or none.

  Every forward pass of a DSU method goes through `forward(shared)`: the head phase, the shared
  phase, evaluation and fine-tuning all see the same network theta * M (dp-pfeddsu.txt eq. 7).
  """
  kind: str = 'none'               # 'none' | 'dsu'
  layer_paths: tuple = ()          # kernel layers of the extractor in forward order
  masked_layers: int = 0
  sparsity: float = 1.0

  @classmethod
  def for_method(cls, spec, model, params) -> 'WeightMask':
    if spec.weight_mask != 'dsu':
      return cls()
    if model.input_dtype != 'float32':
      # DSU masks whole conv/dense layers; an LSTM layer is eight gate kernels, and masking the last
      # few of them (one gate's) is not the paper's method.
      raise ConfigError(f'config.method={spec.name!r} masks the last conv/dense layers (DP-pFedDSU); '
                        f'config.model={model.name!r} is recurrent: use an image model, or another method.')
    return cls('dsu', kernel_layer_paths(model), params.dsu_masked_layers, params.dsu_sparsity)

  def __call__(self, shared):
    """The 0/1 mask over `shared` (None for methods without one)."""
    if self.kind == 'none':
      return None
    return dsu_mask(shared, self.layer_paths, self.masked_layers, self.sparsity)

  def forward(self, shared):
    """The params the network computes with: theta * M, or theta itself."""
    mask = self(shared)
    return shared if mask is None else trees.apply_mask(shared, mask)
