"""Metric writers in the style of clu.metric_writers: `write_scalars(step, scalars)`, `flush()`,
`close()`.

A training run writes two collections into its workdir (train.py):

  train_metrics.jsonl   every round: train_loss, mean_update_norm, clipped_fraction, cohort_size,
                        nonfinite_clients, seconds (the round's wall time)
  metrics.jsonl         every evaluated round: epsilon, the evaluation, the training scalars
                        averaged over the rounds since the previous evaluation, seconds per round
                        of that window

Each line is `{"round": step, **scalars}`. With the `[tensorboard]` extra (tensorboardX, which needs
no TensorFlow) the same scalars also go to TensorBoard event files under `tensorboard/train` and
`tensorboard/eval`.

Appending keeps a line whole against a kill (one write call per line); a torn last line, which
only a crash inside that call could leave, is dropped by `read_jsonl`. On resume, each file is cut
back to the checkpointed round before the run appends again, so an interrupted and resumed run
leaves the files of an uninterrupted one (but `seconds`).

This module imports no JAX: the caller decides which process writes (process 0 of a multi-host run).
"""

from __future__ import annotations

import abc
import importlib.util
import itertools
import json
import math
import numbers
import os
import sys
from typing import Any, Iterable, Mapping

TRAIN_FILE = 'train_metrics.jsonl'
EVAL_FILE = 'metrics.jsonl'
HOSTS_FILE = 'hosts.jsonl'  # a line per start of the run: the machine (run_files.record_host)
TENSORBOARD_DIR = 'tensorboard'


class MetricWriter(abc.ABC):
  """Writes the scalars of a step; `flush()` makes them durable, `close()` ends the writer."""

  @abc.abstractmethod
  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes the scalars of one step (a round)."""

  def flush(self) -> None:  # noqa: B027 -- a writer that buffers nothing needs no flush
    pass

  def close(self) -> None:
    self.flush()


def _json_value(value):
  """Python numbers for JSON (numpy scalars included); NaN becomes None (strict JSON has no NaN)."""
  if isinstance(value, bool) or value is None or isinstance(value, str):
    return value
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    value = float(value)
    return None if math.isnan(value) else value
  return value


class JsonlWriter(MetricWriter):
  """One JSON object per `write_scalars` call, appended to `path`."""

  def __init__(self, path: str):
    self.path = path
    self._file = None

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    if self._file is None:
      self._file = open(self.path, 'a', encoding='utf-8')
    record = {'round': int(step), **{k: _json_value(v) for k, v in scalars.items()}}
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()  # one write call per line; a reader (a live plot) sees every round at once

  def flush(self) -> None:
    if self._file is not None:
      self._file.flush()
      os.fsync(self._file.fileno())  # before a checkpoint claims these rounds

  def close(self) -> None:
    if self._file is not None:
      self.flush()
      self._file.close()
      self._file = None


_event_files = itertools.count()


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without torch where torch is installed but not loaded
  (Colab, the [bench] extra): tensorboardX imports it only to accept torch tensors, and that is
  ~4.5 of its ~5 s import on this project's CPU machine. We write floats."""
  if 'torch' in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel  (optional)
    return SummaryWriter
  sys.modules['torch'] = None  # `import torch` now raises ImportError, which tensorboardX allows
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
  finally:
    del sys.modules['torch']
  return SummaryWriter


class TensorBoardWriter(MetricWriter):
  """Scalars as TensorBoard event files, through tensorboardX (the `[tensorboard]` extra).

  `purge_step`: on resume, the first round the run writes again; TensorBoard hides what an earlier
  event file of this directory holds from that round on (written before the interruption).
  """

  def __init__(self, logdir: str, purge_step: int | None = None):
    SummaryWriter = _summary_writer_class()  # pylint: disable=invalid-name
    # tensorboardX names a file by the second it was made: a writer made in the same second (a
    # resume in the same process) would overwrite it without the pid and a count.
    self._writer = SummaryWriter(logdir, purge_step=purge_step,
                                 filename_suffix=f'.{os.getpid()}.{next(_event_files)}')

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    for name, value in scalars.items():
      # Text fields (an epsilon caveat) and undefined values (None) are not scalars. Nor, here, are
      # inf and NaN (epsilon = inf in every round of a non-private run): TensorBoard draws no point
      # for them and tensorboardX logs a warning for each; the JSONL keeps them.
      if (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value)):
        self._writer.add_scalar(name, float(value), int(step))

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class MultiWriter(MetricWriter):
  """Writes to every writer it holds (none: writes nothing, e.g. on processes other than 0)."""

  def __init__(self, writers: Iterable[MetricWriter]):
    self.writers = list(writers)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    for writer in self.writers:
      writer.write_scalars(step, scalars)

  def flush(self) -> None:
    for writer in self.writers:
      writer.flush()

  def close(self) -> None:
    for writer in self.writers:
      writer.close()


def tensorboard_available() -> bool:
  return importlib.util.find_spec('tensorboardX') is not None


def create_writer(workdir: str, collection: str, filename: str,
                  resume_round: int = 0) -> MultiWriter:
  """The writer of one collection ('train' or 'eval'): `<workdir>/<filename>`, and TensorBoard
  event files in `<workdir>/tensorboard/<collection>` when tensorboardX is installed."""
  writers: list[MetricWriter] = [JsonlWriter(os.path.join(workdir, filename))]
  if tensorboard_available():
    writers.append(TensorBoardWriter(os.path.join(workdir, TENSORBOARD_DIR, collection),
                                     purge_step=resume_round + 1 if resume_round else None))
  return MultiWriter(writers)


def read_jsonl(path: str) -> list[dict]:
  """The records of a JSONL metrics file ([] if there is none), without a torn line."""
  if not os.path.exists(path):
    return []
  records = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except ValueError:
        continue  # a torn line: cut off on resume
  return records


def rewrite_jsonl(path: str, records: list[dict]) -> None:
  """Replaces the file by these records atomically (a temporary file and a rename)."""
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    for record in records:
      f.write(json.dumps(record) + '\n')
  os.replace(tmp, path)


def truncate_jsonl(path: str, last_round: int) -> list[dict]:
  """Keeps the records of rounds <= last_round (the checkpoint's); returns them."""
  kept = [r for r in read_jsonl(path) if r.get('round', math.inf) <= last_round]
  if os.path.exists(path):
    rewrite_jsonl(path, kept)
  return kept
