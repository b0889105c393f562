"""Empirical privacy audit: a lower bound on the epsilon the real round step actually has.

A canary client (id `canary_client`) replaces its update, through `make_round_step`'s `update_hook`,
by `canary_norm * C * v` for a fixed unit direction v of the shared parameters (so after clipping it
is exactly C v, the largest contribution a client can make). The real round step then runs for
`num_rounds` rounds, `num_trials` times in each of two neighbouring worlds:

  with the canary:     the canary's update is +canary_norm C v
  without the canary:  Poisson (add/remove-one): 0, which releases the same sum as removing the
                       client (its zero upload adds nothing; distributed noise still totals sigma C);
                       fixed-size (replace-one): -canary_norm C v, the farthest replacement (2C away).

The attacker sees every round's released update u_t = (phi_{t+1} - phi_t) * m / server_lr (the noised
sum) and scores a trial by s = sum_t <u_t, v> / C. From the scores of both worlds,
`privacy/audit.py` (statistics only) derives eps_lower, a Clopper-Pearson lower bound on the
mechanism's epsilon with a threshold chosen on held-out trials; the harness reports it next to the
accounted epsilon of the same mechanism.
"""

from __future__ import annotations

import dataclasses


import jax
import jax.numpy as jnp
import numpy as np

from dp2fedsam_jax.algorithms.specs import MethodParams
from dp2fedsam_jax.privacy.audit import epsilon_from_scores
from dp2fedsam_jax.round import make_round_step


@dataclasses.dataclass(frozen=True)
class AuditSettings:
  num_trials: int = 1000       # per world
  num_rounds: int = 1          # rounds per trial (the canary takes part in every one it is sampled in)
  canary_client: int = 0
  canary_norm: float = 10.0    # the canary's raw update norm, in units of C (clipped back to C)
  alpha: float = 0.05          # 1 - confidence of eps_lower
  select_fraction: float = 0.5  # trials used only to choose the threshold
  batch_trials: int = 500      # trials vmapped at once (memory)
  seed: int = 0                # the audit's own keys; the experiment's keys come from config.seed

  def __post_init__(self):
    if self.num_trials < 4 or self.num_rounds < 1 or self.batch_trials < 1:
      raise ValueError(f'audit: num_trials >= 4, num_rounds >= 1 and batch_trials >= 1 needed; got '
                       f'{self.num_trials}, {self.num_rounds}, {self.batch_trials}.')
    if not 0.0 < self.alpha < 1.0 or not 0.0 < self.select_fraction < 1.0:
      raise ValueError(f'audit: alpha and select_fraction must lie in (0, 1); got {self.alpha}, '
                       f'{self.select_fraction}.')
    if self.canary_norm < 1.0:
      raise ValueError(f'audit: canary_norm={self.canary_norm} must be >= 1 (a multiple of C).')

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
class AuditResult:
  method: str
  sampling: str
  noise_placement: str
  noise_multiplier: float
  sampling_rate: float
  num_rounds: int
  delta: float
  epsilon_accounted: float
  epsilon_lower: float
  confidence: float
  num_trials: int        # per world, threshold selection and evaluation together
  threshold: float
  fpr: float             # on the evaluation trials
  fnr: float
  fpr_hi: float
  fnr_hi: float

  def row(self) -> str:
    return (f'| {self.method} | {self.sampling} | {self.noise_placement} | {self.sampling_rate:g} | '
            f'{self.noise_multiplier:g} | {self.num_rounds} | {self.delta:.0e} | '
            f'{self.epsilon_accounted:.2f} | {self.epsilon_lower:.2f} | {self.fpr:.3f} | '
            f'{self.fnr:.3f} | {self.num_trials} |')


TABLE_HEADER = ('| method | sampling | noise | q | sigma | rounds | delta | eps accounted | '
                'eps_lower (95 %) | FPR | FNR | trials/world |\n'
                '|---|---|---|---|---|---|---|---|---|---|---|---|')



def canary_direction(key, shared):
  """A unit vector (global L2 norm 1) with the structure of the shared parameters."""
  leaves, treedef = jax.tree.flatten(shared)
  keys = jax.random.split(key, len(leaves))
  v = [jax.random.normal(k, x.shape, jnp.float32) for k, x in zip(keys, leaves)]
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in v))
  return jax.tree.unflatten(treedef, [x / norm for x in v])


