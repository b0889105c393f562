"""Cohort sampling under jit: a boolean membership mask over all N clients.

The mask, not a fixed-size index list, is the sampler's output, so no sampled client can be lost to a
too-small buffer: the round step walks the sampled clients in chunks until all are processed.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# The samplers sample_cohort implements (config.dp.sampling); accounting.py accounts each one.
SAMPLINGS = ('poisson', 'fixed')


def cohort_size(sampling: str, sampling_rate: float, num_clients: int) -> int:
  """Number of clients per round for 'fixed'; the expected number for 'poisson'."""
  if sampling == 'fixed':
    return max(1, round(sampling_rate * num_clients))
  return sampling_rate * num_clients


def sample_cohort(key: jax.Array, sampling: str, sampling_rate: float, num_clients: int) -> jax.Array:
  """bool[num_clients]: who takes part this round.

  'poisson': each client independently with probability q (what PoissonSampledDpEvent accounts).
  'fixed': exactly m = round(q N) clients uniformly without replacement (SampledWithoutReplacementDpEvent).
  """
  if sampling == 'poisson':
    return jax.random.uniform(key, (num_clients,)) < sampling_rate
  if sampling == 'fixed':
    m = cohort_size('fixed', sampling_rate, num_clients)
    chosen = jax.random.permutation(key, num_clients)[:m]
    return jnp.zeros((num_clients,), bool).at[chosen].set(True)
  raise ValueError(f'config.dp.sampling={sampling!r}: unknown; choose one of {list(SAMPLINGS)}.')


def default_capacity(sampling: str, sampling_rate: float, num_clients: int) -> int:
  """Client slots per chunk of the round.

  'fixed': the cohort, exactly. 'poisson': mean + 1 std. Every slot costs a full client's compute
  whether or not it holds a sampled client, and a cohort that overflows the chunk costs one more
  chunk (processed exactly, nobody is dropped). Expected slots per round, c (1 + P(|S| > c)), is
  near its minimum at mean + 1 std: for a mean of 20, c = 25 costs ~28 slots against 38 for mean +
  4 std. Set `cohort_capacity` to trade memory for fewer chunks.
  """
  if sampling == 'fixed':
    return cohort_size('fixed', sampling_rate, num_clients)
  mean = sampling_rate * num_clients
  std = math.sqrt(num_clients * sampling_rate * (1.0 - sampling_rate))
  return int(min(num_clients, max(1, math.ceil(mean + std))))
