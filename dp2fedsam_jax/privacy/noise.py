"""Gaussian noise on pytrees: the one swappable piece that turns a clipped sum into a DP release."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Where the noise is added (config.dp.noise_placement), the same total std on the sum either way:
# 'central' once by the server on the sum; 'distributed' by each client, N(0, s^2 C^2 / |S|).
NOISE_PLACEMENTS = ('central', 'distributed')


def gaussian_like(key: jax.Array, tree, stddev) -> object:
  """Independent N(0, stddev^2) noise with the structure, shapes and dtypes of `tree`."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, len(leaves))
  noise = [stddev * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
  return jax.tree.unflatten(treedef, noise)


def add_gaussian_noise(key: jax.Array, tree, stddev, mask=None):
  """tree + N(0, stddev^2); with a 0/1 `mask`, noise only where it is 1 (e.g. a public rand-k mask)."""
  noise = gaussian_like(key, tree, stddev)
  if mask is not None:
    noise = jax.tree.map(lambda z, m: z * m.astype(z.dtype), noise, mask)
  return jax.tree.map(jnp.add, tree, noise)
