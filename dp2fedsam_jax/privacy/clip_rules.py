"""How the clip norm C moves from round to round (`dp.clipping`), one small object each.

    FixedClip     C = dp.clip_norm every round; no server state; the update's Gaussian alone
    AdaptiveClip  geometric quantile tracking (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially
                  Private Learning with Adaptive Clipping", NeurIPS 2021; docs/privacy.md section 8)

Adaptive clipping, one round at clip norm C_t (the server state, public to the clients):

    each sampled client i reports b_i = 1[||Delta_i|| <= C_t], centred as b_i - 1/2
    the server releases  B = sum_i (b_i - 1/2) + N(0, s_b^2)               (s_b: count_noise_std)
    b~ = B / m + 1/2     m: the same public divisor as the update's (q N for Poisson)
    C_{t+1} = C_t exp(-eta (b~ - gamma))

so C shrinks while more than a fraction gamma of the clients are unclipped and grows otherwise;
without noise its fixed point is the gamma-quantile of the update norms.

Accounting. Adding or removing one client moves the centred count by exactly 1/2 and the sum of
clipped updates by at most C_t. Released together from one cohort, the pair (sum + N(0, s^2 C_t^2 I),
count + N(0, s_b^2)) is one Gaussian mechanism: scale the count by s C_t / s_b, so that both parts have
noise std s C_t; the joint sensitivity is sqrt(C_t^2 + s^2 C_t^2 / (4 s_b^2)), hence the multiplier

    s_eff = (s^-2 + (2 s_b)^-2)^(-1/2)

(Andrew et al., Theorem 1). Under replace-one neighbours (fixed-size cohorts) both sensitivities
double (2 C_t and 1), so the same s_eff holds with accounting.py's factor 2. C_t depends only on
earlier releases: adaptive composition of T such rounds, sampled like the update.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from dp2fedsam_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class FixedClip:
  """The same clip norm every round: nothing to carry, nothing more to account."""
  name = 'fixed'
  adaptive = False

  @staticmethod
  def check(**unused) -> None:
    del unused  # every noise mechanism and placement

  def init_state(self, clip_norm: float):
    del clip_norm
    return ()

  def clip_norm(self, state, initial: float) -> float:
    """The round's C: the configured one (a Python float, so the round compiles as before)."""
    del state
    return initial

  def next_state(self, key, state, unclipped, cohort, divisor):
    del key, unclipped, cohort, divisor
    return state

  def client_sums(self, norms, valid, clip_norm) -> dict:
    """No count to release: nothing moves C."""
    del norms, valid, clip_norm
    return {}

  def round_metrics(self, clip_norm) -> dict:
    del clip_norm
    return {}

  def effective_noise_multiplier(self, noise_multiplier: float) -> float:
    return noise_multiplier

  def update_noise_multiplier(self, effective: float) -> float:
    return effective

  def describe(self) -> dict:
    return {}


@dataclasses.dataclass(frozen=True)
class AdaptiveClip:
  """Andrew et al.'s geometric update of C towards the target_quantile of the update norms.

  Attributes:
    target_quantile: gamma in (0, 1), the fraction of sampled clients to leave unclipped.
    clip_lr: eta >= 0, the step of log C per round.
    count_noise_std: s_b >= 0, the std of the Gaussian noise on the sum of the clients' bits
      (config.dp.count_noise_multiplier: a bit is 0 or 1, so it is the multiplier in bits).
  """
  target_quantile: float = 0.5
  clip_lr: float = 0.2
  count_noise_std: float = 0.0

  name = 'adaptive'
  adaptive = True
  # |(b_i - 1/2) - 0|: what adding or removing one client moves the centred count by.
  COUNT_SENSITIVITY = 0.5

  def __post_init__(self):
    check_fields(self.target_quantile, self.clip_lr, self.count_noise_std)

  @staticmethod
  def check(*, noise_mechanism='independent', noise_placement='central') -> None:
    if noise_mechanism != 'independent':
      raise ConfigError(
          f"config.dp.noise_mechanism={noise_mechanism!r}: dp.clipping='adaptive' changes C every "
          "round, which breaks the correlated noise's sensitivity across rounds; set "
          "--config.dp.noise_mechanism=independent or --config.dp.clipping=fixed.")
    if noise_placement != 'central':
      raise ConfigError(
          f"config.dp.noise_placement={noise_placement!r}: dp.clipping='adaptive' noises the count "
          'of unclipped clients at the server only; set --config.dp.noise_placement=central or '
          '--config.dp.clipping=fixed.')

  def init_state(self, clip_norm: float) -> jax.Array:
    """C_0, carried in ServerState.clip_state."""
    return jnp.asarray(clip_norm, jnp.float32)

  def clip_norm(self, state, initial: float) -> jax.Array:
    del initial
    return state

  def noised_unclipped_fraction(self, key: jax.Array, unclipped: jax.Array, cohort: jax.Array,
                                divisor) -> jax.Array:
    """b~: the noised sum of the centred bits over the public divisor, plus 1/2."""
    centred = unclipped.astype(jnp.float32) - 0.5 * cohort.astype(jnp.float32)
    noised = centred + self.count_noise_std * jax.random.normal(key, (), jnp.float32)
    return noised / divisor + 0.5

  def next_state(self, key: jax.Array, state: jax.Array, unclipped: jax.Array, cohort: jax.Array,
                 divisor) -> jax.Array:
    """C_{t+1} = C_t exp(-eta (b~ - gamma)), from the noised fraction only."""
    fraction = self.noised_unclipped_fraction(key, unclipped, cohort, divisor)
    return state * jnp.exp(-self.clip_lr * (fraction - self.target_quantile))

  def client_sums(self, norms, valid, clip_norm) -> dict:
    """sum_i b_i, b_i = 1[||Delta_i|| <= C_t], over the chunk's sampled clients: what next_state's
    `unclipped` count is made of."""
    return {'unclipped': unclipped_count(norms, valid, clip_norm)}

  def round_metrics(self, clip_norm) -> dict:
    return {'clip_norm': clip_norm}  # the C this round clipped to

  def effective_noise_multiplier(self, noise_multiplier: float) -> float:
    """(s^-2 + (2 s_b)^-2)^(-1/2): the one Gaussian the pair (sum, count) is (0 if either is 0)."""
    count_multiplier = self.count_noise_std / self.COUNT_SENSITIVITY
    if noise_multiplier <= 0 or count_multiplier <= 0:
      return 0.0
    return (noise_multiplier ** -2 + count_multiplier ** -2) ** -0.5

  def update_noise_multiplier(self, effective: float) -> float:
    """The update's s that leaves `effective` for the pair: (s_eff^-2 - (2 s_b)^-2)^(-1/2)."""
    count_multiplier = self.count_noise_std / self.COUNT_SENSITIVITY
    if effective <= 0:
      return 0.0
    if count_multiplier <= effective:
      raise ConfigError(
          f'config.dp.count_noise_multiplier={self.count_noise_std!r}: the target epsilon needs a '
          f'combined noise multiplier of {effective:.4g}, and the count alone (2 * '
          f'count_noise_multiplier = {count_multiplier:.4g}) must exceed it; set '
          f'--config.dp.count_noise_multiplier > {effective / 2:.4g}.')
    return (effective ** -2 - count_multiplier ** -2) ** -0.5

  def describe(self) -> dict:
    return {'target_quantile': self.target_quantile, 'clip_lr': self.clip_lr,
            'count_noise_multiplier': self.count_noise_std}


