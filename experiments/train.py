r"""Runs one experiment: `python -m experiments.train --config=experiments/configs/default.py --workdir=DIR`.

Override any field with `--config.<field>=<value>`, e.g. `--config.method=centaur --config.dp.clip_norm=0.2`,
or pass arguments to the config file: `--config=experiments/configs/default.py:eps=2`.

Multi-host (`--config.executor=sharded`, the cohort split over the devices of all processes): run the
same command on every host with `--distributed` (on Cloud TPU / SLURM the other flags are found
automatically), or `--distributed --coordinator_address=host0:1234 --num_processes=2 --process_id=i`.
"""

import json
import sys

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from dp2fedsam_jax import train

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where config.json, metrics.jsonl and checkpoints go.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the model size and privacy parameters as one '
                             'JSON line, then exit without training.')
_DISTRIBUTED = flags.DEFINE_bool('distributed', False, 'Call jax.distributed.initialize first '
                                  '(multi-host runs; use with --config.executor=sharded).')
_COORDINATOR = flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (None: '
                                   'auto-detected on Cloud TPU / SLURM / Open MPI).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Number of processes (None: auto).')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process\'s index (None: auto).')
_COORDINATOR_BIND = flags.DEFINE_string('coordinator_bind_address', None, 'host:port the coordinator '
                                        '(process 0) listens on (None: every interface, at the port '
                                        'of --coordinator_address).')


def main(argv):
  del argv
  if _DISTRIBUTED.value:  # before any other JAX call: it fixes the global device list
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                               num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
                               coordinator_bind_address=_COORDINATOR_BIND.value)
  config = _CONFIG.value
  if _DRY_RUN.value:
    print(json.dumps(train.describe(config)))  # reads no data
    return
  if not _WORKDIR.value:
    sys.exit('--workdir is required (where config.json, metrics.jsonl and checkpoints are written).')
  logging.set_verbosity(logging.INFO)
  final = train.train_and_evaluate(config, _WORKDIR.value)
  print(json.dumps(final))


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main)
