r"""Tables and plots from a root of workdirs: `python -m experiments.report --root=runs --out=report`.

Reads every `metrics.jsonl` (one line per evaluated round) under --root, with its `config.json`,
`train_metrics.jsonl` (one line per round) where the run has one, and `sweep.json` when
launch/sweep.py made it; groups the runs by config, setting (the sweep's arguments other than
method and seed) and method, and writes to --out:

  results.md, results.csv   final-round test accuracy, mean ± sample std over seeds, per method and
                            setting; the best round's accuracy in a separate, labelled column (it
                            is chosen on test data, so it is optimistic); epsilon reached; seeds;
                            each method against the next below it: gap in points and in pooled
                            seed stds, with the seeds on each side; --reference (dp2fedsam)
                            against every other method, one column per eps; each setting with
                            extra arguments (noise=banded) against the same method without them;
                            the accuracy pooled over all test targets and the never-sampled
                            clients apart where the runs record them; local_only (nothing
                            released) shows ε = 0, a dotted line in the plot against ε; a run's
                            re-evaluations under other protocols (experiments.evaluate's
                            evaluations.jsonl, at its final round) as rows 'method [protocol]'
  <config>/<setting>_accuracy.png      test accuracy vs round per method, ±std band over seeds
  <config>/<setting>_update_norm.png   mean pre-clip update norm vs round, ±std band over seeds
                            (every round from train_metrics.jsonl when all its runs have one, as
                            the papers' update-norm figures; else at the evaluated rounds;
                            values 100x above the median are drawn at the top edge, labelled)
  <config>/<setting>_clip_norm.png     the clip norm C_t every round, ±std band over seeds, for
                            settings whose runs all clip adaptively (train_metrics' clip_norm)
  <config>/<setting>_accuracy_vs_eps.png   final accuracy vs epsilon, when settings differ only in
                            eps: seed-std error bars, log eps axis, eps = inf as horizontal lines,
                            values far off the curves' range listed in a note, not drawn
  runs/...                  with --copy_runs: the runs' small files (with experiments.evaluate's
                            evaluations.jsonl), for committing the results
                            (--finished_only: only runs that finished or failed, while a sweep runs)

Matplotlib comes with the `[report]` extra.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import math
import os
import re
import shutil

import numpy as np
from absl import app
from absl import flags

from dp2fedsam_jax import cli, metric_writers

FLAGS = flags.FLAGS


@dataclasses.dataclass
class RunResult:
  workdir: str
  config_name: str
  setting: dict
  method: str
  seed: int
  num_rounds: int           # what the config asks for
  records: list[dict]       # metrics.jsonl, one per evaluated round
  failure: dict | None = None  # failure.json of experiments.train: error, message, round
  rounds: list[dict] = dataclasses.field(default_factory=list)  # train_metrics.jsonl, every round
  executor: str = ''  # config.json's, as resolved: 'sequential' on a CPU, 'vmap' on a GPU under auto
  protocol: str = ''  # a re-evaluation of the run under another protocol (evaluations.jsonl)

  @property
  def finished(self) -> bool:
    return bool(self.records) and self.records[-1]['round'] >= self.num_rounds

  @property
  def failed(self) -> bool:
    return self.failure is not None and not self.finished

  def failure_text(self) -> str:
    """'seed=1 failed (FloatingPointError at round 1)'."""
    where = f" at round {self.failure['round']}" if self.failure.get('round') else ''
    return f"seed={self.seed} failed ({self.failure.get('error', 'error')}{where})"


def _fmt(value) -> str:
  if isinstance(value, float):
    return 'inf' if math.isinf(value) else f'{value:g}'
  return str(value)


def setting_label(setting: dict) -> str:
  return ','.join(f'{k}={_fmt(v)}' for k, v in sorted(setting.items())) or 'default'


def _setting_from_config(config: dict) -> dict:
  """For workdirs not made by launch/sweep.py: the fields that usually tell settings apart."""
  setting = {'dataset': config.get('dataset'), 'N': config.get('num_clients')}
  if config.get('partition') == 'pathological':
    setting['S'] = config.get('classes_per_client')
  elif config.get('partition') == 'dirichlet':
    setting['alpha'] = config.get('dirichlet_alpha')
  eps = (config.get('dp') or {}).get('target_epsilon')
  if eps is not None:
    setting['eps'] = eps
  return setting


def _read_json(path: str):
  with open(path) as f:
    return json.load(f)


def load_runs(root: str) -> list[RunResult]:
  """Every workdir under root: with metrics, or failed (failure.json) before or after any."""
  runs = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if not d.startswith('.'))  # e.g. the sweep's .jax_cache
    if TUNING_FILE in files:  # a tuning's trials: its own section (tuning_lines), not seeds
      subdirs[:] = []
      continue
    failure = (_read_json(os.path.join(directory, 'failure.json')) if 'failure.json' in files
               else None)
    has_metrics = 'metrics.jsonl' in files and 'config.json' in files
    if not (has_metrics or (failure and ('config.json' in files or 'sweep.json' in files))):
      continue
    config = _read_json(os.path.join(directory, 'config.json')) if 'config.json' in files else {}
    records = metric_writers.read_jsonl(os.path.join(directory, metric_writers.EVAL_FILE))
    if not records and not failure:
      continue
    sweep = _read_json(os.path.join(directory, 'sweep.json')) if 'sweep.json' in files else None
    if sweep:
      config_name = sweep['config_name']
      setting = {k: v for k, v in sweep['args'].items() if k not in ('method', 'seed')}
    else:
      config_name = os.path.relpath(directory, root).split(os.sep)[0]
      setting = _setting_from_config(config)
    args = sweep['args'] if sweep else {}
    seed_dir = os.path.basename(directory)
    seed = config.get('seed', args.get('seed', seed_dir[5:] if seed_dir.startswith('seed=') else 0))
    method = config.get('method') or args.get('method') or os.path.basename(
        os.path.dirname(os.path.dirname(directory)))
    rounds = metric_writers.read_jsonl(os.path.join(directory, metric_writers.TRAIN_FILE))
    runs.append(RunResult(directory, config_name, setting, method, int(seed),
                          int(config.get('num_rounds', 0)), records, failure, rounds,
                          config.get('executor', '')))
    if 'evaluations.jsonl' in files and runs[-1].finished:
      runs += _re_evaluations(runs[-1], config, os.path.join(directory, 'evaluations.jsonl'))
  return runs


TUNING_FILE = 'tuning.json'  # launch/tune.py's


def load_tunings(root: str) -> list[tuple[str, dict]]:
  """(directory, tuning.json) of every finished tuning under root (launch/tune.py)."""
  found = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if not d.startswith('.'))
    if TUNING_FILE in files:
      tuning = _read_json(os.path.join(directory, TUNING_FILE))
      if tuning.get('status') == 'done':
        found.append((directory, tuning))
      subdirs[:] = []
  return found


def tuning_lines(tunings: list[tuple[str, dict]], root: str) -> list[str]:
  """The selection's epsilon next to the selected run's test accuracy, one row per tuning."""
  if not tunings:
    return []
  lines = ['## Tuning (launch/tune.py)', '',
           'Each row: K random candidates trained, the best by its noised validation score '
           'released. *Selection ε* covers the whole tuning (every trial, the released model and '
           'its score; Papernot & Steinke 2022, docs/privacy.md); *one trial* is a single '
           'trial\'s ε by the same RDP accounting (its score included), *naive* the drawn K '
           'trials composed (a study with a secret K: round(E[K]) trials, marked E[K]; its K and '
           'trials stay in the operator\'s file). The test accuracy is the selected run\'s final '
           'round; it never took part in the selection.', '',
           '| tuning | K (law) | selected run | test acc | selection ε | one trial ε | naive ε (K) '
           '| δ | cost on the private clients |', '|---|---|---|---|---|---|---|---|---|']
  for directory, t in tunings:
    law = t['trial_distribution']
    law_text = ', '.join(f'{k}={_fmt(v)}' for k, v in law.items() if k != 'name')
    # A study drawn from a secret publishes neither K nor the naive cost at it (launch/tune.py).
    k_text = 'secret' if t.get('num_trials') is None else t['num_trials']
    accuracy = '–'
    if t.get('selected_run'):
      records = metric_writers.read_jsonl(os.path.join(directory, t['selected_run'],
                                                       metric_writers.EVAL_FILE))
      if records:
        accuracy = f"{100 * records[-1]['test_accuracy']:.2f}"
    proxy = t.get('proxy')
    if t.get('private') is False:  # a non-private method's tuning: no epsilon anywhere
      lines.append(f"| {os.path.relpath(directory, root) or '.'} | {k_text} ({law['name']} "
                   f"{law_text}) | {t['selected_run'] or 'none'} | {accuracy} | – | – | – | – | none: "
                   'a non-private method (its models are released unprotected) |')
      continue
    cost = (f"none: tuned on a {proxy['kind'].replace('_', ' ')} ({proxy['description']}), the "
            'only case in which the tuned values carry no cost on the private clients'
            if proxy else f"{t['selection_epsilon']:.3f} (the selection ε)")
    none = ('none' if t.get('num_trials') is None else 'none (K = 0)' if not t['num_trials']
            else 'none (all failed)')
    naive = (f"{t['naive_epsilon']:.3f} ({t['naive_trials']})" if 'naive_epsilon' in t else
             f"{t['naive_epsilon_at_mean_k']:.3f} (E[K]: {t['naive_trials_at_mean_k']})")
    lines.append(
        f"| {os.path.relpath(directory, root) or '.'} | {k_text} ({law['name']} "
        f"{law_text}) | {t['selected_run'] or none} "
        f"| {accuracy} | {t['selection_epsilon']:.3f} | {t['per_trial_epsilon']:.3f} | "
        f"{naive} | {t['delta']:.3g} | {cost} |")
  notes = [n for _, t in tunings for n in t.get('notes', [])]
  return (lines + [''] + [f'- {n}' for n in notes] + ([''] if notes else [])
          + trial_lines(tunings, root))


def trial_lines(tunings: list[tuple[str, dict]], root: str) -> list[str]:
  """Every trial of every tuning: tuning.json's `trials`, the operator's record."""
  lines = []
  for directory, t in tunings:
    if not t.get('trials'):
      continue
    names = sorted({k for trial in t['trials'] for k in trial.get('values', {})})
    lines += [f"### Trials of {os.path.relpath(directory, root) or '.'}: the operator's record", '',
              "Not covered by the selection ε: publishing every trial's score is K releases (the "
              'naive composition). *Metric* is the un-noised selection metric '
              f"({t.get('selected_by', '?').split(' ')[0]}), *score* what the selection compared.", '',
              '| trial | ' + ' | '.join(names) + ' | status | metric | score | test acc |',
              '|---|' + '---|' * (len(names) + 4)]
    for trial in t['trials']:
      def pct(key, trial=trial):
        value = trial.get(key)
        return '–' if value is None else f'{100 * value:.2f}'
      run = trial['run'] + (' (selected)' if trial['run'] == t.get('selected_run') else '')
      values = ' | '.join(_fmt(trial.get('values', {}).get(k, '–')) for k in names)
      lines.append(f"| {run} | {values} | {trial['status']} | {pct('metric')} | {pct('score')} "
                   f"| {pct('test_accuracy')} |")
    lines.append('')
  return lines
PROTOCOL_FIELDS = ('eval.adapt_epochs', 'eval.adapt_lr', 'eval.adapt_part', 'eval.head_init',
                   'eval_clients')
_PROTOCOL_DEFAULTS = (0, None, 'auto', 'own', None)


def protocol_label(record: dict) -> str:
  """'adapt head 10 ep lr 0.1, head random' for an experiments.evaluate record."""
  epochs, lr, part, head, clients = (record.get(k, d) for k, d in zip(PROTOCOL_FIELDS,
                                                                      _PROTOCOL_DEFAULTS))
  words = [f'adapt {part} {epochs} ep lr {_fmt(lr)}' if epochs else 'no adaptation']
  if head != 'own':
    words.append(f'head {head}')
  if clients is not None:
    words.append(f'{clients} clients')
  return ', '.join(words)


def _re_evaluations(run: RunResult, config: dict, path: str) -> list[RunResult]:
  """One row per protocol experiments.evaluate tested the run's final round with (the last such
  line), other than the protocol the run itself evaluated with: method 'fedavg [adapt ...]'."""
  block = config.get('eval') or {}
  own = (*(block.get(k.split('.', 1)[1], d) for k, d in zip(PROTOCOL_FIELDS[:4], _PROTOCOL_DEFAULTS)),
         config.get('eval_clients'))
  # Without adaptation epochs the lr and the part change nothing.
  same = lambda key: key if key[0] else (0, None, 'auto', *key[3:])
  latest = {}
  for record in metric_writers.read_jsonl(path):
    key = same(tuple(record.get(k, d) for k, d in zip(PROTOCOL_FIELDS, _PROTOCOL_DEFAULTS)))
    if record.get('round') == run.records[-1]['round'] and key != same(own):
      latest[key] = record
  # s/round: the training run's (the re-evaluation's own time is not a round's).
  seconds = float(np.mean([r.get('seconds', np.nan) for r in run.records]))
  return [dataclasses.replace(run, method=f'{run.method} [{protocol_label(record)}]',
                              records=[{**record, 'seconds': seconds}], rounds=[],
                              protocol=protocol_label(record))
          for record in latest.values()]


def _mean_std(values) -> tuple[float, float]:
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
  rounds, per 100 rounds (nan with fewer than 2 evaluations there)."""
  last = records[-1]['round'] if records else 0
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
      out[key] = _mean_std([np.mean(v) for v in per_run])
  return out


