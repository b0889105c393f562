"""Empirical privacy audit: canary clients in the real round step, and what their scores certify.

`num_canaries` canary clients join the federation (ids N..N+k-1; canary j holds a copy of real
client j mod N's data and trains on it like any client). Through `make_round_step`'s `update_hook`
canary i's update then becomes canary_norm * C * v_i, where v_1..v_k are orthonormal directions of
the shared parameters: after clipping it is exactly C v_i, the largest contribution a client can
make, and with orthonormal directions the canaries see independent noise and no cross-talk. In every
trial each canary is included independently with probability 1/2; a canary that is not included
  Poisson (add/remove-one): uploads 0, the same release as removing the client (a zero upload adds
    nothing; distributed noise shares still total sigma C);
  fixed-size (replace-one): uploads -canary_norm C v_i, the farthest replacement (2C away).

A trial runs the real round step `num_rounds` times (scanned) from the initial state with its own
keys; trials are independent and vmapped in batches. The attacker sees every round's released
update u_t = (phi_{t+1} - phi_t) * m / server_lr (the noised sum). Two scores per canary and trial:

  white-box  s_i = sum_t <u_t, v_i> / C   (q = 1: Gaussian, mean T or 0 (-T), std sigma sqrt T)
  final      cos(phi_T - phi_0, v_i)     (the released model only, as Andrew et al. score it)

and from them (statistics in privacy/auditing.py, which says what each one assumes):

  bounds      Clopper-Pearson and the GDP interval (Nasr et al.) on the white-box scores of all
              trials; the one-run bounds of Steinke et al. and Mahloujifar et al. (f-DP) on the
              final scores of trial 0 alone: k canaries, ONE training run
  estimate    the Gaussian fit of Andrew et al. on the final scores of trial 0

The GDP and f-DP bounds test a Gaussian trade-off curve; the accountant claims one only when every
client takes part in every round (q = 1), so elsewhere they are not computed. Clopper-Pearson and
GDP treat each (trial, canary) score as an independent trial. Across trials that holds by
construction. Within a trial it holds for the mechanism the accountant claims: isotropic Gaussian
noise has independent projections on orthonormal directions, and with working clipping each canary
moves only its own score (exactly for T = 1; over more rounds a canary's uploads move the model and
so, a little, every later update). So a bound above the accounted epsilon refutes the accountant's claim at
level alpha; as a lower bound for an arbitrary mechanism it assumes that independence, which
`num_canaries=1` makes exact (at about k times the cost per score).

Correlated noise (dp.noise_mechanism banded | tree, privacy/correlated.py): the canaries join through
the mechanism's own sampler (BandMF's groups, the tree's epochs). Under BandMF the white-box score
undoes the correlation first (white_box_scores: the matched filter of C U = C X + Z over the
canary's public group rounds, the test whose mu the accountant's sensitivity bounds); under the
tree it stays sum_t <u_t, v_i> / C, the canary's coordinate of the released prefix sum, a valid but
weaker test. Projections on orthonormal
directions stay independent (the noise is isotropic in every round), so every bound keeps its
meaning; the GDP ones are computed where the accountant claims a Gaussian (gaussian_claim). The
white-box noise-multiplier estimate assumes fresh noise every round and is not computed (NaN) for
these mechanisms.

Adaptive clipping (dp.clipping=adaptive): each canary's raw norm is canary_norm * C_0, so it is
clipped to C_t while C_t < canary_norm * C_0, and its bit b_i = 0 moves C_t like any clipped
client's; the white-box score divides round t's projection by that round's C_t. The accounted epsilon
is the pair's (sum and count as one Gaussian, privacy/clip_rules.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from scipy import linalg

from dp2fedsam_jax import keys
from dp2fedsam_jax.data.federated import select_clients
from dp2fedsam_jax.privacy import auditing
from dp2fedsam_jax.federated_round import make_round_step


@dataclasses.dataclass(frozen=True)
class AuditSettings:
  num_trials: int = 20         # independent runs of the audited rounds
  num_canaries: int = 1000     # canary clients per run, each included with probability 1/2
  num_rounds: int = 1          # rounds per trial (a canary is in every round it is sampled in)
  canary_norm: float = 10.0    # the canary's raw update norm, in units of C (clipped back to C)
  alpha: float = 0.05          # 1 - confidence of every bound and interval
  select_fraction: float = 0.2  # scores used only to choose a threshold
  batch_trials: int = 1        # trials vmapped at once (memory)
  seed: int = 0                # the audit's own keys; the experiment's keys come from config.seed
  estimate_every: int = 0      # one-run estimates also after every this many rounds (0: at the end)

  def __post_init__(self):
    if (self.num_trials < 1 or self.num_canaries < 1 or self.num_rounds < 1
        or self.batch_trials < 1 or self.num_trials * self.num_canaries < 8
        or self.estimate_every < 0):
      raise ValueError(f'audit: num_trials, num_canaries, num_rounds, batch_trials >= 1, '
                       f'estimate_every >= 0 and at least 8 canary scores needed; got '
                       f'{self.num_trials}, {self.num_canaries}, {self.num_rounds}, '
                       f'{self.batch_trials}, {self.estimate_every}.')
    if not 0.0 < self.alpha < 0.5 or not 0.0 < self.select_fraction < 1.0:
      raise ValueError(f'audit: alpha must lie in (0, 0.5) and select_fraction in (0, 1); got '
                       f'{self.alpha}, {self.select_fraction}.')
    if self.canary_norm < 1.0:
      raise ValueError(f'audit: canary_norm={self.canary_norm} must be >= 1 (a multiple of C).')

  def estimate_rounds(self) -> list[int]:
    """The rounds after which the one-run estimates are computed; the last round always."""
    every = self.estimate_every or self.num_rounds
    return sorted(set(range(every, self.num_rounds + 1, every)) | {self.num_rounds})

  @classmethod
  def from_config(cls, config) -> 'AuditSettings':
    """config.audit.* (experiments/configs/audit.py); the rounds per trial are config.num_rounds."""
    audit = config.audit.to_dict() if config.get('audit') is not None else {}
    unknown = set(audit) - {f.name for f in dataclasses.fields(cls)} | ({'num_rounds'} & set(audit))
    if unknown:
      raise ValueError(f'config.audit: unknown field(s) {sorted(unknown)} (rounds per trial are '
                       'config.num_rounds).')
    return cls(num_rounds=config.num_rounds, **audit)


@dataclasses.dataclass(frozen=True)
class OneRunEstimates:
  """Trial 0 -- one training run -- after `round` rounds, next to the accounted epsilon then."""
  round: int
  epsilon_accounted: float
  epsilon_one_run: float            # bound (Steinke et al.) on the released model's scores
  epsilon_gaussian_fit: float       # estimate (Andrew et al.) on the same scores, and interval
  epsilon_gaussian_fit_low: float
  epsilon_gaussian_fit_high: float
  noise_multiplier: float           # white-box estimate of sigma from rounds 1..round, interval
  noise_multiplier_low: float
  noise_multiplier_high: float
  epsilon_noise_estimate: float     # the accountant's epsilon at that sigma, and interval
  epsilon_noise_estimate_low: float
  epsilon_noise_estimate_high: float


def _after_all_rounds(field: str) -> property:
  """A read-only AuditResult value: `field` of its last along-the-run row (after every round)."""
  return property(lambda self: getattr(self.along_run[-1], field),
                  doc=f'{field} of the last along-the-run row (after all rounds).')


@dataclasses.dataclass(frozen=True)
class AuditResult:
  method: str
  sampling: str
  noise_placement: str
  noise_multiplier: float
  sampling_rate: float
  num_rounds: int
  delta: float
  epsilon_accounted: float
  # Lower bounds (1 - alpha); NaN where not computed (see the module docstring).
  epsilon_clopper_pearson: float
  epsilon_gdp_lower: float
  epsilon_one_run_fdp: float
  # Estimates.
  epsilon_gdp: float              # at the observed error rates; the interval's upper end:
  epsilon_gdp_upper: float
  gdp_mu_lower: float
  gdp_mu: float
  gdp_mu_upper: float
  confidence: float
  num_trials: int
  num_canaries: int
  seconds: float
  # One run (trial 0) after every settings.estimate_every rounds; the last is after all rounds and
  # gives the one-run bound and estimates of the table (the properties below).
  along_run: tuple[OneRunEstimates, ...]
  noise_mechanism: str = 'independent'  # config.dp.noise_mechanism
  clipping: str = 'fixed'               # config.dp.clipping

  epsilon_one_run = _after_all_rounds('epsilon_one_run')
  epsilon_gaussian_fit = _after_all_rounds('epsilon_gaussian_fit')
  epsilon_gaussian_fit_low = _after_all_rounds('epsilon_gaussian_fit_low')
  epsilon_gaussian_fit_high = _after_all_rounds('epsilon_gaussian_fit_high')
  noise_multiplier_estimate = _after_all_rounds('noise_multiplier')
  noise_multiplier_estimate_low = _after_all_rounds('noise_multiplier_low')
  noise_multiplier_estimate_high = _after_all_rounds('noise_multiplier_high')
  epsilon_noise_estimate = _after_all_rounds('epsilon_noise_estimate')
  epsilon_noise_estimate_low = _after_all_rounds('epsilon_noise_estimate_low')
  epsilon_noise_estimate_high = _after_all_rounds('epsilon_noise_estimate_high')

  BOUNDS = ('epsilon_clopper_pearson', 'epsilon_gdp_lower', 'epsilon_one_run',
            'epsilon_one_run_fdp')

  def bounds(self) -> dict[str, float]:
    values = {name: getattr(self, name) for name in self.BOUNDS}
    return {name: value for name, value in values.items() if not math.isnan(value)}

  @property
  def best_bound(self) -> float:
    return max(self.bounds().values())

  def exceeded(self) -> list[str]:
    """The bounds above the accounted epsilon: the implementation leaks more than it accounts."""
    return [name for name, value in self.bounds().items() if value > self.epsilon_accounted]

  def row(self) -> str:
    gdp = (f'{_num(self.epsilon_gdp_lower)} [{_num(self.epsilon_gdp)}, '
           f'{_num(self.epsilon_gdp_upper)}]'
           if not math.isnan(self.epsilon_gdp_lower) else '—')
    fit = _interval(self.epsilon_gaussian_fit, self.epsilon_gaussian_fit_low,
                    self.epsilon_gaussian_fit_high)
    noise = _interval(self.epsilon_noise_estimate, self.epsilon_noise_estimate_low,
                      self.epsilon_noise_estimate_high)
    noise += f' (σ̂ {self.noise_multiplier_estimate:.3g})'
    sampler = self.sampling if self.noise_mechanism == 'independent' else self.noise_mechanism
    if self.clipping != 'fixed':
      sampler += f' {self.clipping}-clip'
    return (f'| {self.method} {sampler} {self.noise_placement} | {self.noise_multiplier:g} | '
            f'{self.sampling_rate:g} | {self.num_rounds} | {self.epsilon_accounted:.2f} | '
            f'{_num(self.epsilon_clopper_pearson)} | {gdp} | {_num(self.epsilon_one_run)} | '
            f'{_num(self.epsilon_one_run_fdp)} | {fit} | {noise} | '
            f'{self.num_trials} × {self.num_canaries} | {self.seconds:.0f} |')

  def along_run_table(self) -> str:
    """The one-run estimates after every K rounds, one row each."""
    rows = [ALONG_RUN_HEADER]
    for e in self.along_run:
      fit = _interval(e.epsilon_gaussian_fit, e.epsilon_gaussian_fit_low,
                      e.epsilon_gaussian_fit_high)
      noise = _interval(e.epsilon_noise_estimate, e.epsilon_noise_estimate_low,
                        e.epsilon_noise_estimate_high)
      rows.append(f'| {e.round} | {e.epsilon_accounted:.2f} | {_num(e.epsilon_one_run)} | {fit} | '
                  f'{noise} | {e.noise_multiplier:.3g} [{e.noise_multiplier_low:.3g}, '
                  f'{e.noise_multiplier_high:.3g}] |')
    return '\n'.join(rows)


def _num(x: float) -> str:
  return '—' if math.isnan(x) else f'{x:.2f}'


def _interval(value: float, low: float, high: float) -> str:
  return f'{_num(value)} [{_num(low)}, {_num(high)}]'


TABLE_HEADER = (
    '| mechanism | σ | q | T | ε accounted | CP bound | GDP bound [estimate, upper] | '
    'one-run bound | one-run f-DP bound | Gaussian-fit estimate [95 % bootstrap] | '
    'σ̂ estimate: ε [95 % bootstrap] (σ̂) | trials × canaries | s |\n'
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|')

ALONG_RUN_HEADER = (
    '| round | ε accounted | one-run bound | Gaussian-fit estimate [95 %] | '
    'σ̂ estimate: ε [95 %] | σ̂ [95 %] |\n'
    '|---|---|---|---|---|---|')


def gaussian_claim(mechanism) -> bool:
  """Does the accountant claim a Gaussian trade-off? Only where it credits no amplification: every
  client in every round (q = 1), BandMF's within-group rate q b = 1, or the tree (none claimed)."""
  if mechanism.correlated and mechanism.noise_mechanism == 'tree':
    return True
  bands = mechanism.noise.bands if mechanism.correlated else 1
  return mechanism.sampling_rate * bands >= 1.0


