"""The second design's pilot, read: the regime rule and C by rule applied to its committed runs
(docs/benchmark.md section 5; the runs: experiments/configs/fair2_pilot.py).

- The regime: the first of REGIMES, in the declared order, where the non-private ceiling's final
  accuracy (P-FedSAM at S) stands at least ROOM points above DP2-FedSAM's at (S, eps). A regime whose
  two runs have not finished leaves the choice open (a later one cannot be chosen over it).
- C by rule, per family: the median over rounds of its pilot run's mean pre-clip update norm
  (train_metrics.jsonl's mean_update_norm, every round): the DP2-FedSAM run at the chosen regime for
  the personal-head rows, the one DP-FedAvg run for the global-model rows.

A final accuracy is the block's metric: the mean of the last FINAL_EVALUATIONS evaluations. No
epsilon covers these numbers: the pilot is declared as such and no verdict uses its runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics

from dp2fedsam_jax import metric_writers

RUNS = os.path.join('experiments', 'results', 'fair2_pilot', 'runs')
REGIMES = ((5, 0.25), (10, 0.25), (5, 1.0), (10, 1.0))  # (classes a client S, eps), in order
ROOM = 2.0               # points the ceiling must clear
FINAL_EVALUATIONS = 3    # the block's metric: the mean of the last 3 evaluations
NUM_ROUNDS = 200         # T of every pilot run
CEILING, PERSONAL_HEAD, GLOBAL_MODEL = 'p_fedsam', 'dp2fedsam', 'dp_fedavg'
GLOBAL_PILOT = (5, 0.25)  # the pilot's one DP-FedAvg run


@dataclasses.dataclass(frozen=True)
class PilotRun:
  """One committed pilot run, as the rules read it."""
  method: str
  classes: int
  eps: float
  rounds: int                  # the last evaluated round
  final_accuracy: float        # points: the mean of its last FINAL_EVALUATIONS evaluations
  median_update_norm: float    # median over rounds of the mean pre-clip update norm
  clip_norm: float | None      # the C it ran with (None: non-private)

  @property
  def finished(self) -> bool:
    return self.rounds >= NUM_ROUNDS


def _setting(name: str) -> tuple[int, float]:
  """'S=5,eps=0.25' -> (5, 0.25); eps=inf for the ceiling."""
  fields = dict(part.split('=') for part in name.split(','))
  return int(fields['S']), float(fields['eps'])


def read_run(directory: str, method: str, classes: int, eps: float) -> PilotRun:
  """The run in `directory` (its metrics.jsonl, train_metrics.jsonl and config.json)."""
  evaluations = metric_writers.read_jsonl(os.path.join(directory, metric_writers.EVAL_FILE))
  rounds = metric_writers.read_jsonl(os.path.join(directory, metric_writers.TRAIN_FILE))
  if not evaluations or not rounds:
    raise ValueError(f'{directory}: no evaluations or no rounds yet')
  last = [e['test_accuracy'] for e in evaluations[-FINAL_EVALUATIONS:]]
  with open(os.path.join(directory, 'config.json')) as f:
    config = json.load(f)
  private = math.isfinite(eps)
  return PilotRun(method, classes, eps, int(evaluations[-1]['round']), 100 * statistics.fmean(last),
                  statistics.median(r['mean_update_norm'] for r in rounds),
                  config['dp']['clip_norm'] if private else None)


def read_runs(root: str) -> list[PilotRun]:
  """Every committed run under root (<method>/S=<S>,eps=<eps>/seed=0), in a stable order."""
  out = []
  for method in sorted(os.listdir(root)):
    for setting in sorted(os.listdir(os.path.join(root, method))):
      directory = os.path.join(root, method, setting, 'seed=0')
      if os.path.isdir(directory):
        out.append(read_run(directory, method, *_setting(setting)))
  return out


def _finished(runs, method: str, classes: int, eps: float) -> PilotRun | None:
  return next((r for r in runs if (r.method, r.classes, r.eps) == (method, classes, eps)
               and r.finished), None)


@dataclasses.dataclass(frozen=True)
class Regime:
  """The rule's outcome: the chosen (S, eps) with its two accuracies, or None with why it is open."""
  classes: int | None
  eps: float | None
  ceiling: float | None = None
  private: float | None = None
  open_because: str = ''

  @property
  def room(self) -> float | None:
    return None if self.ceiling is None else self.ceiling - self.private


def regime(runs: list[PilotRun]) -> Regime:
  """The first regime of REGIMES with ROOM, or open where an earlier one's runs are missing."""
  for classes, eps in REGIMES:
    ceiling = _finished(runs, CEILING, classes, math.inf)
    private = _finished(runs, PERSONAL_HEAD, classes, eps)
    if ceiling is None or private is None:
      return Regime(None, None, open_because=f'S = {classes}, eps {eps:g}: its two pilot runs have '
                    'not both finished')
    if ceiling.final_accuracy >= private.final_accuracy + ROOM:
      return Regime(classes, eps, ceiling.final_accuracy, private.final_accuracy)
  return Regime(None, None, open_because=f'no regime has {ROOM:g} points of room')


def clip_norms(runs: list[PilotRun], chosen: Regime) -> dict[str, float | None]:
  """C by rule per family (None: its pilot run has not finished, or the regime is open)."""
  personal = (None if chosen.classes is None
              else _finished(runs, PERSONAL_HEAD, chosen.classes, chosen.eps))
  global_model = _finished(runs, GLOBAL_MODEL, *GLOBAL_PILOT)
  return {'personal_head': personal and personal.median_update_norm,
          'global_model': global_model and global_model.median_update_norm}


@dataclasses.dataclass(frozen=True)
class Outcome:
  """The first stage's rules applied to the committed runs."""
  runs: list
  regime: Regime
  clip_norms: dict  # family -> C by rule (None: pending)


def chosen(repo: str) -> Outcome:
  """The regime and C by rule from the pilot runs committed under `repo`."""
  runs = read_runs(os.path.join(repo, RUNS))
  picked = regime(runs)
  return Outcome(runs, picked, clip_norms(runs, picked))


def table_lines(repo: str) -> list[str]:
  """docs/benchmark.md's `fair2-pilot` block: the committed runs, the regime and C by rule."""
  outcome = chosen(repo)
  runs = outcome.runs
  lines = ['| run | rounds | final accuracy (%) | median pre-clip norm | C it ran with |',
           '|---|---|---|---|---|']
  for r in runs:
    eps = 'non-private' if math.isinf(r.eps) else f'ε {r.eps:g}'
    clip = '–' if r.clip_norm is None else f'{r.clip_norm:.4g}'
    lines.append(f'| {r.method}, S = {r.classes}, {eps} | {r.rounds} | {r.final_accuracy:.2f} | '
                 f'{r.median_update_norm:.3f} | {clip} |')
  picked = outcome.regime
  if picked.classes is None:
    lines += ['', f'- Regime: open ({picked.open_because}).']
  else:
    lines += ['', f'- Regime: S = {picked.classes}, ε {picked.eps:g} (ceiling {picked.ceiling:.2f} vs '
              f'{picked.private:.2f}: {picked.room:.2f} points of room, {ROOM:g} needed).']
  for family, value in outcome.clip_norms.items():
    text = 'pending (its pilot run has not finished)' if value is None else f'{value:.3f}'
    lines.append(f'- C by rule, {family.replace("_", "-")} rows: {text}.')
  return lines