def _mean_std_of(records: list[dict], key: str) -> tuple[float, float]:
  values = [r[key] for r in records if r.get(key) is not None]
  return _mean_std(values) if values and len(values) == len(records) else (float('nan'),) * 2


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
        final_acc=_mean_std([f['test_accuracy'] for f in finals]) if finals else nan,
        best_acc=(_mean_std([max(rec['test_accuracy'] for rec in r.records) for r in group])
                  if group else nan),
        seconds_per_round=(float(np.mean([np.mean([rec['seconds'] for rec in r.records])
                                          for r in group])) if group else float('nan')),
        note='; '.join(notes), num_runs=len(everyone),
        participated_acc=_mean_std_of(finals, 'test_accuracy_participated'),
        participation=_mean_std_of(finals, 'participation')[0],
        setting_args=dict(everyone[0].setting),
        spread={k: _mean_std_of(finals, k) for k in SPREAD},
        pooled={k: (_mean_std([pooled_gain_per_100_rounds(r.records) for r in group])
                    if k == POOLED_GAIN and group else _mean_std_of(finals, k)) for k in POOLED},
        clipping=clipping_over_last_rounds(group)))
  return rows


def failure_lines(rows: list[Row]) -> list[str]:
  """'config / setting / method: 1/2 seeds; seed=1 failed (...)' for each row with a failure."""
  return [f'{r.config_name} / {r.setting} / {r.method}: {r.note}' for r in rows
          if r.num_seeds < r.num_runs]


