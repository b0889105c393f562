"""Clipping of a client's whole shared update by its global L2 norm."""

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


def clip_by_global_norm(tree, clip_norm):
  """Scales `tree` so its global L2 norm is at most `clip_norm`.

  Returns (clipped tree, norm before clipping). The sensitivity of a sum of such trees to adding or
  removing one client is exactly `clip_norm`.
  """
  norm = global_norm(tree)
  # Written as min(1, C/norm) rather than C/max(C, norm) so a zero update stays exactly zero.
  scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norm, jnp.finfo(norm.dtype).tiny))
  return jax.tree.map(lambda x: (x * scale).astype(x.dtype), tree), norm
