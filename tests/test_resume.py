"""A run killed at the awkward points of a round resumes to the uninterrupted run's exact result.

test_train.py covers a clean stop after a round; here the "kill" (an exception that nothing catches,
like SIGKILL would leave things) lands (a) after the checkpoint is written but before metrics.jsonl
is, (b) before a checkpoint is written, after train_metrics.jsonl got a line of the uncheckpointed
round, with torn lines in both metrics files and a temporary file left behind, as a kill inside a
write would leave them. Both metrics files must end as the uninterrupted run's (but `seconds`).
"""

import json
import os

import chex
import pytest

from conftest import tiny_config
from dp2fedsam_jax import checkpoint, metric_writers, train


class Killed(BaseException):
  """Not an Exception: like a signal, nothing in the library may swallow it."""


def _config():
  return tiny_config(num_rounds=4, eval_every=1)


def _without_time(record):
  return {k: v for k, v in record.items() if k != 'seconds'}


def _metrics(workdir):
  """(metrics.jsonl, train_metrics.jsonl) without `seconds`; json.loads fails on a torn line."""
  def read(name):
    with open(os.path.join(workdir, name)) as f:
      return [_without_time(json.loads(line)) for line in f]
  return read('metrics.jsonl'), read('train_metrics.jsonl')


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
  real_write = metric_writers.JsonlWriter.write_scalars

  def write_then_die_at_round_2(writer, step, scalars):
    if writer.path.endswith(os.sep + 'metrics.jsonl') and step == 2:
      raise Killed  # round 2's checkpoint exists; its metrics line was never written
    real_write(writer, step, scalars)

  monkeypatch.setattr(metric_writers.JsonlWriter, 'write_scalars', write_then_die_at_round_2)
  with pytest.raises(Killed):
    train.train_and_evaluate(_config(), workdir)
  monkeypatch.undo()
  evaluated, trained = _metrics(workdir)
  assert [r['round'] for r in evaluated] == [1] and [r['round'] for r in trained] == [1, 2]
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
      # What a kill inside a write would leave: torn lines and a temp file.
      with open(os.path.join(wd, 'metrics.jsonl'), 'a') as f:
        f.write('{"round": 3, "test_accur')
      with open(os.path.join(wd, 'train_metrics.jsonl'), 'a') as f:
        f.write('{"round": 4, "train_lo')
      with open(os.path.join(wd, 'metrics.jsonl.tmp'), 'w') as f:
        f.write('{"round": 3')
      raise Killed
    real_save(wd, state, records)

  monkeypatch.setattr(checkpoint, 'save', die_before_saving_round_3)
  with pytest.raises(Killed):
    train.train_and_evaluate(_config(), workdir)
  monkeypatch.undo()
  assert int(_final_state(workdir).round) == 2
  with open(os.path.join(workdir, 'train_metrics.jsonl')) as f:
    assert [json.loads(line)['round'] for line in f.read().splitlines()[:-1]] == [1, 2, 3]

  train.train_and_evaluate(_config(), workdir)
  metrics, state = uninterrupted
  # The torn lines and round 3's uncheckpointed line are gone, rounds 3 and 4 are recomputed.
  assert _metrics(workdir) == metrics
  chex.assert_trees_all_equal(_final_state(workdir), state)
