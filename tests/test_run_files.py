"""One writer per workdir (dp2fedsam_jax/run_files.py): a second run on a workdir in
use exits 2 naming the holder's pid and writes nothing there; a sweep does not start it; the lock of
a killed process is gone with it."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import tiny_config
from dp2fedsam_jax import host, metric_writers, run_files, train
from launch import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_HOLD = textwrap.dedent('''
    import sys, time
    from dp2fedsam_jax import run_files
    with run_files.hold(sys.argv[1]):
      print('held', flush=True)
      time.sleep(300)
''')

SWEEP_CONFIG = textwrap.dedent('''
    from dp2fedsam_jax.config import base_config

    def get_config(arg=None):
      c = base_config()
      c.dataset, c.model, c.partition = 'synthetic', 'mlp', 'iid'
      c.num_clients, c.sampling_rate, c.num_rounds = 6, 0.5, 1
      c.local.personal_epochs = c.local.shared_epochs = 1
      c.local.batch_size = 16
      c.dp.clip_norm, c.dp.noise_multiplier = 1.0, 1.0
      return c
''')


@pytest.fixture
def held(tmp_path):
  """A workdir whose lock another live process holds: (workdir, that process)."""
  workdir = tmp_path / 'sweep' / 'tiny' / 'dp2fedsam' / 'default' / 'seed=0'
  workdir.mkdir(parents=True)
  script = tmp_path / 'hold.py'
  script.write_text(_HOLD)
  process = subprocess.Popen([sys.executable, str(script), str(workdir)], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, env={**os.environ, 'PYTHONPATH': ROOT})
  assert process.stdout.readline().strip() == 'held'
  yield str(workdir), process
  process.kill()
  process.wait()


def test_a_second_writer_is_refused_naming_the_pid_and_writes_nothing(held, tmp_path):
  workdir, holder = held
  assert run_files.holder(workdir) == holder.pid
  message = (f'--workdir={workdir} is in use by another run (pid {holder.pid}); wait for it to end or '
             f'stop it (kill -TERM {holder.pid}), or use another --workdir.')
  with pytest.raises(run_files.WorkdirBusyError) as info:
    train.train_and_evaluate(tiny_config(num_rounds=1), workdir)
  assert str(info.value) == message
  out = subprocess.run([sys.executable, '-m', 'experiments.train',
                        '--config=experiments/configs/default.py', f'--workdir={workdir}',
                        '--config.dataset=synthetic', '--config.model=mlp'],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1] == f'error: {message}'
  assert os.listdir(workdir) == [run_files.LOCK_FILE]  # no config.json, failure.json or log

  # The sweep lists it as in use and does not start it.
  config = tmp_path / 'tiny.py'
  config.write_text(SWEEP_CONFIG)
  root = str(tmp_path / 'sweep')
  [run] = sweep.plan(str(config), root, [], [])
  assert run.workdir == workdir and run.status == f'in use (pid {holder.pid}; not started)'
  assert sweep.plan_summary([run]).endswith('1 in use by another process')
  results = sweep.run_sweep(str(config), root, [], [])
  assert results == {workdir: f'skipped (in use (pid {holder.pid}; not started))'}
  assert os.listdir(workdir) == [run_files.LOCK_FILE]  # no sweep.json, no train.log

  # Killed, the holder leaves no stale lock: the next run takes the workdir.
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  assert run_files.holder(workdir) is None
  assert train.train_and_evaluate(tiny_config(num_rounds=1), workdir)['round'] == 1


def test_the_lock_is_reentrant_in_one_process_and_released_after(tmp_path):
  workdir = str(tmp_path / 'w')
  assert run_files.holder(workdir) is None
  with run_files.hold(workdir):
    with run_files.hold(workdir):  # the binary holds it around train_and_evaluate, which holds it
      assert run_files.holder(workdir) == os.getpid()
    assert run_files.holder(workdir) == os.getpid()
  assert run_files.holder(workdir) is None
  with open(os.path.join(workdir, run_files.LOCK_FILE)) as f:
    assert f.read().strip() == str(os.getpid())  # who held it last: read only while it is held


def _with_old_names(node: dict) -> dict:
  """config.json as a run committed before the renames wrote it (old field names)."""
  from dp2fedsam_jax.config_help import RENAMED_FIELDS
  node = json.loads(json.dumps(node))
  node.pop('private_metrics_only')  # a field added since
  for old, new in RENAMED_FIELDS.items():
    *new_parents, new_leaf = new.split('.')
    old_leaf = old.rsplit('.', 1)[-1]
    parent = node
    for part in new_parents:
      parent = parent[part]
    parent[old_leaf] = parent.pop(new_leaf)
  return node


def test_a_committed_run_with_the_old_field_names_is_the_same_run(tmp_path):
  """A config.json that holds local.lr_body, sparsity, ... (experiments/results) is read under the
  new names: the finished run is found without training, and resuming it is not refused; a changed
  value under an old name still is."""
  config = tiny_config(num_rounds=2, eval_every=2)
  final = train.train_and_evaluate(config, str(tmp_path))
  path = tmp_path / 'config.json'
  resolved = json.loads(path.read_text())
  old = _with_old_names(resolved)
  assert 'lr_body' in old['local'] and 'sparsity' in old and 'sparsity' in old['dsu']
  path.write_text(json.dumps(old))
  config, _ = train._with_executor(config, str(tmp_path))  # 'auto' as the run resolved it
  assert run_files.finished_record(config, str(tmp_path)) == final
  run_files.check_same_run(str(tmp_path), resolved)
  old['local']['lr_body'] = 0.5
  path.write_text(json.dumps(old))
  with pytest.raises(ValueError, match=r'local\.lr_shared: 0\.5 -> 0\.05'):
    run_files.check_same_run(str(tmp_path), resolved)


def test_a_finished_run_is_found_under_another_executor_but_a_resume_is_not_moved(tmp_path):
  """Which executor trained the cohort does not make another run: a finished run counts for a
  config that names another executor (a sweep moved to 'sharded', CPU seeds read on a GPU host);
  resuming a checkpoint under another executor is still refused (the resume would not repeat the
  run bit for bit)."""
  config = tiny_config(num_rounds=2, eval_every=2, executor='sequential')
  final = train.train_and_evaluate(config, str(tmp_path))
  for executor in ('sharded', 'vmap'):
    other = config.copy_and_resolve_references()
    other.executor = executor
    assert run_files.finished_record(other, str(tmp_path)) == final
  other.num_rounds = 3  # one round more: it resumes, so the executor must be the run's
  assert run_files.finished_record(other, str(tmp_path)) is None
  resolved = json.loads((tmp_path / 'config.json').read_text())
  with pytest.raises(ValueError, match=r"executor: 'sequential' -> 'vmap'"):
    run_files.check_same_run(str(tmp_path), dict(resolved, executor='vmap'))


def test_each_start_records_its_machine_and_a_stretch_run_again_replaces_its_line(tmp_path):
  """hosts.jsonl: a line per start with the machine whose instruction set and cores the bits
  depend on; a start from an earlier checkpoint drops the lines of the rounds it runs again."""
  workdir = str(tmp_path)
  run_files.record_host(workdir, 0)
  run_files.record_host(workdir, 5)
  run_files.record_host(workdir, 3)  # resumed from round 3's checkpoint: the stretch from 5 reruns
  lines = metric_writers.read_jsonl(os.path.join(workdir, metric_writers.HOSTS_FILE))
  assert [line['from_round'] for line in lines] == [0, 3]
  assert lines[0]['usable_cores'] == host.usable_cores() and lines[0]['platform'] == 'cpu'
  assert lines[0]['jax_version'] and lines[0]['device_count'] >= 1
  assert not [k for k in lines[0] if 'time' in k or 'started' in k]  # no clock time (run_files)
