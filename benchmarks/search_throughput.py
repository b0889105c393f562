r"""A search as one compiled program against one process per trial: trials an hour, and agreement.

K trials of the Fashion-MNIST CNN (experiments/configs/default.py's model and data, a short
federation), drawn from a log-uniform space of client lr, server lr and C, each at its own training
seed, run twice:

  one_program            this process: one data load, one compile, every trial a mapped axis of the
                         round step (dp2fedsam_jax/search_program.py)
  one_process_per_trial  `python3 -m experiments.train` once per trial, as launch.tune runs a study
                         today: import, data load and compile each time (the persistent compilation
                         cache does not help: each trial's scalars are constants of its program)

Writes benchmarks/results/<machine>-<date>/search_throughput.json: modes.<mode>.trials_per_hour and
seconds, max_rel_diff (the largest relative difference of a trial's final test accuracy between the
two modes), device.platform, model, K and rounds.

  python3 -m benchmarks.search_throughput                    # K = 16, 3 rounds (~10 min on 2 cores)
  python3 -m benchmarks.search_throughput --trials=4 --rounds=2 --num_clients=40 --out=/tmp/st
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

from dp2fedsam_jax import host, metric_writers
from experiments import config_files

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, 'experiments', 'configs', 'default.py')
SPACE = {'local.lr_shared': (0.01, 0.2), 'server_lr': (0.3, 3.0), 'dp.clip_norm': (0.05, 1.0)}


def trial_overrides(num_trials: int, rounds: int, num_clients: int, seed: int = 0) -> list[list[str]]:
  """Each trial's --config.x=y overrides: a short federation, its drawn scalars, its seed."""
  rng = np.random.default_rng(seed)
  common = [f'--config.num_rounds={rounds}', f'--config.eval_every={rounds}',
            f'--config.num_clients={num_clients}', '--config.sampling_rate=0.1',
            '--config.checkpoint_every=1000']
  out = []
  for _ in range(num_trials):
    drawn = {f: float(f'{math.exp(rng.uniform(math.log(lo), math.log(hi))):.4g}')
             for f, (lo, hi) in SPACE.items()}
    out.append(common + [f'--config.{f}={v}' for f, v in drawn.items()]
               + [f'--config.training_seed={2**32 + int(rng.integers(2**31))}'])
  return out


def configs_of(overrides: list[list[str]]):
  module = config_files.load_config_module(CONFIG)
  return [config_files.apply_overrides(module.get_config(), o) for o in overrides]


def run_one_program(overrides) -> tuple[float, list[float]]:
  """(seconds from the first import of the engine to the last evaluation, each trial's accuracy)."""
  start = time.perf_counter()
  from dp2fedsam_jax import search_program  # pylint: disable=import-outside-toplevel
  program = search_program.SearchProgram.of_configs(configs_of(overrides))
  final = {}
  program.run(on_eval=lambda done, records: final.update(records))
  seconds = time.perf_counter() - start
  return seconds, [float(a) for a in np.asarray(final['test_accuracy'])]


def run_one_process_per_trial(overrides, workdir: str) -> tuple[float, list[float]]:
  """(wall seconds of the K processes, each trial's final test accuracy from its metrics)."""
  accuracies, start = [], time.perf_counter()
  for k, extra in enumerate(overrides):
    trial_dir = os.path.join(workdir, f'trial={k}')
    subprocess.run([sys.executable, '-m', 'experiments.train', f'--config={CONFIG}',
                    f'--workdir={trial_dir}', *extra], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    record = metric_writers.read_jsonl(os.path.join(trial_dir, metric_writers.EVAL_FILE))[-1]
    accuracies.append(float(record['test_accuracy']))
  return time.perf_counter() - start, accuracies


def max_rel_diff(a: list[float], b: list[float]) -> float:
  return max(abs(x - y) / max(abs(y), 1e-9) for x, y in zip(a, b))


def measure(num_trials: int, rounds: int, num_clients: int, workdir: str) -> dict:
  overrides = trial_overrides(num_trials, rounds, num_clients)
  per_trial_seconds, per_trial = run_one_process_per_trial(overrides, workdir)
  program_seconds, program = run_one_program(overrides)
  config = configs_of(overrides[:1])[0]
  mode = lambda seconds: {'seconds': seconds, 'trials_per_hour': num_trials * 3600 / seconds}  # noqa: E731
  return {
      'benchmark': 'search_throughput', 'model': config.model, 'dataset': config.dataset,
      'method': config.method, 'num_clients': num_clients, 'sampling_rate': config.sampling_rate,
      'K': num_trials, 'rounds': rounds, 'space': {f: list(r) for f, r in SPACE.items()},
      'modes': {'one_program': mode(program_seconds),
                'one_process_per_trial': mode(per_trial_seconds)},
      'speedup': per_trial_seconds / program_seconds,
      'test_accuracy': {'one_program': program, 'one_process_per_trial': per_trial},
      'max_rel_diff': max_rel_diff(program, per_trial),
      'device': host.describe(),
  }


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as workdir:
    result = measure(FLAGS.trials, FLAGS.rounds, FLAGS.num_clients, workdir)
  day = datetime.date.today().isoformat()
  out = FLAGS.out or os.path.join(ROOT, 'benchmarks', 'results',
                                  f'{result["device"]["platform"]}-{host.usable_cores()}core-{day}')
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, 'search_throughput.json')
  with open(path, 'w') as f:
    json.dump(result, f, indent=2)
  modes = result['modes']
  print(f"K = {result['K']} trials of {result['model']}, {result['rounds']} rounds: one program "
        f"{modes['one_program']['trials_per_hour']:.0f} trials/h, one process per trial "
        f"{modes['one_process_per_trial']['trials_per_hour']:.0f} trials/h "
        f"({result['speedup']:.2f}x); max relative difference {result['max_rel_diff']:.2e} -> {path}")


if __name__ == '__main__':
  flags.DEFINE_integer('trials', 16, 'K: trials of the search.')
  flags.DEFINE_integer('rounds', 3, 'Rounds of each trial.')
  flags.DEFINE_integer('num_clients', 100, 'Clients of the federation (q = 0.1).')
  flags.DEFINE_string('out', None, 'Folder of the JSON (default benchmarks/results/<machine>-<date>).')
  app.run(main)
