r"""Runs one experiment: `python -m experiments.train --config=experiments/configs/default.py --workdir=DIR`.

Override any field with `--config.<field>=<value>`, e.g. `--config.method=centaur --config.dp.clip_norm=0.2`,
or pass arguments to the config file: `--config=experiments/configs/default.py:eps=2`.
"""

import json
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from dp2fedsam_jax import train

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where config.json, metrics.jsonl and checkpoints go.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the model size and privacy parameters as one '
                             'JSON line, then exit without training.')


def main(argv):
  del argv
  config = _CONFIG.value
  if _DRY_RUN.value:
    exp = train.build_experiment(config)
    print(json.dumps({'method': config.method, **exp.param_counts(),
                      'noise_multiplier': exp.privacy.noise_multiplier,
                      'epsilon': exp.privacy.epsilon, 'delta': exp.privacy.delta,
                      **({'epsilon_caveat': exp.privacy_caveat} if exp.privacy_caveat else {})}))
    return
  if not _WORKDIR.value:
    sys.exit('--workdir is required (where config.json, metrics.jsonl and checkpoints are written).')
  logging.set_verbosity(logging.INFO)
  final = train.train_and_evaluate(config, _WORKDIR.value)
  print(json.dumps(final))


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main)
