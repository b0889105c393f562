r"""Runs one experiment: `python -m experiments.train --config=experiments/configs/default.py --workdir=DIR`.

Every config field with its value and a line of help: add `--print_config` (and nothing runs; the
config is validated first). Every method, model, dataset and partition: `--list` (with `--config=<file>`,
the ones that file registers too; docs/extending.md).
Override any field with `--config.<field>=<value>`, e.g. `--config.method=centaur --config.dp.clip_norm=0.2`
(`None` unsets an optional one: `--config.dp.target_epsilon=None --config.dp.noise_multiplier=1.0`),
or pass arguments to the config file: `--config=experiments/configs/default.py:eps=2`.

The console shows the run header, one line per evaluation and, on a terminal, a progress line; the
whole log (orbax's lines at every checkpoint, JAX's) goes to `<workdir>/train.INFO` (or --log_dir);
`--alsologtostderr` or `-v 1` shows it on the console too.

An error prints one line `error: ...` and exits with 2 (`-v 1` or DP2FEDSAM_TRACEBACK=1: with the
traceback). Ctrl-C or SIGTERM stops at the end of the current round, checkpoints it and exits with 130
(Ctrl-C) or 143 (SIGTERM); the same command resumes. A second run on a workdir in use exits with 2,
naming the pid that holds it. A failed run leaves `failure.json` (error, message, round) in its
workdir for experiments/report/.

Compiled programs are kept in a persistent cache (`--compilation_cache`, default
~/.cache/dp2fedsam_jax/jax_cache; `off` turns it off): a restart loads them instead of compiling.

Multi-host (`--config.executor=sharded`, the cohort split over the devices of all processes): run the
same command on every host with `--distributed` (on Cloud TPU / SLURM the other flags are found
automatically), or `--distributed --coordinator_address=host0:1234 --num_processes=2 --process_id=i`.
"""

import json
import os
import re

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from dp2fedsam_jax import cli
from dp2fedsam_jax.config_help import describe_config

FAILURE_FILE = 'failure.json'


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Registers the flags (on a fresh FlagValues in tests/test_docs.py)."""
  config_flags.DEFINE_config_file('config', None, 'Experiment config file (see --print_config).',
                                  lock_config=True, flag_values=flag_values)
  flags.DEFINE_string('workdir', None, 'Where config.json, metrics.jsonl, train_metrics.jsonl, '
                      'checkpoints and the log file go.',
                      flag_values=flag_values)
  flags.DEFINE_bool('dry_run', False, 'Print the model size and privacy parameters as one '
                    'JSON line (a token dataset: its client count and size quantiles first), then '
                    'exit without training.', flag_values=flag_values)
  flags.DEFINE_bool('print_config', False, 'Validate the config, then print every field (after the '
                    'file arguments and --config.x overrides) with a line of help, and exit.',
                    flag_values=flag_values)
  flags.DEFINE_bool('list', False, 'Print every registered method (one line each), model, dataset '
                    'and partition, then exit; with --config=<file>, those the file registers too.',
                    flag_values=flag_values)
  flags.DEFINE_string('compilation_cache', None, 'Persistent JAX compilation cache: a directory, '
                      'or off. Default: $DP2FEDSAM_COMPILATION_CACHE, else $JAX_COMPILATION_CACHE_DIR, '
                      'else $XDG_CACHE_HOME/dp2fedsam_jax/jax_cache (~/.cache/...).',
                      flag_values=flag_values)
  flags.DEFINE_bool('distributed', False, 'Call jax.distributed.initialize first '
                    '(multi-host runs; use with --config.executor=sharded).', flag_values=flag_values)
  flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (None: '
                      'auto-detected on Cloud TPU / SLURM / Open MPI).', flag_values=flag_values)
  flags.DEFINE_integer('num_processes', None, 'Number of processes (None: auto).',
                       flag_values=flag_values)
  flags.DEFINE_integer('process_id', None, 'This process\'s index (None: auto).',
                       flag_values=flag_values)
  flags.DEFINE_string('coordinator_bind_address', None, 'host:port the coordinator (process 0) '
                      'listens on (None: every interface, at the port of --coordinator_address).',
                      flag_values=flag_values)


def write_failure(workdir: str, error: BaseException) -> None:
  """failure.json: what stopped the run, for experiments/report/ (removed by the next start)."""
  match = re.search(r'\bround (\d+)\b', str(error))
  record = {'error': type(error).__name__, 'message': str(error),
            'round': int(match.group(1)) if match else None}
  try:
    with open(os.path.join(workdir, FAILURE_FILE), 'w') as f:
      json.dump(record, f, indent=2)
  except OSError:
    pass  # the workdir itself is the problem; the error line says so


def run(f: flags.FlagValues = flags.FLAGS) -> None:
  """What the binary does with parsed flags."""
  config = f.config
  if f.list:
    from dp2fedsam_jax import api  # pylint: disable=import-outside-toplevel  (JAX: after the flags)
    print(api.listing())
    return
  if config is None:
    raise app.UsageError('--config is required (an experiment config file, e.g. '
                         'experiments/configs/default.py); --list needs none.')
  if f.print_config:
    from dp2fedsam_jax import config as config_lib  # pylint: disable=import-outside-toplevel
    config_lib.validate_config(config)  # a typo fails here, as it would at the start of the run
    print(describe_config(config, f'{config_flags.get_config_filename(f["config"])}, resolved',
                          config_lib.field_help()))
    return
  # pylint: disable=import-outside-toplevel  (JAX: after the flags)
  import jax
  from dp2fedsam_jax import compilation_cache, run_files, sharding, train
  if config.executor == 'sharded':  # on a CPU: one device per core unless a count was chosen
    sharding.one_cpu_device_per_core()
  if f.distributed:  # before any other JAX call: it fixes the global device list
    jax.distributed.initialize(coordinator_address=f.coordinator_address,
                               num_processes=f.num_processes, process_id=f.process_id,
                               coordinator_bind_address=f.coordinator_bind_address)
  if f.dry_run:
    info = train.describe(config)  # reads no data but a token dataset's (its clients' sizes)
    sizes = info.pop('client_sizes', None)
    if sizes:
      print(sizes)
    print(json.dumps(info))
    return
  workdir = f.workdir
  if not workdir:
    raise app.UsageError('--workdir is required (where config.json, metrics.jsonl and checkpoints '
                         'are written).')
  train.validate_config(config, train.METHODS)  # a bad field fails before the workdir is made
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ValueError(f'--workdir={workdir}: cannot create it ({e.strerror}: {e.filename})') from e
  with run_files.hold(workdir):  # one writer per workdir: nothing is written there before this
    if os.path.exists(os.path.join(workdir, FAILURE_FILE)):
      os.remove(os.path.join(workdir, FAILURE_FILE))
    logging.set_verbosity(logging.INFO)
    # The log file goes to the workdir; other processes of a multi-host run do not write there.
    log_dir = flags.FLAGS['log_dir'].value or (workdir if jax.process_index() == 0 else None)
    log_file = cli.log_to_file(log_dir, 'train')
    if log_file and not cli.shows_everything_on_stderr():
      logging.info('Full log (orbax and JAX lines too): %s; --alsologtostderr shows it here.',
                   log_file)
    logging.info('Persistent compilation cache: %s',
                 compilation_cache.enable(f.compilation_cache) or 'off')
    try:
      final = train.train_and_evaluate(config, workdir, validated=True)
    except Exception as e:  # pylint: disable=broad-except
      write_failure(workdir, e)
      raise
  print(train.summary(final, workdir))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  run(flags.FLAGS)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