def neighbour_sign(sampler: str) -> float:
  """A canary's sign when it is not included: removed (Poisson) or mirrored (replace-one)."""
  return 0.0 if sampler == 'poisson' else -1.0


def with_canary_clients(exp, num_canaries: int):
  """The experiment with `num_canaries` more clients, N..N+k-1 (canary j holds a copy of client
  j mod N's data), and its mechanism -- round step and accountant -- over all N + k clients."""
  data = exp.data
  source = np.arange(num_canaries) % data.num_clients
  data = select_clients(data, np.concatenate([np.arange(data.num_clients), source]))
  # dataclasses.replace keeps the mechanism's class: a deliberately broken one stays broken.
  mechanism = exp.mechanism.with_num_clients(data.num_clients)
  round_config = dataclasses.replace(exp.round_config, mechanism=mechanism)
  return dataclasses.replace(exp, data=data, round_config=round_config)


def canary_directions(key, num_params: int, num_canaries: int) -> np.ndarray:
  """float32[k, d]: k orthonormal rows, uniformly random: the Q of a Gaussian matrix G = QR with
  R's diagonal positive, computed as G L^-T with L L^T = G^T G (Cholesky QR; G is well conditioned
  for d >> k; LAPACK's Householder QR was several times slower on the shared CPU)."""
  if num_canaries > num_params:
    raise ValueError(f'audit: {num_canaries} canaries cannot be orthogonal in {num_params} shared '
                     'parameters; use fewer canaries per trial and more trials.')
  gaussian = np.asarray(jax.random.normal(key, (num_params, num_canaries), jnp.float32), np.float64)
  lower = np.linalg.cholesky(gaussian.T @ gaussian)
  return linalg.solve_triangular(lower, gaussian.T, lower=True).astype(np.float32)


