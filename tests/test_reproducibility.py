"""Same config and seed -> bit-identical metrics, whatever the process, workdir or global RNG state;
another seed -> other metrics. Every key derives from config.seed (train.Experiment.root_key)."""

import json
import os
import random
import subprocess
import sys

import numpy as np

from conftest import tiny_config
from dp2fedsam_jax import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RUN = ('import sys; sys.path.insert(0, "tests"); from conftest import tiny_config; '
        'from dp2fedsam_jax import train; '
        'train.train_and_evaluate(tiny_config(num_rounds=2, seed=int(sys.argv[2])), sys.argv[1])')


def _metrics(workdir):
  """metrics.jsonl without the wall-clock `seconds`, the one field allowed to differ."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  for r in records:
    r.pop('seconds')
  return records


def test_same_seed_bit_identical_metrics_other_seed_different(tmp_path):
  here, there, other = (str(tmp_path / d) for d in ('a', 'elsewhere/b', 'c'))
  np.random.seed(1)
  random.seed(1)
  train.train_and_evaluate(tiny_config(num_rounds=2), here)
  # Another process (other hash seed, fresh global RNGs), another workdir, the same config.
  env = dict(os.environ, PYTHONHASHSEED='12345', PYTHONPATH=ROOT)
  subprocess.run([sys.executable, '-c', _RUN, there, '0'], cwd=ROOT, env=env, check=True,
                 capture_output=True, timeout=600)
  first, second = _metrics(here), _metrics(there)
  assert [r['round'] for r in first] == [1, 2]
  assert first == second  # floats parsed from their exact repr: equal means bit-identical

  train.train_and_evaluate(tiny_config(num_rounds=2, seed=1), other)
  changed = _metrics(other)
  for a, b in zip(first, changed):
    assert a['train_loss'] != b['train_loss'] and a['mean_update_norm'] != b['mean_update_norm']
    assert a['epsilon'] == b['epsilon']  # the privacy accounting does not depend on the seed