# config.dp.clipping -> its class.
CLIP_RULES = {cls.name: cls for cls in (FixedClip, AdaptiveClip)}


def unclipped_count(norms, valid, clip_norm) -> jax.Array:
  """The count of sampled clients with ||Delta_i|| <= C: over the chunk's valid slots only (a padded
  slot is nobody; counting it would move C as if the capacity were sampled)."""
  return jnp.sum(valid & (norms <= clip_norm), dtype=jnp.int32)


def check_fields(target_quantile, clip_lr, count_noise_std, initial_clip_norm=1.0) -> None:
  """One line naming the first bad adaptive-clipping field."""
  def bad(value, ok):
    return isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value)
  if bad(target_quantile, lambda v: 0.0 < v < 1.0):
    raise ConfigError(f'config.dp.target_quantile={target_quantile!r}: the fraction of clients left '
                      'unclipped must lie in (0, 1); the paper uses 0.5.')
  if bad(clip_lr, lambda v: 0.0 <= v < math.inf):
    raise ConfigError(f'config.dp.clip_lr={clip_lr!r}: the step of log C must be a finite number '
                      '>= 0; the paper uses 0.2.')
  if count_noise_std is not None and bad(count_noise_std, lambda v: 0.0 <= v < math.inf):
    raise ConfigError(f'config.dp.count_noise_multiplier={count_noise_std!r}: the noise std on the '
                      'count of unclipped clients must be a finite number >= 0; leave it unset for '
                      'the expected cohort / 20.')
  if initial_clip_norm is not None and bad(initial_clip_norm, lambda v: 0.0 < v < math.inf):
    raise ConfigError(f'config.dp.initial_clip_norm={initial_clip_norm!r}: C_0 must be a finite '
                      'number > 0; leave it unset for dp.clip_norm.')


def check_config(config) -> None:
  """The rules of `config.dp.clipping` for the other dp fields, one line naming the field."""
  dp = config.dp
  if dp.clipping not in CLIP_RULES:
    raise ConfigError(f'config.dp.clipping={dp.clipping!r}: unknown; choose one of '
                      f'{list(CLIP_RULES)}.')
  check_fields(dp.target_quantile, dp.clip_lr, dp.count_noise_multiplier, dp.initial_clip_norm)
  CLIP_RULES[dp.clipping].check(noise_mechanism=dp.noise_mechanism,
                                noise_placement=dp.noise_placement)


def default_count_noise_std(expected_cohort: float) -> float:
  """Andrew et al.'s choice (and TFF's default): s_b = m / 20, so b~ has noise std 0.05."""
  return expected_cohort / 20.0


def from_config(config, expected_cohort: float) -> FixedClip | AdaptiveClip:
  """The clip rule `config.dp` names (checked with `check_config`)."""
  check_config(config)
  dp = config.dp
  if dp.clipping == 'fixed':
    return FixedClip()
  count_noise_std = dp.count_noise_multiplier
  if count_noise_std is None:
    count_noise_std = default_count_noise_std(expected_cohort)
  return AdaptiveClip(float(dp.target_quantile), float(dp.clip_lr), float(count_noise_std))


def initial_clip_norm(config) -> float:
  """C_0: dp.initial_clip_norm under adaptive clipping when set, else dp.clip_norm."""
  dp = config.dp
  if dp.clipping == 'adaptive' and dp.initial_clip_norm is not None:
    return float(dp.initial_clip_norm)
  return dp.clip_norm
