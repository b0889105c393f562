"""How `python3 -m experiments.train` ends: a short summary on stdout (the last evaluation's accuracy
and epsilon, where the files are) while every metric stays in metrics.jsonl; orbax's lines go to the
log file, not to the console."""

import json
import os
import re
import subprocess
import sys

from conftest import TINY_FLAGS
from dp2fedsam_jax import metric_writers, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _numbers(line: str) -> list[str]:
  """The numbers of a line, in order, not those inside a name (dp2fedsam's 2)."""
  return re.findall(r'(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?', line)


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
  config = json.loads((workdir / 'config.json').read_text())
  assert config['method'] in done and config['dataset'] in done, done
  # round 2 of 2, the test accuracy and the pooled one (%), epsilon and the delta it is at.
  rounds, total, accuracy, pooled, epsilon, delta = _numbers(done)
  assert (rounds, total, delta) == ('2', '2', f"{config['dp']['delta']:.2g}"), done
  accuracy, pooled, epsilon = map(float, (accuracy, pooled, epsilon))
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
  done, files = train.summary({'round': 5, 'epsilon': float('inf')}, str(tmp_path)).splitlines()
  assert 'fedavg' in done and 'synthetic' in done and _numbers(done) == ['5', '5']  # no accuracy
  # The field that left the accuracy out, and epsilon = inf.
  assert 'private_metrics_only' in done and re.search(r'\binf\b', done), done
  assert str(tmp_path) in files and re.findall(r'(\S+) \(', files) == ['config.json'], files
