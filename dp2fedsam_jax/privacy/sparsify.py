"""Sparsification masks over pytrees: top-k by magnitude, data-independent rand-k, per-layer top-k.

A mask is a pytree of float32 0/1 arrays shaped like the tree it masks. Whether a mask is safe for
DP depends only on *what it is computed from* (see docs/privacy.md): from the noised release or from
public randomness it is post-processing; from a client's private update it leaks if noise is then
added only where the mask is 1.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

# Applying a mask is a tree helper (trees.py); re-exported here, where masks are made.
from dp2fedsam_jax.trees import apply_mask, ones_like  # noqa: F401


def num_kept(ratio: float, size: int) -> int:
  """k = ceil(ratio * size), at least 1: the number of coordinates a ratio-p sparsifier keeps."""
  return max(1, min(size, math.ceil(ratio * size)))


def _mask_from_scores(scores: jax.Array, k: int) -> jax.Array:
  """1 at the k largest scores (exactly k, ties broken by position), 0 elsewhere."""
  _, idx = jax.lax.top_k(scores, k)
  return jnp.zeros(scores.shape, jnp.float32).at[idx].set(1.0)


def topk_mask(tree, ratio: float):
  """Keeps the ceil(ratio * d) coordinates of largest magnitude over the whole tree (Definition 5
  of dp-fedsam-topk.txt, one global k)."""
  flat, unravel = ravel_pytree(tree)
  return unravel(_mask_from_scores(jnp.abs(flat), num_kept(ratio, flat.size)))


def randk_mask(key: jax.Array, tree, ratio: float):
  """ceil(ratio * d) coordinates chosen uniformly at random from `key` alone: never reads the values."""
  flat, unravel = ravel_pytree(jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree))
  return unravel(_mask_from_scores(jax.random.uniform(key, flat.shape), num_kept(ratio, flat.size)))


def leafwise_topk_mask(tree, ratio: float):
  """Per-array top-k by magnitude: each leaf keeps ceil(ratio * its size) entries."""
  def leaf_mask(x):
    flat = jnp.abs(x).reshape(-1)
    return _mask_from_scores(flat, num_kept(ratio, flat.size)).reshape(x.shape)
  return jax.tree.map(leaf_mask, tree)
