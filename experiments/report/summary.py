"""Rows: the runs of one config, setting and method summarized over seeds (final round, spread over
clients, pooled accuracy and its gain, whether the clip binds)."""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np

from experiments.report.workdirs import RunResult, setting_label


def mean_std(values) -> tuple[float, float]:
  values = np.asarray(values, dtype=float)
  std = float(np.std(values, ddof=1)) if len(values) > 1 else float('nan')
  return float(np.mean(values)), std


@dataclasses.dataclass
class Row:
  config_name: str
  setting: str
  method: str
  epsilon: float
  num_seeds: int
  final_round: int
  final_acc: tuple[float, float]
  best_acc: tuple[float, float]
  seconds_per_round: float
  note: str
  num_runs: int = 0         # seeds found, failed ones included (num_seeds: the ones averaged)
  # Mean over the clients sampled at least once, and their fraction (records that predate these
  # fields, or where nobody took part yet: nan).
  participated_acc: tuple[float, float] = (float('nan'), float('nan'))
  participation: float = float('nan')
  setting_args: dict = dataclasses.field(default_factory=dict)  # the setting as a dict
  # The spread over clients at the final round: SPREAD key -> (mean, std) over seeds (nan where a
  # run's records predate it).
  spread: dict = dataclasses.field(default_factory=dict)
  # Accuracy pooled over all test targets, and the never-sampled clients apart: POOLED key ->
  # (mean, std) over seeds (nan where a run's records predate them).
  pooled: dict = dataclasses.field(default_factory=dict)
  # Private runs only: CLIPPING key -> (mean, std) over seeds of its mean over the last CLIP_WINDOW
  # rounds (train_metrics.jsonl); empty where a seed has no train_metrics.
  clipping: dict = dataclasses.field(default_factory=dict)

  @property
  def has_clipping(self) -> bool:
    return bool(self.clipping)

  @property
  def clip_binds(self) -> bool:
    """Whether the mean clipped fraction over the last CLIP_WINDOW rounds is at least CLIP_BINDS
    (False without clipping records)."""
    return self.has_clipping and self.clipping['clipped_fraction'][0] >= CLIP_BINDS

  @property
  def has_spread(self) -> bool:
    return any(not math.isnan(mean) for mean, _ in self.spread.values())

  @property
  def has_pooled(self) -> bool:
    return any(not math.isnan(mean) for mean, _ in self.pooled.values())

  @property
  def eps_setting(self):
    """The setting's eps (the sweep's argument; None when the setting has none)."""
    return self.setting_args.get('eps')

  @property
  def rest(self) -> str:
    """The setting without eps: rows that differ only in eps share it."""
    return setting_label({k: v for k, v in self.setting_args.items() if k != 'eps'})


# The spread over the clients with test data (evaluation.accuracy_spread): record key -> label.
SPREAD = {'test_accuracy_std': 'std over clients', 'test_accuracy_worst10': 'worst 10 %',
          'test_accuracy_p10': 'p10', 'test_accuracy_p50': 'p50', 'test_accuracy_p90': 'p90'}


# Pooled over the test targets (evaluation.pooled_accuracy): record key -> label.
POOLED = {'test_accuracy_pooled': 'pooled', 'test_accuracy_pooled_participated':
          'pooled, sampled clients', 'test_accuracy_never_sampled': 'never sampled (mean)',
          'test_accuracy_pooled_never_sampled': 'never sampled (pooled)',
          'pooled_gain_per_100_rounds': 'pooled gain / 100 rounds, last 200'}


# Not a record key: the slope of the pooled accuracy over the last GAIN_WINDOW rounds (flat: under
# 0.3 points per 100 rounds, the operating-point criterion of docs/evaluation.md).
POOLED_GAIN, GAIN_WINDOW = 'pooled_gain_per_100_rounds', 200


def pooled_gain_per_100_rounds(records: list[dict]) -> float:
  """Least-squares slope of test_accuracy_pooled against the round over the last GAIN_WINDOW
  rounds, per 100 rounds (nan for a run shorter than the window, or with fewer than 2 evaluations
  there: a rate over 2 rounds says nothing of the next 100)."""
  last = records[-1]['round'] if records else 0
  if last < GAIN_WINDOW:
    return float('nan')
  points = [(r['round'], r['test_accuracy_pooled']) for r in records
            if r['round'] >= last - GAIN_WINDOW and r.get('test_accuracy_pooled') is not None]
  if len(points) < 2:
    return float('nan')
  rounds, accuracy = np.asarray(points, dtype=float).T
  return float(np.polyfit(rounds, accuracy, 1)[0] * 100)


