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
from experiments.studies import search_spread

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


# The second stage: the divergence edge of each family's two searched steps, declared here (the
# runs: experiments/configs/fair2_edge.py). Each family is one method's ladders.
EDGE_RUNS = os.path.join('experiments', 'results', 'fair2_pilot', 'edge')
T_EDGE = 20                # rounds of a ladder run (evaluated at 10 and 20)
FAMILIES = {PERSONAL_HEAD: 'personal_head', GLOBAL_MODEL: 'global_model', CEILING: 'ceiling'}
KNOBS = ('client_lr', 'step')
CLIENT_LR_LADDER = (0.01, 0.0316, 0.1, 0.316, 1.0)
STEP_LADDER = (0.01, 0.0316, 0.1, 0.316, 1.0)          # eta_eff = server lr x C
CEILING_STEP_LADDER = (0.1, 0.316, 1.0, 3.16, 10.0)   # non-private: the server lr
EDGE_DROP = 10.0       # points under the ladder's best run that count as diverged
RANGE_DECADES = 1.5    # a searched range: from the top 1.5 decades down


@dataclasses.dataclass(frozen=True)
class LadderRun:
  """One run of a ladder: its method, knob ('client_lr' | 'step'), value, last evaluated round and
  test accuracy there (points; None: it failed, NaN/Inf)."""
  method: str
  knob: str
  value: float
  rounds: int
  accuracy: float | None


def read_ladder_runs(root: str) -> list[LadderRun]:
  """Every ladder run under root (<method>/knob=<knob>,value=<value>/seed=0)."""
  out = []
  for method in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    for setting in sorted(os.listdir(os.path.join(root, method))):
      directory = os.path.join(root, method, setting, 'seed=0')
      fields = dict(part.split('=') for part in setting.split(','))
      evaluations = metric_writers.read_jsonl(os.path.join(directory, metric_writers.EVAL_FILE))
      failed = os.path.exists(os.path.join(directory, 'failure.json'))
      last = evaluations[-1] if evaluations else {}
      accuracy = last.get('test_accuracy')
      if failed or accuracy is None or not math.isfinite(accuracy):
        accuracy = None
      out.append(LadderRun(method, fields['knob'], float(fields['value']),
                           int(last.get('round', 0)), None if accuracy is None else 100 * accuracy))
  return out


@dataclasses.dataclass(frozen=True)
class Edge:
  """A ladder read by the rule: its runs by value, the edge (None: not reached) and the range's
  top (None: open, with why)."""
  method: str
  knob: str
  accuracies: tuple          # ((value, accuracy; None: failed), ...) along the ladder
  unfinished: tuple = ()     # the values whose runs have not finished (their accuracy: None)
  edge: float | None = None
  top: float | None = None
  open_because: str = ''

  @property
  def bottom(self) -> float | None:
    return None if self.top is None else self.top / 10 ** RANGE_DECADES

  @property
  def range(self) -> tuple[float, float] | None:
    """The searched law's bounds (4 significant digits), or None while the ladder is open."""
    return None if self.top is None else (float(f'{self.bottom:.4g}'), float(f'{self.top:.4g}'))


def edge(runs: list[LadderRun], method: str, knob: str, ladder: tuple, rounds: int) -> Edge:
  """The rule: the edge is the first value above the ladder's best run that failed or ended
  EDGE_DROP points or more under it; the range's top is the value below the edge (the ladder's top
  when none did: edge not reached)."""
  found = {r.value: r for r in runs if (r.method, r.knob) == (method, knob)}
  accuracies = tuple((v, found[v].accuracy if v in found else None) for v in ladder)
  unfinished = [v for v in ladder if v not in found or (found[v].accuracy is not None
                                                        and found[v].rounds < rounds)]
  if unfinished:
    return Edge(method, knob, accuracies, tuple(unfinished),
                open_because=f'{len(unfinished)} of its runs unfinished')
  trained = [(a, i) for i, (_, a) in enumerate(accuracies) if a is not None]
  if not trained:
    return Edge(method, knob, accuracies, open_because='every run failed')
  best, at = max(trained, key=lambda t: (t[0], -t[1]))  # a tie: the smallest value
  for i in range(at + 1, len(ladder)):
    accuracy = accuracies[i][1]
    if accuracy is None or accuracy <= best - EDGE_DROP:
      return Edge(method, knob, accuracies, edge=ladder[i], top=ladder[i - 1])
  return Edge(method, knob, accuracies, edge=None, top=ladder[-1])


def ladder(method: str, knob: str) -> tuple[float, ...]:
  """The declared ladder of a family's knob."""
  if knob == 'client_lr':
    return CLIENT_LR_LADDER
  return CEILING_STEP_LADDER if FAMILIES[method] == 'ceiling' else STEP_LADDER


def edges(repo: str) -> dict[tuple[str, str], Edge]:
  """{(method, knob): Edge} of every declared ladder, from the runs committed under `repo`."""
  runs = read_ladder_runs(os.path.join(repo, EDGE_RUNS))
  return {(m, k): edge(runs, m, k, ladder(m, k), T_EDGE) for m in FAMILIES for k in KNOBS}


