"""The throughput benchmark runs as a binary and writes every field the README's tables use."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_client_throughput_binary_writes_positive_numbers(tmp_path):
  out = tmp_path / 'bench.json'
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]),
             XLA_FLAGS='', JAX_PLATFORMS='cpu')
  proc = subprocess.run(
      [sys.executable, '-m', 'benchmarks.client_throughput', '--model=mlp', '--clients=2',
       '--samples_per_client=8', '--batch_size=4', '--personal_epochs=1', '--shared_epochs=1',
       '--cpu_devices=2', '--rounds=1', '--matmul_size=64', '--notorch',
       f'--json_out={out}'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 's/round' in proc.stdout  # the table
  result = json.loads(out.read_text())
  assert result['device']['platform'] == 'cpu' and result['device']['matmul_peak_gflops'] > 0
  assert result['client_flops']['personal_phase'] > 0 and result['client_flops']['body_phase'] > 0
  assert result['device']['device_count'] == 2  # --cpu_devices: the sharded row's 2 devices
  assert [(r['mode'], r['clients']) for r in result['results']] == [
      ('vmap', 2), ('sequential', 2), ('sharded', 2)]
  for row in result['results']:
    for field in ('seconds_per_round', 'clients_per_second', 'examples_per_second',
                  'gflops_per_second', 'compile_seconds', 'peak_rss_bytes_process',
                  'percent_of_matmul_peak'):
      assert row[field] > 0, (field, row)


@pytest.mark.slow
def test_accelerator_command_runs_end_to_end_at_smoke_sizes(tmp_path):
  """benchmarks/accelerator.sh, the README's one command for a GPU/TPU machine, on this CPU."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]),
             XLA_FLAGS='--xla_backend_optimization_level=0', JAX_PLATFORMS='cpu', SMOKE='1',
             SKIP_INSTALL='1')
  out = tmp_path / 'acc'
  proc = subprocess.run(['bash', 'benchmarks/accelerator.sh', str(out)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  summary = json.loads((out / 'summary.json').read_text())
  assert summary['smoke'] and summary['device']['platform'] == 'cpu'
  assert not summary['skipped'] and not summary['failed']
  assert list(summary['step_seconds']) == ['conv_sweep', 'pfl', 'agreement', 'paper_regime', 'scaling',
                                           'masks']
  assert summary['agreement']['agree']
  assert summary['paper_regime']['rounds'] == 1 and summary['paper_regime']['wall_seconds'] > 0
  # The conv sweep: both lowerings against the best loop, and the entry of auto's table it supports.
  assert set(summary['conv_sweep']['vmap_over_best_sequential']['2']) == {'xla', 'im2col'}
  assert summary['conv_sweep']['auto_conv_impl_supported']['cpu'] in ('xla', 'im2col')
  sweep = json.loads((out / 'conv_sweep.json').read_text())
  assert [(r['conv_impl'], r['matmul_precision'], r['mode']) for r in sweep['results']][-1][1:] == (
      'bfloat16', 'vmap')
  assert all(r['status'] == 'ok' for r in sweep['results'])
  # pfl-research's setup: every method, its reference figure beside it.
  assert set(summary['pfl']['results']) == {'fedavg', 'dp_fedavg', 'dp2fedsam'}
  assert all(r['client_updates_per_second'] > 0 for r in summary['pfl']['results'].values())
  assert summary['pfl']['pfl_research']['derived_client_updates_per_second'] == [250, 420]
  assert {(r['mode'], r['clients']) for r in summary['scaling']['rows']} == {
      ('sequential', 1), ('sequential', 2), ('vmap', 1), ('vmap', 2)}
  scaling = json.loads((out / 'cohort_scaling.json').read_text())
  assert {(r['mode'], r['clients']) for r in scaling['rows'] if r['status'] == 'ok'} == {
      ('sequential', 1), ('sequential', 2), ('vmap', 1), ('vmap', 2)}
  assert all(r['seconds_per_client'] > 0 and r['peak_memory_bytes'] > 0 for r in scaling['rows'])
  assert (out / 'cohort_scaling.png').stat().st_size > 10_000
  assert 'paper regime: 1 rounds' in proc.stdout and 'executors agree' in proc.stdout
  assert "pfl-research's CIFAR-10 setup, fedavg" in proc.stdout
  # The mask step: both ways timed (the benchmark fails if their masks differ), one client and vmapped.
  assert set(summary['masks']) == {'64 x 0.5, one client', '64 x 0.5, vmap over 2'}
  assert all(x > 0 for x in summary['masks'].values())


def test_conv_sweep_and_pfl_setup_run_at_tiny_sizes(tmp_path):
  """The two benchmark modes of issue 59 at 2 rounds and cohort 2 (CI; the GPU runs them at size)."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]),
             XLA_FLAGS='--xla_backend_optimization_level=0', JAX_PLATFORMS='cpu')
  sweep = subprocess.run(
      [sys.executable, '-m', 'benchmarks.conv_sweep', f'--out={tmp_path}', '--model=pfl_cifar_cnn',
       '--impls=im2col', '--vmap_cohorts=2', '--sequential_cohorts=', '--precision_cohort=2',
       '--extra_precisions=', '--samples_per_client=4', '--batch_size=2', '--personal_epochs=1',
       '--shared_epochs=1', '--rounds=2', '--matmul_size=64', '--noflops'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert sweep.returncode == 0, sweep.stderr[-3000:]
  result = json.loads((tmp_path / 'conv_sweep.json').read_text())
  (row,) = result['results']
  assert (row['conv_impl'], row['mode'], row['clients'], row['status']) == ('im2col', 'vmap', 2, 'ok')
  assert row['seconds_per_round'] > 0 and len(row['round_seconds']) == 2
  assert result['summary']['fastest_vmap_impl'] == {'2': 'im2col'}
  pfl = subprocess.run(
      [sys.executable, '-m', 'benchmarks.pfl_cifar10', f'--out={tmp_path}', '--rounds=2', '--users=4',
       '--cohort=2', '--examples_per_user=4', '--batch_size=2', '--noise_multiplier=1.0'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert pfl.returncode == 0, pfl.stderr[-3000:]
  result = json.loads((tmp_path / 'pfl_cifar10.json').read_text())
  assert [r['method'] for r in result['results']] == ['fedavg', 'dp_fedavg', 'dp2fedsam']
  for r in result['results']:
    assert r['rounds'] == 2 and r['client_updates_per_second'] > 0 and r['setup_minutes_projected']
    assert r['executor'] == 'sequential'  # auto on a CPU
  assert result['results'][1]['noise_multiplier'] == 1.0 and result['results'][1]['clip_norm'] == 0.4
  assert result['config']['local']['lr_shared'] == 0.1 and result['config']['local']['momentum'] == 0
  assert 'a few minutes' in result['pfl_research']['published']


def test_sweep_summary_compares_vmap_with_the_best_loop_and_picks_auto():
  from benchmarks.timing import numerics, sweep_summary
  line = lambda impl, mode, clients, s, precision='default', norm=1.0: {
      'conv_impl': impl, 'mode': mode, 'clients': clients, 'seconds_per_round': s, 'status': 'ok',
      'matmul_precision': precision, 'last_round': {'mean_update_norm': norm}}
  rows = [line('xla', 'vmap', 50, 0.1), line('xla', 'sequential', 50, 0.25),
          line('im2col', 'vmap', 50, 0.02), line('im2col', 'sequential', 50, 0.5),
          line('im2col', 'vmap', 50, 0.01, 'bfloat16', 1.01), line('im2col', 'vmap', 50, 0.03, 'float32'),
          {'conv_impl': 'xla', 'mode': 'vmap', 'clients': 500, 'status': 'out of memory',
           'matmul_precision': 'default'}]
  s = sweep_summary(rows, 50)
  assert s['best_sequential_seconds_per_client'] == 0.25 / 50  # the faster loop, either lowering
  assert s['vmap_over_best_sequential']['50'] == {'xla': 2.5, 'im2col': 12.5}
  assert s['goal_met'] and s['fastest_vmap_impl'] == {'50': 'im2col'}
  assert list(s['auto_conv_impl_supported'].values()) == ['im2col']
  (bf16,) = [n for n in numerics(rows) if n['matmul_precision'] == 'bfloat16']
  assert abs(bf16['relative_difference_to_float32']['mean_update_norm'] - 0.01) < 1e-12


def test_results_go_under_the_device_and_date_by_default():
  from types import SimpleNamespace
  from benchmarks.accelerator import default_out
  out = default_out(SimpleNamespace(device_kind='NVIDIA H200', platform='gpu'))
  assert out.startswith(os.path.join('benchmarks', 'results', 'nvidia-h200-20'))
  assert os.path.basename(default_out(SimpleNamespace(device_kind='AMD EPYC', platform='cpu'))).startswith(
      'cpu-20')


def test_executor_agreement_is_relative_and_catches_a_perturbed_round():
  from types import SimpleNamespace
  import numpy as np
  from benchmarks.accelerator import compare_rounds
  start = {'w': np.zeros(4)}
  metrics = {'mean_update_norm': 5.1172, 'train_loss': 1.6093, 'clipped_fraction': 1.0,
             'cohort_size': 20}
  a = (SimpleNamespace(shared={'w': np.full(4, 1.0)}), metrics)
  # The measured gap of the default experiment (2.8e-4 in the norm) agrees ...
  close = (SimpleNamespace(shared={'w': np.full(4, 1.0001)}),
           {**metrics, 'mean_update_norm': 5.1158, 'train_loss': 1.6087})
  assert compare_rounds(start, a, close)['agree']
  # ... a different cohort, a client trained twice (norm off by ~1/20) or another step does not.
  assert not compare_rounds(start, a, (close[0], {**close[1], 'cohort_size': 19}))['agree']
  assert not compare_rounds(start, a, (close[0], {**close[1], 'mean_update_norm': 5.37}))['agree']
  assert not compare_rounds(start, a, (SimpleNamespace(shared={'w': np.full(4, 1.05)}),
                                       close[1]))['agree']


@pytest.mark.slow
def test_sequence_flops_matches_a_direct_count_of_the_unrolled_lstm():
  """The length-2/length-3 extrapolation is XLA's count of the model unrolled over all T steps, up to
  the zero-carry simplifications of the unrolled first steps (1-3 % at T = 5, measured)."""
  import numpy as np
  from benchmarks import flops
  from dp2fedsam_jax.algorithms import get_method
  from dp2fedsam_jax.config import base_config
  from dp2fedsam_jax.data import from_flat_arrays
  from dp2fedsam_jax.local import LocalConfig
  from dp2fedsam_jax.models import get_model
  c = base_config()
  c.local.personal_epochs, c.local.shared_epochs, c.local.batch_size = 1, 1, 2
  lc, spec = LocalConfig.from_config(c), get_method('dp2fedsam')
  tokens = np.ones((2, 5), np.uint8)
  data = from_flat_arrays(train_x=tokens, train_y=tokens, train_offsets=[0, 2], test_x=tokens[:1],
                          test_y=tokens[:1], test_offsets=[0, 1], num_classes=6,
                          input_kind='tokens', pad_id=0)
  count = lambda t: flops.client_flops(
      spec, get_model('char_lstm_small', 6, (t,), hidden=(4,), unroll=t), lc, 2, data.normalize,
      data.loss_mask)
  extrapolated, direct = flops.sequence_flops(count, 5), count(5)
  assert direct.body_step > 0 and direct.head_step > 0
  assert np.isclose(extrapolated.total, direct.total, rtol=0.04), (extrapolated, direct)
  assert np.isclose(extrapolated.body_step, direct.body_step, rtol=0.04)
  assert extrapolated.overhead == direct.overhead  # per-parameter work does not grow with T
