"""TFDS image-classification datasets (CIFAR-10/100, EMNIST, ...) as in-memory ArrayDatasets.

The only module that imports TensorFlow, and only when a TFDS dataset is loaded: the core and the
default Fashion-MNIST (IDX) path never do (Colab TPU runtimes no longer ship TF). Needs the [tfds]
extra: `pip install -e '.[tfds]'`.

Data is read by iterating the tf.data pipeline in batches (`batch_size=-1` aborted the process under
`tfds.testing.mock_data`), once, into numpy.
"""

from __future__ import annotations

import os

import numpy as np

from dp2fedsam_jax.data.arrays import ArrayDataset, DatasetNotFoundError, normalization

DEFAULT_TFDS_DIR = os.path.join(os.path.expanduser('~'), 'tensorflow_datasets')
_BATCH = 4096


class MissingExtraError(ImportError):
  """A dataset needs the [tfds] extra, which is not installed; the message says how to install it."""


def _import_tfds(name: str):
  try:
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TF's C++ start-up chatter
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise MissingExtraError(
        f'config.dataset={name!r} is read through TensorFlow Datasets, which is not installed '
        f'({e}). Fix: pip install -e \'.[tfds]\' (tensorflow-datasets + tensorflow-cpu); or, for '
        "Fashion-MNIST without TensorFlow, use config.dataset='fashion_mnist' (IDX files from the "
        'Debian package dataset-fashion-mnist).') from e
  # TF must not take accelerator memory that JAX needs; it only decodes images here.
  try:
    tf.config.set_visible_devices([], 'GPU')
  except RuntimeError:  # already initialised by the caller; nothing to undo
    pass
  return tfds


def _how_to_get(name: str, data_dir: str) -> str:
  hint = (f"Fix: run once while online (downloads into {data_dir}): python3 -c \"import "
          f"tensorflow_datasets as tfds; tfds.builder('{name}', data_dir='{data_dir}')"
          f'.download_and_prepare()"; or copy a prepared {name} directory from another machine\'s '
          f'~/tensorflow_datasets into {data_dir} (or pass --config.data_dir=DIR).')
  if name.split('/')[0] == 'fashion_mnist':
    hint += (" Offline Fashion-MNIST: sudo apt-get install dataset-fashion-mnist and "
             "config.dataset='fashion_mnist' (the IDX reader, no TensorFlow).")
  return hint


def load_tfds(name: str, data_dir: str | None = None, split: str = 'train', *,
              download: bool = True) -> ArrayDataset:
  """Loads TFDS dataset `name` (e.g. 'cifar10', 'emnist/balanced') split `split` into memory.

  Not yet prepared in `data_dir` (default ~/tensorflow_datasets): downloaded and prepared there
  if `download`; if that fails (offline), DatasetNotFoundError says what is missing and how to get
  it. EMNIST images are transposed to upright (TFDS stores them as NIST does, transposed). mean/std
  are the dataset's published constants (arrays.NORMALIZATION; [0, 1] -> [-1, 1] for a dataset
  without), never statistics of the loaded examples.
  """
  tfds = _import_tfds(name)
  data_dir = DEFAULT_TFDS_DIR if data_dir is None else os.fspath(data_dir)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ValueError(f'config.dataset: TFDS has no dataset {name!r} ({e}).') from e
  if not builder.is_prepared():
    if not download:
      raise DatasetNotFoundError(
          f'TFDS dataset {name!r} is not prepared in {data_dir} (missing {builder.data_path}). '
          + _how_to_get(name, data_dir))
    try:
      builder.download_and_prepare()
    except Exception as e:  # noqa: BLE001 - network, checksum, disk: all re-raised with the fix
      raise DatasetNotFoundError(
          f'TFDS dataset {name!r}: not in {data_dir} and the download failed '
          f'({type(e).__name__}: {e}). ' + _how_to_get(name, data_dir)) from e

  info = builder.info
  image_key, label_key = info.supervised_keys or ('image', 'label')
  features = info.features
  if (image_key not in features or label_key not in features
      or not hasattr(features[label_key], 'num_classes')):
    raise ValueError(f'TFDS dataset {name!r} is not image classification: features {features}.')
  if info.splits and split not in info.splits:  # (mock_data has no split metadata)
    raise ValueError(f'split={split!r} is unknown for TFDS {name!r}; choose one of {sorted(info.splits)}.')

  ds = builder.as_dataset(split=split, shuffle_files=False)
  ds = ds.map(lambda ex: (ex[image_key], ex[label_key])).batch(_BATCH)
  xs, ys = [], []
  for x, y in tfds.as_numpy(ds):
    xs.append(np.asarray(x, np.uint8))
    ys.append(np.asarray(y, np.int32))
  if not xs:
    raise ValueError(f'TFDS {name!r} split {split!r} is empty.')
  x = np.concatenate(xs)
  y = np.concatenate(ys)
  if x.ndim == 3:
    x = x[..., None]
  if name.split('/')[0] == 'emnist':
    x = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
  mean, std = normalization(name, x.shape[-1])  # published constants, never the clients' data
  return ArrayDataset(x=x, y=y, num_classes=int(features[label_key].num_classes), mean=mean, std=std)