def _accuracy_text(value: float, accuracy: float | None, unfinished: tuple) -> str:
  if value in unfinished:
    return f'{value:g}: –'
  return f'{value:g}: ' + ('failed' if accuracy is None else f'{accuracy:.1f}')


def edge_lines(repo: str) -> list[str]:
  """docs/benchmark.md's `fair2-edge` block: each ladder's accuracies, its edge and range."""
  lines = [f'| family (method) | knob | test accuracy at round {T_EDGE} (%) along the '
           'ladder | edge | searched range |', '|---|---|---|---|---|']
  for (method, knob), found in edges(repo).items():
    family = FAMILIES[method].replace('_', '-')
    knob_text = 'client lr' if knob == 'client_lr' else (
        'server lr' if family == 'ceiling' else 'η_eff')
    cells = ' · '.join(_accuracy_text(v, a, found.unfinished) for v, a in found.accuracies)
    if found.range is None:
      edge_text, range_text = 'open', f'open ({found.open_because})'
    else:
      edge_text = 'not reached' if found.edge is None else f'{found.edge:g}'
      range_text = f'{found.range[0]:.4g} – {found.range[1]:.4g}'
    lines.append(f'| {family} ({method}) | {knob_text} | {cells} | {edge_text} | {range_text} |')
  return lines


# The trial length (experiments/configs/fair2_rank.py): ten configurations validated along T.
RANK_RUNS = os.path.join('experiments', 'results', 'fair2_pilot', 'rank')
TRIAL_LENGTHS = (40, 60, 100)   # the candidates for T_trial, shortest first
MIN_SPEARMAN = 0.8
MIN_CONFIGURATIONS = 10
RANK_EVAL_EVERY = 20            # a rank run validates every 20 rounds


@dataclasses.dataclass(frozen=True)
class TrialLength:
  """The rule's outcome: T_trial (None: open, with why), and Spearman's rho of each candidate."""
  rounds: int | None
  spearman: tuple = ()        # ((candidate rounds, rho), ...)
  configurations: int = 0
  open_because: str = ''


def _validation_by_round(directory: str) -> dict[int, float]:
  """{round: validation accuracy} of a run (a non-finite one 0). A run that diverged (failure.json)
  is finished: its evaluations before the failure stand (a trial that short is the same rounds and
  would have scored them), and it scores 0 at every evaluation round after it, T included (a
  trial that long fails, and a failed trial ranks last)."""
  evaluations = metric_writers.read_jsonl(os.path.join(directory, metric_writers.EVAL_FILE))
  scores = {int(e['round']): float(e['validation_accuracy']) if math.isfinite(e['validation_accuracy'])
            else 0.0 for e in evaluations}
  failure = os.path.join(directory, 'failure.json')
  if os.path.exists(failure):
    with open(failure) as f:
      failed_at = json.load(f).get('round') or 0
    scores = {r: v for r, v in scores.items() if r < failed_at}
    scores.update({r: 0.0 for r in range(RANK_EVAL_EVERY, NUM_ROUNDS + 1, RANK_EVAL_EVERY)
                   if r >= failed_at})
  return scores


def trial_length_of(runs: list[dict[int, float]], rounds: int = NUM_ROUNDS) -> TrialLength:
  """The smallest candidate of TRIAL_LENGTHS whose validation ranks have Spearman rho >=
  MIN_SPEARMAN with the ranks of the mean of the last FINAL_EVALUATIONS validations at `rounds`;
  `rounds` itself when none does. `runs`: each configuration's {round: validation accuracy}."""
  finished = [r for r in runs if max(r, default=0) >= rounds]
  if len(finished) < MIN_CONFIGURATIONS:
    return TrialLength(None, configurations=len(finished), open_because=(
        f'{len(finished)} of {MIN_CONFIGURATIONS} configurations finished'))
  final = [statistics.fmean(v for _, v in sorted(r.items())[-FINAL_EVALUATIONS:]) for r in finished]
  rhos = []
  for candidate in TRIAL_LENGTHS:
    rhos.append((candidate, search_spread.rank_stability([r[candidate] for r in finished], final)))
  chosen = next((t for t, rho in rhos if rho >= MIN_SPEARMAN), rounds)
  return TrialLength(chosen, tuple(rhos), len(finished))


def trial_length(repo: str) -> TrialLength:
  """T_trial from the rank runs committed under `repo` (<method>/index=<i>/seed=0)."""
  root = os.path.join(repo, RANK_RUNS)
  runs = []
  for method in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    for setting in sorted(os.listdir(os.path.join(root, method))):
      runs.append(_validation_by_round(os.path.join(root, method, setting, 'seed=0')))
  return trial_length_of(runs)


def trial_length_lines(repo: str) -> list[str]:
  """docs/benchmark.md's `fair2-rank` block: Spearman's rho of each candidate and T_trial."""
  found = trial_length(repo)
  if found.rounds is None:
    return [f'- T_trial: open ({found.open_because}).']
  rhos = ', '.join(f'{t} rounds {rho:.2f}' for t, rho in found.spearman)
  return [f'- Spearman ρ with the ranks at T over {found.configurations} configurations: {rhos}.',
          f'- T_trial: {found.rounds} rounds (the smallest with ρ ≥ {MIN_SPEARMAN:g}; else T).']
