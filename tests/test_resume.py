"""A run killed at the awkward points of a round resumes to the uninterrupted run's exact result.

test_train.py covers a clean stop after a round; here the "kill" (an exception that nothing catches,
like SIGKILL would leave things) lands (a) after the checkpoint is written but before metrics.jsonl
is, (b) before a checkpoint is written, with a half-written metrics file and temporary file left
behind, as a kill inside a non-atomic write would leave them.
"""

import json
import os

import chex
import pytest

from conftest import tiny_config
from dp2fedsam_jax import checkpoint, train


class Killed(BaseException):
  """Not an Exception: like a signal, nothing in the library may swallow it."""


def _config():
  return tiny_config(num_rounds=4, eval_every=1)


def _without_time(record):
  return {k: v for k, v in record.items() if k != 'seconds'}


def _metrics(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [_without_time(json.loads(line)) for line in f]


def _final_state(workdir):
  state, _ = checkpoint.restore(workdir, train.build_experiment(_config()).init_state())
  return state


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('full'))
  train.train_and_evaluate(_config(), workdir)
  return _metrics(workdir), _final_state(workdir)


def test_kill_between_checkpoint_and_metrics_write(uninterrupted, tmp_path, monkeypatch):
  workdir = str(tmp_path)
  real_write = checkpoint.write_metrics

  def write_then_die_at_round_2(path, records):
    if records and records[-1]['round'] == 2:
      raise Killed  # round 2's checkpoint exists; its metrics line was never written
    real_write(path, records)

  monkeypatch.setattr(checkpoint, 'write_metrics', write_then_die_at_round_2)
  with pytest.raises(Killed):
    train.train_and_evaluate(_config(), workdir)
  monkeypatch.undo()
  assert [r['round'] for r in _metrics(workdir)] == [1]
  assert int(_final_state(workdir).round) == 2

  train.train_and_evaluate(_config(), workdir)
  metrics, state = uninterrupted
  assert _metrics(workdir) == metrics
  chex.assert_trees_all_equal(_final_state(workdir), state)


def test_kill_before_checkpoint_with_torn_metrics_files(uninterrupted, tmp_path, monkeypatch):
  workdir = str(tmp_path)
  real_save = checkpoint.save

  def die_before_saving_round_3(wd, state, records):
    if int(state.round) == 3:
      # What a kill inside a plain (non-atomic) write would leave: a torn line and a temp file.
      with open(os.path.join(wd, 'metrics.jsonl'), 'a') as f:
        f.write('{"round": 3, "test_accur')
      with open(os.path.join(wd, 'metrics.jsonl.tmp'), 'w') as f:
        f.write('{"round": 3')
      raise Killed
    real_save(wd, state, records)

  monkeypatch.setattr(checkpoint, 'save', die_before_saving_round_3)
  with pytest.raises(Killed):
    train.train_and_evaluate(_config(), workdir)
  monkeypatch.undo()
  assert int(_final_state(workdir).round) == 2

  train.train_and_evaluate(_config(), workdir)
  metrics, state = uninterrupted
  assert _metrics(workdir) == metrics  # the torn line is gone, rounds 3 and 4 are recomputed
  chex.assert_trees_all_equal(_final_state(workdir), state)
