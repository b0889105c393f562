"""What every dataset source returns: an in-memory ArrayDataset (uint8 images, labels, channel
stats), and the error a missing dataset raises.

A leaf of `data/` (numpy only): `sources.py`, `femnist.py` and `tfds_source.py` all build on it, so
none of them imports another for these names.
"""

from __future__ import annotations

import dataclasses

import numpy as np


class DatasetNotFoundError(FileNotFoundError):
  """A dataset file is missing; the message says how to get it."""


@dataclasses.dataclass(frozen=True)
class ArrayDataset:
  """Images and labels held in memory.

  Attributes:
    x: uint8 [n, H, W, C].
    y: int32 [n], values in [0, num_classes).
    num_classes: number of classes.
    mean: per-channel mean of x / 255.
    std: per-channel std of x / 255.
    writers: int32 [n], the writer (natural client) of each example, or None when the data has
      no natural clients; needed by partition 'natural'.
    writer_ids: the writers' names, indexed by `writers`.
  """

  x: np.ndarray
  y: np.ndarray
  num_classes: int
  mean: tuple[float, ...]
  std: tuple[float, ...]
  writers: np.ndarray | None = None
  writer_ids: tuple[str, ...] | None = None

  def __post_init__(self):
    if self.x.ndim != 4 or self.x.dtype != np.uint8:
      raise ValueError(
          f'ArrayDataset.x must be uint8 [n, H, W, C]; got {self.x.dtype} '
          f'{self.x.shape}.')
    if self.y.shape != (self.x.shape[0],):
      raise ValueError(
          f'ArrayDataset.y must have shape ({self.x.shape[0]},); got '
          f'{self.y.shape}.')
    channels = self.x.shape[-1]
    if len(self.mean) != channels or len(self.std) != channels:
      raise ValueError(
          f'ArrayDataset.mean/std need {channels} entries (one per channel); '
          f'got {len(self.mean)} and {len(self.std)}.')
    if self.y.size and (self.y.min() < 0 or self.y.max() >= self.num_classes):
      raise ValueError(
          f'labels must lie in [0, {self.num_classes}); got range '
          f'[{self.y.min()}, {self.y.max()}].')
    if self.writers is not None:
      if self.writers.shape != self.y.shape or not np.issubdtype(self.writers.dtype, np.integer):
        raise ValueError(f'ArrayDataset.writers must be integer [{len(self.y)}]; got '
                         f'{self.writers.dtype} {self.writers.shape}.')
      if self.writer_ids is None or (self.writers.size and self.writers.max() >= len(self.writer_ids)):
        raise ValueError('ArrayDataset.writer_ids must name every index in writers.')

  def __len__(self) -> int:
    return int(self.x.shape[0])

  @property
  def image_shape(self) -> tuple[int, ...]:
    return tuple(self.x.shape[1:])


def channel_stats(x: np.ndarray, chunk: int = 8192) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """Per-channel mean and std of x / 255 for uint8 [n, H, W, C], in chunks (no float copy of x)."""
  c = x.shape[-1]
  total = np.zeros(c, np.float64)
  squares = np.zeros(c, np.float64)
  for start in range(0, len(x), chunk):
    part = x[start:start + chunk].reshape(-1, c).astype(np.float64)
    total += part.sum(axis=0)
    squares += np.square(part).sum(axis=0)
  count = max(1, x.size // c)
  mean = total / count / 255.0
  var = np.maximum(squares / count / 255.0**2 - mean**2, 0.0)
  std = np.maximum(np.sqrt(var), 1e-3)  # avoid /0 on constant data
  return tuple(float(m) for m in mean), tuple(float(s) for s in std)
