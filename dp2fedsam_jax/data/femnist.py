"""FEMNIST by writer: each writer of the handwriting is one client (the natural federated split).

Two on-disk schemas are read, both 28x28 grey images with values in [0, 1] and labels in [0, 62):
- TFF h5 (`fed_emnist_train.h5`, `fed_emnist_test.h5` from TensorFlow Federated):
  `examples/<writer_id>/pixels` float [n, 28, 28], `examples/<writer_id>/label` int [n].
- LEAF JSON (`data/femnist/data/all_data/*.json` from LEAF's preprocess.sh):
  {"users": [...], "num_samples": [...], "user_data": {writer_id: {"x": [[784 floats]], "y": [...]}}}.

All files found are merged per writer (a writer's TFF train and test examples become one pool); the
engine then splits every client 90/10 like any other partition. numpy only; h5py is imported only
when an h5 file is read.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from typing import Iterable

import numpy as np

from dp2fedsam_jax.data.arrays import ArrayDataset, DatasetNotFoundError, normalization, tff_h5_clients

NUM_CLASSES = 62  # 10 digits, 26 upper-case, 26 lower-case letters
# TFF's cache location (tff.simulation.datasets.emnist.load_data): used when config.data_dir is None.
DEFAULT_FEMNIST_DIR = os.path.join(os.path.expanduser('~'), '.keras', 'datasets')
TFF_URL = 'https://storage.googleapis.com/tff-datasets-public/fed_emnist.tar.bz2'
TFF_FILES = ('fed_emnist_train.h5', 'fed_emnist_test.h5')


def _to_uint8(pixels: np.ndarray, where: str) -> np.ndarray:
  pixels = np.asarray(pixels, np.float32)
  if pixels.size and (not np.all(np.isfinite(pixels)) or pixels.min() < 0.0 or pixels.max() > 1.0):
    raise ValueError(f'{where}: pixel values must lie in [0, 1] (the FEMNIST schema); got range '
                     f'[{pixels.min()}, {pixels.max()}].')
  return np.rint(pixels * 255.0).astype(np.uint8)


def _labels(y, n: int, where: str) -> np.ndarray:
  y = np.asarray(y)
  if y.shape != (n,) or (y.size and not np.issubdtype(y.dtype, np.integer)):
    raise ValueError(f'{where}: expected {n} integer labels; got {y.dtype} {y.shape}.')
  if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES):
    raise ValueError(f'{where}: labels must lie in [0, {NUM_CLASSES}); got [{y.min()}, {y.max()}].')
  return y.astype(np.int32)


def read_tff_h5(path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{writer_id: (x uint8 [n, 28, 28, 1], y int32 [n])} from a TFF FEMNIST h5 file."""
  out = {}
  for writer, arrays in tff_h5_clients(path, 'FEMNIST', ('pixels', 'label')):
    where, pixels = f'{path}: examples/{writer}', arrays['pixels']
    if pixels.ndim != 3 or pixels.shape[1:] != (28, 28):
      raise ValueError(f'{where}/pixels: expected shape [n, 28, 28]; got {pixels.shape}.')
    out[writer] = (_to_uint8(pixels, where)[..., None], _labels(arrays['label'], len(pixels), where))
  return out