# Whether the clip binds: train_metrics key -> label, each averaged over the last CLIP_WINDOW rounds
# of a run (clip_norm: C_t, recorded where the clip is adaptive). A clip that binds clips at least
# CLIP_BINDS of the updates there (docs/privacy.md section 8); the papers' argument (smaller
# update norms, less clipping error) needs one.
CLIPPING = {'clipped_fraction': 'clipped fraction', 'clip_norm': 'clip norm C_t',
            'mean_update_norm': 'pre-clip update norm'}


CLIP_WINDOW, CLIP_BINDS = 50, 0.05


def clipping_over_last_rounds(group: list[RunResult]) -> dict:
  """CLIPPING key -> (mean, std) over the runs of each run's mean over its last CLIP_WINDOW rounds;
  {} unless every run is private (0 < epsilon < inf) and recorded clipped_fraction every round."""
  if not group or not all(r.rounds and r.records and 0 < r.records[-1]['epsilon'] < math.inf
                          and all('clipped_fraction' in x for x in r.rounds) for r in group):
    return {}
  out = {}
  for key in CLIPPING:
    per_run = [[x[key] for x in r.rounds[-CLIP_WINDOW:] if x.get(key) is not None] for r in group]
    if all(per_run):
      out[key] = mean_std([np.mean(v) for v in per_run])
  return out


def _mean_std_of(records: list[dict], key: str) -> tuple[float, float]:
  values = [r[key] for r in records if r.get(key) is not None]
  return mean_std(values) if values and len(values) == len(records) else (float('nan'),) * 2


def summarize(runs: list[RunResult]) -> list[Row]:
  groups = collections.defaultdict(list)
  for run in runs:
    groups[(run.config_name, setting_label(run.setting), run.method)].append(run)
  rows = []
  for (config_name, setting, method), everyone in sorted(groups.items()):
    everyone.sort(key=lambda r: r.seed)
    # A failed run's last round is not comparable: it is reported, not averaged.
    group = [r for r in everyone if r.records and not r.failed]
    failed = [r for r in everyone if r.failed]
    finals = [r.records[-1] for r in group]
    unfinished = [r.seed for r in group if not r.finished]
    rounds = {f['round'] for f in finals}
    notes = []
    if failed:
      notes.append(f'{len(group)}/{len(everyone)} seeds; '
                   + '; '.join(r.failure_text() for r in failed))
    if unfinished:
      notes.append(f'unfinished seeds {unfinished}')
    if len(rounds) > 1:
      notes.append(f'seeds end at different rounds {sorted(rounds)}')
    executors = sorted({r.executor for r in group})
    if len(executors) > 1:  # e.g. seeds run on a CPU and on a GPU: the same run, other speeds
      seeds = '; '.join(f'{e or "?"} {[r.seed for r in group if r.executor == e]}' for e in executors)
      notes.append(f's/round mixes executors (seeds: {seeds})')
    nan = (float('nan'), float('nan'))
    rows.append(Row(
        config_name, setting, method,
        epsilon=float(np.mean([f['epsilon'] for f in finals])) if finals else float('nan'),
        num_seeds=len(group), final_round=min(rounds) if rounds else 0,
        final_acc=mean_std([f['test_accuracy'] for f in finals]) if finals else nan,
        best_acc=(mean_std([max(rec['test_accuracy'] for rec in r.records) for r in group])
                  if group else nan),
        seconds_per_round=(float(np.mean([np.mean([rec['seconds'] for rec in r.records])
                                          for r in group])) if group else float('nan')),
        note='; '.join(notes), num_runs=len(everyone),
        participated_acc=_mean_std_of(finals, 'test_accuracy_participated'),
        participation=_mean_std_of(finals, 'participation')[0],
        setting_args=dict(everyone[0].setting),
        spread={k: _mean_std_of(finals, k) for k in SPREAD},
        pooled={k: (mean_std([pooled_gain_per_100_rounds(r.records) for r in group])
                    if k == POOLED_GAIN and group else _mean_std_of(finals, k)) for k in POOLED},
        clipping=clipping_over_last_rounds(group)))
  return rows


def failure_lines(rows: list[Row]) -> list[str]:
  """'config / setting / method: 1/2 seeds; seed=1 failed (...)' for each row with a failure."""
  return [f'{r.config_name} / {r.setting} / {r.method}: {r.note}' for r in rows
          if r.num_seeds < r.num_runs]
