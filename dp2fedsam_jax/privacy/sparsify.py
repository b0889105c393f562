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


def _running_sum(counts: jax.Array) -> jax.Array:
  """Inclusive prefix sum of int32 counts; an associative scan: 4x faster than jnp.cumsum's lowering
  on a CPU (1.4 ms against 5.5 for 524,288 entries), and exact for integers."""
  return jax.lax.associative_scan(jnp.add, counts)


def _count_at_or_above(histogram: jax.Array) -> jax.Array:
  """[b] -> how many counted entries fall in bin b or a higher one."""
  return _running_sum(histogram[::-1])[::-1]


def _kth_largest_bits(bits: jax.Array, k: int) -> jax.Array:
  """The int32 bit pattern of the k-th largest of `bits` (non-negative float32 bit patterns, which
  order as the floats do), by a two-pass radix select over the high and the low 16 bits."""
  high = bits >> 16  # 0 .. 2**15 - 1: the sign bit is 0
  at_or_above = _count_at_or_above(jnp.zeros(1 << 15, jnp.int32).at[high].add(1))
  bin_ = jnp.sum(at_or_above >= k) - 1  # the highest bin that, with those above it, holds >= k
  above_bin = jnp.where(bin_ + 1 < (1 << 15), at_or_above[jnp.minimum(bin_ + 1, (1 << 15) - 1)], 0)
  in_bin = (high == bin_).astype(jnp.int32)
  low_at_or_above = _count_at_or_above(jnp.zeros(1 << 16, jnp.int32).at[bits & 0xFFFF].add(in_bin))
  return (bin_ << 16) | (jnp.sum(low_at_or_above + above_bin >= k) - 1)


def top_k_scatter(scores: jax.Array, k: int) -> jax.Array:
  """1 at the indices `jax.lax.top_k` gives (exactly k; ties: the lower index first), 0 elsewhere."""
  _, idx = jax.lax.top_k(scores, k)
  return jnp.zeros(scores.shape, jnp.float32).at[idx].set(1.0)


def radix_select_mask(scores: jax.Array, k: int) -> jax.Array:
  """`top_k_scatter`'s mask for `scores` >= 0 (magnitudes, uniform draws), from the k-th largest
  score: what is above it, and the first of its ties by position."""
  bits = jax.lax.bitcast_convert_type(jnp.asarray(scores, jnp.float32), jnp.int32)
  kth = _kth_largest_bits(bits, k)
  at_least = bits >= kth

  def first_ties_by_position():  # only when the k-th value is tied: rare for float weights
    above = bits > kth
    tied = bits == kth
    return above | (tied & (_running_sum(tied.astype(jnp.int32)) <= k - jnp.sum(above)))

  mask = jax.lax.cond(jnp.sum(at_least) == k, lambda: at_least, first_ties_by_position)
  return mask.astype(jnp.float32)


def radix_select_pays(size: int, k: int) -> bool:
  """Whether the radix select beats top_k for one mask on a CPU: k > 1,024 + size / 512. Measured
  on the 2-core EPYC (benchmarks.sparsify_masks, benchmarks/README.md): the radix select takes
  ~0.4 ms up to 51,200 entries (its two histograms), 1.9 at 524,288, whatever k; top_k + scatter
  grows with k (0.45 ms for 1,024 of 51,200, 1.56 for 1,049 of 524,288, 4.0 for 5,243), and the
  two cross near k = 1,000-1,200 at 33k-51k entries, ~1,600 at 524k, 7k-15k at 2.1M."""
  return k > 1024 + size // 512


def _mask_from_scores(scores: jax.Array, k: int) -> jax.Array:
  """1 at the k largest scores (>= 0), exactly k, ties broken by position; 0 elsewhere.

  The same mask either way; which is faster depends on the backend, k and the size
  (benchmarks/README.md, "Sparsification masks"). On a CPU the radix select where it pays: ~7x
  faster for k = 26k of 524k (2 ms against 14.5), where DP-pFedDSU, recomputing its weight mask at
  every local step, spent two thirds of a round in top_k; top_k for small k (a 2,000-entry update
  keeping 200: 0.02 against 0.34 ms). Elsewhere top_k, until measured there."""
  if jax.default_backend() == 'cpu' and radix_select_pays(scores.size, k):
    return radix_select_mask(scores, k)
  return top_k_scatter(scores, k)


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