def _pct(mean_std: tuple[float, float]) -> str:
  mean, std = mean_std
  if math.isnan(mean):
    return '–'
  return f'{100 * mean:.2f}' + ('' if math.isnan(std) else f' ± {100 * std:.2f}')


def _eps_text(eps: float) -> str:
  if math.isnan(eps):
    return '–'
  if eps == 0:
    return '0 (nothing released)'
  return '∞' if math.isinf(eps) else f'{eps:.3g}'


def _seeds_text(row: Row) -> str:
  return f'{row.num_seeds}/{row.num_runs}' if row.num_seeds < row.num_runs else str(row.num_seeds)


def ordering(rows: list[Row]) -> list[tuple[Row, Row, float, float]]:
  """(higher, lower, gap, gap / pooled seed std) for each method against the next one below it in
  the same config and setting, by final-round mean accuracy. The pooled std is
  sqrt((s_hi^2 + s_lo^2) / 2) over seeds; nan when either side has fewer than two seeds."""
  pairs = []
  by_setting = collections.defaultdict(list)
  for r in rows:
    if not math.isnan(r.final_acc[0]):
      by_setting[(r.config_name, r.setting)].append(r)
  for _, ranked in sorted(by_setting.items()):
    ranked.sort(key=lambda r: -r.final_acc[0])
    for hi, lo in zip(ranked, ranked[1:]):
      pairs.append((hi, lo, *_gap(hi, lo)))
  return pairs


def _gap(hi: Row, lo: Row) -> tuple[float, float]:
  """(hi - lo in final-round mean accuracy, that gap / pooled seed std sqrt((s_hi^2 + s_lo^2)/2));
  the second is nan when either side has fewer than two seeds."""
  gap = hi.final_acc[0] - lo.final_acc[0]
  pooled = math.sqrt((hi.final_acc[1] ** 2 + lo.final_acc[1] ** 2) / 2)  # nan if one seed
  return gap, gap / pooled if pooled > 0 else float('nan')


