"""How `python3 -m experiments.train` ends: a short summary on stdout (the last evaluation's accuracy
and epsilon, where the files are) while every metric stays in metrics.jsonl; orbax's lines go to the
log file, not to the console."""

import os
import re
import subprocess
import sys

from conftest import TINY_FLAGS
from dp2fedsam_jax import metric_writers, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_binary_ends_with_a_summary_of_the_metrics_files(tmp_path):
  workdir = tmp_path / 'w'
  out = subprocess.run([sys.executable, '-m', 'experiments.train', '--config=experiments/configs/default.py',
                        *TINY_FLAGS, '--config.num_rounds=2', f'--workdir={workdir}',
                        f'--compilation_cache={tmp_path / "cache"}'],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  final = metric_writers.read_jsonl(str(workdir / metric_writers.EVAL_FILE))[-1]
  assert len(final) > 10  # the file keeps every metric; the console says a few
  done, files = out.stdout.strip().splitlines()
  match = re.fullmatch(r'Done: dp2fedsam on synthetic, round 2/2: test accuracy ([\d.]+) % \(pooled '
                       r'([\d.]+) %\), epsilon = ([\d.]+) at delta = [\d.e-]+\.', done)
  assert match, done
  accuracy, pooled, epsilon = map(float, match.groups())
  assert accuracy == round(100 * final['test_accuracy'], 2)
  assert pooled == round(100 * final['test_accuracy_pooled'], 2)
  assert epsilon == round(final['epsilon'], 3)
  assert files.startswith(f'Files in {workdir}: {metric_writers.EVAL_FILE} (')
  for name in (metric_writers.TRAIN_FILE, 'config.json', 'train.INFO', 'checkpoints/'):
    assert f' {name} (' in files
  # orbax's INFO lines (a few dozen a checkpoint) are in the log file only.
  assert 'CheckpointManager' not in out.stderr
  with open(workdir / 'train.INFO') as f:
    assert 'CheckpointManager' in f.read()


def test_summary_of_a_run_without_accuracy_or_privacy(tmp_path):
  (tmp_path / 'config.json').write_text('{"method": "fedavg", "dataset": "synthetic", "num_rounds": 5}')
  text = train.summary({'round': 5, 'epsilon': float('inf')}, str(tmp_path))
  assert text.splitlines() == [
      'Done: fedavg on synthetic, round 5/5: accuracy not recorded (private_metrics_only), not private '
      '(epsilon = inf).', f'Files in {tmp_path}: config.json (the config as run).']
