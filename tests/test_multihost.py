"""Two JAX processes on this machine run `experiments.train --distributed` as two hosts would.

Each process has 2 CPU devices, so the sharded executor's 'clients' mesh spans 4 devices of 2
processes and the upload sum is a cross-process all-reduce over JAX's CPU collectives (gloo). Both
processes run the real binary on one shared workdir, with a loopback coordinator
(127.0.0.1:<free port>) and gloo pinned to 127.0.0.1. A single process with 4 devices runs the same
command without --distributed. The two runs must give the same metrics and final parameters, and
only process 0 may write config.json and metrics.jsonl.
"""

import builtins
import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from conftest import tiny_config, xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, 'tests')
TIMEOUT_S = 240  # for all three processes together; 20-50 s on 2 CPU cores, by their load
CONFIG_OVERRIDES = dict(num_clients=12, sampling_rate=0.7, num_rounds=2, eval_every=2)
CONFIG_FILE = f'''
import sys
sys.path.insert(0, {TESTS!r})
from conftest import tiny_config


def get_config(arg=None):
  return tiny_config(**{CONFIG_OVERRIDES!r})
'''


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _pin_gloo_to_loopback():
  """Gloo listens on the address the machine's hostname resolves to unless told otherwise; JAX has
  no public setting for it, so the CPU backend is registered again with gloo bound to 127.0.0.1."""
  from jax._src import distributed, xla_bridge  # pylint: disable=import-outside-toplevel
  from jax._src.lib import _jax  # pylint: disable=import-outside-toplevel

  def cpu_client():
    return xla_bridge.make_cpu_client(collectives=_jax.make_gloo_tcp_collectives(
        distributed_client=distributed.global_state.client, hostname='127.0.0.1'))
  xla_bridge.register_backend_factory('cpu', cpu_client, priority=0, fail_quietly=False)


def _child(workdir: str, report: str, argv: list[str]) -> None:
  """Runs experiments.train's main with `argv`, recording which files it writes in `workdir`."""
  if '--distributed' in argv:
    _pin_gloo_to_loopback()
  written = set()
  real_open, real_replace = builtins.open, os.replace
  inside = lambda path: os.path.abspath(path).startswith(os.path.abspath(workdir) + os.sep)

  def recording_open(file, mode='r', *args, **kwargs):
    if isinstance(file, (str, os.PathLike)) and set(mode) & set('wax+') and inside(file):
      written.add(os.path.relpath(file, workdir))
    return real_open(file, mode, *args, **kwargs)

  def recording_replace(src, dst, *args, **kwargs):
    if inside(dst):
      written.add(os.path.relpath(dst, workdir))
    return real_replace(src, dst, *args, **kwargs)

  builtins.open, os.replace = recording_open, recording_replace
  from absl import flags  # pylint: disable=import-outside-toplevel
  from experiments import train as train_binary  # pylint: disable=import-outside-toplevel
  train_binary.define_flags()
  flags.FLAGS(['train'] + argv)
  train_binary.main(['train'])
  builtins.open, os.replace = real_open, real_replace
  with open(report, 'w') as f:
    json.dump({'process_index': jax.process_index(), 'process_count': jax.process_count(),
               'device_count': jax.device_count(), 'local_devices': jax.local_device_count(),
               # orbax writes the checkpoint from every process in its own way: not counted
               'written': sorted(p for p in written if not p.startswith('checkpoints'))}, f)


def _spawn(tmp_path, name: str, devices: int, workdir, argv: list[str]):
  # The suite's compile-time flags in all three processes (conftest.py): the runs compared still
  # execute the same programs.
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=xla_flags(devices),
             PYTHONPATH=os.pathsep.join([ROOT, TESTS, os.environ.get('PYTHONPATH', '')]))
  log = open(tmp_path / f'{name}.log', 'w')
  proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(workdir),
                           str(tmp_path / f'{name}.json'), *argv],
                          cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
  return proc, log


def _records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def test_two_processes_match_one(tmp_path):
  from jax._src.lib import _jax  # pylint: disable=import-outside-toplevel
  if not hasattr(_jax, 'make_gloo_tcp_collectives'):
    pytest.skip('this jaxlib has no gloo CPU collectives (jax._src.lib._jax.make_gloo_tcp_collectives '
                'is missing): multi-process CPU runs cannot all-reduce')
  config_file = tmp_path / 'tiny.py'
  config_file.write_text(CONFIG_FILE)
  shared, single = tmp_path / 'shared', tmp_path / 'single'
  address = f'127.0.0.1:{_free_port()}'
  common = [f'--config={config_file}', '--config.executor=sharded']
  start = time.monotonic()
  procs = {f'process{i}': _spawn(tmp_path, f'process{i}', 2, shared, common + [
      f'--workdir={shared}', '--distributed', f'--coordinator_address={address}',
      f'--coordinator_bind_address={address}', '--num_processes=2', f'--process_id={i}'])
           for i in (0, 1)}
  procs['single'] = _spawn(tmp_path, 'single', 4, single, common + [f'--workdir={single}'])
  try:
    for name, (proc, log) in procs.items():
      try:
        proc.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - start)))
      finally:
        log.close()
      output = (tmp_path / f'{name}.log').read_text()
      assert proc.returncode == 0, f'{name} exited with {proc.returncode}:\n{output[-4000:]}'
  finally:
    for proc, _ in procs.values():
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  elapsed = time.monotonic() - start
  reports = {name: json.loads((tmp_path / f'{name}.json').read_text()) for name in procs}

  for i in (0, 1):
    r = reports[f'process{i}']
    assert (r['process_index'], r['process_count'], r['device_count'], r['local_devices']) == (
        i, 2, 4, 2), r
  assert reports['single']['process_count'] == 1 and reports['single']['device_count'] == 4
  # Only process 0 writes the shared workdir's config.json and metrics.jsonl.
  assert {'config.json', 'metrics.jsonl'} <= set(reports['process0']['written']), reports
  assert reports['process1']['written'] == [], reports

  with open(shared / 'config.json') as f, open(single / 'config.json') as g:
    assert json.load(f) == json.load(g)
  multi, one = _records(shared), _records(single)
  assert [r['round'] for r in multi] == [r['round'] for r in one] == [2]
  for a, b in zip(multi, one):
    assert set(a) == set(b)
    for key in sorted(set(a) - {'seconds'}):
      if a[key] is None or b[key] is None:  # NaN is written as null (e.g. no never-sampled client)
        assert a[key] == b[key], key
        continue
      np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=key)

  # The final parameters, restored from both checkpoints in this (single) process.
  from dp2fedsam_jax import checkpoint, train  # pylint: disable=import-outside-toplevel
  initial = train.build_experiment(tiny_config(**CONFIG_OVERRIDES)).init_state()
  (state_multi, _), (state_one, _) = (checkpoint.restore(str(w), initial) for w in (shared, single))
  assert int(state_multi.round) == int(state_one.round) == 2
  diffs = [float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
           for a, b in zip(jax.tree.leaves(state_multi), jax.tree.leaves(state_one))]
  assert max(diffs) <= 1e-6, diffs
  assert max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(
      jax.tree.leaves(state_multi.shared), jax.tree.leaves(initial.shared))) > 0  # it trained
  print(f'two processes vs one: {elapsed:.1f} s, max |param diff| {max(diffs):.2e}')


if __name__ == '__main__':
  _child(sys.argv[1], sys.argv[2], sys.argv[3:])
