"""What every dataset source returns: an in-memory ArrayDataset (uint8 images, labels, the
dataset's published normalization), the error a missing dataset raises, and the reader of TFF's
per-client h5 files.

A leaf of `data/` (numpy only): `sources.py`, `femnist.py` and `tfds_source.py` all build on it, so
none of them imports another for these names.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

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
    mean: per-channel mean of x / 255 to normalise with (NORMALIZATION: published, not measured).
    std: per-channel std of x / 255 to normalise with.
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


# Per-channel (mean, std) of x / 255 that every released model is normalised with: published
# constants, never statistics of the federation's own data (those would enter every released model
# without noise). Keys are TFDS names (and 'femnist', 'synthetic'); `normalization` looks them up.
NORMALIZATION = {
    # Each dataset's training set, as its community normalises it.
    'mnist': ((0.1307,), (0.3081,)),
    'fashion_mnist': ((0.2860,), (0.3530,)),
    'cifar10': ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    'cifar100': ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    # EMNIST by split (Cohen et al. 2017's data; the constants PyTorch Lightning Bolts ships).
    'emnist': ((0.174,), (0.332,)),  # TFDS's default config, byclass
    'emnist/byclass': ((0.174,), (0.332,)),
    'emnist/bymerge': ((0.174,), (0.332,)),
    'emnist/balanced': ((0.175,), (0.333,)),
    'emnist/letters': ((0.172,), (0.331,)),
    'emnist/digits': ((0.173,), (0.332,)),
    'emnist/mnist': ((0.173,), (0.332,)),
    # FEMNIST (TFF / LEAF) holds EMNIST's characters on a white background (fedjax's loader flips
    # them back): EMNIST byclass's constants, flipped.
    'femnist': ((1.0 - 0.174,), (0.332,)),
    # The generator's own scale, not its samples: uniform prototypes around 0.5, spread ~0.35.
    'synthetic': ((0.5,), (0.35,)),
}
# A dataset without published constants (any 'tfds:<name>'): [0, 1] -> [-1, 1], data-independent.
DEFAULT_NORMALIZATION = ((0.5,), (0.5,))


def normalization(name: str, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """(mean, std) per channel for dataset `name` (a NORMALIZATION key), from the table alone: a
  one-channel entry is repeated over `channels` (the synthetic source's colour images)."""
  mean, std = NORMALIZATION.get(name.split(':')[0], DEFAULT_NORMALIZATION)  # (a TFDS version)
  if len(mean) == 1:
    mean, std = mean * channels, std * channels
  if len(mean) != channels:
    raise ValueError(f'the normalization of {name!r} has {len(mean)} channels, the images {channels}.')
  return mean, std


def tff_h5_clients(path: str, dataset: str,
                   fields: tuple[str, ...]) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
  """(client id, {field: array}) for each client of a TFF h5 file (examples/<client>/<field>),
  with an error naming the file and the client where a group or a field is missing."""
  import h5py  # pylint: disable=import-outside-toplevel  (only needed for this format)
  layout = ' and '.join(f'examples/<client>/{field}' for field in fields)
  with h5py.File(path, 'r') as f:
    if 'examples' not in f:
      raise ValueError(f'{path}: no group "examples"; not a TFF {dataset} h5 file (expected {layout}).')
    for client, group in f['examples'].items():
      missing = [field for field in fields if field not in group]
      if missing:
        raise ValueError(f'{path}: examples/{client} has no {missing} (has {sorted(group)}).')
      yield client, {field: group[field][()] for field in fields}