def canary_hook(first_canary: int, directions, unravel, raw_norm, signs):
  """update_hook: client first_canary + i uploads signs[i] * raw_norm * v_i; others, their own."""
  last = directions.shape[0] - 1

  def hook(client_id, delta):
    index = client_id - first_canary
    safe = jnp.clip(index, 0, last)
    canary = unravel(signs[safe] * raw_norm * directions[safe])
    return jax.tree.map(lambda d, c: jnp.where(index >= 0, c.astype(d.dtype), d), delta, canary)
  return hook


def _flat(tree):
  return ravel_pytree(tree)[0]


def make_trial_scores(exp, settings: AuditSettings):
  """scores(state0, data, directions, run_keys, signs) -> (projections, cosines, sampled,
  scheduled), each [trials, rounds, k]: round t's released sum on canary i's direction / C, the
  cosine of the model moved since round 0 with it, whether canary i was in round t's cohort, and
  whether the public schedule let round t sample it.

  One jitted program: the real round step (with the canary hook), scanned over the rounds and
  vmapped over the trials; signs[trial, i] (+1, 0 or -1) is canary i's contribution in that trial.
  `exp` already holds the canary clients (with_canary_clients).
  """
  rc, spec, mech = exp.round_config, exp.spec, exp.mechanism
  if spec.server_step is not None:
    raise ValueError(f'config.method={spec.name!r}: its own server step ({rc.server_step.name}) is '
                     "not the sgd step the audit reads each round's released sum back from; audit "
                     'a method without one (a server step is post-processing: the release is the same).')
  if rc.server_step.name != 'sgd':
    raise ValueError(f'config.server_optimizer={rc.server_step.name!r}: the audit reads each '
                     "round's released sum back from the sgd step; set --config.server_optimizer=sgd "
                     '(a server optimizer is post-processing: the audited release is the same).')
  clip = mech.clip_norm
  first_canary = exp.data.num_clients - settings.num_canaries

  def one_trial(state0, data, directions, run_key, signs):
    _, unravel = ravel_pytree(state0.shared)
    hook = canary_hook(first_canary, directions, unravel, settings.canary_norm * clip, signs)
    step = make_round_step(spec, exp.model, exp.local_config, rc, update_hook=hook)
    flat0 = _flat(state0.shared)

    def body(state, _):
      new, metrics = step(state, data, run_key)
      denominator = mech.denominator(metrics['cohort_size'])  # what the round divided by
      flat_new = _flat(new.shared)
      released = (flat_new - _flat(state.shared)) * (denominator / rc.server_lr)
      clip_t = metrics.get('clip_norm', clip)  # adaptive clipping: the C this round clipped to
      moved = flat_new - flat0
      cosine = directions @ moved / jnp.maximum(jnp.linalg.norm(moved), 1e-30)
      sampled = (new.times_sampled - state.times_sampled)[first_canary:] > 0
      scheduled = mech.schedule(state.round, run_key)[first_canary:]
      return new, (directions @ released / clip_t, cosine, sampled, scheduled)

    _, per_round = jax.lax.scan(body, state0, None, length=settings.num_rounds)
    return per_round

  return jax.jit(jax.vmap(one_trial, in_axes=(None, None, None, 0, 0)))