def read_leaf_json(path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{writer_id: (x uint8 [n, 28, 28, 1], y int32 [n])} from one LEAF FEMNIST JSON file."""
  with open(path) as f:
    blob = json.load(f)
  missing = {'users', 'user_data'} - set(blob)
  if missing:
    raise ValueError(f'{path}: missing keys {sorted(missing)}; not a LEAF JSON file '
                     '(expected "users", "num_samples", "user_data").')
  counts = blob.get('num_samples', [None] * len(blob['users']))
  out = {}
  for writer, count in zip(blob['users'], counts):
    where = f'{path}: user {writer}'
    if writer not in blob['user_data']:
      raise ValueError(f'{where}: listed in "users" but absent from "user_data".')
    data = blob['user_data'][writer]
    x = np.asarray(data['x'], np.float32)
    if x.ndim != 2 or x.shape[1] != 784:
      raise ValueError(f'{where}: "x" must be a list of flat 784-value images; got shape {x.shape}.')
    if count is not None and count != len(x):
      raise ValueError(f'{where}: num_samples says {count} but "x" holds {len(x)} images.')
    out[writer] = (_to_uint8(x.reshape(-1, 28, 28), where)[..., None], _labels(data['y'], len(x), where))
  return out


def find_files(data_dir: str) -> tuple[str, list[str]]:
  """('h5' | 'json', paths) found in `data_dir` (a directory or one file).

  TFF names are preferred; otherwise LEAF's *.json in data_dir, data_dir/all_data, or
  data_dir/{train,test}.
  """
  if os.path.isfile(data_dir):
    kind = 'h5' if data_dir.endswith('.h5') else 'json'
    return kind, [data_dir]
  tff = [os.path.join(data_dir, n) for n in TFF_FILES if os.path.exists(os.path.join(data_dir, n))]
  if tff:
    return 'h5', tff
  leaf = sorted(glob.glob(os.path.join(data_dir, '*.json')))
  if not leaf:
    leaf = sorted(glob.glob(os.path.join(data_dir, 'all_data', '*.json')))
  if not leaf:
    leaf = sorted(glob.glob(os.path.join(data_dir, 'train', '*.json')) +
                  glob.glob(os.path.join(data_dir, 'test', '*.json')))
  if leaf:
    return 'json', leaf
  raise DatasetNotFoundError(
      f'FEMNIST not found in {data_dir}: expected the TFF files {list(TFF_FILES)} or LEAF JSON files '
      f'(*.json, all_data/*.json or train/ + test/*.json). Fix: while online, run with '
      f'--config.data_dir unset (downloads {TFF_URL} into {DEFAULT_FEMNIST_DIR}), or download and '
      f'extract that file into a directory yourself, or run LEAF\'s data/femnist/preprocess.sh '
      f'(github.com/TalwalkarLab/leaf) and pass --config.data_dir=.../data/femnist/data/all_data.')


def download_tff(cache_dir: str, url: str | None = None) -> list[str]:
  """Fetches TFF's fed_emnist.tar.bz2 (url None: TFF_URL) and extracts its two h5 files into
  `cache_dir`.

  Files are written under a temporary name and renamed, so an interrupted download leaves nothing
  that looks complete. Raises DatasetNotFoundError (offline, bad URL) with how to get the files.
  """
  url = TFF_URL if url is None else url
  os.makedirs(cache_dir, exist_ok=True)
  try:
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
      archive = os.path.join(tmp, 'fed_emnist.tar.bz2')
      with urllib.request.urlopen(url, timeout=60) as response, open(archive, 'wb') as f:
        shutil.copyfileobj(response, f)
      with tarfile.open(archive, 'r:bz2') as tar:
        members = {os.path.basename(m.name): m for m in tar.getmembers() if m.isfile()}
        missing = [n for n in TFF_FILES if n not in members]
        if missing:
          raise DatasetNotFoundError(f'{url}: archive lacks {missing}; has {sorted(members)}.')
        for name in TFF_FILES:
          src = tar.extractfile(members[name])
          part = os.path.join(tmp, name)
          with open(part, 'wb') as out:
            shutil.copyfileobj(src, out)
          os.replace(part, os.path.join(cache_dir, name))
  except (urllib.error.URLError, OSError, tarfile.TarError) as e:
    if isinstance(e, DatasetNotFoundError):
      raise
    raise DatasetNotFoundError(
        f'FEMNIST: could not download {url} into {cache_dir} ({e}). Fix: get the file while online '
        f'and extract {list(TFF_FILES)} into {cache_dir} (or any directory passed as '
        '--config.data_dir), or use LEAF JSON files (github.com/TalwalkarLab/leaf, data/femnist).') from e
  return [os.path.join(cache_dir, n) for n in TFF_FILES]


def read_writers(paths: Iterable[str], kind: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Merges every file's writers; a writer present in several files gets all its examples."""
  reader = read_tff_h5 if kind == 'h5' else read_leaf_json
  parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
  for path in paths:
    for writer, xy in reader(path).items():
      parts.setdefault(writer, []).append(xy)
  return {w: (np.concatenate([x for x, _ in p]), np.concatenate([y for _, y in p]))
          for w, p in parts.items()}


def load_femnist(data_dir: str | None = None, split: str = 'train', *,
                 download: bool = True) -> ArrayDataset:
  """All FEMNIST examples with `writers` (a writer index per example; `writer_ids` names them).

  data_dir None: TFF's cache dir, downloading TFF's files there if missing and `download`.
  `split` must be 'train': FEMNIST has no global test split here, every client is split 90/10.
  """
  if split != 'train':
    raise ValueError(f"split={split!r}: FEMNIST is split per writer (90/10) by the engine; use 'train'.")
  if data_dir is None:
    data_dir = DEFAULT_FEMNIST_DIR
    if download and not os.path.exists(os.path.join(data_dir, TFF_FILES[0])):
      try:
        find_files(data_dir)
      except DatasetNotFoundError:
        download_tff(data_dir)
  if not os.path.exists(data_dir):
    raise DatasetNotFoundError(f'config.data_dir={data_dir!r} does not exist.' + ' ' + _HOW_TO_GET)
  kind, paths = find_files(os.fspath(data_dir))
  by_writer = read_writers(paths, kind)
  if not by_writer:
    raise ValueError(f'FEMNIST files {paths} hold no writers.')
  writer_ids = sorted(by_writer)
  x = np.concatenate([by_writer[w][0] for w in writer_ids])
  y = np.concatenate([by_writer[w][1] for w in writer_ids])
  writers = np.repeat(np.arange(len(writer_ids), dtype=np.int32),
                      [len(by_writer[w][1]) for w in writer_ids])
  mean, std = normalization('femnist', x.shape[-1])  # published, not the writers' own statistics
  return ArrayDataset(x=x, y=y, num_classes=NUM_CLASSES, mean=mean, std=std, writers=writers,
                      writer_ids=tuple(writer_ids))


_HOW_TO_GET = (f'Get FEMNIST: while online leave --config.data_dir unset (downloads {TFF_URL} into '
               f'{DEFAULT_FEMNIST_DIR}), or pass a directory holding {list(TFF_FILES)} or LEAF JSON files.')
