r"""Empirical privacy audit: `python -m experiments.audit --config=experiments/configs/audit.py`.

Adds config.audit.num_canaries canary clients to the federation, runs the real round step
config.audit.num_trials times with each canary in or out at random, and prints one table row per
setting: the accounted epsilon next to every lower bound and estimate (docs/privacy.md, section 5),
and with `--config.audit.estimate_every=K` a table of one run's estimates after every K rounds.
`--table` runs every setting of the config file's audit_grid(). Exits non-zero if a lower bound
exceeds the accounted epsilon. Override fields as for training:
`--config.dp.noise_multiplier=0.5 --config.audit.num_trials=40`.
"""

import dataclasses
import json
import math
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from dp2fedsam_jax import cli
from dp2fedsam_jax import train
from dp2fedsam_jax import canaries
from dp2fedsam_jax.config_help import describe_config
from experiments import config_files

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Only the program registers flags: importing this module must not define --config twice
  (tests/test_docs.py parses into a fresh FlagValues)."""
  fv = {'flag_values': flag_values}
  config_flags.DEFINE_config_file('config', 'experiments/configs/audit.py', 'Audit config file.',
                                  lock_config=False, **fv)
  flags.DEFINE_bool('table', False, "Audit every entry of the config file's audit_grid() (the "
                    'file is reloaded with each entry as its argument; --config.x overrides are '
                    'ignored then).', **fv)
  flags.DEFINE_string('out', None, 'Also append each result as a JSON line to this file.', **fv)
  flags.DEFINE_bool('print_config', False, 'Print every field of the (first) audited config with '
                    'a line of help, then exit.', **fv)


def configs_to_audit(f: flags.FlagValues = FLAGS) -> list:
  """The config of --config, or with --table one per entry of the file's audit_grid()."""
  if not f.table:
    return [f.config]
  path = config_flags.get_config_filename(f['config'])
  module = config_files.load_config_module(path)
  return [module.get_config(config_files.arg_string(e)) for e in module.audit_grid()]


def audit_one(config) -> canaries.AuditResult:
  exp = train.build_experiment(config)
  return canaries.run_audit(exp, canaries.AuditSettings.from_config(config))


def _strict_json(value):
  """NaN (a bound or estimate not computed) as null: strict JSON has no NaN."""
  if isinstance(value, float) and math.isnan(value):
    return None
  if isinstance(value, dict):
    return {k: _strict_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_strict_json(v) for v in value]
  return value


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  configs = configs_to_audit(FLAGS)
  if FLAGS.print_config:
    print(describe_config(configs[0], f'{config_flags.get_config_filename(FLAGS["config"])}, '
                          'resolved'))
    return
  print(canaries.TABLE_HEADER, flush=True)
  violations, along_run = [], []
  for config in configs:
    result = audit_one(config)
    print(result.row(), flush=True)
    if len(result.along_run) > 1:
      along_run.append(f'\nOne run along the way ({result.method} {result.sampling} '
                       f'{result.noise_placement}, σ {result.noise_multiplier:g}, q '
                       f'{result.sampling_rate:g}):\n{result.along_run_table()}')
    if FLAGS.out:
      with open(FLAGS.out, 'a') as f:
        f.write(json.dumps(_strict_json(dataclasses.asdict(result))) + '\n')
    if result.exceeded():
      violations.append(f'{result.row()}  exceeded: {", ".join(result.exceeded())}')
  if along_run:
    print('\n'.join(along_run), flush=True)
  if violations:
    sys.exit('a lower bound exceeds the accounted epsilon (the implementation leaks more than it '
             'accounts, or a caveat applies):\n' + '\n'.join(violations))


if __name__ == '__main__':
  define_flags()
  cli.run(main)