@dataclasses.dataclass(frozen=True)
class CanaryScores:
  projections: np.ndarray  # float[trials, rounds, k]: <u_t, v_i> / C
  cosines: np.ndarray      # float[trials, rounds, k]: cos(phi_t - phi_0, v_i)
  sampled: np.ndarray      # bool[trials, rounds, k]: canary i in round t's cohort (secret)
  included: np.ndarray     # bool[trials, k]
  signs: np.ndarray        # float[trials, k]: canary i's upload in units of C v_i
  scheduled: np.ndarray | None = None  # bool[trials, rounds, k]: round t may sample i (public)

  @property
  def white_box(self) -> np.ndarray:
    """float[trials, k]: sum_t <u_t, v_i> / C."""
    return self.projections.sum(axis=1)

  @property
  def final(self) -> np.ndarray:
    """float[trials, k]: the released model's score, cos(phi_T - phi_0, v_i)."""
    return self.cosines[:, -1]


def audit_scores(exp, settings: AuditSettings) -> CanaryScores:
  """Every canary's scores in every trial; `exp` already holds the canary clients."""
  streams = keys.audit_keys(settings.seed, settings.num_trials)
  state0 = exp.init_state()
  directions = jnp.asarray(canary_directions(
      streams.directions, _flat(state0.shared).size, settings.num_canaries))
  included = np.asarray(jax.random.bernoulli(
      streams.inclusion, 0.5, (settings.num_trials, settings.num_canaries)))
  signs = np.where(included, 1.0, neighbour_sign(exp.mechanism.sampling)).astype(np.float32)
  scores = make_trial_scores(exp, settings)
  size = min(settings.batch_trials, settings.num_trials)
  batches = []
  for start in range(0, settings.num_trials, size):
    # The last batch is padded with trial 0 again: one shape, one compilation.
    rows = np.arange(start, start + size) % settings.num_trials
    real = min(size, settings.num_trials - start)
    out = scores(state0, exp.data, directions, streams.runs[rows], jnp.asarray(signs[rows]))
    batches.append([np.asarray(a)[:real] for a in out])
  projections, cosines, sampled, scheduled = (np.concatenate(parts) for parts in zip(*batches))
  return CanaryScores(projections, cosines, sampled, included, signs, scheduled)