def rule_label(candidate: Row, reference: Row, min_gap: float = 0.01, min_seeds: int = 3,
               key: str = 'test_accuracy_pooled') -> tuple[str, float, float]:
  """(label, d, s): a pre-declared rule between two rows (experiments/configs/shakespeare_field.py).

  d = the candidate's mean over seeds of `key` minus the reference's, s = the pooled seed std
  sqrt((s_c^2 + s_r^2) / 2). 'helps' if d >= max(min_gap, 2 s), 'hurts' if d <= -max(min_gap, 2 s),
  else 'level'; 'undecided' while either row has fewer than min_seeds seeds."""
  (c_mean, c_std), (r_mean, r_std) = candidate.pooled[key], reference.pooled[key]
  d = c_mean - r_mean
  s = math.sqrt((c_std ** 2 + r_std ** 2) / 2)
  if min(candidate.num_seeds, reference.num_seeds) < min_seeds or math.isnan(d + s):
    return 'undecided', d, s
  bar = max(min_gap, 2 * s)
  return ('helps' if d >= bar else 'hurts' if d <= -bar else 'level'), d, s


def reference_gaps(rows: list[Row], reference: str) -> dict:
  """The reference method against every other method at the same eps: (config, setting without
  eps) -> {other method: {eps label: (reference row, other row, gap, gap / pooled std)}}, for the
  settings where the reference method has a result."""
  by_setting = collections.defaultdict(dict)
  for r in rows:
    if not math.isnan(r.final_acc[0]):
      by_setting[(r.config_name, r.setting)][r.method] = r
  gaps = collections.defaultdict(lambda: collections.defaultdict(dict))
  for (config_name, _), methods in sorted(by_setting.items()):
    ref = methods.get(reference)
    if ref is None:
      continue
    for method, other in methods.items():
      if method != reference:
        gaps[(config_name, ref.rest)][method][_eps_label(ref)] = (ref, other, *_gap(ref, other))
  return gaps


def variant_gaps(rows: list[Row]) -> list[tuple[Row, Row, float, float]]:
  """(variant, baseline, gap, gap / pooled std) for each row whose setting is another row's plus
  extra arguments (e.g. noise=banded,bands=2 on top of eps=1), same config and method: what the
  extra arguments change. Only the closest baseline (the most shared arguments) is used."""
  pairs = []
  by_method = collections.defaultdict(list)
  for r in rows:
    if not math.isnan(r.final_acc[0]):
      by_method[(r.config_name, r.method)].append(r)
  for _, group in sorted(by_method.items()):
    for variant in group:
      bases = [b for b in group if b is not variant and set(b.setting_args) < set(variant.setting_args)
               and all(_fmt(variant.setting_args[k]) == _fmt(v) for k, v in b.setting_args.items())]
      if bases:
        base = max(bases, key=lambda b: len(b.setting_args))
        pairs.append((variant, base, *_gap(variant, base)))
  return sorted(pairs, key=lambda p: (p[0].config_name, p[0].rest, p[0].method,
                                      -_eps_sort_key(_eps_label(p[0]))))


def _variant_table(rows: list[Row], config_name: str) -> list[str]:
  pairs = [p for p in variant_gaps(rows) if p[0].config_name == config_name]
  if not pairs:
    return []
  lines = ['', 'Settings with extra arguments against the same method without them (e.g. '
           'correlated noise against independent noise at the same ε): final-round gap in points '
           '(the variant minus the baseline) / in pooled seed stds (– with one seed on a side).', '',
           '| method | variant | baseline | variant acc | baseline acc | gap (points) / pooled std '
           '(seeds) |', '|---|---|---|---|---|---|']
  for variant, base, gap, units in pairs:
    lines.append(f'| {variant.method} | {variant.setting} | {base.setting} | '
                 f'{_pct(variant.final_acc)} | {_pct(base.final_acc)} | '
                 f'{_gap_cell(gap, units, variant, base)} |')
  return lines


def _eps_label(row: Row) -> str:
  eps = row.eps_setting if row.eps_setting is not None else row.epsilon
  return _fmt(float(eps))


def _eps_sort_key(label: str) -> float:
  return float(label)


def _gap_cell(gap: float, units: float, ref: Row, other: Row) -> str:
  size = '–' if math.isnan(units) else f'{units:+.1f} sd'
  return f'{100 * gap:+.2f} / {size} ({ref.num_seeds} v {other.num_seeds})'


def _final_round_table(rows: list[Row], config_name: str, kind: str) -> list[str]:
  """The final round's per-client spread (kind 'spread') or pooled accuracy ('pooled'), for the
  rows whose runs record it; mean ± std over seeds."""
  columns, intro = {
      'spread': (SPREAD, 'Spread over the clients with test data at the final round (each client '
                 'tests its own model): the std over clients, the mean over the worst 10 % of them, '
                 'and the 10th, 50th and 90th percentiles; mean ± std over seeds.'),
      'pooled': (POOLED, 'Accuracy pooled over all test targets of the evaluated clients (correct / '
                 'targets: a client weighs by its number of targets, as TFF and fedjax count), over '
                 'the clients sampled at least once, and the clients never sampled apart (their mean '
                 'over clients, and pooled; – where there are none); final round, mean ± std over '
                 f'seeds. The gain is the least-squares slope of the pooled accuracy over the last '
                 f'{GAIN_WINDOW} rounds, in points per 100 rounds (flat: under 0.3).'),
  }[kind]
  rows = [r for r in rows if r.config_name == config_name and getattr(r, f'has_{kind}')]
  if not rows:
    return []
  return ['', intro, '', '| setting | method | ' + ' | '.join(columns.values()) + ' |',
          '|---|---|' + '---|' * len(columns)] + [
              f'| {r.setting} | {r.method} | '
              + ' | '.join(_pct(getattr(r, kind)[k]) for k in columns) + ' |' for r in rows]


