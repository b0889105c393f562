"""The stop protocol (dp2fedsam_jax/stopping.py): Ctrl-C and SIGTERM stop a run at a round boundary
with that round checkpointed; a second signal or the SIGTERM deadline stops at once; a sweep forwards
the signal to its runs and waits for them."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import TINY_FLAGS, tiny_config
from dp2fedsam_jax import checkpoint, run_files, stopping, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = 'experiments/configs/default.py'
_PROCESS_ERRORS = ('Traceback', 'Fatal Python error', 'Segmentation fault', 'core dumped')


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_interruptible_defers_the_first_signal_and_not_the_second(signum):
  seen = []

  @stopping.interruptible(lambda: 'stopped: checkpoint of round 3 intact')
  def work():
    signal.raise_signal(signum)  # the first: only a request
    seen.append(stopping.stop_requested())
    with stopping.critical():  # the second, inside a critical block: after the block
      signal.raise_signal(signum)
      seen.append('still in the block')
    seen.append('never here')

  with pytest.raises(stopping.Interrupted, match='stopped: checkpoint of round 3 intact') as info:
    work()
  assert seen == [True, 'still in the block']
  assert info.value.exit_code == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum]
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
  assert not stopping.stop_requested()


def test_ctrl_c_stops_train_and_evaluate_between_rounds(tmp_path, monkeypatch):
  save = checkpoint.save

  def save_then_ctrl_c(workdir, state, records, window=()):
    save(workdir, state, records, window)
    signal.raise_signal(signal.SIGINT)  # a real SIGINT while round 2's checkpoint is written
  monkeypatch.setattr(checkpoint, 'save', save_then_ctrl_c)
  config = tiny_config(num_rounds=4, eval_every=2, checkpoint_every=100)
  with pytest.raises(stopping.Interrupted) as info:
    train.train_and_evaluate(config, str(tmp_path))
  assert str(info.value) == (f'interrupted after round 2; the checkpoint of round 2 in {tmp_path} '
                             'is intact; rerun the same command to resume')
  assert info.value.exit_code == stopping.EXIT_INTERRUPTED
  assert [json.loads(l)['round'] for l in open(tmp_path / 'metrics.jsonl')] == [2]
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_checkpoints_the_round_it_reached_not_only_evaluated_ones(tmp_path, monkeypatch):
  """eval_every=4, SIGTERM during round 1: before a stop checkpointed the round it reached, the run
  kept only round 0."""
  rounds = []
  write = run_files.metric_writers.JsonlWriter.write_scalars

  def write_then_sigterm(writer, step, scalars):
    write(writer, step, scalars)
    if writer.path.endswith('train_metrics.jsonl'):
      rounds.append(step)
      if step == 1:
        signal.raise_signal(signal.SIGTERM)
  monkeypatch.setattr(run_files.metric_writers.JsonlWriter, 'write_scalars', write_then_sigterm)
  config = tiny_config(num_rounds=8, eval_every=4, checkpoint_every=100)
  with pytest.raises(stopping.Interrupted) as info:
    train.train_and_evaluate(config, str(tmp_path))
  assert str(info.value) == (f'terminated (SIGTERM) after round 1; the checkpoint of round 1 in '
                             f'{tmp_path} is intact; rerun the same command to resume')
  assert info.value.exit_code == stopping.EXIT_TERMINATED
  assert rounds == [1] and checkpoint.latest_round(str(tmp_path)) == 1
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def _train_binary(workdir, *extra, env=None):
  command = [sys.executable, '-m', 'experiments.train', f'--config={DEFAULT}', *TINY_FLAGS,
             f'--workdir={workdir}', *extra]
  return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, **(env or {})})


def _signal_when(process, wait_for, signum):
  """Sends signum once `wait_for` is in the process's stderr; returns (exit code, stderr)."""
  seen = []
  deadline = time.monotonic() + 300
  for line in process.stderr:
    seen.append(line)
    if wait_for in line or time.monotonic() > deadline:
      process.send_signal(signum)
      break
  _, rest = process.communicate(timeout=300)
  return process.returncode, ''.join(seen) + rest