def white_box_scores(mechanism, scores: CanaryScores) -> np.ndarray:
  """float[trials, k]: each canary's white-box score. sum_t <u_t, v_i> / C, except under BandMF:
  there the releases are U = X + C^-1 Z, so C U = C X + Z has fresh noise again, and the score is
  the matched filter <C p_i, C s_i> / ||C s_i|| (p_i: the canary's per-round projections, s_i: the
  rounds of its group, public), N(0, sigma^2) out, and in, a mean <= ||C s_i|| -- equal to it at
  q b = 1, where the group's rounds are the rounds it was sampled in.

  s_i is the public schedule, never the secret sampling outcome: a score that knew who was sampled
  would test the unamplified mechanism (at q b < 1 its pair has a larger epsilon than the amplified
  one the accountant charges, so a correct run could fail Clopper-Pearson)."""
  if not (mechanism.correlated and mechanism.noise_mechanism == 'banded'):
    return scores.white_box
  if scores.scheduled is None:
    raise ValueError('white_box_scores under BandMF needs the public schedule (CanaryScores.scheduled).')
  rounds = scores.projections.shape[1]
  strategy = sum(c * np.eye(rounds, k=-j) for j, c in enumerate(mechanism.noise.strategy))
  filtered = np.einsum('st,ntk->nsk', strategy, scores.projections.astype(np.float64))
  pattern = np.einsum('st,ntk->nsk', strategy, scores.scheduled.astype(np.float64))
  norm = np.linalg.norm(pattern, axis=1)
  return np.where(norm > 0, (filtered * pattern).sum(axis=1) / np.maximum(norm, 1e-30), 0.0)


