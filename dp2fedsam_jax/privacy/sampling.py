"""Cohort sampling under jit: a boolean membership mask over all N clients.

The mask, not a fixed-size index list, is the sampler's output, so no sampled client can be lost to a
too-small buffer: the round step walks the sampled clients in chunks until all are processed.
Samplers (`SAMPLINGS`): Poisson (a uniform per client, or `dp.poisson_draw='gaps'`: geometric gaps
between sampled ids, O(cohort)) and a fixed cohort; `default_capacity` sizes the chunks the round walks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# The samplers sample_cohort implements (config.dp.sampling); accounting.py accounts each one.
SAMPLINGS = ('poisson', 'fixed')
# How a Poisson cohort is drawn (config.dp.poisson_draw): the same distribution, other random numbers.
# 'per_client': a uniform per client, O(N) a round; 'gaps': geometric gaps between the sampled ids,
# O(cohort) (poisson_by_gaps).
POISSON_DRAWS = ('per_client', 'gaps')


def cohort_size(sampling: str, sampling_rate: float, num_clients: int) -> int:
  """Number of clients per round for 'fixed'; the expected number for 'poisson'."""
  if sampling == 'fixed':
    return max(1, round(sampling_rate * num_clients))
  return sampling_rate * num_clients


def sample_cohort(key: jax.Array, sampling: str, sampling_rate: float, num_clients: int,
                  poisson_draw: str = 'per_client') -> jax.Array:
  """bool[num_clients]: who takes part this round.

  'poisson': each client independently with probability q (what PoissonSampledDpEvent accounts),
  drawn per client (`uniform < q`) or by `poisson_by_gaps` (poisson_draw; POISSON_DRAWS).
  'fixed': exactly m = round(q N) clients uniformly without replacement (SampledWithoutReplacementDpEvent).
  """
  if sampling == 'poisson':
    if poisson_draw == 'gaps':
      return poisson_by_gaps(key, sampling_rate, num_clients)
    if poisson_draw != 'per_client':
      raise ValueError(f'config.dp.poisson_draw={poisson_draw!r}: unknown; choose one of '
                       f'{list(POISSON_DRAWS)}.')
    return jax.random.uniform(key, (num_clients,)) < sampling_rate
  if sampling == 'fixed':
    m = cohort_size('fixed', sampling_rate, num_clients)
    chosen = jax.random.permutation(key, num_clients)[:m]
    return jnp.zeros((num_clients,), bool).at[chosen].set(True)
  raise ValueError(f'config.dp.sampling={sampling!r}: unknown; choose one of {list(SAMPLINGS)}.')


def _exponentials(key: jax.Array, shape) -> jax.Array:
  """float32 Exp(1) variates -log(U), U uniform on (0, 1), resolved to float32's relative precision
  near 0 and near 1 (jax.random.uniform's 23-bit grid would cap -log(U) at 23 log 2 = 15.9 and make
  its tail, the long gaps, lumpy).

  U is W or 1 - W, each with probability 1/2, for W uniform on (0, 1/2] from 64 random bits:
  -log(W), or -log1p(-W) without forming 1 - W (which would round W away).
  """
  hi, lo, side = jax.random.bits(key, (3, *shape), jnp.uint32)
  w = (hi.astype(jnp.float32) + (lo.astype(jnp.float32) + 0.5) * 2.0**-32) * 2.0**-33
  return jnp.where((side & 1) == 1, -jnp.log(w), -jnp.log1p(-w))


def gap_block(sampling_rate: float, num_clients: int) -> int:
  """Gaps poisson_by_gaps draws at once: the cohort's mean + 4 std + 1 (one block almost always),
  capped so that the positions of one block fit int32 (every gap is at most N + 1)."""
  mean = sampling_rate * num_clients
  block = math.ceil(mean + 4 * math.sqrt(mean * (1.0 - sampling_rate))) + 1
  return max(1, min(block, (2**31 - 1 - num_clients) // (num_clients + 1)))


def poisson_by_gaps(key: jax.Array, sampling_rate: float, num_clients: int,
                    block: int | None = None) -> jax.Array:
  """bool[N], each client independently with probability q, in O(qN) random numbers.

  The sampled ids in increasing order are a renewal process: the gap from one to the next (from -1
  to the first) is Geometric(q) on {1, 2, ...}, P(G = g) = (1 - q)^(g-1) q, independent of the
  others, exactly when every client is an independent Bernoulli(q). G = 1 + floor(E / -log(1 - q))
  for E ~ Exp(1) (inverse CDF: P(G > g) = P(E >= g (-log(1 - q))) = (1 - q)^g). Gaps are drawn
  `block` at a time inside a while_loop until the position passes N - 1; every position below N is
  set in the mask, so none is lost.

  Float32: P(G > g) is exact up to float32 rounding of E, of -log(1 - q) (computed in float64 on the
  host, then rounded) and of the quotient, relative ~1e-7: the draw is Geometric(q') with
  |q' / q - 1| of order 1e-7. E is cut at -log(2^-66) = 45.7 (no gap beyond 45.7 / q; probability
  2^-66 = 1.4e-20 a gap). `uniform < q` (per_client) gives each client ceil(q 2^23) / 2^23 instead:
  jax's float32 uniforms lie on a 2^-23 grid, so up to 2^-23 above q (+0.017 % at q = 1e-4).
  """
  if sampling_rate >= 1.0:
    return jnp.ones((num_clients,), bool)
  block = gap_block(sampling_rate, num_clients) if block is None else block
  rate = -math.log1p(-sampling_rate)

  def draw(carry):
    index, last, mask = carry
    exponentials = _exponentials(jax.random.fold_in(key, index), (block,))
    # A gap of N + 1 or more leaves [0, N) whatever its length: capped there (int32, and no overflow).
    gaps = 1 + jnp.floor(jnp.minimum(exponentials / rate, num_clients)).astype(jnp.int32)
    positions = last + jnp.cumsum(gaps)
    return index + 1, positions[-1], mask.at[positions].set(True, mode='drop')

  start = (jnp.zeros((), jnp.int32), jnp.full((), -1, jnp.int32), jnp.zeros((num_clients,), bool))
  return jax.lax.while_loop(lambda carry: carry[1] < num_clients - 1, draw, start)[2]


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
