"""Gaussian noise on pytrees, and the two small objects that say where it goes.

    placement   CentralNoise (the server adds std sigma C to the sum) | DistributedNoise (each of the
                |S| sampled clients adds a share of std sigma C / sqrt(|S|)): config.dp.noise_placement
    support     EveryCoordinate | OnUploadMask (only where a sampled client's upload mask is 1: the
                noise-on-mask methods, MethodSpec.noise_on_mask)

The privatizer (mechanism.py) holds a placement; the round holds a support. Neither is asked which
kind it is: each answers the same calls.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dp2fedsam_jax import trees

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


@dataclasses.dataclass(frozen=True)
class CentralNoise:
  """The server adds all the noise, once, to the sum of the clipped uploads (a trusted server)."""
  name = 'central'

  def client_noise_std(self, noise_std, cohort: jax.Array) -> jax.Array:
    del noise_std, cohort
    return jnp.zeros((), jnp.float32)

  def add_client_share(self, key: jax.Array, upload, stddev, support=None):
    del key, stddev, support
    return upload

  def client_sums(self, upload) -> dict:
    """The client's part of the privatizer's sums: nothing (its upload carries no noise, so the
    sum of the uploads is the clean sum the diagnostics read)."""
    del upload
    return {}

  def server_noise_std(self, noise_std, cohort: jax.Array) -> jax.Array:
    del cohort
    return jnp.asarray(noise_std, jnp.float32)


@dataclasses.dataclass(frozen=True)
class DistributedNoise:
  """Each sampled client adds its share: the |S| shares add up to N(0, (sigma C)^2) on the sum. The
  guarantee against the server then needs secure aggregation (docs/privacy.md)."""
  name = 'distributed'

  def client_noise_std(self, noise_std, cohort: jax.Array) -> jax.Array:
    return noise_std / jnp.sqrt(jnp.maximum(cohort, 1).astype(jnp.float32))

  def add_client_share(self, key: jax.Array, upload, stddev, support=None):
    return add_gaussian_noise(key, upload, stddev, support)

  def client_sums(self, upload) -> dict:
    """The upload before its noise share, whose sum the diagnostics compare the release with."""
    return {'clean': upload}

  def server_noise_std(self, noise_std, cohort: jax.Array) -> jax.Array:
    """All of it only if nobody was sampled, so the release is the Gaussian the accountant assumes
    also for an empty Poisson cohort."""
    return jnp.where(cohort == 0, noise_std, 0.0)


PLACEMENTS = {'central': CentralNoise(), 'distributed': DistributedNoise()}
assert tuple(PLACEMENTS) == NOISE_PLACEMENTS


class EveryCoordinate:
  """Noise on every coordinate of the sum: no support to carry (None all the way)."""

  def round_support(self, round_mask, shared):
    del round_mask, shared
    return None

  def client_support(self, mask):
    del mask
    return None

  def merge(self, support, masks, valid):
    del support, masks, valid
    return None


class OnUploadMask:
  """Noise only on the coordinates some sampled client kept (Fed-SMP, DP-pFedDSU): the support is the
  union of the chunk's upload masks over its valid slots. Safe only for a public mask (specs.py)."""

  def round_support(self, round_mask, shared):
    # A public mask is noised even when nobody was sampled: an exact zero would reveal an empty
    # cohort, which the accountant does not allow for.
    if round_mask is not None:
      return round_mask
    return jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), shared)

  def client_support(self, mask):
    return mask

  def merge(self, support, masks, valid):
    return jax.tree.map(jnp.maximum, support, trees.masked_max(masks, valid))


def noise_support(noise_on_mask: bool) -> EveryCoordinate | OnUploadMask:
  """Where a method's noise goes (MethodSpec.noise_on_mask)."""
  return OnUploadMask() if noise_on_mask else EveryCoordinate()
