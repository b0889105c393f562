"""The 'sharded' executor gives the vmap executor's state, on 8 forced CPU devices and on 1.

Each check runs in a fresh process: the device count is fixed when JAX initialises, and another
test may already have initialised it in this one.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import TINY_FLAGS, tiny_config, xla_flags
from dp2fedsam_jax.config import ConfigError, validate_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(devices: int) -> dict:
  """Runs 2 rounds per executor variant and reports the largest difference to vmap."""
  import dataclasses

  import jax
  import numpy as np

  from dp2fedsam_jax import canaries, sharding, train
  from dp2fedsam_jax.executors import Sharded, Vmap
  from dp2fedsam_jax.federated_round import make_round_step

  assert jax.device_count() == devices, jax.devices()
  # 12 clients, q = 0.7: the cohort spans several slots per device; chunk_size=4 forces 2 chunks.
  exp = train.build_experiment(tiny_config(num_clients=12, sampling_rate=0.7))

  def run(**variant):
    rc = dataclasses.replace(exp.round_config, **variant)
    state, data, key = rc.executor.place((exp.init_state(), exp.data, exp.root_key))
    # Compiled once, explicitly, so the HLO checked below is the program that ran.
    step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, rc)).lower(
        state, data, key).compile()
    for _ in range(2):
      state, metrics = step(state, data, key)
    return rc, step.as_text(), state, metrics

  _, ref_hlo, reference, ref_metrics = run(executor=Vmap())
  variants = {'sharded': dict(executor=Sharded())}
  if devices > 1:
    variants['sharded_chunked'] = dict(executor=Sharded(chunk_size=4))
  out = {}
  for name, variant in variants.items():
    rc, hlo, state, metrics = run(**variant)
    diffs = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0))
             for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(state))]
    leaf = jax.tree.leaves(state.shared)[0]
    out[name] = {
        'max_abs_diff': max(diffs),
        'loss_diff': abs(float(metrics['train_loss']) - float(ref_metrics['train_loss'])),
        'cohort': int(metrics['cohort_size']),
        'capacity': rc.capacity,
        'state_devices': len(leaf.sharding.device_set),
        'state_replicated': bool(leaf.sharding.is_fully_replicated),
        'collectives': sorted({c for c in ('all-reduce', 'all-gather', 'all-to-all', 'collective-permute')
                               if c in hlo}),
        # On a CPU each device loops over its slots: one while loop more than vmap's program.
        'extra_loops': hlo.count(' while(') - ref_hlo.count(' while('),
    }
  # The CPU loop keeps slot order: slot i's output is f of slot i's input.
  mesh = sharding.client_mesh()
  slots = np.arange(2 * devices * 3, dtype=np.float32).reshape(2 * devices, 3)
  mapped = jax.jit(lambda x: sharding.map_slots_on_each_device(
      lambda env, r: (r * env, r.sum()), 2.0, (x,), mesh))(slots)
  out['slot_order'] = bool(np.array_equal(mapped[0], 2 * slots)
                           and np.array_equal(mapped[1], slots.sum(1)))
  # The audit's canary hook closes over traced canary directions and signs; the sharded round (a
  # shard_map on a CPU) runs it too and releases what the vmapped one does.
  settings = canaries.AuditSettings(num_trials=2, num_canaries=4, num_rounds=2)
  projections = {}
  for executor in (Vmap(), Sharded()):
    audited = canaries.with_canary_clients(dataclasses.replace(
        exp, round_config=dataclasses.replace(exp.round_config, executor=executor)), 4)
    projections[executor.name] = canaries.audit_scores(audited, settings).projections
  out['audit_max_abs_diff'] = float(np.max(np.abs(projections['vmap'] - projections['sharded'])))
  out['audit_scores_nonzero'] = bool(np.any(projections['vmap'] != 0))
  return out


@pytest.mark.parametrize('devices', [8, 1])
def test_sharded_executor_matches_vmap(devices):
  env = dict(os.environ, XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS='cpu',
             PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, 'tests'),
                                         os.environ.get('PYTHONPATH', '')]))
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(devices)], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result.pop('slot_order'), result
  assert result.pop('audit_scores_nonzero') and result.pop('audit_max_abs_diff') <= 1e-4, result
  for name, r in result.items():
    if r['capacity'] > devices:  # CPU: each device trains its slots one at a time
      assert r['extra_loops'] >= 1, (name, r)
    assert r['max_abs_diff'] <= 1e-5 and r['loss_diff'] <= 1e-5, (name, r)
    assert r['cohort'] > 0 and r['capacity'] % devices == 0, (name, r)
    assert r['state_devices'] == devices and r['state_replicated'], (name, r)
  if devices > 1:  # the cohort really was split: its uploads cross devices to be summed (an
    # all-reduce where each device sums its slice; the CPU loop gathers them back in slot order)
    assert result['sharded']['collectives'], result
    # 10 default slots -> 16; chunk_size=4 caps a chunk at 4 slots, rounded up to 8 devices.
    assert result['sharded']['capacity'] == 16 and result['sharded_chunked']['capacity'] == 8


def test_a_sharded_run_on_a_cpu_gets_one_device_per_core_unless_a_count_was_chosen(tmp_path):
  # The binary, as a sweep starts it: no device count in the environment. One device would train
  # the whole cohort with one core's worth of small GEMMs (launch.fair_benchmark's block (d)).
  env = {k: v for k, v in os.environ.items() if k != 'JAX_NUM_CPU_DEVICES'}
  env['XLA_FLAGS'] = re.sub(r'--xla_force_host_platform_device_count=\d+', '', env['XLA_FLAGS'])
  env['JAX_PLATFORMS'] = 'cpu'
  cores = len(os.sched_getaffinity(0))

  def header(workdir, **extra):
    proc = subprocess.run(
        [sys.executable, '-m', 'experiments.train', '--config=experiments/configs/default.py',
         *TINY_FLAGS, '--config.num_rounds=1', '--config.executor=sharded', f'--workdir={workdir}'],
        cwd=ROOT, env={**env, **extra}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return re.search(r'executor sharded \(over (\d+) cpu devices\)',
                     (workdir / 'train.INFO').read_text()).group(1)

  assert header(tmp_path / 'auto') == str(cores)
  assert header(tmp_path / 'chosen', JAX_NUM_CPU_DEVICES='3') == '3'
  # Once JAX has started its backends the count is fixed: the function leaves it alone.
  code = ('import jax; from dp2fedsam_jax import sharding; jax.devices(); '
          'print(sharding.one_cpu_device_per_core(), jax.device_count())')
  proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.stdout.split() == ['None', '1'], proc.stderr[-2000:]


def test_config_accepts_the_sharded_executor_and_names_the_choices():
  validate_config(tiny_config(executor='sharded'))
  with pytest.raises(ConfigError, match=r"config\.executor='pmap'.*'sharded'"):
    validate_config(tiny_config(executor='pmap'))


if __name__ == '__main__':
  print(json.dumps(_child(int(sys.argv[1]))))
