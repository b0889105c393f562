"""The client-level Gaussian mechanism of a run, in one object: what the round step executes is what
the accountant composes.

    sample(key)                   who takes part (Poisson q, or exactly m without replacement)
    clip(delta)                   global L2 clipping of a client's whole shared update to C
    privatize_upload(key, u, |S|) [distributed] a client's share N(0, s^2 C^2 / |S|)
    privatize_sum(key, sum, |S|)  [central] N(0, s^2 C^2) on the sum; [distributed] nothing, unless
                                  nobody was sampled (then the server adds all of it)
    denominator(|S|)              the expected cohort size qN (Poisson) or m (fixed): public
    dp_event(rounds)              the dp_accounting event of `rounds` such rounds

A non-private method runs the same object with `private=False`: no clipping, no noise, the actual
cohort as the divisor, and epsilon = inf.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from dp2fedsam_jax.privacy import accounting, clipping, noise, sampling

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
  """
  num_clients: int
  sampling: str            # 'poisson' | 'fixed'
  sampling_rate: float     # q
  clip_norm: float         # C
  noise_multiplier: float  # sigma: noise std on the sum / C
  noise_placement: str = 'central'  # 'central' | 'distributed'
  private: bool = True

  def __post_init__(self):
    if self.noise_placement not in NOISE_PLACEMENTS:
      raise ValueError(f'config.dp.noise_placement={self.noise_placement!r}: unknown; choose one '
                       f'of {list(NOISE_PLACEMENTS)}.')

  @property
  def noise_std(self) -> float:
    """Std of the Gaussian noise on the sum of clipped updates: sigma C (0 if not private)."""
    return self.noise_multiplier * self.clip_norm if self.private else 0.0

  @property
  def distributed(self) -> bool:
    return self.noise_placement == 'distributed'

  def sample(self, key: jax.Array) -> jax.Array:
    """bool[num_clients]: the cohort of one round."""
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

  def privatize_sum(self, key: jax.Array, total, cohort: jax.Array, support=None):
    """The sum of the clipped uploads plus the server's noise. `support`: a 0/1 mask where noise
    goes (a public rand-k mask; the union of private masks for the leaky methods)."""
    if not self.private:
      return total
    return noise.add_gaussian_noise(key, total, self.server_noise_std(cohort), support)

  def denominator(self, cohort: jax.Array) -> jax.Array:
    """What the noised sum is divided by: the *expected* cohort size for private runs, a public
    constant, so the mean's sensitivity does not depend on who was sampled."""
    if self.private:
      return jnp.asarray(sampling.cohort_size(self.sampling, self.sampling_rate, self.num_clients),
                         jnp.float32)
    return jnp.maximum(cohort, 1).astype(jnp.float32)

  def dp_event(self, rounds: int):
    """The dp_accounting event of `rounds` rounds of this mechanism (None if not private)."""
    if not self.private:
      return None
    return accounting.dp_event(self.noise_multiplier, self.sampling_rate, rounds,
                               sampling=self.sampling, num_clients=self.num_clients)

  def epsilon(self, rounds: int, delta: float, accountant: str = 'pld') -> float:
    """Client-level epsilon at `delta` after `rounds` rounds (inf if not private)."""
    if not self.private:
      return math.inf
    return accounting.compute_epsilon(self.noise_multiplier, self.sampling_rate, rounds, delta,
                                      sampling=self.sampling, accountant=accountant,
                                      num_clients=self.num_clients)
