"""Faults as tests: a run SIGKILLed during compilation, mid-round and inside a
checkpoint write, then stopped by a failing disk, ends, once the same command has run to the end,
exactly as an uninterrupted run; a corrupted latest checkpoint falls back to the one before with a
warning; none readable is a one-line refusal, never a silent restart from round 0.

The faults are injected by tests/faulty_train.py (experiments.train with one patch, seeded)."""

import json
import logging
import os
import re
import signal
import subprocess
import sys

import chex
import pytest

from conftest import TINY_FLAGS, tiny_config
from dp2fedsam_jax import checkpoint, cli, train
from launch import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = 'experiments/configs/default.py'
# conftest.tiny_config() on top of the default config file; 6 rounds, evaluated at 3 and 6,
# checkpointed every 2 rounds besides: kills land between checkpoints and between evaluations.
FLAGS = TINY_FLAGS + ['--config.num_rounds=6', '--config.eval_every=3', '--config.checkpoint_every=2']


def _run(workdir, fault=None, seed=0):
  """experiments.train (with `fault` injected) on workdir: (exit code, stderr)."""
  if fault:
    command = [sys.executable, os.path.join(ROOT, 'tests', 'faulty_train.py')]
  else:
    command = [sys.executable, '-m', 'experiments.train']
  env = {**os.environ, 'PYTHONPATH': ROOT, 'FAULT': fault or '', 'SEED': str(seed)}
  out = subprocess.run([*command, f'--config={DEFAULT}', *FLAGS, f'--workdir={workdir}'],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  return out.returncode, out.stderr


def _without_time(path):
  with open(path) as f:
    return [{k: v for k, v in json.loads(l).items() if k != 'seconds'} for l in f]


def _final_state(workdir):
  config = sweep.apply_overrides(cli.load_config_file(DEFAULT), FLAGS)
  state, _ = checkpoint.restore(str(workdir), train.build_experiment(config).init_state())
  return state


def test_sigkill_anywhere_then_a_full_disk_end_as_an_uninterrupted_run(tmp_path):
  full, workdir = tmp_path / 'full', tmp_path / 'faulty'
  assert _run(full)[0] == 0
  # A kill inside the checkpoint write of round 4 leaves it unfinished: the full-disk run below then
  # resumes from round 2.
  for seed, fault in enumerate(['kill_in_compile', 'kill_mid_round:2', 'kill_in_checkpoint:4']):
    before = checkpoint.latest_round(str(workdir)) if workdir.exists() else 0
    rc, stderr = _run(workdir, fault, seed)
    assert rc == -signal.SIGKILL, (fault, stderr[-3000:])
    assert checkpoint.latest_round(str(workdir)) >= before, fault  # nothing finished is lost
  # A write error in the checkpoint of round 6 (the disk is full from there on): one line, exit 2,
  # and the checkpoint before it intact.
  kept = checkpoint.latest_round(str(workdir))
  rc, stderr = _run(workdir, 'file_size_limit:6')
  assert rc == 2, stderr[-3000:]
  # (tensorboardX's own thread and exit hook may complain after it that they cannot write either.)
  [line] = [l for l in stderr.splitlines() if l.startswith('error: ')]
  assert re.fullmatch(rf'error: round 6: cannot write its checkpoint in \S+ \(.+\); the checkpoint of '
                      rf'round {kept} is intact\. Free space or make the workdir writable, then rerun '
                      r'the same command to resume\.', line), line
  assert checkpoint.latest_round(str(workdir)) == kept

  rc, stderr = _run(workdir)
  assert rc == 0, stderr[-3000:]
  for name in ('metrics.jsonl', 'train_metrics.jsonl'):
    assert _without_time(workdir / name) == _without_time(full / name), name
  chex.assert_trees_all_equal(_final_state(workdir), _final_state(full))


# ---------------------------------------------------------------- a corrupted checkpoint


def _config(num_rounds):
  return tiny_config(num_rounds=num_rounds, eval_every=2, checkpoint_every=1)


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('full')
  train.train_and_evaluate(_config(4), str(workdir))
  exp = train.build_experiment(_config(4))
  return _without_time(workdir / 'metrics.jsonl'), checkpoint.restore(str(workdir),
                                                                       exp.init_state())[0]


def _data_files(workdir, step):
  """The files that hold the arrays of the checkpoint of round `step`."""
  root = os.path.join(workdir, 'checkpoints', str(step), 'state')
  return [os.path.join(d, n) for d, _, names in os.walk(root) for n in names
          if os.sep + 'd' in d[len(root):]]


def _truncate(path):
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


def _flip_a_byte(path):
  with open(path, 'r+b') as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize('damage', [_truncate, _flip_a_byte])
def test_a_corrupted_latest_checkpoint_falls_back_to_the_one_before(damage, uninterrupted, tmp_path,
                                                                     caplog):
  workdir = str(tmp_path)
  train.train_and_evaluate(_config(3), workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '3']  # two kept
  for path in _data_files(workdir, 3):
    damage(path)
  caplog.set_level(logging.WARNING)
  train.train_and_evaluate(_config(4), workdir)
  assert re.search(rf'The checkpoint of round 3 in {re.escape(workdir)} is unreadable \(.+\); moved '
                   r'to \S+corrupt_checkpoints/3-\S+, trying the one before', caplog.text), caplog.text
  metrics, state = uninterrupted
  assert _without_time(tmp_path / 'metrics.jsonl') == metrics  # rounds 3 and 4 rerun from round 2
  chex.assert_trees_all_equal(checkpoint.restore(workdir, state)[0], state)


def test_no_readable_checkpoint_is_refused_in_one_line_never_a_restart_from_round_0(tmp_path):
  workdir = str(tmp_path)
  train.train_and_evaluate(_config(3), workdir)
  for step in (2, 3):
    for path in _data_files(workdir, step):
      _truncate(path)
  with pytest.raises(checkpoint.CheckpointError) as info:
    train.train_and_evaluate(_config(4), workdir)
  message = str(info.value)
  assert message.startswith(f'no readable checkpoint in {os.path.join(workdir, "checkpoints")} '
                            '(round 3: ')
  assert 'round 2: ' in message and 'start again from round 0' in message
  assert cli.is_user_error(info.value) and '\n' not in cli.error_line(info.value)
  assert [json.loads(l)['round'] for l in open(tmp_path / 'metrics.jsonl')] == [2, 3]  # untouched