def test_ctrl_c_during_compilation_exits_130_without_a_crash(tmp_path):
  process = _train_binary(tmp_path / 'w', '--config.num_rounds=50')
  rc, log = _signal_when(process, 'Compiling the round step', signal.SIGINT)
  assert rc == stopping.EXIT_INTERRUPTED, log[-3000:]
  assert not any(e in log for e in _PROCESS_ERRORS), log[-3000:]
  last = log.strip().splitlines()[-1]
  match = re.fullmatch(r'interrupted after round (\d+); (.*); rerun the same command to '
                       r'(resume|start again)', last)
  assert match, last
  if match.group(1) == '0':  # the usual case: stopped before round 1
    assert match.group(2) == f'no checkpoint was written yet in {tmp_path / "w"}'


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_stop_mid_run_checkpoints_that_round_and_the_same_command_resumes(signum, tmp_path):
  workdir = tmp_path / 'w'
  process = _train_binary(workdir, '--config.num_rounds=1000', '--config.eval_every=2',
                          '--config.checkpoint_every=1000')
  rc, log = _signal_when(process, 'round 2/1000', signum)
  assert rc == 128 + signum, log[-3000:]
  assert not any(e in log for e in _PROCESS_ERRORS), log[-3000:]
  by = 'interrupted' if signum == signal.SIGINT else r'terminated \(SIGTERM\)'
  last = log.strip().splitlines()[-1]
  match = re.fullmatch(rf'{by} after round (\d+); the checkpoint of round (\d+) in '
                       rf'{re.escape(str(workdir))} is intact; rerun the same command to resume',
                       last)
  assert match, last
  k, j = int(match.group(1)), int(match.group(2))
  assert j == k >= 2  # the round it reached, evaluated or not
  rounds = [json.loads(l)['round'] for l in open(workdir / 'metrics.jsonl')]
  assert rounds == list(range(2, k + 1, 2))  # nothing half-written
  assert not [n for n in os.listdir(workdir) if n.endswith('.tmp')]
  assert checkpoint.latest_round(str(workdir)) == k
  assert run_files.holder(str(workdir)) is None  # the OS released the writer lock
  if signum == signal.SIGTERM:
    return  # the resume itself is the same for both (and bit for bit: tests/test_resume.py)
  again = subprocess.run(
      [sys.executable, '-m', 'experiments.train', f'--config={DEFAULT}', *TINY_FLAGS,
       f'--workdir={workdir}', f'--config.num_rounds={k + 2}', '--config.eval_every=2'],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f'Resuming {workdir} from round {k}' in again.stderr
  assert [json.loads(l)['round'] for l in open(workdir / 'train_metrics.jsonl')] == list(
      range(1, k + 3))
  # A quiet console in both runs (each wrote checkpoints): only the project's own log lines; orbax's
  # lines at every checkpoint went to the log file in the workdir.
  for stderr in (log, again.stderr):
    assert set(re.findall(r'^[IWEF]\d{4} [\d:.]+ +\d+ ([^:\s]+):\d+\]', stderr,
                          re.MULTILINE)) == {'train.py'}, stderr[-3000:]
  assert 'checkpoint_manager.py' in (workdir / 'train.INFO').read_text()


# A stand-in for a round that does not end: the deadline and the second signal are about the
# process, not about training, so a plain Python loop shows them in a fraction of a second.
_STUCK = textwrap.dedent('''
    import sys, time
    from dp2fedsam_jax import cli, stopping

    @stopping.interruptible(lambda: 'the checkpoint of round 7 is intact')
    def stuck():
      print('ready', flush=True)
      if sys.argv[1] == 'critical':
        with stopping.critical():
          time.sleep(60)
      for _ in range(600):
        time.sleep(0.1)

    cli.run(lambda argv: stuck())
''')


def _stuck(tmp_path, where, env):
  script = tmp_path / 'stuck.py'
  script.write_text(_STUCK)
  process = subprocess.Popen([sys.executable, str(script), where], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, 'PYTHONPATH': ROOT, **env})
  assert process.stdout.readline().strip() == 'ready'
  return process


def test_the_sigterm_deadline_stops_a_run_that_does_not_reach_a_round_boundary(tmp_path):
  process = _stuck(tmp_path, 'critical', {stopping.DEADLINE_ENV: '0.5'})
  start = time.monotonic()
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=30)
  assert process.returncode == stopping.EXIT_TERMINATED, stderr
  assert time.monotonic() - start < 20
  assert stderr.strip().splitlines()[-1] == (
      f'the stop deadline (0.5 s after SIGTERM, {stopping.DEADLINE_ENV}) passed: stopped at once; '
      'the checkpoint of round 7 is intact')


def test_a_second_sigterm_stops_at_once(tmp_path):
  process = _stuck(tmp_path, 'loop', {stopping.DEADLINE_ENV: '600'})
  process.send_signal(signal.SIGTERM)
  time.sleep(0.5)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=30)
  assert process.returncode == stopping.EXIT_TERMINATED, stderr
  lines = stderr.strip().splitlines()
  assert lines[0].startswith('SIGTERM: stopping at the end of the current round (at most 600 s)')
  assert lines[-1] == 'the checkpoint of round 7 is intact'


SWEEP_CONFIG = textwrap.dedent('''
    from dp2fedsam_jax.config import base_config

    def get_config(arg=None):
      c = base_config()
      c.dataset, c.model, c.partition = 'synthetic', 'mlp', 'iid'
      c.num_clients, c.sampling_rate = 6, 0.5
      c.num_rounds, c.eval_every, c.checkpoint_every = 1000, 2, 1000
      c.local.personal_epochs = c.local.shared_epochs = 1
      c.local.batch_size = 16
      c.dp.clip_norm, c.dp.noise_multiplier = 1.0, 1.0
      return c
''')


def test_a_sweep_forwards_sigterm_to_its_runs_and_waits_for_them(tmp_path):
  config = tmp_path / 'long.py'
  config.write_text(SWEEP_CONFIG)
  root = tmp_path / 'runs'
  workdir = root / 'long' / 'dp2fedsam' / 'default' / 'seed=0'
  process = subprocess.Popen([sys.executable, '-m', 'launch.sweep', f'--config={config}',
                              f'--root={root}'], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
  deadline = time.monotonic() + 300
  while time.monotonic() < deadline:
    log = workdir / 'train.log'
    if log.exists() and 'round 2/1000' in log.read_text():
      break
    time.sleep(0.2)
  run_pid = run_files.holder(str(workdir))
  assert os.getpgid(run_pid) == run_pid != os.getpgid(process.pid)  # a Ctrl-C reaches the sweep only
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == stopping.EXIT_TERMINATED, stderr[-3000:]
  assert re.search(r'terminated \(SIGTERM\): 0 of 1 runs finished, 1 stopped at a round boundary',
                   stderr), stderr[-3000:]
  last = (workdir / 'train.log').read_text().strip().splitlines()[-1]
  match = re.fullmatch(r'terminated \(SIGTERM\) after round (\d+); the checkpoint of round (\d+) '
                       r'in .* is intact; rerun the same command to resume', last)
  assert match and match.group(1) == match.group(2), last
  assert run_files.holder(str(workdir)) is None  # the run has ended: the OS released its lock