def write_tables(rows: list[Row], out: str, reference: str = 'dp2fedsam') -> tuple[str, str]:
  csv_path, md_path = os.path.join(out, 'results.csv'), os.path.join(out, 'results.md')
  # The spread columns only where some run records it (runs that predate it keep their tables).
  spread_columns = list(SPREAD) if any(r.has_spread for r in rows) else []
  spread_columns += list(POOLED) if any(r.has_pooled for r in rows) else []
  clip_columns = list(CLIPPING) if any(r.has_clipping for r in rows) else []
  with open(csv_path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['config', 'setting', 'method', 'epsilon', 'num_seeds', 'final_round',
                     'final_acc_mean', 'final_acc_std', 'best_round_acc_mean',
                     'best_round_acc_std', 'seconds_per_round', 'note', 'num_runs',
                     'participated_acc_mean', 'participated_acc_std', 'participation']
                    + [f'{k}_{stat}' for k in spread_columns for stat in ('mean', 'std')]
                    + [f'{k}_last{CLIP_WINDOW}_{stat}' for k in clip_columns
                       for stat in ('mean', 'std')])
    for r in rows:
      writer.writerow([r.config_name, r.setting, r.method, r.epsilon, r.num_seeds, r.final_round,
                       r.final_acc[0], r.final_acc[1], r.best_acc[0], r.best_acc[1],
                       r.seconds_per_round, r.note, r.num_runs, r.participated_acc[0],
                       r.participated_acc[1], r.participation]
                      + [v for k in spread_columns for v in {**r.spread, **r.pooled}[k]]
                      + [v for k in clip_columns for v in r.clipping.get(k, (math.nan,) * 2)])
  lines = ['# Results', '',
           'Test accuracy (%) at the final round: mean ± sample std over seeds of the mean over '
           'clients of each client\'s test accuracy (with the model the method evaluates: own head, '
           'global model, or fine-tuned copy). *Best round* is the maximum over evaluated '
           'rounds, chosen on test data, so it is optimistic; it is shown only for comparison with '
           'papers that report it. *Participated* is the same mean over only the clients sampled at '
           'least once (a never-sampled client tests with its initial personal head), and '
           '*participation* their fraction. ε: reached after the final round (δ as in each '
           'config.json).', '']
  for config_name in sorted({r.config_name for r in rows}):
    lines += [f'## {config_name}', '',
              '| setting | method | ε | seeds | round | final-round acc | participated acc | '
              'participation | best-round acc (optimistic) | s/round | note |',
              '|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
      if r.config_name == config_name:
        lines.append(f'| {r.setting} | {r.method} | {_eps_text(r.epsilon)} | {_seeds_text(r)} | '
                     f'{r.final_round} | {_pct(r.final_acc)} | {_pct(r.participated_acc)} | '
                     f'{"–" if math.isnan(r.participation) else f"{100 * r.participation:.0f} %"} | '
                     f'{_pct(r.best_acc)} | '
                     f'{"–" if math.isnan(r.seconds_per_round) else f"{r.seconds_per_round:.2f}"} | '
                     f'{r.note} |')
    pairs = [p for p in ordering(rows) if p[0].config_name == config_name]
    if pairs:
      lines += ['', 'Each method against the next one below it in its setting (final-round mean): '
                'the gap in points and in pooled seed standard deviations '
                '√((s₁² + s₂²)/2) (– where a side has fewer than two seeds; with three seeds this '
                'is a size, not a significance test).', '',
                '| setting | higher | lower | gap (points) | gap / pooled std | seeds |',
                '|---|---|---|---|---|---|']
      lines += [f'| {hi.setting} | {hi.method} | {lo.method} | {100 * gap:.2f} | '
                f'{"–" if math.isnan(units) else f"{units:.1f}"} | '
                f'{hi.num_seeds} v {lo.num_seeds} |' for hi, lo, gap, units in pairs]
    lines += _final_round_table(rows, config_name, 'spread')
    lines += _final_round_table(rows, config_name, 'pooled')
    lines += _clipping_table(rows, config_name)
    lines += _reference_table(rows, config_name, reference)
    lines += _variant_table(rows, config_name)
    lines.append('')
  with open(md_path, 'w') as f:
    f.write('\n'.join(lines))
  return md_path, csv_path


def _clipping_table(rows: list[Row], config_name: str) -> list[str]:
  """Whether the clip binds, for the private rows with every round's train metrics."""
  rows = [r for r in rows if r.config_name == config_name and r.has_clipping]
  if not rows:
    return []

  def plain(mean_std):
    mean, std = mean_std
    return f'{mean:.3g}' + ('' if math.isnan(std) else f' ± {std:.2g}')

  def binds(row):
    return 'yes' if row.clip_binds else f'**no** (< {CLIP_BINDS:g})'

  return ['', f'Clipping over the last {CLIP_WINDOW} rounds (private runs with every round\'s '
          'train_metrics.jsonl): each run\'s mean, then mean ± std over seeds. The clip *binds* '
          f'where the mean clipped fraction is at least {CLIP_BINDS:g}; C_t only where the clip is '
          'adaptive.', '',
          '| setting | method | ' + ' | '.join(CLIPPING.values()) + ' | clip binds |',
          '|---|---|' + '---|' * (len(CLIPPING) + 1)] + [
              f'| {r.setting} | {r.method} | '
              + ' | '.join(plain(r.clipping[k]) if k in r.clipping else '–' for k in CLIPPING)
              + f' | {binds(r)} |' for r in rows]


def _reference_table(rows: list[Row], config_name: str, reference: str) -> list[str]:
  """The reference method's gap to every other method, one column per eps: where its gain holds,
  grows or vanishes as eps shrinks. One table per config and setting without eps where the
  reference has a result."""
  lines = []
  for (name, rest), by_method in sorted(reference_gaps(rows, reference).items()):
    if name != config_name:
      continue
    eps_labels = sorted({e for cells in by_method.values() for e in cells}, key=_eps_sort_key)
    columns = ' | '.join(f'ε = {"∞" if e == "inf" else e}' for e in eps_labels)
    lines += ['', f'{reference} against each other method at the same ε'
              + ('' if rest == 'default' else f' ({rest})') + ': final-round gap in points '
              f'({reference} minus the other) / in pooled seed stds √((s₁² + s₂²)/2) '
              f'(– with one seed on a side) (seeds: {reference} v the other).', '',
              f'| method | {columns} |', '|---|' + '---|' * len(eps_labels)]
    order = sorted(by_method, key=lambda m: (-len(by_method[m]), m))
    for method in order:
      cells = []
      for e in eps_labels:
        ref, other, gap, units = by_method[method].get(e, (None,) * 4)
        cells.append('' if ref is None else _gap_cell(gap, units, ref, other))
      lines.append(f'| {method} | ' + ' | '.join(cells) + ' |')
  return lines


def _curves(group: list[RunResult], key: str, per_round: bool = False):
  """(rounds, mean, std) over seeds at the rounds every seed has (per_round: from the runs'
  train_metrics.jsonl, else at the evaluated rounds)."""
  lines = {id(r): (r.rounds if per_round else r.records) for r in group}
  common = sorted(set.intersection(*({rec['round'] for rec in lines[id(r)] if key in rec}
                                     for r in group)))
  values = np.array([[next(rec[key] for rec in lines[id(r)] if rec['round'] == rnd)
                      for rnd in common] for r in group], dtype=float)
  std = values.std(axis=0, ddof=1) if len(group) > 1 else np.zeros(len(common))
  return np.array(common), values.mean(axis=0), std


def _safe(text: str) -> str:
  return re.sub(r'[^A-Za-z0-9_.=,+-]+', '_', text)


def _new_axes():
  import matplotlib
  matplotlib.use('Agg')  # files only: no display needed
  import matplotlib.pyplot as plt
  return plt.subplots(figsize=(6.4, 4.2), dpi=120)


def method_styles(methods: list[str]) -> dict:
  """One look per method across every plot; past 10 methods the colours repeat, so the line style
  and marker change with them and no two methods look alike."""
  return {m: {'color': f'C{i % 10}', 'linestyle': ('-', '--', ':')[i // 10 % 3],
              'marker': ('o', 's', '^')[i // 10 % 3]} for i, m in enumerate(methods)}


def _save(fig, ax, title: str, path: str) -> None:
  import matplotlib.pyplot as plt
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  if len(ax.get_legend_handles_labels()[1]) > 6:  # many methods: the legend goes beside the axes
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.set_size_inches(9.6, 4.8)
  else:
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def _off_scale_limit(values: np.ndarray) -> float | None:
  """The top of the y axis when a few values are orders of magnitude above the rest (a blow-up in
  the first rounds of DP-FedAvg reaches 1e19 while every later norm is near 1): 3x the largest of
  the rest, so that the curves stay readable; None when nothing is that far out."""
  values = values[np.isfinite(values)]
  if not len(values) or np.median(values) <= 0:
    return None
  rest = values[values <= 100 * np.median(values)]
  return 3 * rest.max() if len(rest) < len(values) else None


def _plot_curves(by_method: dict, key: str, ylabel: str, title: str, path: str, colors: dict,
                 scale=1.0, per_round: bool = False, off_scale: bool = False) -> None:
  fig, ax = _new_axes()
  curves = {m: _curves(g, key, per_round) for m, g in sorted(by_method.items())}
  means = np.concatenate([c[1] for c in curves.values()] or [np.zeros(0)])
  top = _off_scale_limit(means) if off_scale else None
  shown = means if top is None else means[means <= top]
  # Norms that still span orders of magnitude (after the off-scale ones) get a log axis.
  log = bool(len(shown)) and shown.min() > 0 and shown.max() / shown.min() > 100
  if log:
    ax.set_yscale('log')
  for method, group in sorted(by_method.items()):
    rounds, mean, std = curves[method]
    if not len(rounds):
      continue
    lower, upper = mean - std, mean + std
    if log:  # a band below zero cannot be drawn on a log axis: floor it under the lowest mean
      lower = np.maximum(lower, 0.5 * shown.min())
    style = colors[method]
    ax.plot(rounds, scale * mean, marker=style['marker'], markersize=3, color=style['color'],
            linestyle=style['linestyle'], label=f'{method} (n={len(group)})')
    ax.fill_between(rounds, scale * lower, scale * upper, color=style['color'], alpha=0.2,
                    linewidth=0)
    for rnd, value in ([] if top is None else zip(rounds, mean)):
      if value > top:  # drawn at the top edge, labelled with its value
        ax.plot([rnd], [scale * top], marker='^', color=style['color'], markersize=7, clip_on=False)
        ax.annotate(f'off scale: {scale * value:.1e}', (rnd, scale * top), xytext=(4, -10),
                    textcoords='offset points', fontsize=7, color=style['color'])
  if top is not None:
    ax.set_ylim(top=scale * top)
    if not log:
      ax.set_ylim(bottom=min(0.0, scale * shown.min()))
  ax.set_xlabel('round')
  from matplotlib.ticker import MaxNLocator  # pylint: disable=import-outside-toplevel
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
  ax.set_ylabel(ylabel + (' (log scale)' if log else ''))
  _save(fig, ax, title, path)


def _plot_vs_eps(points: dict, title: str, path: str, colors: dict) -> None:
  """points: method -> list of (eps, mean, std, seeds). Each method with finite eps is a line with
  seed-std error bars; eps = inf (non-private, or clipping only) a dashed horizontal line. The y
  axis spans the methods drawn at two eps or more; a point or line far outside that span (a
  collapsed ceiling at 10 %) would flatten them, so it is listed in a note on the axes instead.
  A log eps axis when the eps span a factor of 4 or more."""
  fig, ax = _new_axes()
  curves = {m: sorted(p for p in pts if math.isfinite(p[0]) and p[0] > 0)
            for m, pts in points.items()}
  focus = [p for pts in curves.values() if len(pts) >= 2 for p in pts] or [
      p for pts in curves.values() for p in pts]
  lows = [100 * (p[1] - np.nan_to_num(p[2])) for p in focus]
  highs = [100 * (p[1] + np.nan_to_num(p[2])) for p in focus]
  low, high = (min(lows), max(highs)) if focus else (0.0, 100.0)
  slack = max(2.0, high - low)
  keep = (low - slack, high + slack)
  off = []
  for method in sorted(points):
    style = colors[method]
    finite = curves[method]
    shown = [p for p in finite if keep[0] <= 100 * p[1] <= keep[1]]
    off += [f'{method} {100 * p[1]:.1f} % at ε = {p[0]:.3g}' for p in finite if p not in shown]
    if shown:
      eps, mean, std, seeds = (np.array(v) for v in zip(*shown))
      n = f'{seeds.min()}' if seeds.min() == seeds.max() else f'{seeds.min()}–{seeds.max()}'
      ax.errorbar(eps, 100 * mean, yerr=100 * np.nan_to_num(std), marker=style['marker'],
                  capsize=3, color=style['color'], linestyle=style['linestyle'],
                  label=f'{method} ({n} seed{"" if n == "1" else "s"})')
      bars = 100 * np.nan_to_num(std)
      low, high = min(low, *(100 * mean - bars)), max(high, *(100 * mean + bars))
    # Horizontal lines: non-private runs (ε = ∞) and local_only (nothing released, ε = 0).
    for at, linestyle, eps_text in ((lambda e: not math.isfinite(e), '--', '∞'),
                                    (lambda e: e == 0, ':', '0')):
      line = [p[1] for p in points[method] if at(p[0])]
      if not line:
        continue
      value = 100 * float(np.mean(line))
      if keep[0] <= value <= keep[1]:
        ax.axhline(value, linestyle=linestyle, color=style['color'],
                   label=f'{method} (ε = {eps_text})')
        low, high = min(low, value), max(high, value)
      else:
        off.append(f'{method} {value:.1f} % at ε = {eps_text}')
  finite_eps = sorted({round(p[0], 6) for pts in curves.values() for p in pts})
  if finite_eps and finite_eps[0] > 0 and finite_eps[-1] / finite_eps[0] >= 4:
    ax.set_xscale('log')
    ax.set_xticks(finite_eps)
    ax.set_xticklabels([f'{e:.3g}' for e in finite_eps])
    ax.minorticks_off()
  pad = max(0.3, 0.05 * (high - low))
  ax.set_ylim(low - pad, high + pad)
  if off:
    ax.text(0.01, 0.01, 'off scale: ' + '; '.join(off), transform=ax.transAxes, fontsize=7,
            va='bottom', ha='left', wrap=True)
  ax.set_xlabel('ε (reached after the final round)' + (', log scale' if ax.get_xscale() == 'log'
                                                       else ''))
  ax.set_ylabel('final-round test accuracy (%)')
  _save(fig, ax, title, path)


def write_plots(runs: list[RunResult], out: str) -> list[str]:
  paths = []
  # One colour per method across every plot.
  colors = method_styles(sorted({r.method for r in runs}))
  groups = collections.defaultdict(lambda: collections.defaultdict(list))
  for run in runs:
    groups[(run.config_name, setting_label(run.setting))][run.method].append(run)
  for (config_name, setting), by_method in sorted(groups.items()):
    directory = os.path.join(out, _safe(config_name))
    os.makedirs(directory, exist_ok=True)
    title = f'{config_name}: {setting} (mean ± std over seeds)'
    path = os.path.join(directory, f'{_safe(setting)}_accuracy.png')
    _plot_curves(by_method, 'test_accuracy', 'test accuracy (%)', title, path, colors,
                 scale=100.0)
    paths.append(path)
    path = os.path.join(directory, f'{_safe(setting)}_update_norm.png')
    # Every round where every run has its per-round file (runs that predate it: evaluated rounds).
    per_round = all(r.rounds for group in by_method.values() for r in group)
    _plot_curves(by_method, 'mean_update_norm', 'mean update norm before clipping', title, path,
                 colors, per_round=per_round, off_scale=True)
    paths.append(path)
    if all(r.rounds and 'clip_norm' in r.rounds[0] for g in by_method.values() for r in g):
      path = os.path.join(directory, f'{_safe(setting)}_clip_norm.png')  # adaptive clipping's C_t
      _plot_curves(by_method, 'clip_norm', 'clip norm C', title, path, colors, per_round=True)
      paths.append(path)

  # Accuracy vs epsilon: settings that differ only in eps.
  by_rest = collections.defaultdict(lambda: collections.defaultdict(list))
  for row_group in _group_final(runs).items():
    (config_name, rest, method), pts = row_group
    by_rest[(config_name, rest)][method].extend(pts)
  for (config_name, rest), points in sorted(by_rest.items()):
    eps_values = {round(p[0], 6) for pts in points.values() for p in pts
                  if math.isfinite(p[0]) and p[0] > 0}
    if len(eps_values) < 2:
      continue
    directory = os.path.join(out, _safe(config_name))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f'{_safe(rest)}_accuracy_vs_eps.png')
    _plot_vs_eps(points, f'{config_name}: final accuracy vs ε ({rest}; mean ± std over seeds)', path,
                 colors)
    paths.append(path)
  return paths


def _group_final(runs: list[RunResult]) -> dict:
  """(config, setting without eps, method) -> [(eps reached, final acc mean, std, seeds)] per eps, over
  finished runs (a run stopped early has reached a smaller epsilon than its setting's)."""
  groups = collections.defaultdict(list)
  for run in runs:
    if not run.finished:
      continue
    rest = setting_label({k: v for k, v in run.setting.items() if k != 'eps'})
    eps_key = _fmt(run.setting.get('eps', run.records[-1]['epsilon']))
    groups[(run.config_name, rest, run.method, eps_key)].append(run)
  out = collections.defaultdict(list)
  for (config_name, rest, method, _), group in groups.items():
    mean, std = _mean_std([r.records[-1]['test_accuracy'] for r in group])
    eps = float(np.mean([r.records[-1]['epsilon'] for r in group]))
    out[(config_name, rest, method)].append((eps, mean, std, len(group)))
  return out


def copy_run_files(runs: list[RunResult], root: str, out: str) -> None:
  for run in runs:
    target = os.path.join(out, 'runs', os.path.relpath(run.workdir, root))
    os.makedirs(target, exist_ok=True)
    for name in ('config.json', 'sweep.json', metric_writers.EVAL_FILE, metric_writers.TRAIN_FILE,
                 'failure.json', 'evaluations.jsonl'):
      if os.path.exists(os.path.join(run.workdir, name)):
        shutil.copyfile(os.path.join(run.workdir, name), os.path.join(target, name))


def copy_tuning_files(tunings: list[tuple[str, dict]], root: str, out: str) -> None:
  """tuning.json and the small files of the trials it lists to <out>/runs/ (the report rebuilds
  from them): every trial of an older tuning.json (which listed them), the selected run only of one
  drawn from a secret (its other trials are the operator's, never copied; nor is its operator
  file)."""
  for directory, tuning in tunings:
    target = os.path.join(out, 'runs', os.path.relpath(directory, root))
    os.makedirs(target, exist_ok=True)
    shutil.copyfile(os.path.join(directory, TUNING_FILE), os.path.join(target, TUNING_FILE))
    secret_draw = 'trials' not in tuning
    listed = [trial['run'] for trial in tuning.get('trials', [])] or (
        [tuning['selected_run']] if tuning.get('selected_run') else [])
    for run in listed:
      os.makedirs(os.path.join(target, run), exist_ok=True)
      for name in ('config.json', 'sweep.json', 'failure.json', metric_writers.EVAL_FILE,
                   metric_writers.TRAIN_FILE):
        source, copy = os.path.join(directory, run, name), os.path.join(target, run, name)
        if not os.path.exists(source):
          continue
        if secret_draw and name == metric_writers.EVAL_FILE:
          # The selected run's un-noised validation metrics would give its score's noise back.
          records = [{k: v for k, v in r.items() if not k.startswith('validation_')}
                     for r in metric_writers.read_jsonl(source)]
          with open(copy, 'w') as f:
            f.writelines(json.dumps(r) + '\n' for r in records)
        else:
          shutil.copyfile(source, copy)


def write_report(root: str, out: str, copy_runs: bool = False, finished_only: bool = False,
                 reference: str = 'dp2fedsam') -> dict:
  """Writes the tables and plots; returns their paths. `finished_only` leaves out the runs still
  under way (failed runs stay: the table says why they stopped)."""
  runs = load_runs(root)
  if finished_only:
    runs = [r for r in runs if r.finished or r.failed]
  tunings = load_tunings(root)
  if not runs and not tunings:
    raise ValueError(f'no workdir with metrics.jsonl and config.json under {root}')
  os.makedirs(out, exist_ok=True)
  if copy_runs:
    copy_run_files([r for r in runs if not r.protocol], root, out)
    copy_tuning_files(tunings, root, out)
  if not runs:  # tunings only: their trials are in their own section, not in the run tables
    md = os.path.join(out, 'results.md')
    with open(md, 'w') as f:
      f.write('\n'.join(['# Results', ''] + tuning_lines(tunings, root)))
    return {'markdown': md, 'csv': None, 'plots': [], 'num_runs': 0, 'failures': []}
  rows = summarize(runs)
  md, csv_path = write_tables(rows, out, reference)
  # Re-evaluations are one final point each: in the tables, not in the plots.
  plots = write_plots([r for r in runs if r.records and not r.failed and not r.protocol], out)
  with open(md, 'a') as f:
    f.write('\n'.join([''] + tuning_lines(tunings, root)))
    f.write('\n## Plots\n\n' + '\n'.join(f'![{os.path.relpath(p, out)}]({os.path.relpath(p, out)})'
                                          for p in plots) + '\n')
  return {'markdown': md, 'csv': csv_path, 'plots': plots, 'num_runs': len(runs),
          'failures': failure_lines(rows)}


def define_flags() -> None:
  """Registers the flags. Only the program does this, so that importing the module (tests, or a
  sweep and a report in one process) never defines a second --root."""
  flags.DEFINE_string('root', None, 'Directory holding the workdirs (searched recursively).')
  flags.DEFINE_string('out', None, 'Output directory for results.md, results.csv and PNGs.')
  flags.DEFINE_bool('copy_runs', False, 'Also copy each run\'s config.json, sweep.json, '
                    'metrics.jsonl and train_metrics.jsonl (not its checkpoints) to <out>/runs/, '
                    'so the results can be committed and the report rebuilt from them.')
  flags.DEFINE_string('reference', 'dp2fedsam', 'The method whose gap to every other method at '
                      'each eps gets its own table (where it has results).')
  flags.DEFINE_bool('finished_only', False, 'Leave out the runs still under way (a sweep that is '
                    'running): commit each finished run while the rest go on.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  paths = write_report(FLAGS.root, FLAGS.out, FLAGS.copy_runs, FLAGS.finished_only,
                       FLAGS.reference)
  for line in paths['failures']:
    print(line)
  print(json.dumps(paths, indent=2))


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['root', 'out'])
  cli.run(main)
