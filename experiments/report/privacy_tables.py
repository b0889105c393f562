"""docs/privacy.md's generated blocks.

- `audit-seeds` (section 5): the committed `experiments.audit` records of the default experiment's
  three seeds and the numbers read from them, beside the spread the sigma-hat estimator shows on
  ideal scores at the same T, k, q and sigma (a seeded simulation).
- `selection-costs` (section 9): what a private search costs under each law of K
  (privacy.selection.selection_cost), for one trial of the Fashion-MNIST paper regime's run.
"""

from __future__ import annotations

import dataclasses
import json
import os

import dp_accounting
import numpy as np

from dp2fedsam_jax.privacy import auditing, selection

AUDIT_DIR = os.path.join('experiments', 'results', 'audit_default')
IDEAL_SEEDS = 60  # simulated audits on ideal scores


def load_records(repo: str) -> list[dict]:
  """The committed audit records, by seed."""
  directory = os.path.join(repo, AUDIT_DIR)
  names = sorted(n for n in os.listdir(directory) if n.startswith('seed=') and n.endswith('.jsonl'))
  out = []
  for name in names:
    with open(os.path.join(directory, name)) as f:
      out.append({'seed': int(name[5:-6]), **json.load(f)})
  return out


@dataclasses.dataclass(frozen=True)
class IdealSpread:
  """sigma-hat over simulated audits whose scores are exactly the mechanism's: its std and how
  often its nominal 95 % interval holds the true sigma."""
  mean: float
  std: float
  coverage: float
  seeds: int


def ideal_spread(sigma: float, rounds: int, canaries: int, rate: float,
                 seeds: int = IDEAL_SEEDS) -> IdealSpread:
  """Each seed: canaries in (+1) or out (0) at random, sampled with probability `rate` each round,
  projections = schedule + sigma N(0, 1); sigma-hat as experiments.audit estimates it."""
  estimates, covered = [], 0
  for seed in range(seeds):
    rng = np.random.default_rng(seed)
    signs = (rng.random(canaries) < 0.5).astype(float)  # Poisson's add/remove neighbour
    sampled = rng.random((rounds, canaries)) < rate
    projections = np.where(sampled, signs, 0.0) + sigma * rng.normal(size=(rounds, canaries))
    e = auditing.noise_multiplier_estimate(projections, sampled, signs, seed=seed)
    estimates.append(e.noise_multiplier)
    covered += e.low <= sigma <= e.high
  return IdealSpread(float(np.mean(estimates)), float(np.std(estimates, ddof=1)),
                     covered / seeds, seeds)


def _row(record: dict) -> str:
  end = record['along_run'][-1]
  return (f"| {record['seed']} | {end['noise_multiplier']:.3f} [{end['noise_multiplier_low']:.3f}, "
          f"{end['noise_multiplier_high']:.3f}] | {end['epsilon_noise_estimate']:.2f} "
          f"[{end['epsilon_noise_estimate_low']:.2f}, {end['epsilon_noise_estimate_high']:.2f}] | "
          f"{end['epsilon_gaussian_fit']:.2f} | {record['epsilon_clopper_pearson']:.2f} | "
          f"{end['epsilon_one_run']:.2f} | {record['seconds']:.0f} |")


def audit_seed_lines(repo: str) -> list[str]:
  """The table, one row per committed seed, then its numbers as bullets."""
  records = load_records(repo)
  ends = [r['along_run'][-1] for r in records]
  first = records[0]
  executed = first['noise_multiplier']
  sigmas = np.array([e['noise_multiplier'] for e in ends])
  bounds = [b for r, e in zip(records, ends) for b in (r['epsilon_clopper_pearson'], e['epsilon_one_run'])]
  ideal = ideal_spread(executed, first['num_rounds'], first['num_canaries'], first['sampling_rate'])
  return [
      f"After {first['num_rounds']} rounds:", '',
      '| seed | σ̂ [95 %] | σ̂ estimate: ε [95 %] | Gaussian-fit estimate | CP bound | one-run bound | s |',
      '|---|---|---|---|---|---|---|',
      *[_row(r) for r in records], '',
      f'- σ̂ over the seeds: mean {sigmas.mean():.3f} ({100 * (sigmas.mean() / executed - 1):+.1f} % '
      f'against the executed {executed:.3f}), std {sigmas.std(ddof=1):.3f}.',
      f"- σ̂'s ε estimate, mean over the seeds: "
      f"{np.mean([e['epsilon_noise_estimate'] for e in ends]):.2f}; accounted: "
      f"{np.mean([e['epsilon_accounted'] for e in ends]):.2f}.",
      f'- On ideal scores ({ideal.seeds} simulated audits at this T, k, q and σ): σ̂ std '
      f'{ideal.std:.3f}; the nominal 95 % interval holds σ in {100 * ideal.coverage:.0f} % of them.',
      f'- Largest lower bound (CP or one-run): {max(bounds):.2f}.',
  ]


# One trial of the cost table: the paper regime's run (q, T) at a sigma calibrated by PLD for the
# trial's epsilon at delta, plus the validation score's Gaussian (noise multiplier SCORE_NOISE).
COST_RATE, COST_ROUNDS, COST_DELTA, SCORE_NOISE = 0.05, 200, 1e-3, 10.0
COST_SIGMAS = (2.014, 5.924)  # PLD epsilon 1 and 0.25 of the run alone
COST_LAWS = (('Poisson', (1, 3, 10, 30)), ('logarithmic', (3, 10, 30)), ('geometric (eta = 1)', (10,)))


def trial_event(sigma: float) -> dp_accounting.DpEvent:
  run = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
      COST_RATE, dp_accounting.GaussianDpEvent(sigma)), COST_ROUNDS)
  return dp_accounting.ComposedDpEvent([run, dp_accounting.GaussianDpEvent(SCORE_NOISE)])


def law(name: str, mean: float) -> selection.TrialDistribution:
  if name == 'Poisson':
    return selection.TrialDistribution.from_dict({'name': 'poisson', 'mu': float(mean)})
  eta = 0.0 if name == 'logarithmic' else 1.0
  return selection.TrialDistribution.from_dict(
      {'name': 'truncated_negative_binomial', 'eta': eta, 'mean': float(mean)})


def run_pld_epsilon(sigma: float) -> float:
  """The run's epsilon alone (PLD), the first column's calibration target."""
  accountant = dp_accounting.pld.PLDAccountant()
  accountant.compose(trial_event(sigma).events[0])
  return accountant.get_epsilon(COST_DELTA)


def selection_cost_lines() -> list[str]:
  lines = ['| trial (PLD eps, sigma) | K | E[K] | one trial eps | selection eps | '
           'naive eps at round(E[K]) |', '|---|---|---|---|---|---|']
  for sigma in COST_SIGMAS:
    trial = f'{run_pld_epsilon(sigma):.2f} ({sigma})'
    for name, means in COST_LAWS:
      for mean in means:
        cost = selection.selection_cost([trial_event(sigma)], law(name, mean), COST_DELTA)
        lines.append(f'| {trial} | {name} | {mean} | {cost.per_trial_epsilon:.3f} | '
                     f'{cost.selection_epsilon:.3f} | {cost.naive_epsilon:.3f} ({cost.naive_trials}) |')
  return lines
