"""The client-level Gaussian mechanism of a run, in one object: what the round step executes is what
the accountant composes.

    sample(key, round, root)      who takes part (Poisson q, or exactly m without replacement;
                                  banded: Poisson q b within the round's group; tree: the round's
                                  block of the epoch's shuffle)
    clip(delta)                   global L2 clipping of a client's whole shared update to C
    privatize_upload(key, u, |S|) [distributed] a client's share N(0, s^2 C^2 / |S|)
    privatize_sum(key, sum, |S|, noise_state, round, root)
                                  -> (released sum, new noise_state). [central] N(0, s^2 C^2) on the
                                  sum, or row t of C^-1 Z for correlated noise (privacy/correlated.py);
                                  [distributed] nothing, unless nobody was sampled (then the server
                                  adds all of it)
    init_noise_state(shared)      what the server carries between rounds (BandMF: the last b-1 draws)
    denominator(|S|)              the expected cohort size qN (Poisson) or m (fixed): public
    dp_event(rounds)              the dp_accounting event of `rounds` such rounds
    calibrate(eps, rounds, delta) sigma for a target epsilon, through the same dp_event

A non-private method runs the same object with `private=False`: no clipping, no noise, the actual
cohort as the divisor, and epsilon = inf.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

import dp_accounting

from dp2fedsam_jax.privacy import accounting, clipping, correlated, noise, sampling

from dp2fedsam_jax.privacy.noise import NOISE_PLACEMENTS


@dataclasses.dataclass(frozen=True)
class DPMechanism:
  """Sampling, clipping, noise and accounting of one run (all static: hashable, jit-friendly).

  The round step executes exactly this object and the accountant composes its `dp_event`, so the
  accounted mechanism cannot drift from the executed one. Built by `round.mechanism_from(config)`.

  Attributes:
    num_clients: N.
    sampling: 'poisson' | 'fixed' (see accounting.dp_event).
    sampling_rate: q.
    clip_norm: C, the bound on each client's whole shared update (global L2 norm).
    noise_multiplier: sigma; the noise on the sum of clipped updates has std sigma C.
    noise_placement: 'central' (the server adds it) | 'distributed' (each sampled client adds a
      share of std sigma C / sqrt(|S|)).
    private: False for the non-private methods: no clipping, no noise, divide by the cohort.
    noise_mechanism: 'independent' | 'banded' | 'tree' (privacy/correlated.py); the correlated
      ones bring their own sampler (`sampling` must be 'poisson') and central placement.
    strategy: BandMF's Toeplitz coefficients c_0..c_{b-1} (b = bands); (1.0,) otherwise.
  """
  num_clients: int
  sampling: str            # 'poisson' | 'fixed'
  sampling_rate: float     # q
  clip_norm: float         # C
  noise_multiplier: float  # sigma: noise std on the sum / C
  noise_placement: str = 'central'  # 'central' | 'distributed'
  private: bool = True
  noise_mechanism: str = 'independent'
  strategy: tuple = (1.0,)

  def __post_init__(self):
    if self.noise_placement not in NOISE_PLACEMENTS:
      raise ValueError(f'config.dp.noise_placement={self.noise_placement!r}: unknown; choose one '
                       f'of {list(NOISE_PLACEMENTS)}.')
    if self.noise_mechanism not in correlated.NOISE_MECHANISMS:
      raise ValueError(f'config.dp.noise_mechanism={self.noise_mechanism!r}: unknown; choose one '
                       f'of {list(correlated.NOISE_MECHANISMS)}.')
    if self.correlated and (self.distributed or self.sampling != 'poisson'):
      raise ValueError(f'config.dp.noise_mechanism={self.noise_mechanism!r} needs '
                       "dp.noise_placement='central' and dp.sampling='poisson'.")
    if self.noise_mechanism == 'banded' and self.sampling_rate * self.bands > 1 + 1e-12:
      raise ValueError(f'config.dp.num_bands={self.bands} with sampling_rate={self.sampling_rate}: '
                       'BandMF samples at rate sampling_rate * num_bands within a group, which '
                       'must be <= 1.')

  @property
  def correlated(self) -> bool:
    """Noise correlated across rounds (a private run with noise_mechanism 'banded' or 'tree')."""
    return self.private and self.noise_mechanism in correlated.CORRELATED

  @property
  def bands(self) -> int:
    return len(self.strategy) if self.noise_mechanism == 'banded' else 1

  @property
  def cohort_sampling(self) -> str:
    """The sampler's shape for sizing chunks: 'fixed' (exactly m) under 'tree', else `sampling`."""
    return 'fixed' if self.correlated and self.noise_mechanism == 'tree' else self.sampling

  @property
  def epoch_length(self) -> int:
    """'tree': the rounds of one epoch (each client in exactly one of them)."""
    return correlated.tree_epoch_length(self.sampling_rate, self.num_clients)

  @property
  def noise_std(self) -> float:
    """Std of the Gaussian noise on the sum of clipped updates: sigma C (0 if not private)."""
    return self.noise_multiplier * self.clip_norm if self.private else 0.0

  @property
  def distributed(self) -> bool:
    return self.noise_placement == 'distributed'

  def sample(self, key: jax.Array, round_index=0, root: jax.Array | None = None) -> jax.Array:
    """bool[num_clients]: the cohort of round `round_index` (`root`: the run's key, whose public
    schedule the correlated mechanisms' samplers follow)."""
    if self.correlated and self.noise_mechanism == 'banded':
      return correlated.sample_banded(key, round_index, root, self.sampling_rate,
                                      self.num_clients, self.bands)
    if self.correlated and self.noise_mechanism == 'tree':
      return correlated.sample_tree(round_index, root, self.sampling_rate, self.num_clients)
    return sampling.sample_cohort(key, self.sampling, self.sampling_rate, self.num_clients)

  def clip(self, delta):
    """(upload, pre-clip global norm): the update clipped to norm C (unclipped if not private)."""
    if self.private:
      return clipping.clip_by_global_norm(delta, self.clip_norm)
    return delta, clipping.global_norm(delta)

  def client_noise_std(self, cohort: jax.Array) -> jax.Array:
    """A client's share: the |S| shares add up to N(0, (sigma C)^2) on the sum (distributed)."""
    if not (self.private and self.distributed):
      return jnp.zeros((), jnp.float32)
    return self.noise_std / jnp.sqrt(jnp.maximum(cohort, 1).astype(jnp.float32))

  def server_noise_std(self, cohort: jax.Array) -> jax.Array:
    """What the server adds: all of it (central), or all of it only if nobody was sampled, so the
    release is the Gaussian the accountant assumes also for an empty Poisson cohort."""
    if not self.private:
      return jnp.zeros((), jnp.float32)
    if self.distributed:
      return jnp.where(cohort == 0, self.noise_std, 0.0)
    return jnp.asarray(self.noise_std, jnp.float32)

  def privatize_upload(self, key: jax.Array, upload, cohort: jax.Array, support=None):
    """A client's clipped upload plus its noise share (distributed placement; else unchanged)."""
    if not (self.private and self.distributed):
      return upload
    return noise.add_gaussian_noise(key, upload, self.client_noise_std(cohort), support)

  def init_noise_state(self, shared):
    """The noise state a run starts with: BandMF's buffer of b-1 zero draws; () otherwise."""
    if self.correlated and self.noise_mechanism == 'banded':
      return correlated.init_banded_buffer(self.strategy, shared)
    return ()

  def privatize_sum(self, key: jax.Array, total, cohort: jax.Array, support=None, noise_state=(),
                    round_index=0, root: jax.Array | None = None):
    """(the sum of the clipped uploads plus the server's noise, the new noise state). `support`:
    a 0/1 mask where noise goes (a public rand-k mask; the union of private masks for the leaky
    methods; never with correlated noise). Correlated noise: row `round_index` of C^-1 Z, with
    Z_t = N(0, s^2 C^2) drawn from `key` (banded) or the tree's node keys of `root`."""
    if not self.private:
      return total, noise_state
    if not self.correlated:
      return noise.add_gaussian_noise(key, total, self.server_noise_std(cohort), support), noise_state
    if support is not None:
      raise ValueError('correlated noise goes on every coordinate; a noise support is refused.')
    if self.noise_mechanism == 'banded':
      z = noise.gaussian_like(key, total, self.server_noise_std(cohort))
      w, noise_state = correlated.banded_noise(z, noise_state, self.strategy)
    else:
      w = correlated.tree_noise(root, round_index, total, self.server_noise_std(cohort),
                                self.epoch_length)
    return jax.tree.map(jnp.add, total, w), noise_state

  def denominator(self, cohort: jax.Array) -> jax.Array:
    """What the noised sum is divided by: the *expected* cohort size for private runs, a public
    constant, so the mean's sensitivity does not depend on who was sampled."""
    if self.correlated and self.noise_mechanism == 'tree':
      return jnp.asarray(correlated.tree_cohort_size(self.sampling_rate, self.num_clients),
                         jnp.float32)
    if self.private:  # banded too: q b |group| averages q N over the groups
      return jnp.asarray(sampling.cohort_size(self.sampling, self.sampling_rate, self.num_clients),
                         jnp.float32)
    return jnp.maximum(cohort, 1).astype(jnp.float32)

  def dp_event(self, rounds: int):
    """The dp_accounting event of `rounds` rounds of this mechanism (None if not private).

    banded: ceil(rounds / b) Poisson(q b)-sampled Gaussians of multiplier sigma / ||c||_2 (a client
    has one chance per b rounds, and its columns do not overlap; Choquette-Choo et al. 2023, as
    jax_privacy's DpsgdTrainingAccountant with cycle_length b). tree: per epoch (a complete one and
    the rounds of the current one) a Gaussian of multiplier sigma / sqrt(L), L the nodes a round
    is in -- dp_accounting's SingleEpochTreeAggregationDpEvent, in a form PLD also composes.
    """
    if not self.private:
      return None
    if not self.correlated:
      return accounting.dp_event(self.noise_multiplier, self.sampling_rate, rounds,
                                 sampling=self.sampling, num_clients=self.num_clients)
    sigma = accounting._check_noise_multiplier(self.noise_multiplier)  # pylint: disable=protected-access
    if self.noise_mechanism == 'banded':
      one = dp_accounting.PoissonSampledDpEvent(
          self.sampling_rate * self.bands,
          dp_accounting.GaussianDpEvent(sigma / correlated.max_column_norm(self.strategy)))
      return dp_accounting.SelfComposedDpEvent(one, math.ceil(rounds / self.bands))
    epoch = self.epoch_length
    full, rest = divmod(rounds, epoch)
    per_epoch = lambda length: dp_accounting.GaussianDpEvent(
        sigma / math.sqrt(correlated.tree_sensitivity_squared(length)))
    events = [dp_accounting.SelfComposedDpEvent(per_epoch(epoch), full)] if full else []
    if rest:
      events.append(per_epoch(rest))
    return dp_accounting.ComposedDpEvent(events)

  def epsilon(self, rounds: int, delta: float, accountant: str = 'pld') -> float:
    """Client-level epsilon at `delta` after `rounds` rounds (inf if not private)."""
    if not self.private:
      return math.inf
    if not self.correlated:
      return accounting.compute_epsilon(self.noise_multiplier, self.sampling_rate, rounds, delta,
                                        sampling=self.sampling, accountant=accountant,
                                        num_clients=self.num_clients)
    return accounting.epsilon_of_event(lambda s: self.with_noise(s).dp_event(rounds),
                                       self.noise_multiplier, rounds, delta, accountant)

  def with_noise(self, noise_multiplier: float) -> 'DPMechanism':
    return dataclasses.replace(self, noise_multiplier=float(noise_multiplier))

  def calibrate(self, target_epsilon: float, rounds: int, delta: float,
                accountant: str = 'pld') -> float:
    """The smallest sigma (to ~1e-3 relative) whose epsilon after `rounds` rounds is <= target."""
    if not self.correlated:
      return accounting.calibrate_noise_multiplier(
          target_epsilon, self.sampling_rate, rounds, delta, sampling=self.sampling,
          accountant=accountant, num_clients=self.num_clients)
    return accounting.calibrate_event(lambda s: self.with_noise(s).dp_event(rounds),
                                      target_epsilon, rounds, delta, accountant)
