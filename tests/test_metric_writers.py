"""The metric writers: JSONL lines a resume can cut back exactly, and TensorBoard event files when
tensorboardX (the [tensorboard] extra) is installed. No JAX, no training: milliseconds."""

import glob
import importlib.util
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from dp2fedsam_jax import metric_writers


def test_jsonl_lines_are_appended_with_python_numbers_and_no_nan(tmp_path):
  path = str(tmp_path / 'm.jsonl')
  writer = metric_writers.JsonlWriter(path)
  writer.write_scalars(1, {'loss': np.float32(0.5), 'cohort': np.int32(3), 'eps': math.inf,
                           'acc': float('nan'), 'caveat': 'text'})
  # Visible before flush/close: a live plot reads every round as it comes.
  assert json.loads(open(path).read()) == {'round': 1, 'loss': 0.5, 'cohort': 3, 'eps': math.inf,
                                           'acc': None, 'caveat': 'text'}
  writer.close()
  writer = metric_writers.JsonlWriter(path)  # a resumed run appends
  writer.write_scalars(2, {'loss': 0.25})
  writer.close()
  assert [r['round'] for r in metric_writers.read_jsonl(path)] == [1, 2]


def test_truncate_keeps_the_checkpointed_rounds_and_drops_a_torn_line(tmp_path):
  path = str(tmp_path / 'm.jsonl')
  writer = metric_writers.JsonlWriter(path)
  for step in (1, 2, 3):
    writer.write_scalars(step, {'loss': float(step)})
  writer.close()
  with open(path, 'a') as f:
    f.write('{"round": 4, "lo')  # what a crash inside a write can leave
  assert [r['round'] for r in metric_writers.read_jsonl(path)] == [1, 2, 3]
  kept = metric_writers.truncate_jsonl(path, 2)
  assert kept == [{'round': 1, 'loss': 1.0}, {'round': 2, 'loss': 2.0}]
  assert open(path).read() == '{"round": 1, "loss": 1.0}\n{"round": 2, "loss": 2.0}\n'
  assert not os.path.exists(path + '.tmp')
  assert metric_writers.truncate_jsonl(str(tmp_path / 'none.jsonl'), 2) == []
  assert not os.path.exists(tmp_path / 'none.jsonl')  # nothing to cut: no file made


def _events(path: str) -> list:
  """The events of one event file (TFRecord framing: length, its crc, the event, its crc)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  data, events, i = open(path, 'rb').read(), [], 0
  while i < len(data):
    (length,) = struct.unpack('<Q', data[i:i + 8])
    events.append(event_pb2.Event.FromString(data[i + 12:i + 12 + length]))
    i += 12 + length + 4
  return events


def _scalars(path: str) -> list[tuple[str, int, float]]:
  return [(v.tag, e.step, v.simple_value) for e in _events(path) for v in e.summary.value]


def test_tensorboard_leaves_out_inf_and_nan_which_the_jsonl_keeps(tmp_path):
  pytest.importorskip('tensorboardX', reason='the [tensorboard] extra is not installed')
  writer = metric_writers.create_writer(str(tmp_path), 'train', 'train_metrics.jsonl')
  writer.write_scalars(1, {'epsilon': math.inf, 'train_loss': float('nan'), 'noise_std': 0.0})
  writer.close()
  [events] = glob.glob(str(tmp_path / 'tensorboard' / 'train' / 'events.out.tfevents.*'))
  assert _scalars(events) == [('noise_std', 1, 0.0)]
  assert metric_writers.read_jsonl(str(tmp_path / 'train_metrics.jsonl')) == [
      {'round': 1, 'epsilon': math.inf, 'train_loss': None, 'noise_std': 0.0}]


def test_tensorboard_event_files_next_to_the_jsonl(tmp_path):
  pytest.importorskip('tensorboardX', reason='the [tensorboard] extra is not installed')
  writer = metric_writers.create_writer(str(tmp_path), 'eval', 'metrics.jsonl')
  writer.write_scalars(2, {'test_accuracy': np.float32(0.75), 'epsilon_caveat': 'text',
                           'test_loss': None})
  writer.close()
  pattern = str(tmp_path / 'tensorboard' / 'eval' / 'events.out.tfevents.*')
  [first] = glob.glob(pattern)
  assert _scalars(first) == [('test_accuracy', 2, 0.75)]  # text and None are no scalars
  assert metric_writers.read_jsonl(str(tmp_path / 'metrics.jsonl')) == [
      {'round': 2, 'test_accuracy': 0.75, 'epsilon_caveat': 'text', 'test_loss': None}]
  # A resume from round 2 (in the same second) adds a file whose START at round 3 makes
  # TensorBoard hide what earlier files hold from round 3 on.
  resumed = metric_writers.create_writer(str(tmp_path), 'eval', 'metrics.jsonl', resume_round=2)
  resumed.write_scalars(3, {'test_accuracy': 0.5})
  resumed.close()
  [second] = set(glob.glob(pattern)) - {first}
  assert _scalars(first) == [('test_accuracy', 2, 0.75)]
  assert _scalars(second) == [('test_accuracy', 3, 0.5)]
  assert any(e.step == 3 and e.session_log.status == e.session_log.START for e in _events(second))


def test_the_tensorboard_writer_does_not_load_torch_and_leaves_it_importable(tmp_path):
  """Where torch is installed, tensorboardX would import it (~4.5 s a run start); in a fresh process
  the writer works without it, and torch still imports afterwards."""
  pytest.importorskip('tensorboardX', reason='the [tensorboard] extra is not installed')
  if importlib.util.find_spec('torch') is None:
    pytest.skip('torch is not installed: nothing would load it')
  code = ('import sys; from dp2fedsam_jax import metric_writers as m; '
          f'w = m.TensorBoardWriter({str(tmp_path)!r}); w.write_scalars(1, {{"a": 1.0}}); w.close(); '
          "loaded = 'torch' in sys.modules; import torch; print(loaded, torch.ones(2).sum().item())")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ['False', '2.0'], out.stdout + out.stderr
  assert glob.glob(str(tmp_path / 'events.out.tfevents.*'))


def test_no_tensorboard_files_without_the_extra(tmp_path, monkeypatch):
  monkeypatch.setattr(metric_writers, 'tensorboard_available', lambda: False)
  writer = metric_writers.create_writer(str(tmp_path), 'train', 'train_metrics.jsonl')
  writer.write_scalars(1, {'train_loss': 1.0})
  writer.close()
  assert sorted(os.listdir(tmp_path)) == ['train_metrics.jsonl']
