"""Noise correlated across rounds (the matrix mechanism) and the samplers each one is accounted with.

For a lower-triangular strategy C (T x T) the server adds to round t's sum the noise w_t = (C^-1 Z)_t,
with Z_t ~ N(0, (sigma C_clip)^2 I) fresh each round: the released sums X + W are a post-processing
of C X + Z, whose sensitivity is what the accountant sees (docs/privacy.md section 7).

    'independent'  C = I: w_t = z_t (DP-FedAvg as before), Poisson or fixed cohorts.
    'banded'       BandMF (Choquette-Choo et al. 2023): C a b-banded lower-triangular Toeplitz matrix
                   with coefficients c (||c||_2 = 1, optimised for the prefix-sum workload of T rounds
                   by jax_privacy.matrix_factorization.toeplitz.optimize_banded_toeplitz);
                   w_t = (z_t - sum_{j=1}^{b-1} c_j w_{t-j}) / c_0 from a buffer of the last b-1 w's.
                   Sampler: the clients split into b fixed public groups (from the seed); round t
                   samples Poisson at rate q b within group t mod b only. Accounted as ceil(T / b)
                   Poisson(q b)-sampled Gaussians with multiplier sigma / max column norm of C.
    'tree'         DP-FTRL tree aggregation (Kairouz et al. 2021), restarted every epoch: one Gaussian
                   N(0, (sigma C_clip)^2) per complete dyadic node of the epoch's rounds; the noise on
                   the prefix sum of s rounds is the sum of the nodes of s's binary decomposition, and
                   w_t = P_{t+1} - P_t. Stateless: a node's noise comes from fold_in(key, epoch,
                   level, node). Sampler: every epoch a fresh public shuffle of all clients cut into
                   cohorts of m = round(q N), so each client is in exactly one round per epoch of
                   E = ceil(N / m) rounds. Accounted without amplification: per epoch a Gaussian with
                   sensitivity sqrt(L), L = floor(log2 E) + 1 the nodes a round is in (equal to
                   dp_accounting's SingleEpochTreeAggregationDpEvent; tests/test_correlated.py).
                   Neighbours: a client's uploads replaced by zero in its (public) rounds --
                   dp_accounting's REPLACE_SPECIAL; an unsampled Gaussian has add/remove's curve there.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from dp2fedsam_jax import keys
from dp2fedsam_jax.privacy import noise as noise_lib

# ------------------------------------------------------------------------------------------ banded
@functools.lru_cache(maxsize=None)
def banded_strategy(num_rounds: int, bands: int) -> tuple[float, ...]:
  """The b Toeplitz coefficients c_0..c_{b-1} of the BandMF strategy for T rounds (||c||_2 = 1).

  jax_privacy's LBFGS optimisation of the mean squared error of the T prefix sums, run on the CPU so
  that a run and its resume on another backend get the same coefficients (cached per (T, b)).
  """
  if bands == 1:
    return (1.0,)
  # pylint: disable=import-outside-toplevel
  from jax_privacy.matrix_factorization import toeplitz
  with jax.default_device(jax.devices('cpu')[0]):
    coefs = np.asarray(toeplitz.optimize_banded_toeplitz(max(num_rounds, bands), bands), np.float64)
  coefs = coefs / np.linalg.norm(coefs)
  return tuple(float(c) for c in coefs)


def max_column_norm(strategy: tuple[float, ...]) -> float:
  """The largest column norm of a banded Toeplitz C: ||c||_2 (the truncated last columns are less).

  With each client at most once in any b consecutive rounds, its columns do not overlap, so this is
  the sensitivity of one participation (brute-forced in tests/test_correlated.py)."""
  return float(np.linalg.norm(np.asarray(strategy, np.float64)))


def init_banded_buffer(strategy: tuple[float, ...], like):
  """The last b-1 noise draws, all zero before round 0 (w_t = 0 for t < 0): [b-1, *leaf] per leaf."""
  if len(strategy) == 1:
    return ()
  return jax.tree.map(lambda x: jnp.zeros((len(strategy) - 1,) + x.shape, x.dtype), like)


def banded_noise(z, buffer, strategy: tuple[float, ...]):
  """(w_t, new buffer): w_t = (z_t - sum_j c_j w_{t-j}) / c_0, i.e. row t of C W = Z solved for W.

  buffer[j - 1] holds w_{t-j}; the new buffer shifts w_t in at the front."""
  if len(strategy) == 1:
    return jax.tree.map(lambda x: x / strategy[0], z), buffer
  c = jnp.asarray(strategy[1:], jnp.float32)

  def one(zl, bl):
    inner = jnp.tensordot(c.astype(bl.dtype), bl, axes=1)
    return (zl - inner) / jnp.asarray(strategy[0], zl.dtype)

  w = jax.tree.map(one, z, buffer)
  new_buffer = jax.tree.map(lambda wl, bl: jnp.concatenate([wl[None], bl[:-1]], axis=0), w, buffer)
  return w, new_buffer


def group_of_clients(root: jax.Array, num_clients: int, bands: int) -> jax.Array:
  """int32[N]: each client's public group in 0..b-1 (sizes differ by at most one), from the seed."""
  order = jax.random.permutation(keys.group_key(root), num_clients)
  return jnp.zeros((num_clients,), jnp.int32).at[order].set(jnp.arange(num_clients) % bands)


