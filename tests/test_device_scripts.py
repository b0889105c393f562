"""The scripts a lent GPU machine runs (benchmarks/device/*.sh), checked on the CPU: a lease is rare and
short, so they must work the first time.

- setup.sh unpacks the carried Fashion-MNIST to the bytes the loader reads, and leaves a copy
  already there alone;
- first_call.sh runs end to end at smoke sizes (slow: the accelerator's smoke and 2 notebook
  rounds, ~3.5 minutes) and brings back at most the tool's 8 files;
- tree.sh slim leaves the earlier studies' runs out of what a call sends, keeps the fair
  blocks and the uncommitted edits, and restore gives back the branch as it was.
"""

import lzma
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE = os.path.join(ROOT, 'benchmarks', 'device')
SCRIPTS = ('setup.sh', 'payload.sh', 'first_call.sh', 'fair_benchmark.sh', 'shakespeare_field.sh',
           'tree.sh', 'small_files.sh')


@pytest.mark.parametrize('script', SCRIPTS)
def test_each_device_script_parses(script):
  out = subprocess.run(['bash', '-n', os.path.join(DEVICE, script)], capture_output=True,
                       text=True, check=False)
  assert out.returncode == 0, out.stderr


def test_setup_unpacks_the_carried_data_where_the_loader_looks_and_keeps_what_is_there(tmp_path):
  checkout, target = tmp_path / 'checkout', tmp_path / 'datasets' / 'fashion-mnist'
  (checkout / '.device_data' / 'fashion-mnist').mkdir(parents=True)
  shutil.copytree(DEVICE, checkout / 'benchmarks' / 'device')
  idx = {'train-labels-idx1-ubyte': bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 1, 9])}
  for name, data in idx.items():
    (checkout / '.device_data' / 'fashion-mnist' / f'{name}.xz').write_bytes(lzma.compress(data))
  source = f'FASHION_MNIST_DIR={target}; source benchmarks/device/setup.sh'
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
  out = subprocess.run(['bash', os.path.join(DEVICE, 'first_call.sh'), str(out_dir)],
                       cwd=ROOT, env={**os.environ, 'SMOKE': '1'}, capture_output=True, text=True,
                       check=False)
  assert out.returncode == 0, out.stdout[-3000:]
  assert sorted(os.listdir(out_dir)) == ['accelerator.tar.gz', 'colab_tpu_executed.ipynb',
                                         'first_call.log']
  listing = subprocess.run(['tar', 'tzf', str(out_dir / 'accelerator.tar.gz')], capture_output=True,
                           text=True, check=True).stdout
  assert 'summary.json' in listing and 'checkpoints' not in listing


def _git(checkout, *args):
  return subprocess.run(['git', *args], cwd=checkout, capture_output=True, text=True,
                        check=True).stdout.strip()


def _clone_on_branch_work(tmp_path):
  """A shared clone of this repository on a branch 'work' (a CI clone may sit on a detached
  HEAD), holding this checkout's tree.sh."""
  checkout = tmp_path / 'clone'
  subprocess.run(['git', 'clone', '-q', '--shared', ROOT, str(checkout)], check=True)
  _git(checkout, 'switch', '-q', '-c', 'work')
  (checkout / 'benchmarks' / 'device').mkdir(parents=True, exist_ok=True)
  shutil.copy(os.path.join(DEVICE, 'tree.sh'), checkout / 'benchmarks' / 'device')
  return checkout


