"""A run killed at the awkward points of a round resumes to the uninterrupted run's exact result.

test_train.py covers a clean stop after a round; here the "kill" (an exception that nothing catches,
like SIGKILL would leave things) lands (a) after the checkpoint is written but before metrics.jsonl
is, (b) before a checkpoint is written, after train_metrics.jsonl got a line of the uncheckpointed
round, with torn lines in both metrics files and a temporary file left behind, as a kill inside a
write would leave them. Both metrics files must end as the uninterrupted run's (but `seconds`).

Between evaluations: a stop (SIGTERM) at a round that is not evaluated checkpoints that
round, and a kill loses only the rounds since the last `checkpoint_every` checkpoint; the training
scalars of the rounds since the last evaluation come back from the checkpoint, so the next record
averages the same rounds as the uninterrupted run's.
"""

import json
import os

import signal

import chex
import pytest

from conftest import Killed, tiny_config, train_killed_before_checkpoint
from dp2fedsam_jax import checkpoint, metric_writers, stopping, train


def _config(eval_every=1, checkpoint_every=1):
  return tiny_config(num_rounds=4, eval_every=eval_every, checkpoint_every=checkpoint_every)


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
  # Each start says where it ran: from round 0, then from the checkpoint of round 2.
  hosts = metric_writers.read_jsonl(os.path.join(workdir, metric_writers.HOSTS_FILE))
  assert [line['from_round'] for line in hosts] == [0, 2]


def test_kill_before_checkpoint_with_torn_metrics_files(uninterrupted, tmp_path, monkeypatch):
  workdir = str(tmp_path)

  def tear_the_metrics_files(wd, state):
    if int(state.round) == 3:  # what a kill inside a write would leave: torn lines, a temp file
      with open(os.path.join(wd, 'metrics.jsonl'), 'a') as f:
        f.write('{"round": 3, "test_accur')
      with open(os.path.join(wd, 'train_metrics.jsonl'), 'a') as f:
        f.write('{"round": 4, "train_lo')
      with open(os.path.join(wd, 'metrics.jsonl.tmp'), 'w') as f:
        f.write('{"round": 3')

  train_killed_before_checkpoint(monkeypatch, _config(), workdir, kill_round=3,
                                 on_save=tear_the_metrics_files)
  assert int(_final_state(workdir).round) == 2
  with open(os.path.join(workdir, 'train_metrics.jsonl')) as f:
    assert [json.loads(line)['round'] for line in f.read().splitlines()[:-1]] == [1, 2, 3]

  train.train_and_evaluate(_config(), workdir)
  metrics, state = uninterrupted
  # The torn lines and round 3's uncheckpointed line are gone, rounds 3 and 4 are recomputed.
  assert _metrics(workdir) == metrics
  chex.assert_trees_all_equal(_final_state(workdir), state)


_UNINTERRUPTED = {}


def _uninterrupted(eval_every, tmp_path_factory):
  if eval_every not in _UNINTERRUPTED:
    workdir = str(tmp_path_factory.mktemp(f'full_every_{eval_every}'))
    train.train_and_evaluate(_config(eval_every), workdir)
    _UNINTERRUPTED[eval_every] = _metrics(workdir), _final_state(workdir)
  return _UNINTERRUPTED[eval_every]


def _on_train_line(monkeypatch, round_index, action):
  """Calls action() right after train_metrics.jsonl got the line of round `round_index`."""
  real_write = metric_writers.JsonlWriter.write_scalars

  def write(writer, step, scalars):
    real_write(writer, step, scalars)
    if writer.path.endswith(metric_writers.TRAIN_FILE) and step == round_index:
      action()
  monkeypatch.setattr(metric_writers.JsonlWriter, 'write_scalars', write)


def test_sigterm_between_evaluations_resumes_bit_identical(tmp_path, tmp_path_factory, monkeypatch):
  workdir = str(tmp_path)
  _on_train_line(monkeypatch, 3, lambda: signal.raise_signal(signal.SIGTERM))
  with pytest.raises(stopping.Interrupted, match='after round 3; the checkpoint of round 3 in'):
    train.train_and_evaluate(_config(eval_every=2, checkpoint_every=100), workdir)
  monkeypatch.undo()
  assert checkpoint.latest_round(workdir) == 3  # not evaluated, checkpointed by the stop
  assert [r['round'] for r in _metrics(workdir)[0]] == [2]
  window = checkpoint.restore_run(workdir, train.build_experiment(_config()).init_state()).window
  assert len(window) == 1  # round 3's scalars, for round 4's record

  train.train_and_evaluate(_config(eval_every=2, checkpoint_every=100), workdir)
  metrics, state = _uninterrupted(2, tmp_path_factory)
  assert _metrics(workdir) == metrics  # round 4's record averages rounds 3 and 4, as uninterrupted
  chex.assert_trees_all_equal(_final_state(workdir), state)


def test_a_kill_loses_only_the_rounds_since_the_last_checkpoint_every(tmp_path, tmp_path_factory,
                                                                        monkeypatch):
  workdir = str(tmp_path)

  def kill():
    raise Killed
  _on_train_line(monkeypatch, 3, kill)  # round 3 ran; its checkpoint was never written
  with pytest.raises(Killed):
    train.train_and_evaluate(_config(eval_every=4, checkpoint_every=2), workdir)
  monkeypatch.undo()
  assert checkpoint.latest_round(workdir) == 2 and not _metrics(workdir)[0]

  train.train_and_evaluate(_config(eval_every=4, checkpoint_every=2), workdir)
  metrics, state = _uninterrupted(4, tmp_path_factory)
  assert _metrics(workdir) == metrics  # the one record averages rounds 1-4, two of them restored
  chex.assert_trees_all_equal(_final_state(workdir), state)


def test_rounds_before_eval_from_train_untested_and_still_checkpoint(tmp_path):
  """eval_from = 4 of 4, every 2: one evaluation (round 4); round 2 is checkpointed all the same
  (checkpoint_every 100), and its record averages every round's training scalars."""
  workdir = str(tmp_path)
  config = tiny_config(num_rounds=4, eval_every=2, eval_from=4, checkpoint_every=100)
  train.train_and_evaluate(config, workdir)
  records, lines = _metrics(workdir)
  assert [r['round'] for r in records] == [4] and [r['round'] for r in lines] == [1, 2, 3, 4]
  assert sorted(int(r) for r in os.listdir(os.path.join(workdir, 'checkpoints'))) == [2, 4]
  losses = [r['train_loss'] for r in lines]
  assert records[0]['train_loss'] == pytest.approx(sum(losses) / 4, rel=1e-6)
