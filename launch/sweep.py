r"""Runs a grid of experiments, one workdir each; finished runs are skipped, unfinished ones resumed.

  python -m launch.sweep --config=experiments/configs/dp2fedsam_table2.py --root=runs
  python -m launch.sweep --config=experiments/configs/dp2fedsam_table2.py --root=runs \
      --only=dataset=cifar10 --only=N=1000 --methods=dp2fedsam,centaur --seeds=0 \
      --config.num_rounds=50
  python -m launch.sweep ... --plan     # list the runs and their status (and the config's
                                        # planned_hours(args) summed, if it has one), run nothing
  python -m launch.sweep ... --seed_from=experiments/results/<name>/runs   # committed runs count

The grid is the config's `sweep_grid()` (a list of config-argument dicts) when it has one, else one
empty entry; `--only=key=value[,value...]` keeps the entries with one of those values; then
`--methods`, `--seeds`, `--eps` and each `--grid=key=v1,v2` replace that key in every entry by each
of the listed values (a product). Every entry runs as
`python -m experiments.train --config=CONFIG:args --workdir=W [--config.x=y ...]` with its output
appended to `W/train.log`, where

  W = <root>/<config name>/<method>/<other args, sorted, k=v joined by ','>/seed=<seed>

A run whose metrics.jsonl (one line per evaluation) already reaches the config's num_rounds is
skipped, and so is one whose release turned NaN/Inf (its failure.json: a rerun repeats it); one
with a checkpoint resumes from it (experiments.train does that, bit for bit, its metrics files
included). Extra `--config.x=y` overrides go to every run unchanged; they are
recorded in `W/sweep.json` but are not part of W, so a different override in the same root is
refused by experiments.train when it would change the run (only num_rounds, eval_every, eval_from,
checkpoint_every and dp.target_epsilon may change on resume) — use another --root.

--one_program=auto runs the unfinished runs that differ only in searched scalars (the lrs, rho, C,
the server lr, lam: dp2fedsam_jax/search_program.py) and training_seed as one compiled program in
this process (launch/trial_program.py: the runs a mapped axis, each run's files in its workdir as
experiments.train writes them), then the others one process each: a ladder of lrs compiles once.

Runs go in grid order (with --parallel=k, the next k at a time): a config lists its most wanted
runs first, and an interrupted sweep has done those.

--seed_from=DIR fills a fresh root with committed runs (the `runs/` folder `experiments.report
--copy_runs` writes): each grid entry whose workdir holds no metrics.jsonl and no checkpoints gets
the small files of the same run in DIR (found at the workdir's path under <root>/<config name>, or
under <root>), when that run finished and its sweep.json has the same arguments and overrides; the
sweep then skips it. Nothing is overwritten; with --plan too (the copy is what the plan reports).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags

from dp2fedsam_jax import cli, config_help, metric_writers, stopping
from experiments import studies
from experiments.config_files import (OVERRIDE_PREFIX, apply_overrides, arg_string, config_name,
                                      format_value, load_config_module, parse_literal)
from experiments.report import workdirs

FLAGS = flags.FLAGS

_overrides: list[str] = []  # the --config.x=y flags, taken out before absl parses the rest
# Overrides a finished or unfinished run may change and still be the same run (see experiments.train).
_RESUMABLE_OVERRIDES = ('--config.num_rounds=', '--config.eval_every=', '--config.eval_from=',
                        '--config.checkpoint_every=', '--config.dp.target_epsilon=')
RESUMES = 'resume from round '  # Run.status of a run with a checkpoint: RESUMES + its round
DIVERGED = 'diverged'  # Run.status of a run whose release turned NaN/Inf: final, not run again


@dataclasses.dataclass
class Run:
  args: dict
  workdir: str
  num_rounds: int
  method: str
  config_name: str
  overrides: tuple[str, ...] = ()
  missing_data: str | None = None  # why the run's dataset is not on this machine (None: it is)

  @property
  def rounds_done(self) -> int:
    """The last evaluated round in metrics.jsonl (a run's last round is always evaluated)."""
    records = metric_writers.read_jsonl(os.path.join(self.workdir, metric_writers.EVAL_FILE))
    return int(records[-1]['round']) if records else 0

  @property
  def diverged_at(self) -> int | None:
    """The round whose release was NaN/Inf (workdirs.diverged_at), else None. The run is final
    there: a rerun repeats it (a run is deterministic), and one that did not would be a retry until
    success."""
    return workdirs.diverged_at(self.workdir)

  def conflict(self) -> str | None:
    """Why this workdir holds another run (other arguments or overrides), or None."""
    path = os.path.join(self.workdir, 'sweep.json')
    if not os.path.exists(path):
      return None
    with open(path) as f:
      old = json.load(f)
    if arg_string(old['args']) != arg_string(self.args):
      return f"arguments {arg_string(old['args'])!r} != {arg_string(self.args)!r}"
    changed = set(current_names(old['overrides'])) ^ set(self.overrides)
    changed = sorted(o for o in changed if not o.startswith(_RESUMABLE_OVERRIDES))
    return f'overrides differ: {changed}' if changed else None

  def holder(self) -> int | None:
    """The pid of a live run that writes to this workdir (0: pid unknown), or None."""
    from dp2fedsam_jax import run_files  # pylint: disable=import-outside-toplevel
    return run_files.holder(self.workdir) if os.path.isdir(self.workdir) else None

  @property
  def status(self) -> str:
    held = self.holder()
    if held is not None:
      return f'in use (pid {held}; not started)'
    conflict = self.conflict()
    if conflict:
      return f'conflict ({conflict}; use another --root)'
    done = self.rounds_done
    if done >= self.num_rounds:
      return 'done'
    if self.diverged_at is not None:
      return DIVERGED
    # The run restarts from its last checkpoint, which may be past its last evaluation.
    from dp2fedsam_jax import checkpoint  # pylint: disable=import-outside-toplevel
    start = checkpoint.latest_round(self.workdir)
    return f'{RESUMES}{start}' if start else 'new'


def current_names(overrides: list[str]) -> list[str]:
  """--config.x=y overrides under the current field names (a sweep.json written before a rename
  holds the old ones, config_help.RENAMED_FIELDS)."""
  out = []
  for override in overrides:
    field, sep, value = override.partition('=')
    name = field.removeprefix('--config.')
    if field.startswith('--config.') and name in config_help.RENAMED_FIELDS:
      override = f'--config.{config_help.RENAMED_FIELDS[name]}{sep}{value}'
    out.append(override)
  return out


def expand_grid(base: list[dict], axes: list[tuple[str, list]]) -> list[dict]:
  """Replaces each axis key in every base entry by each of its values; drops duplicates."""
  entries = [dict(e) for e in base] or [{}]
  for key, values in axes:
    entries = [{**e, key: v} for e in entries for v in values]
  seen, unique = set(), []
  for e in entries:
    k = arg_string(e)
    if k not in seen:
      seen.add(k)
      unique.append(e)
  return unique


def missing_data(config) -> str | None:
  """Why config.dataset is not on this machine, or None when it is (or needs no files)."""
  # Imported here: a sweep that only plans stays light. pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.data import sources
  dataset, data_dir = config.dataset, config.get('data_dir')
  if dataset == 'fashion_mnist':
    directory = data_dir or sources.DEFAULT_FASHION_MNIST_DIR
    try:
      for names in sources._FASHION_MNIST_FILES.values():  # pylint: disable=protected-access
        for name in names:
          sources._find_file(directory, name)  # pylint: disable=protected-access
    except sources.DatasetNotFoundError:
      return (f'fashion_mnist: no IDX files in {directory} (sudo apt-get install '
              'dataset-fashion-mnist, or --config.data_dir=DIR)')
    return None
  if dataset == 'femnist':
    from dp2fedsam_jax.data import femnist
    directory = data_dir or femnist.DEFAULT_FEMNIST_DIR
    try:
      femnist.find_files(directory)
    except (sources.DatasetNotFoundError, OSError):
      return f'femnist: no TFF h5 or LEAF JSON files in {directory} (downloaded on first use, online)'
    return None
  if dataset in sources.TOKEN_DATASETS:
    from dp2fedsam_jax.data import shakespeare
    try:
      shakespeare.check_available(dataset, data_dir)
    except sources.DatasetNotFoundError as e:
      return f'{dataset}: {e}'
    return None
  tfds_name = dataset[5:] if dataset.startswith('tfds:') else sources.TFDS_DATASETS.get(dataset)
  if tfds_name is None:
    return None  # synthetic
  if importlib.util.find_spec('tensorflow_datasets') is None:
    return f"{dataset}: needs the [tfds] extra (pip install -e '.[tfds]')"
  directory = data_dir or os.path.join(os.path.expanduser('~'), 'tensorflow_datasets')
  if not os.path.isdir(os.path.join(directory, tfds_name)):
    return f'{dataset}: not prepared in {directory} (TFDS downloads it on first use, online only)'
  return None


def validate_runs(runs: list[Run], configs: list) -> None:
  """Every run's config checked before any run starts: an unknown method, a bad override, ..."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.config import validate_config  # pylint: disable=import-outside-toplevel
  for run, config in zip(runs, configs):
    try:
      validate_config(config, METHODS)
    except ValueError as e:
      raise ValueError(f'{run.config_name} run {arg_string(run.args) or "(default)"}: {e}') from e


def workdir_for(root: str, config_name: str, config, args: dict) -> str:
  rest = {k: v for k, v in args.items() if k not in ('method', 'seed')}
  return os.path.join(root, config_name, config.method, arg_string(rest) or 'default',
                      f'seed={config.seed}')


def plan(config_path: str, root: str, axes: list[tuple[str, list]], overrides: list[str],
         only: list[str] = ()) -> list[Run]:
  """The runs of a sweep: one per grid entry, with its workdir and the rounds it must reach."""
  return [run for run, _ in planned(config_path, root, axes, overrides, only)]


def planned(config_path: str, root: str, axes: list[tuple[str, list]], overrides: list[str],
            only: list[str] = ()) -> list[tuple[Run, object]]:
  """[(run, its resolved config)] of the sweep, one per grid entry (plan's runs)."""
  path, _, fixed = config_path.partition(':')
  module = load_config_module(path)
  base = module.sweep_grid() if hasattr(module, 'sweep_grid') else [{}]
  if fixed:
    fixed_args = dict(item.split('=', 1) for item in fixed.split(','))
    base = [{**e, **fixed_args} for e in base]
  for item in only:
    key, _, values = item.partition('=')
    wanted = {format_value(parse_literal(v)) for v in values.split(',')}
    base = [e for e in base if key in e and format_value(e[key]) in wanted]
    if not base:
      raise ValueError(f'--only={item}: no grid entry of {path} has it')
  name = config_name(path)
  runs, configs, missing = [], [], {}
  for args in expand_grid(base, axes):
    config = apply_overrides(module.get_config(arg_string(args) or None), overrides)
    key = (config.dataset, config.get('data_dir'))
    if key not in missing:
      missing[key] = missing_data(config)
    runs.append(Run(args, workdir_for(root, name, config, args), int(config.num_rounds),
                    config.method, name, tuple(overrides), missing[key]))
    configs.append(config)
  validate_runs(runs, configs)
  return list(zip(runs, configs))


SEED_FILES = ('config.json', 'sweep.json', metric_writers.EVAL_FILE, metric_writers.TRAIN_FILE,
              metric_writers.HOSTS_FILE, workdirs.FAILURE_FILE)


def seed_from(runs: list[Run], root: str, source: str) -> list[tuple[str, str]]:
  """Copies finished runs from `source` (a report's runs/ folder) into the empty workdirs of the
  same runs; returns [(workdir, copied from)]. Never overwrites: a workdir with metrics.jsonl or
  checkpoints is left alone, and a source run that is unfinished, failed or of other arguments or
  overrides is not used. A run that diverged (Run.diverged_at) is finished: it is copied, failure.json
  included, and never run again."""
  if not os.path.isdir(source):
    raise ValueError(f'--seed_from={source}: no such directory')
  seeded = []
  for run in runs:
    if (os.path.exists(os.path.join(run.workdir, metric_writers.EVAL_FILE))
        or os.path.exists(os.path.join(run.workdir, 'checkpoints')) or run.diverged_at is not None):
      continue
    relative = os.path.relpath(run.workdir, root)
    candidates = [os.path.join(source, os.path.relpath(relative, run.config_name)),
                  os.path.join(source, relative)]
    for path in candidates:
      if not os.path.exists(os.path.join(path, 'sweep.json')):
        continue
      committed = dataclasses.replace(run, workdir=path)
      finished = committed.diverged_at is not None or (
          committed.rounds_done >= run.num_rounds
          and not os.path.exists(os.path.join(path, workdirs.FAILURE_FILE)))
      if committed.conflict() or not finished:
        continue
      os.makedirs(run.workdir, exist_ok=True)
      for name in SEED_FILES:
        if os.path.exists(os.path.join(path, name)):
          shutil.copyfile(os.path.join(path, name), os.path.join(run.workdir, name))
      seeded.append((run.workdir, path))
      break
  return seeded


def plan_summary(runs: list[Run]) -> str:
  """'N runs: F finished, R to run (n new, u to resume)[, c conflicts][; d without their data]'
  (a diverged run is finished: DIVERGED)."""
  statuses = [run.status for run in runs]
  done = statuses.count('done') + statuses.count(DIVERGED)
  new = statuses.count('new')
  conflicts = sum(s.startswith('conflict') for s in statuses)
  in_use = sum(s.startswith('in use') for s in statuses)
  resume = len(runs) - done - new - conflicts - in_use
  text = (f'{len(runs)} runs: {done} finished, {new + resume} to run ({new} new, {resume} to '
          'resume)')
  if conflicts:
    text += f', {conflicts} in conflict with their workdir'
  if in_use:
    text += f', {in_use} in use by another process'
  no_data = sorted({r.missing_data for r in runs if r.missing_data and r.status != 'done'})
  if no_data:
    count = sum(1 for r in runs if r.missing_data and r.status != 'done')
    text += f'; {count} without their data here: ' + '; '.join(no_data)
  return text


def planned_cost(config_path: str, runs: list[Run]) -> str | None:
  """'planned cost: ...' from the config's study (experiments/studies/<config name>.py): its
  planned_hours(args) (hours of one run, its docstring's measured estimate) summed over the runs not
  finished; None when the config has no study or its study no estimate."""
  study = studies.of_config(config_name(config_path))
  if not hasattr(study, 'planned_hours'):
    return None
  left = [r for r in runs if r.status not in ('done', DIVERGED)]
  hours = sum(float(study.planned_hours(r.args)) for r in left)
  machine = getattr(study, 'PLANNED_ON', "the study's estimate")
  return f'planned cost: ~{hours:.1f} h for the {len(left)} runs left ({machine})'


def _command(config_path: str, run: Run, overrides: list[str]) -> list[str]:
  path = os.path.abspath(config_path.partition(':')[0])
  argstr = arg_string(run.args)
  return [sys.executable, '-m', 'experiments.train', f'--config={path}:{argstr}' if argstr else
          f'--config={path}', f'--workdir={run.workdir}', *overrides]


def write_run_record(config_path: str, run: Run, **extra) -> list[str]:
  """<workdir>/sweep.json: the run's arguments and overrides (what Run.conflict compares) and its
  command; returns the command."""
  os.makedirs(run.workdir, exist_ok=True)
  command = _command(config_path, run, list(run.overrides))
  with open(os.path.join(run.workdir, 'sweep.json'), 'w') as f:
    json.dump({'config': config_path.partition(':')[0], 'config_name': run.config_name,
               'args': run.args, 'overrides': list(run.overrides), 'command': command, **extra}, f,
              indent=2)
  return command


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


ONE_PROGRAM_RUN = 'a run of one program with other runs of its sweep (launch.sweep --one_program)'
ONE_PROGRAM_MODES = ('auto', 'never')


def runs_in_a_program(config) -> bool:
  """Whether a trial's config can be a trial of a search program: a federated method (local_only
  has no rounds) on an executor the trial axis can map (not the sharded mesh)."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  return METHODS[config.method].federated and config.executor != 'sharded'


def execution_plan(runs, one_program: str = 'auto') -> list[list[int]]:
  """The trials that run as one program: each group (>= 2 indices into `runs`, [(run, config)]) of
  unfinished trials with one search_program.one_program_key and one latest checkpoint round (0:
  none); a finished one is skipped. Every other trial runs in its own process (execute): a trial
  alone in its group, one that differs from the others in a static field (epochs, keep fraction,
  method, ...), or every trial with one_program='never'."""
  if one_program == 'never':
    return []
  from dp2fedsam_jax import checkpoint, search_program  # pylint: disable=import-outside-toplevel
  groups: dict[tuple, list[int]] = {}
  for index, (run, config) in enumerate(runs):
    status = run.status
    if ((status == 'new' or status.startswith(RESUMES)) and not run.missing_data
        and runs_in_a_program(config)):
      # Trials resume together from one round: their common checkpoint's.
      key = (search_program.one_program_key(config), checkpoint.latest_round(run.workdir))
      groups.setdefault(key, []).append(index)
  return [group for group in groups.values() if len(group) >= 2]


def execute_trials(config_path: str, runs, parallel: int, cache_dir: str,
                   one_program: str = 'auto', ran_as: str = ONE_PROGRAM_RUN) -> dict:
  """Runs the unfinished runs of `runs` ([(run, config)]: a study's trials, a row's final seeds, a
  sweep's grid): each group of execution_plan as one program in this process
  (launch/trial_program.py), then the others one process each (execute; finished ones skipped);
  returns {workdir: status}. `ran_as`: what a program's run is, in its sweep.json."""
  from launch import trial_program  # pylint: disable=import-outside-toplevel
  results, in_programs = {}, set()
  for group in execution_plan(runs, one_program):
    for index in group:  # the trial's arguments and overrides, as a run alone records them
      write_run_record(config_path, runs[index][0], ran_as=ran_as)
    results.update(trial_program.run_trials([runs[i][1] for i in group],
                                            [runs[i][0].workdir for i in group]))
    in_programs.update(group)
  alone = [run for index, (run, _) in enumerate(runs) if index not in in_programs]
  if alone:
    results.update(execute(config_path, alone, parallel, cache_dir))
  return results


def enable_program_cache(root: str) -> None:
  """The programs compiled in this process share the sweep runs' persistent cache (<root>/.jax_cache
  unless the environment chose one): a restarted program loads its compiled steps."""
  from dp2fedsam_jax import compilation_cache  # pylint: disable=import-outside-toplevel
  chosen = any(os.environ.get(v) for v in (compilation_cache.ENV, 'JAX_COMPILATION_CACHE_DIR'))
  jax_cache_log = logging.getLogger('jax._src.compilation_cache')
  level = jax_cache_log.level
  jax_cache_log.setLevel(logging.WARNING)  # its 'Resetting cache' line is no news to the operator
  try:
    compilation_cache.enable(None if chosen else os.path.join(root, '.jax_cache'))
  finally:
    jax_cache_log.setLevel(level)


def run_sweep(config_path: str, root: str, axes, overrides: list[str], parallel: int = 1,
              cache_dir: str | None = None, only: list[str] = (), one_program: str = 'never') -> dict:
  """Runs every unfinished run, `parallel` at a time; returns {workdir: status}.

  cache_dir: a persistent JAX compilation cache shared by the runs (None: none, or the caller's
  JAX_COMPILATION_CACHE_DIR). one_program='auto': the unfinished runs that differ only in searched
  scalars (a ladder of lrs, of rho, ...) and their training_seed run as one compiled program in this
  process, as launch.tune runs a study's trials (each run's files as a run alone writes them; its
  numbers within float32 reassociation of a run alone's); the others one process each.
  """
  runs = planned(config_path, root, axes, overrides, only)
  if one_program == 'never':
    return execute(config_path, [run for run, _ in runs], parallel, cache_dir)
  return execute_trials(config_path, runs, parallel, cache_dir, one_program)


def execute(config_path: str, runs: list[Run], parallel: int = 1,
            cache_dir: str | None = None) -> dict:
  """Runs every unfinished run of `runs` (each with its own overrides), `parallel` at a time, under
  the sweep's rules (skips finished runs and runs in use, refuses conflicts, forwards Ctrl-C);
  returns {workdir: status}. launch/tune.py runs its trials through it."""
  results = {}
  pending = []
  for run in runs:
    status = run.status
    if status == 'done':
      results[run.workdir] = 'skipped (done)'
      _log(f'skip    {run.workdir} (finished: round {run.num_rounds})')
    elif status == DIVERGED:
      results[run.workdir] = f'failed (diverged at round {run.diverged_at}; not run again)'
      _log(f'skip    {run.workdir} (diverged at round {run.diverged_at}: a rerun repeats it)')
    elif status.startswith('conflict'):
      results[run.workdir] = f'failed ({status})'
      _log(f'FAILED  {run.workdir}: {status}')
    elif status.startswith('in use'):
      results[run.workdir] = f'skipped ({status})'
      _log(f'skip    {run.workdir} ({status})')
    else:
      pending.append(run)
  running: list[tuple[Run, subprocess.Popen, float, object]] = []
  env = {**os.environ, 'PYTHONUNBUFFERED': '1'}
  if cache_dir and 'JAX_COMPILATION_CACHE_DIR' not in env:
    env.update(JAX_COMPILATION_CACHE_DIR=os.path.abspath(cache_dir),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')
  total = len(pending)
  received = []  # the stop signal that reached the sweep: its runs get the same
  with _stop_signals(received):
    try:
      _run_pending(config_path, parallel, pending, running, results, env, total)
    except KeyboardInterrupt:
      signum = received[0] if received else signal.SIGINT
      _stop_running(running, results, signum)
      finished = sum(1 for s in results.values() if s in ('ran', 'skipped (done)'))
      by = 'terminated (SIGTERM)' if signum == signal.SIGTERM else 'interrupted'
      raise stopping.Interrupted(
          f'{by}: {finished} of {len(runs)} runs finished, {len(running)} stopped at a round '
          f'boundary with their checkpoints intact, {len(pending)} not started; rerun the same '
          'command to resume',
          stopping.EXIT_TERMINATED if signum == signal.SIGTERM else stopping.EXIT_INTERRUPTED
      ) from None
  return results


@contextlib.contextmanager
def _stop_signals(received: list):
  """SIGINT and SIGTERM raise KeyboardInterrupt in the sweep (main thread), noting which came."""
  def handler(signum, frame):
    del frame
    received.append(signum)
    raise KeyboardInterrupt
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {s: signal.signal(s, handler) for s in stopping.STOP_SIGNALS}
  try:
    yield
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


def _stop_running(running, results, signum=signal.SIGINT) -> None:
  """Ctrl-C / SIGTERM: forwarded to every running run, which stops after its current round and
  checkpoints it; the sweep waits for them (the same signal again: they stop at once)."""
  name = 'SIGTERM' if signum == signal.SIGTERM else 'Ctrl-C'
  for _, process, _, _ in running:
    if process.poll() is None:
      process.send_signal(signum)  # the runs are in their own process groups
  _log(f'{name}: {len(running)} running run(s) stop after their current round; {name} again '
       'stops them at once')
  while any(process.poll() is None for _, process, _, _ in running):
    try:
      time.sleep(0.2)
    except KeyboardInterrupt:
      for _, process, _, _ in running:
        if process.poll() is None:
          process.send_signal(signum)
  for run, process, _, log in running:
    log.close()
    results[run.workdir] = f'interrupted (exit {process.returncode})'
    with open(os.path.join(run.workdir, 'train.log')) as f:
      last = (f.read().splitlines() or [''])[-1]
    _log(f'stopped {run.workdir}: {last}')


def _run_pending(config_path, parallel, pending, running, results, env, total) -> None:
  started = 0
  while pending or running:
    while pending and len(running) < max(1, parallel):
      run = pending.pop(0)
      started += 1
      held = run.holder()
      if held is not None:  # started elsewhere since the plan: its writer owns the workdir
        results[run.workdir] = f'skipped (in use by pid {held})'
        _log(f'skip    {run.workdir} (in use by pid {held}; not started)')
        continue
      # Finished since the plan (copied in, or by another sweep): train.py would train it again
      # from scratch when it finds no checkpoint, as in a run copied in without one.
      if run.rounds_done >= run.num_rounds:
        results[run.workdir] = 'skipped (done)'
        _log(f'skip    {run.workdir} (finished since the plan: round {run.num_rounds})')
        continue
      command = write_run_record(config_path, run)
      log = open(os.path.join(run.workdir, 'train.log'), 'a')
      log.write(f'\n=== {time.strftime("%Y-%m-%d %H:%M:%S")} {run.status}: {" ".join(command)}\n')
      log.flush()
      _log(f'start   [{started}/{total}] {run.workdir} ({run.status})')
      # Its own process group: a Ctrl-C reaches the sweep only, which forwards it once. Set by
      # process_group, not preexec_fn=os.setpgrp: no Python runs between fork and exec in a parent
      # with JAX's threads (preexec_fn made JAX warn of a deadlock at every start).
      process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 process_group=0)
      running.append((run, process, time.perf_counter(), log))
    time.sleep(0.2)
    for item in list(running):
      run, process, t0, log = item
      if process.poll() is None:
        continue
      running.remove(item)
      log.close()
      seconds = time.perf_counter() - t0
      if process.returncode == 0 and run.rounds_done >= run.num_rounds:
        results[run.workdir] = 'ran'
        _log(f'done    {run.workdir} ({seconds:.0f} s)')
      else:
        results[run.workdir] = f'failed (exit {process.returncode})'
        _log(f'FAILED  {run.workdir} (exit {process.returncode}, {seconds:.0f} s); last lines of '
             f'{os.path.join(run.workdir, "train.log")}:')
        with open(os.path.join(run.workdir, 'train.log')) as f:
          for line in f.read().splitlines()[-8:]:
            _log(f'        {line}')


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Registers the flags. Only the program does this, so that importing the module (tests, or a
  sweep and a report in one process) never defines a second --root (tests/test_docs.py parses
  into a fresh FlagValues)."""
  fv = {'flag_values': flag_values}
  flags.DEFINE_string('config', None, 'Config file (experiments/configs/*.py), optionally with '
                      'fixed arguments: path.py:key=value,...', **fv)
  flags.DEFINE_string('root', None, 'Root directory of the workdirs.', **fv)
  flags.DEFINE_list('methods', None, 'Methods (replaces `method` in the grid).', **fv)
  flags.DEFINE_list('seeds', None, 'Seeds (replaces `seed` in the grid).', **fv)
  flags.DEFINE_list('eps', None, 'Target epsilons (replaces `eps` in the grid).', **fv)
  flags.DEFINE_multi_string('only', [], 'Keep the grid entries whose key has this value (one of '
                            'these), key=value[,value...] (e.g. --only=dataset=cifar10 '
                            '--only=method=dp2fedsam,centaur); several --only keep what all keep.',
                            **fv)
  flags.DEFINE_multi_string('grid', [], 'Another axis, key=v1,v2,... (config argument).', **fv)
  flags.DEFINE_integer('parallel', 1, 'Runs at a time (subprocesses). A CPU run whose steps are '
                       'small GEMMs (the char LSTMs) uses one core: one run per core pays there (2 on '
                       '2 cores: 1.4x the runs per hour); a conv model spreads over every core: 2 at '
                       'a time gave 1.06x the rounds per hour on 2 cores (1.15x with each run pinned '
                       'to its own core; benchmarks/runs_at_a_time.py): keep 1.', **fv)
  flags.DEFINE_bool('compilation_cache', True, 'Share a persistent JAX compilation cache '
                    '(<root>/.jax_cache) between the runs: seeds of one setting compile the same '
                    'programs. Ignored when JAX_COMPILATION_CACHE_DIR or '
                    'DP2FEDSAM_COMPILATION_CACHE is already set.', **fv)
  flags.DEFINE_enum('one_program', 'never', ONE_PROGRAM_MODES, 'auto: the runs that differ only '
                    'in searched scalars (search_program.SEARCHED, lam) and training_seed run as one '
                    'compiled program in this process; never: one process per run.', **fv)
  flags.DEFINE_bool('plan', False, 'Print the runs and their status, run nothing.', **fv)
  flags.DEFINE_string('seed_from', None, 'A folder of committed runs (a report\'s runs/, from '
                      '--copy_runs): its finished runs are copied into the same, empty workdirs '
                      'under --root first, so the sweep skips them; nothing is overwritten.', **fv)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl does not know --config.x=y: keep them aside for the runs, parse the rest."""
  _overrides.extend(a for a in argv[1:] if a.startswith(OVERRIDE_PREFIX))
  return FLAGS([a for a in argv if not a.startswith(OVERRIDE_PREFIX)])


def _axes(f: flags.FlagValues = FLAGS) -> list[tuple[str, list]]:
  axes = []
  if f.methods:
    axes.append(('method', f.methods))
  if f.seeds:
    axes.append(('seed', [int(s) for s in f.seeds]))
  if f.eps:
    axes.append(('eps', [float(e) for e in f.eps]))
  for item in f.grid:
    key, _, values = item.partition('=')
    if not values:
      raise app.UsageError(f'--grid={item}: expected key=v1,v2,...')
    axes.append((key, [parse_literal(v) for v in values.split(',')]))
  return axes


def _check_methods(methods) -> None:
  """An unknown name in --methods fails before anything runs, naming the closest method."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  for name in methods or ():
    if name not in METHODS:
      guess = cli.closest_field(name, sorted(METHODS))
      hint = f'did you mean {guess}? ' if guess else ''
      raise ValueError(f'--methods: unknown method {name!r}; {hint}choose from {sorted(METHODS)}')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  _check_methods(FLAGS.methods)
  if FLAGS.seed_from:
    runs = plan(FLAGS.config, FLAGS.root, _axes(), _overrides, FLAGS.only)
    for workdir, path in seed_from(runs, FLAGS.root, FLAGS.seed_from):
      _log(f'seeded  {workdir} from {path}')
  if FLAGS.plan:
    runs = plan(FLAGS.config, FLAGS.root, _axes(), _overrides, FLAGS.only)
    for run in runs:
      data = f'  [no data: {run.missing_data}]' if run.missing_data and run.status != 'done' else ''
      print(f'{run.status:24s} {run.workdir}{data}')
    print(f'plan: {plan_summary(runs)}')
    cost = planned_cost(FLAGS.config, runs)
    if cost:
      print(cost)
    return
  cache_dir = os.path.join(FLAGS.root, '.jax_cache') if FLAGS.compilation_cache else None
  if FLAGS.one_program == 'auto' and FLAGS.compilation_cache:
    enable_program_cache(FLAGS.root)
  results = run_sweep(FLAGS.config, FLAGS.root, _axes(), _overrides, FLAGS.parallel, cache_dir,
                      FLAGS.only, FLAGS.one_program)
  failed = [w for w, s in results.items() if s.startswith('failed')]
  counts = {s: sum(1 for v in results.values() if v == s) for s in sorted(set(results.values()))}
  _log(f'sweep: {len(results)} runs: {counts}')
  if failed:
    sys.exit(f'{len(failed)} run(s) failed: see train.log in ' + ', '.join(failed))


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['config', 'root'])
  cli.run(main, flags_parser=_parse_flags)