def test_a_slim_tree_leaves_the_earlier_studies_behind_and_restore_gives_all_back(tmp_path):
  checkout = _clone_on_branch_work(tmp_path)
  head = _git(checkout, 'rev-parse', 'HEAD')
  with open(checkout / 'README.md', 'a', encoding='utf-8') as f:
    f.write('an uncommitted edit\n')
  tree = ['bash', 'benchmarks/device/tree.sh']
  size = lambda: int(subprocess.run(tree + ['size'], cwd=checkout, capture_output=True, text=True,
                                    check=True).stdout)
  before = size()

  subprocess.run(tree + ['slim'], cwd=checkout, capture_output=True, check=True)
  results = _git(checkout, 'ls-files', 'experiments/results').splitlines()
  folders = {p.split('/')[2] for p in results if p.count('/') > 2}
  assert folders and all(f.startswith('fair_') for f in folders), folders
  assert not (checkout / 'experiments' / 'results' / 'shakespeare_field').exists()
  assert size() < before
  assert 'an uncommitted edit' in (checkout / 'README.md').read_text(encoding='utf-8')
  assert 'README.md' not in _git(checkout, 'show', '--name-only', '--format=', 'HEAD').splitlines()
  again = subprocess.run(tree + ['slim'], cwd=checkout, capture_output=True, text=True, check=False)
  assert again.returncode == 1 and 'restore first' in again.stderr

  subprocess.run(tree + ['restore'], cwd=checkout, capture_output=True, check=True)
  assert _git(checkout, 'symbolic-ref', '--short', 'HEAD') == 'work'
  assert _git(checkout, 'rev-parse', 'HEAD') == head
  assert size() == before
  status = {line.strip() for line in _git(checkout, 'status', '--porcelain').splitlines()}
  this_tree_sh = {'?? benchmarks/device/', '?? benchmarks/device/tree.sh', 'M benchmarks/device/tree.sh'}
  assert status - this_tree_sh == {'M README.md'}
  assert 'device-slim' not in _git(checkout, 'branch', '--list')


def test_restore_refuses_while_the_slim_branch_holds_a_commit_of_its_own(tmp_path):
  checkout = _clone_on_branch_work(tmp_path)
  subprocess.run(['bash', 'benchmarks/device/tree.sh', 'slim'], cwd=checkout, capture_output=True,
                 check=True)
  (checkout / 'published.txt').write_text('a run published on the wrong branch\n', encoding='utf-8')
  _git(checkout, 'add', 'published.txt')
  _git(checkout, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-q', '-m', 'oops')
  out = subprocess.run(['bash', 'benchmarks/device/tree.sh', 'restore'], cwd=checkout,
                       capture_output=True, text=True, check=False)
  assert out.returncode == 1 and 'git cherry-pick' in out.stderr
  assert _git(checkout, 'symbolic-ref', '--short', 'HEAD') == 'device-slim'


def test_stage_copies_a_cpu_roots_block_with_its_secrets_but_no_checkpoints_and_waits_for_its_sweep(
    tmp_path):
  """tree.sh stage: a block's small files and each search's operator file (so that a search
  under way continues on the device with its K, not a second draw) go to DEST; checkpoints,
  TensorBoard events and absl logs stay; refused while a sweep of that root runs."""
  cpu_root, dest = tmp_path / 'fair', tmp_path / 'dest'
  trial = cpu_root / 'fair_d_shakespeare' / 'centaur' / 'trial=aa'
  for path in ('config.json', 'metrics.jsonl', 'train_metrics.jsonl', 'sweep.json', 'train.log',
               'checkpoints/330/state', 'tensorboard/events.out', 'train.vm.root.log.INFO.1',
               '../tuning_operator_private.json', '../tuning.json'):
    (trial / path).parent.mkdir(parents=True, exist_ok=True)
    (trial / path).write_text(path)
  stage = ['bash', os.path.join(DEVICE, 'tree.sh'), 'stage', 'd', str(cpu_root)]
  env = {**os.environ, 'DEST': str(dest)}
  out = subprocess.run(stage, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
  assert out.returncode == 0, out.stderr
  staged = {str(p.relative_to(dest)) for p in dest.rglob('*') if p.is_file()}
  row = 'fair_d_shakespeare/centaur'
  assert staged == {f'{row}/tuning_operator_private.json', f'{row}/tuning.json'} | {
      f'{row}/trial=aa/{n}' for n in ('config.json', 'metrics.jsonl', 'train_metrics.jsonl',
                                      'sweep.json', 'train.log')}
  sweep = subprocess.Popen(['bash', '-c', f'exec -a "python3 -m launch.fair_benchmark '
                            f'--root={cpu_root} --blocks=d" sleep 30'])
  try:
    out = subprocess.run(stage, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
  finally:
    sweep.kill()
  assert out.returncode == 1 and 'stop it first' in out.stderr
