r"""Re-evaluates a run's last checkpoint under another test-time protocol, without training.

  python3 -m experiments.evaluate --workdir=W --config.eval.adapt_epochs=10 --config.eval.adapt_lr=0.1

The run's config comes from W/config.json; only the protocol (`--config.eval.*`) and the clients
tested (`--config.eval_clients`) may be set here: anything else would be another run. The state is
the last checkpoint's (a finished run keeps its final shared parameters and personal heads there),
tested with the run's own evaluation key of that round, so the default protocol repeats the run's
own last record. Each evaluation appends one line to W/evaluations.jsonl (the run's metrics.jsonl
is never touched): the round, the protocol (`eval.*`), epsilon and the evaluation's metrics.
docs/evaluation.md.
"""

from __future__ import annotations

import json
import math
import os
import time

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from dp2fedsam_jax import cli
from dp2fedsam_jax.config import base_config

EVALUATIONS_FILE = 'evaluations.jsonl'
# The fields a re-evaluation may set: how each client's model is tested, and which clients.
SETTABLE = ('eval.', 'eval_clients')


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  flags.DEFINE_string('workdir', None, 'A run\'s workdir (config.json and checkpoints/).',
                      flag_values=flag_values)
  config_flags.DEFINE_config_dict('config', base_config(), 'Only --config.eval.* and '
                                  '--config.eval_clients: the protocol to test with.',
                                  flag_values=flag_values)


def run_config(workdir: str, overrides: dict):
  """The run's config (config.json over base_config()) with `overrides` ({'eval.adapt_epochs': 10})."""
  from dp2fedsam_jax import run_files  # pylint: disable=import-outside-toplevel
  path = os.path.join(workdir, run_files.CONFIG_FILE)
  if not os.path.exists(path):
    raise ValueError(f'--workdir={workdir}: no {run_files.CONFIG_FILE}; is it a run\'s workdir?')
  bad = sorted(k for k in overrides if not k.startswith(SETTABLE))
  if bad:
    raise ValueError(f'--config.{bad[0]}: a re-evaluation sets only --config.eval.* and '
                     '--config.eval_clients; other fields would make another run (train it with '
                     'experiments.train).')
  with open(path) as f:
    recorded = run_files.flatten(json.load(f))
  config = base_config()
  for key, value in {**recorded, **overrides}.items():
    node = config
    *parents, leaf = key.split('.')
    for p in parents:
      node = node.get(p) if node is not None else None
    if node is not None and leaf in node:  # a field of another version is left out
      node[leaf] = value
  return config


def evaluate_workdir(workdir: str, overrides: dict | None = None) -> dict:
  """Evaluates the last checkpoint of `workdir` with the run's config plus `overrides`; appends the
  record to <workdir>/evaluations.jsonl and returns it."""
  # pylint: disable=import-outside-toplevel  (JAX: after the flags)
  import jax
  from dp2fedsam_jax import checkpoint, run_files, train
  config = run_config(workdir, overrides or {})
  with run_files.hold(workdir):  # not while a run writes its checkpoints
    exp = train.build_experiment(config)
    if not exp.spec.federated or not checkpoint.exists(workdir):
      raise ValueError(f'--workdir={workdir}: no checkpoint to evaluate ({config.method} keeps '
                       'none)' if not exp.spec.federated else
                       f'--workdir={workdir}: no checkpoint to evaluate.')
    state = checkpoint.restore_run(workdir, exp.init_state()).state
    done = int(state.round)
    start = time.perf_counter()
    metrics = jax.device_get(jax.jit(exp.make_evaluate())(state, exp.data, exp.eval_key(done)))
    record = {'round': done, **{f'eval.{k}': v for k, v in exp.protocol.describe().items()},
              'eval_clients': config.get('eval_clients'),
              'finished': done >= config.num_rounds, 'epsilon': exp.epsilon_after(done),
              **{k: _number(v) for k, v in metrics.items()},
              'seconds': time.perf_counter() - start}
    with open(os.path.join(workdir, EVALUATIONS_FILE), 'a') as f:
      f.write(json.dumps(record) + '\n')
  return record


def _number(value) -> float | None:
  value = float(value)
  return None if math.isnan(value) else value


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not flags.FLAGS.workdir:
    raise app.UsageError('--workdir is required (a run\'s workdir).')
  logging.set_verbosity(logging.WARNING)  # orbax's INFO lines at every restore
  overrides = dict(flags.FLAGS['config'].override_values)
  print(json.dumps(evaluate_workdir(flags.FLAGS.workdir, overrides)))


if __name__ == '__main__':
  define_flags()
  cli.run(main)
