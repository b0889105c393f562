"""The throughput benchmark runs as a binary and writes every field the README's tables use."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_client_throughput_binary_writes_positive_numbers(tmp_path):
  out = tmp_path / 'bench.json'
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]),
             XLA_FLAGS='', JAX_PLATFORMS='cpu')
  proc = subprocess.run(
      [sys.executable, '-m', 'benchmarks.client_throughput', '--model=mlp', '--clients=2',
       '--samples_per_client=8', '--batch_size=4', '--head_epochs=1', '--body_epochs=1',
       '--modes=vmap,sequential', '--rounds=1', '--matmul_size=64', '--notorch',
       f'--json_out={out}'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 's/round' in proc.stdout  # the table
  result = json.loads(out.read_text())
  assert result['device']['platform'] == 'cpu' and result['device']['matmul_peak_gflops'] > 0
  assert result['client_flops']['head_phase'] > 0 and result['client_flops']['body_phase'] > 0
  assert [(r['mode'], r['clients']) for r in result['results']] == [('vmap', 2), ('sequential', 2)]
  for row in result['results']:
    for field in ('seconds_per_round', 'clients_per_second', 'examples_per_second',
                  'gflops_per_second', 'compile_seconds', 'peak_rss_bytes_process',
                  'percent_of_matmul_peak'):
      assert row[field] > 0, (field, row)