def run_audit(exp, settings: AuditSettings = AuditSettings()) -> AuditResult:
  """Audits the experiment `exp` (from train.build_experiment) and accounts the same mechanism."""
  start = time.perf_counter()
  audited = with_canary_clients(exp, settings.num_canaries)
  scores = audit_scores(audited, settings)
  delta, alpha, seed = exp.mechanism.delta, settings.alpha, settings.seed
  included = scores.included
  nan = math.nan

  white = white_box_scores(audited.mechanism, scores)
  white_in, white_out = white[included], white[~included]
  cp = auditing.epsilon_clopper_pearson(white_in, white_out, delta, alpha,
                                           settings.select_fraction, seed)
  gaussian = gaussian_claim(audited.mechanism)
  gdp = (auditing.gdp_bound(white_in, white_out, delta, alpha, settings.select_fraction, seed)
         if gaussian else None)

  along_run = tuple(one_run_estimates(audited, scores, rounds, settings)
                    for rounds in settings.estimate_rounds())
  one_run_fdp = nan
  run_in, run_out = _split_by_inclusion(scores.final[0], included[0])
  if gaussian and min(run_in.size, run_out.size) >= 2:
    one_run_fdp = auditing.epsilon_one_run_fdp(run_in, run_out, delta, alpha)

  config = exp.config
  return AuditResult(
      method=config.method, sampling=config.dp.sampling, noise_placement=config.dp.noise_placement,
      noise_multiplier=exp.mechanism.noise_multiplier, sampling_rate=config.sampling_rate,
      num_rounds=settings.num_rounds, delta=delta,
      epsilon_accounted=along_run[-1].epsilon_accounted,
      epsilon_clopper_pearson=cp,
      epsilon_gdp_lower=gdp.epsilon_lower if gdp else nan,
      epsilon_one_run_fdp=one_run_fdp,
      epsilon_gdp=gdp.epsilon if gdp else nan, epsilon_gdp_upper=gdp.epsilon_upper if gdp else nan,
      gdp_mu_lower=gdp.mu_lower if gdp else nan, gdp_mu=gdp.mu if gdp else nan,
      gdp_mu_upper=gdp.mu_upper if gdp else nan,
      confidence=1.0 - alpha, num_trials=settings.num_trials,
      num_canaries=settings.num_canaries, seconds=time.perf_counter() - start,
      along_run=along_run, noise_mechanism=config.dp.noise_mechanism,
      clipping=config.dp.get('clipping', 'fixed'))


