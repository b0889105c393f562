"""Reading a root of workdirs: one RunResult per run (metrics.jsonl, config.json, train_metrics.jsonl,
sweep.json, failure.json), a row per re-evaluation protocol (evaluations.jsonl), and --copy_runs."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil

import numpy as np

from dp2fedsam_jax import metric_writers
from dp2fedsam_jax.config import evaluates_at
from dp2fedsam_jax.protocol import DEFAULTS as EVAL_DEFAULTS


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

  @property
  def diverged(self) -> bool:
    """Its release turned NaN/Inf: final (a rerun repeats it), scored as scored_to_the_end says."""
    return is_divergence(self.failure)

  def failure_text(self) -> str:
    """'seed=1 failed (FloatingPointError at round 1)'."""
    where = f" at round {self.failure['round']}" if self.failure.get('round') else ''
    return f"seed={self.seed} failed ({self.failure.get('error', 'error')}{where})"


def format_value(value) -> str:
  if isinstance(value, float):
    return 'inf' if math.isinf(value) else f'{value:g}'
  return str(value)


def setting_label(setting: dict) -> str:
  return ','.join(f'{k}={format_value(v)}' for k, v in sorted(setting.items())) or 'default'


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


def read_json(path: str):
  with open(path) as f:
    return json.load(f)


FAILURE_FILE = 'failure.json'  # experiments/train.py's: error, message, round
DIVERGED_ERROR = 'FloatingPointError'  # train.check_finite's: the release turned NaN/Inf


def is_divergence(failure: dict | None) -> bool:
  """Whether a failure.json says the release turned NaN/Inf (train.check_finite's error)."""
  return (failure or {}).get('error') == DIVERGED_ERROR


def diverged_at(workdir: str) -> int | None:
  """The round whose release turned NaN/Inf (failure.json of a FloatingPointError), else None."""
  path = os.path.join(workdir, FAILURE_FILE)
  failure = read_json(path) if os.path.exists(path) else None
  return int(failure.get('round') or 0) if is_divergence(failure) else None


def scored_to_the_end(evaluations: list[dict], config: dict, failed_at: int,
                      keys: tuple[str, ...]) -> list[dict]:
  """A diverged run's evaluations as a finished run's: those before round `failed_at` stand, and
  every round it would have evaluated from `failed_at` on (config's num_rounds, eval_every,
  eval_from) scores 0 in each of `keys`, its last round included."""
  num_rounds = int(config['num_rounds'])
  every, start = int(config.get('eval_every') or num_rounds), int(config.get('eval_from') or 0)
  kept = [e for e in evaluations if e['round'] < failed_at]
  return kept + [{'round': r, **{k: 0.0 for k in keys}}
                 for r in range(max(failed_at, 1), num_rounds + 1)
                 if evaluates_at(r, num_rounds, every, start)]


TUNING_FILE = 'tuning.json'  # launch/tune.py's
TRIAL_PREFIX = 'trial='  # its trials' workdirs


def load_runs(root: str) -> list[RunResult]:
  """Every workdir under root: with metrics, or failed (failure.json) before or after any."""
  runs = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if not d.startswith('.'))  # e.g. the sweep's .jax_cache
    if TUNING_FILE in files:  # a tuning's trials: its own section (tuning_lines), not seeds; what
      # else the directory holds (the fair benchmark's final/ runs at the selection) is read
      subdirs[:] = [d for d in subdirs if not d.startswith(TRIAL_PREFIX)]
      continue
    failure = (read_json(os.path.join(directory, 'failure.json')) if 'failure.json' in files
               else None)
    has_metrics = 'metrics.jsonl' in files and 'config.json' in files
    if not (has_metrics or (failure and ('config.json' in files or 'sweep.json' in files))):
      continue
    config = read_json(os.path.join(directory, 'config.json')) if 'config.json' in files else {}
    records = metric_writers.read_jsonl(os.path.join(directory, metric_writers.EVAL_FILE))
    if not records and not failure:
      continue
    sweep = read_json(os.path.join(directory, 'sweep.json')) if 'sweep.json' in files else None
    if sweep:
      config_name = sweep['config_name']
      setting = {k: v for k, v in sweep['args'].items() if k not in ('method', 'seed')}
    else:  # hand-started runs (runs/<method>, ...): one comparison under the root's name
      config_name = os.path.basename(os.path.normpath(os.path.abspath(root)))
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


# config.eval's fields (adapt_epochs, adapt_lr, adapt_part, head_init) and eval_clients.
PROTOCOL_FIELDS = (*(f'eval.{field}' for field in EVAL_DEFAULTS), 'eval_clients')


_PROTOCOL_DEFAULTS = (*EVAL_DEFAULTS.values(), None)


def protocol_label(record: dict) -> str:
  """'adapt head 10 ep lr 0.1, head random' for an experiments.evaluate record."""
  epochs, lr, part, head, clients = (record.get(k, d) for k, d in zip(PROTOCOL_FIELDS,
                                                                      _PROTOCOL_DEFAULTS))
  words = [f'adapt {part} {epochs} ep lr {format_value(lr)}' if epochs else 'no adaptation']
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
  same = lambda key: key if key[0] else (*_PROTOCOL_DEFAULTS[:3], *key[3:])
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


def copy_run_files(runs: list[RunResult], root: str, out: str) -> None:
  for run in runs:
    target = os.path.join(out, 'runs', os.path.relpath(run.workdir, root))
    os.makedirs(target, exist_ok=True)
    for name in ('config.json', 'sweep.json', metric_writers.EVAL_FILE, metric_writers.TRAIN_FILE,
                 'failure.json', 'evaluations.jsonl', metric_writers.HOSTS_FILE):
      if os.path.exists(os.path.join(run.workdir, name)):
        shutil.copyfile(os.path.join(run.workdir, name), os.path.join(target, name))