def sample_banded(key, round_index, root, sampling_rate: float, num_clients: int, bands: int):
  """bool[N]: Poisson at rate q b within group (round mod b); nobody from the other groups."""
  in_group = group_of_clients(root, num_clients, bands) == round_index % bands
  return in_group & (jax.random.uniform(key, (num_clients,)) < min(1.0, sampling_rate * bands))


# -------------------------------------------------------------------------------------------- tree
def tree_cohort_size(sampling_rate: float, num_clients: int) -> int:
  """m = max(1, round(q N)) clients per round (the last round of an epoch may hold fewer)."""
  return max(1, round(sampling_rate * num_clients))


def tree_epoch_length(sampling_rate: float, num_clients: int) -> int:
  """E = ceil(N / m): the rounds of one epoch, in which every client takes part exactly once."""
  return math.ceil(num_clients / tree_cohort_size(sampling_rate, num_clients))


def tree_levels(rounds: int) -> int:
  """L: the most complete dyadic nodes of a tree over `rounds` leaves that one leaf lies in
  (floor(log2 rounds) + 1; 0 for no rounds) -- the squared sensitivity of one participation."""
  return rounds.bit_length()


def tree_sensitivity_squared(rounds: int) -> int:
  """(Sensitivity / C_clip)^2 of one participation in a tree over `rounds` rounds: the number of
  released nodes its round is in, at most tree_levels(rounds) (round 0 is in that many)."""
  return tree_levels(rounds)


def sample_tree(round_index, root, sampling_rate: float, num_clients: int) -> jax.Array:
  """bool[N]: the (round mod E)-th block of m clients of the epoch's public shuffle."""
  m = tree_cohort_size(sampling_rate, num_clients)
  epoch_length = tree_epoch_length(sampling_rate, num_clients)
  epoch, position = round_index // epoch_length, round_index % epoch_length
  order = jax.random.permutation(keys.epoch_order_key(root, epoch), num_clients)
  rank = jnp.zeros((num_clients,), jnp.int32).at[order].set(jnp.arange(num_clients, dtype=jnp.int32))
  return rank // m == position


def tree_noise(root, round_index, like, stddev, epoch_length: int):
  """w_t = P_{s} - P_{s-1} (s = rounds of the epoch so far, t included), P_s = the sum of the node
  noises of s's binary decomposition; node (level l, index j) covers rounds [j 2^l, (j+1) 2^l)."""
  epoch, s = round_index // epoch_length, round_index % epoch_length + 1
  total = jax.tree.map(jnp.zeros_like, like)
  for level in range(tree_levels(epoch_length)):
    new_bit, old_bit = (s >> level) & 1, ((s - 1) >> level) & 1
    same = (s >> level) == ((s - 1) >> level)  # the same node in both decompositions: it cancels
    plus = (new_bit == 1) & ~((old_bit == 1) & same)
    minus = (old_bit == 1) & ~((new_bit == 1) & same)
    for sign, on, prefix in ((1.0, plus, s), (-1.0, minus, s - 1)):
      node = jnp.maximum((prefix >> level) - 1, 0)
      z = noise_lib.gaussian_like(keys.tree_node_key(root, epoch, level, node), like, stddev)
      weight = jnp.where(on, sign, 0.0)
      total = jax.tree.map(lambda acc, zl, w=weight: acc + w.astype(zl.dtype) * zl, total, z)
  return total