def _split_by_inclusion(scores, included):
  return scores[included], scores[~included]


def epsilon_at_noise_multiplier(exp, rounds: int, noise_multiplier: float) -> float:
  """The accountant's epsilon of `exp`'s mechanism run with another sigma (0 for infinite noise)."""
  if math.isnan(noise_multiplier):
    return math.nan
  if math.isinf(noise_multiplier):
    return 0.0
  mechanism = dataclasses.replace(exp.mechanism, noise_multiplier=noise_multiplier)
  return mechanism.epsilon(rounds)


def one_run_estimates(audited, scores: CanaryScores, rounds: int,
                      settings: AuditSettings) -> OneRunEstimates:
  """Trial 0's bound and estimates after `rounds` rounds (`audited` holds the canary clients)."""
  delta, alpha, seed = audited.mechanism.delta, settings.alpha, settings.seed
  run_in, run_out = _split_by_inclusion(scores.cosines[0, rounds - 1], scores.included[0])
  one_run = math.nan
  fit = auditing.GaussianFitEstimate(math.nan, math.nan, math.nan)
  if min(run_in.size, run_out.size) >= 2:
    one_run = auditing.epsilon_one_run(run_in, run_out, delta, alpha)
    fit = auditing.epsilon_gaussian_fit(run_in, run_out, delta, alpha, seed=seed)
  if audited.mechanism.correlated:
    # The estimate reads each round's noise as fresh N(0, sigma^2 C^2); correlated rounds are not.
    sigma = auditing.NoiseMultiplierEstimate(math.nan, math.nan, math.nan)
  else:
    sigma = auditing.noise_multiplier_estimate(
        scores.projections[0, :rounds], scores.sampled[0, :rounds], scores.signs[0], alpha,
        seed=seed)
  eps_at = functools.partial(epsilon_at_noise_multiplier, audited, rounds)
  return OneRunEstimates(
      round=rounds, epsilon_accounted=audited.epsilon_after(rounds), epsilon_one_run=one_run,
      epsilon_gaussian_fit=fit.epsilon, epsilon_gaussian_fit_low=fit.epsilon_low,
      epsilon_gaussian_fit_high=fit.epsilon_high, noise_multiplier=sigma.noise_multiplier,
      noise_multiplier_low=sigma.low, noise_multiplier_high=sigma.high,
      epsilon_noise_estimate=eps_at(sigma.noise_multiplier),
      epsilon_noise_estimate_low=eps_at(sigma.high),  # more noise, less epsilon
      epsilon_noise_estimate_high=eps_at(sigma.low))
