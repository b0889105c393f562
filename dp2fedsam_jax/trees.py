"""Pytree helpers shared by local training, privacy and the method pieces.

A leaf of the package (imports JAX only), so `local.py`, `privacy/` and `algorithms/` use the same
norm and the same masking without importing each other.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def global_norm(tree) -> jax.Array:
  """L2 norm of all leaves together (never per tensor: per-tensor clipping has sensitivity C*sqrt(L)).

  Computed relative to the largest entry, so huge but finite updates (|x| ~ 1e30, whose squares
  overflow float32) still get a finite norm and keep their direction when clipped.
  """
  leaves = jax.tree.leaves(tree)
  if not leaves:
    return jnp.zeros((), jnp.float32)
  biggest = jnp.max(jnp.stack([jnp.max(jnp.abs(x)) for x in leaves]))
  scale = jnp.where(biggest > 0, biggest, 1.0)
  return scale * jnp.sqrt(sum(jnp.sum(jnp.square(x / scale)) for x in leaves))


def apply_mask(tree, mask):
  """tree * mask leaf by leaf; `mask` is a pytree of 0/1 arrays shaped like `tree` (any dtype)."""
  return jax.tree.map(lambda x, m: x * m.astype(x.dtype), tree, mask)


def ones_like(tree):
  """The all-ones float32 mask of `tree` (keeps every coordinate)."""
  return jax.tree.map(lambda x: jnp.ones(x.shape, jnp.float32), tree)


def masked_max(tree, valid):
  """Elementwise max over the leading (client) axis of the entries where valid is True (0 if none)."""
  def leaf_max(x):
    keep = valid.reshape(valid.shape + (1,) * (x.ndim - 1))
    return jnp.max(jnp.where(keep, x, 0), axis=0)
  return jax.tree.map(leaf_max, tree)
