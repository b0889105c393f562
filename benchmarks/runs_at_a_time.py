"""Runs an hour on this CPU: one training run at a time, or one per core.

  python3 -m benchmarks.runs_at_a_time --json_out=benchmarks/results/cpu-2core-epyc-quiet/runs_at_a_time.json

A sweep on a few cores can run its runs one at a time (XLA spreads one run over every core) or k at
a time. Which gives more runs an hour depends on how much of a round XLA parallelises, so this
measures it on a real experiment (default: a trial of the fair benchmark's block (a5), DP2-FedSAM
on Fashion-MNIST (1000, 5)) in four modes, each for --rounds rounds in a temporary workdir:

  alone          one run, every core
  alone_pinned   one run on one core (its serial speed)
  together       one run per core at once, unpinned (the OS places the threads)
  pinned         one run per core at once, each pinned to its own core (taskset)

and prints the median round seconds of each run (rounds after the first 3), the wall time of each
mode, and the rounds an hour of the machine against `alone`. Run it on a quiet machine (the load is
recorded). Pinning needs Linux's `taskset` (util-linux).
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from dp2fedsam_jax import metric_writers

_CONFIG = flags.DEFINE_string(
    'config', 'experiments/configs/fair_a5_dp2fedsam.py:eps=0.25,method=dp2fedsam',
    'The experiment (experiments.train --config).')
_ROUNDS = flags.DEFINE_integer('rounds', 16, 'Rounds a run (the first 3 are not timed).')
_EXTRA = flags.DEFINE_list('overrides', ['--config.validation_fraction=0.1'],
                           'More experiments.train arguments.')
_JSON_OUT = flags.DEFINE_string('json_out', None, 'Where to write the numbers.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Check the experiment (experiments.train --dry_run) '
                             'and print each mode\'s commands as JSON; time nothing.')

WARM_UP_ROUNDS = 3


def _command(workdir: str, core: int | None) -> list[str]:
  pin = ['taskset', '-c', str(core)] if core is not None else []
  return pin + [sys.executable, '-m', 'experiments.train', f'--config={_CONFIG.value}',
                f'--workdir={workdir}', f'--config.num_rounds={_ROUNDS.value}',
                f'--config.eval_every={_ROUNDS.value}', *_EXTRA.value]


def _rounds(workdir: str) -> list[dict]:
  return metric_writers.read_jsonl(os.path.join(workdir, metric_writers.TRAIN_FILE))


def _runs_at_once(scratch: str, name: str, cores: list[int | None]) -> dict:
  """Starts one run per entry of `cores` (None: unpinned) at once; waits for all."""
  start = time.perf_counter()
  workdirs = [os.path.join(scratch, f'{name}{i}') for i in range(len(cores))]
  procs = []
  for workdir, core in zip(workdirs, cores):
    with open(workdir + '.log', 'w') as log:
      procs.append(subprocess.Popen(_command(workdir, core), stdout=log, stderr=subprocess.STDOUT))
  for proc, workdir in zip(procs, workdirs):
    if proc.wait() != 0:
      raise RuntimeError(f'{name}: a run failed; see {workdir}.log')
  wall = time.perf_counter() - start
  runs = [_rounds(w) for w in workdirs]
  seconds = [statistics.median(r['seconds'] for r in run[WARM_UP_ROUNDS:]) for run in runs]
  return {'runs': len(cores), 'pinned': [c for c in cores if c is not None] or None,
          'median_round_seconds': [round(s, 3) for s in seconds], 'wall_seconds': round(wall, 1),
          'rounds_per_hour': round(sum(3600 / s for s in seconds), 1),
          # the same run on other thread counts differs in float rounding: this shows whether it did
          'last_train_loss': [run[-1]['train_loss'] for run in runs]}


def _modes() -> dict[str, list[int | None]]:
  """Each mode's runs, as the core each is pinned to (None: unpinned)."""
  cores = sorted(os.sched_getaffinity(0))
  return {'alone': [None], 'alone_pinned': [cores[0]], 'together': [None] * len(cores),
          'pinned': cores}


def dry_run() -> dict:
  with tempfile.TemporaryDirectory() as scratch:
    check = subprocess.run(_command(os.path.join(scratch, 'check'), None) + ['--dry_run'],
                           capture_output=True, text=True, check=False)
  if check.returncode != 0:
    raise RuntimeError(f'experiments.train --dry_run failed:\n{check.stderr[-2000:]}')
  return {'modes': {name: [' '.join(_command(f'<workdir {i}>', core)) for i, core in enumerate(cores)]
                    for name, cores in _modes().items()}}


def measure() -> dict:
  if shutil.which('taskset') is None:
    raise RuntimeError('pinning needs taskset (Debian: apt-get install util-linux)')
  modes = _modes()
  cores = modes['pinned']
  result = {'config': _CONFIG.value, 'overrides': _EXTRA.value, 'rounds': _ROUNDS.value,
            'cores': len(cores), 'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
            'load_before': os.getloadavg()[0], 'modes': {}}
  with tempfile.TemporaryDirectory() as scratch:
    for name, cores_of_mode in modes.items():
      result['modes'][name] = _runs_at_once(scratch, name, cores_of_mode)
      print(name, result['modes'][name], flush=True)
  base = result['modes']['alone']['rounds_per_hour']
  for mode in result['modes'].values():
    mode['throughput_vs_alone'] = round(mode['rounds_per_hour'] / base, 2)
  result['load_after'] = os.getloadavg()[0]
  return result


def main(argv):
  del argv
  if _DRY_RUN.value:
    print(json.dumps(dry_run()))
    return
  result = measure()
  for name, mode in result['modes'].items():
    print(f"{name:13s} {mode['runs']} run(s): round {mode['median_round_seconds']} s, wall "
          f"{mode['wall_seconds']} s, {mode['rounds_per_hour']} rounds/h = "
          f"{mode['throughput_vs_alone']}x alone")
  if _JSON_OUT.value:
    os.makedirs(os.path.dirname(_JSON_OUT.value) or '.', exist_ok=True)
    with open(_JSON_OUT.value, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  app.run(main)