def canary_hook(canary_client: int, direction, raw_norm, sign):
  """update_hook: the canary's update becomes sign * raw_norm * direction, the others' stay."""
  def hook(client_id, delta):
    is_canary = client_id == canary_client
    return jax.tree.map(lambda d, v: jnp.where(is_canary, (sign * raw_norm * v).astype(d.dtype), d),
                        delta, direction)
  return hook


def _vdot(a, b):
  return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def make_trial_scores(exp, settings: AuditSettings, direction):
  """scores(state0, data, keys, signs) -> float32[trials]: each trial's summed projection / C.

  One jitted program: the real round step (with the canary hook), scanned over the rounds and
  vmapped over the trials; `signs` (+1, 0 or -1 per trial) says which world the trial is in.
  """
  rc, spec, mech = exp.round_config, exp.spec, exp.mechanism
  clip = mech.clip_norm
  params = MethodParams.from_config(exp.config)

  def one_trial(state0, data, key, sign):
    hook = canary_hook(settings.canary_client, direction, settings.canary_norm * clip, sign)
    step = make_round_step(spec, exp.model, exp.local_config, rc, params, update_hook=hook)

    def body(state, _):
      new, metrics = step(state, data, key)
      denominator = mech.denominator(metrics['cohort_size'])  # what the round divided by
      released = jax.tree.map(lambda a, b: (a - b) * (denominator / rc.server_lr),
                              new.shared, state.shared)
      return new, _vdot(released, direction) / clip

    _, projections = jax.lax.scan(body, state0, None, length=settings.num_rounds)
    return jnp.sum(projections)

  return jax.jit(jax.vmap(one_trial, in_axes=(None, None, 0, 0)))


def neighbour_sign(sampler: str) -> float:
  """The canary's sign in the world without it: removed (Poisson) or mirrored (replace-one)."""
  return 0.0 if sampler == 'poisson' else -1.0


def audit_scores(exp, settings: AuditSettings):
  """(scores with the canary, scores without it), num_trials each."""
  if not 0 <= settings.canary_client < exp.data.num_clients:
    raise ValueError(f'audit: canary_client={settings.canary_client} is not a client id '
                     f'(0..{exp.data.num_clients - 1}).')
  root = jax.random.key(settings.seed)
  state0 = exp.init_state()
  direction = canary_direction(jax.random.fold_in(root, 0), state0.shared)
  scores = make_trial_scores(exp, settings, direction)
  out = []
  for world, sign in ((1, 1.0), (2, neighbour_sign(exp.config.dp.sampling))):
    keys = jax.random.split(jax.random.fold_in(root, world), settings.num_trials)
    parts = []
    size = min(settings.batch_trials, settings.num_trials)
    signs = jnp.full((size,), sign, jnp.float32)
    for start in range(0, settings.num_trials, size):
      batch = keys[start:start + size]
      real = batch.shape[0]
      if real < size:  # pad the last batch with repeated keys: one shape, one compilation
        batch = jnp.concatenate([batch, keys[:size - real]])
      parts.append(np.asarray(scores(state0, exp.data, batch, signs))[:real])
    out.append(np.concatenate(parts))
  return out[0], out[1]


def accounted_epsilon(exp, num_rounds: int) -> float:
  """The accountant's epsilon for the mechanism the round step executed, over the audited rounds."""
  return exp.epsilon_after(num_rounds)


def run_audit(exp, settings: AuditSettings = AuditSettings()) -> AuditResult:
  """Audits the experiment `exp` (from train.build_experiment) and accounts the same mechanism."""
  with_canary, without = audit_scores(exp, settings)
  eps, threshold, fpr, fnr, fpr_hi, fnr_hi = epsilon_from_scores(
      with_canary, without, exp.privacy.delta, settings.alpha, settings.select_fraction)
  config = exp.config
  return AuditResult(
      method=config.method, sampling=config.dp.sampling, noise_placement=config.dp.noise_placement,
      noise_multiplier=exp.privacy.noise_multiplier, sampling_rate=config.sampling_rate,
      num_rounds=settings.num_rounds, delta=exp.privacy.delta,
      epsilon_accounted=accounted_epsilon(exp, settings.num_rounds), epsilon_lower=eps,
      confidence=1.0 - settings.alpha, num_trials=settings.num_trials, threshold=threshold,
      fpr=fpr, fnr=fnr, fpr_hi=fpr_hi, fnr_hi=fnr_hi)
