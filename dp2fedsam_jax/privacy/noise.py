"""Gaussian noise on pytrees: the one swappable piece that turns a clipped sum into a DP release."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gaussian_like(key: jax.Array, tree, stddev) -> object:
  """Independent N(0, stddev^2) noise with the structure, shapes and dtypes of `tree`."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, len(leaves))
  noise = [stddev * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
  return jax.tree.unflatten(treedef, noise)


def add_gaussian_noise(key: jax.Array, tree, stddev):
  return jax.tree.map(jnp.add, tree, gaussian_like(key, tree, stddev))
