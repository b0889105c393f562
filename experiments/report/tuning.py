"""launch/tune.py's tunings: their own table (the selection's eps next to the selected run's test
accuracy), every trial as the operator's record, and their files for --copy_runs."""

from __future__ import annotations

import json
import os
import shutil

from dp2fedsam_jax import metric_writers
from experiments.report.workdirs import TUNING_FILE, format_value, read_json

# tuning.json's 'covered_by' where no finite eps covers a tuning: an older study whose tuner's seed,
# and with it K, the candidates and the score noise, is public (its eps fields are null).
NO_FINITE_EPSILON = 'no finite epsilon'


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
           'trials composed (a study with a secret K: round(E[K]) trials, marked E[K]; its K and '
           'trials stay in the operator\'s file). The test accuracy is the selected run\'s final '
           'round; it never took part in the selection.', '',
           '| tuning | K (law) | selected run | test acc | selection ε | one trial ε | naive ε (K) '
           '| δ | cost on the private clients |', '|---|---|---|---|---|---|---|---|---|']
  for directory, t in tunings:
    law = t['trial_distribution']
    law_text = ', '.join(f'{k}={format_value(v)}' for k, v in law.items() if k != 'name')
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
    if t.get('covered_by') == NO_FINITE_EPSILON:
      lines.append(f"| {os.path.relpath(directory, root) or '.'} | {k_text} ({law['name']} "
                   f"{law_text}) | {t['selected_run']} | {accuracy} | – | – | – | {t['delta']:.3g} | "
                   'no finite ε: a public seed (its notes) |')
      continue
    bound = t.get('epsilon_bound') or t['selection_epsilon']  # older files: no bound recorded
    if proxy:
      cost = (f"none: tuned on a {proxy['kind'].replace('_', ' ')} ({proxy['description']}), the "
              'only case in which the tuned values carry no cost on the private clients')
    elif bound > t['selection_epsilon']:  # K published: its naive composition is the bound
      cost = f"{bound:.3f} (K known: the naive composition of its {t['num_trials']} trials)"
    else:
      cost = f"{t['selection_epsilon']:.3f} (the selection ε)"
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
      values = ' | '.join(format_value(trial.get('values', {}).get(k, '–')) for k in names)
      lines.append(f"| {run} | {values} | {trial['status']} | {pct('metric')} | {pct('score')} "
                   f"| {pct('test_accuracy')} |")
    lines.append('')
  return lines


TRAINING_SEED = 'training_seed'


def without_training_seed(record: dict) -> dict:
  """A trial's config.json or sweep.json without its config.training_seed: the secret seed of its
  noise, which published gives the noise, and so the un-noised update, back."""
  flag = f'--config.{TRAINING_SEED}='
  out = {k: v for k, v in record.items() if k != TRAINING_SEED}
  for key in ('overrides', 'command'):
    if isinstance(out.get(key), list):
      out[key] = [t for t in out[key] if not str(t).startswith(flag)]
  return out


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
                   metric_writers.TRAIN_FILE, metric_writers.HOSTS_FILE):
        source, copy = os.path.join(directory, run, name), os.path.join(target, run, name)
        if not os.path.exists(source):
          continue
        if secret_draw and name in ('config.json', 'sweep.json'):
          with open(source) as f, open(copy, 'w') as g:
            json.dump(without_training_seed(json.load(f)), g, indent=2)
        elif secret_draw and name == metric_writers.EVAL_FILE:
          # The selected run's un-noised validation metrics would give its score's noise back.
          records = [{k: v for k, v in r.items() if not k.startswith('validation_')}
                     for r in metric_writers.read_jsonl(source)]
          with open(copy, 'w') as f:
            f.writelines(json.dumps(r) + '\n' for r in records)
        else:
          shutil.copyfile(source, copy)
