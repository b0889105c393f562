"""Clipping of a client's whole shared update by its global L2 norm.

One norm over all arrays together (`trees.global_norm`), never per tensor: the sum's sensitivity is C.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dp2fedsam_jax.trees import global_norm


def clip_by_global_norm(tree, clip_norm):
  """Scales `tree` so its global L2 norm is at most `clip_norm`.

  Returns (clipped tree, norm before clipping). The sensitivity of a sum of such trees to adding or
  removing one client is exactly `clip_norm`.
  """
  norm = global_norm(tree)
  # Written as min(1, C/norm) rather than C/max(C, norm) so a zero update stays exactly zero.
  scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norm, jnp.finfo(norm.dtype).tiny))
  return jax.tree.map(lambda x: (x * scale).astype(x.dtype), tree), norm
