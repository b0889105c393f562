"""The scripts a lent GPU machine runs (launch/device_*.sh), checked on the CPU: a lease is rare and
short, so they must work the first time.

- device_setup.sh unpacks the carried Fashion-MNIST to the bytes the loader reads, and leaves a copy
  already there alone;
- device_first_call.sh runs end to end at smoke sizes (slow: the accelerator's smoke and 2 notebook
  rounds, ~3.5 minutes) and brings back at most the tool's 8 files.
"""

import lzma
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ('device_setup.sh', 'device_payload.sh', 'device_first_call.sh', 'fair_benchmark_device.sh',
           'shakespeare_field_device.sh')


@pytest.mark.parametrize('script', SCRIPTS)
def test_each_device_script_parses(script):
  out = subprocess.run(['bash', '-n', os.path.join(ROOT, 'launch', script)], capture_output=True,
                       text=True, check=False)
  assert out.returncode == 0, out.stderr


def test_setup_unpacks_the_carried_data_where_the_loader_looks_and_keeps_what_is_there(tmp_path):
  checkout, target = tmp_path / 'checkout', tmp_path / 'datasets' / 'fashion-mnist'
  (checkout / '.device_data' / 'fashion-mnist').mkdir(parents=True)
  shutil.copytree(os.path.join(ROOT, 'launch'), checkout / 'launch')
  idx = {'train-labels-idx1-ubyte': bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 1, 9])}
  for name, data in idx.items():
    (checkout / '.device_data' / 'fashion-mnist' / f'{name}.xz').write_bytes(lzma.compress(data))
  source = f'FASHION_MNIST_DIR={target}; source launch/device_setup.sh'
  out = subprocess.run(['bash', '-c', source], cwd=checkout, capture_output=True, text=True,
                       check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  assert (target / 'train-labels-idx1-ubyte').read_bytes() == idx['train-labels-idx1-ubyte']
  assert 'jax ' in out.stdout  # it says what JAX sees
  (target / 'train-labels-idx1-ubyte').write_bytes(b'already here')
  subprocess.run(['bash', '-c', source], cwd=checkout, capture_output=True, check=True)
  assert (target / 'train-labels-idx1-ubyte').read_bytes() == b'already here'


@pytest.mark.slow
@pytest.mark.skipif(os.path.isdir(os.path.join(ROOT, '.whl')),
                    reason='.whl holds the device\'s Python 3.12 wheels, which do not install here')
def test_the_first_call_runs_end_to_end_at_smoke_sizes(tmp_path):
  out_dir = tmp_path / 'out'
  out = subprocess.run(['bash', os.path.join(ROOT, 'launch', 'device_first_call.sh'), str(out_dir)],
                       cwd=ROOT, env={**os.environ, 'SMOKE': '1'}, capture_output=True, text=True,
                       check=False)
  assert out.returncode == 0, out.stdout[-3000:]
  assert sorted(os.listdir(out_dir)) == ['accelerator.tar.gz', 'colab_tpu_executed.ipynb',
                                         'first_call.log']
  listing = subprocess.run(['tar', 'tzf', str(out_dir / 'accelerator.tar.gz')], capture_output=True,
                           text=True, check=True).stdout
  assert 'summary.json' in listing and 'checkpoints' not in listing
