"""launch/tune.py's tunings: their own table (the selection's eps next to the selected run's test
accuracy), every trial as the operator's record, and their files for --copy_runs."""

from __future__ import annotations

import os
import shutil

from dp2fedsam_jax import metric_writers
from experiments.report.workdirs import TUNING_FILE, format_value, read_json


def load_tunings(root: str) -> list[tuple[str, dict]]:
  """(directory, tuning.json) of every finished tuning under root (launch/tune.py)."""
  found = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if not d.startswith('.'))
    if TUNING_FILE in files:
      tuning = read_json(os.path.join(directory, TUNING_FILE))
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
           'trials composed. The test accuracy is the selected run\'s final round; it never took '
           'part in the selection.', '',
           '| tuning | K (law) | selected run | test acc | selection ε | one trial ε | naive ε (K) '
           '| δ | cost on the private clients |', '|---|---|---|---|---|---|---|---|---|']
  for directory, t in tunings:
    law = t['trial_distribution']
    law_text = ', '.join(f'{k}={format_value(v)}' for k, v in law.items() if k != 'name')
    accuracy = '–'
    if t.get('selected_run'):
      records = metric_writers.read_jsonl(os.path.join(directory, t['selected_run'],
                                                       metric_writers.EVAL_FILE))
      if records:
        accuracy = f"{100 * records[-1]['test_accuracy']:.2f}"
    proxy = t.get('proxy')
    if t.get('private') is False:  # a non-private method's tuning: no epsilon anywhere
      lines.append(f"| {os.path.relpath(directory, root) or '.'} | {t['num_trials']} ({law['name']} "
                   f"{law_text}) | {t['selected_run'] or 'none'} | {accuracy} | – | – | – | – | none: "
                   'a non-private method (its models are released unprotected) |')
      continue
    cost = (f"none: tuned on a {proxy['kind'].replace('_', ' ')} ({proxy['description']}), the "
            'only case in which the tuned values carry no cost on the private clients'
            if proxy else f"{t['selection_epsilon']:.3f} (the selection ε)")
    none = 'none (K = 0)' if not t['num_trials'] else 'none (all failed)'
    lines.append(
        f"| {os.path.relpath(directory, root) or '.'} | {t['num_trials']} ({law['name']} "
        f"{law_text}) | {t['selected_run'] or none} "
        f"| {accuracy} | {t['selection_epsilon']:.3f} | {t['per_trial_epsilon']:.3f} | "
        f"{t['naive_epsilon']:.3f} ({t['naive_trials']}) | {t['delta']:.3g} | {cost} |")
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
      values = ' | '.join(format_value(trial.get('values', {}).get(k, '–')) for k in names)
      lines.append(f"| {run} | {values} | {trial['status']} | {pct('metric')} | {pct('score')} "
                   f"| {pct('test_accuracy')} |")
    lines.append('')
  return lines


def copy_tuning_files(tunings: list[tuple[str, dict]], root: str, out: str) -> None:
  """tuning.json and every trial's small files to <out>/runs/ (the report rebuilds from them)."""
  for directory, tuning in tunings:
    target = os.path.join(out, 'runs', os.path.relpath(directory, root))
    os.makedirs(target, exist_ok=True)
    shutil.copyfile(os.path.join(directory, TUNING_FILE), os.path.join(target, TUNING_FILE))
    for trial in tuning.get('trials', []):
      os.makedirs(os.path.join(target, trial['run']), exist_ok=True)
      for name in ('config.json', 'sweep.json', 'failure.json', metric_writers.EVAL_FILE,
                   metric_writers.TRAIN_FILE):
        if os.path.exists(os.path.join(directory, trial['run'], name)):
          shutil.copyfile(os.path.join(directory, trial['run'], name),
                          os.path.join(target, trial['run'], name))
