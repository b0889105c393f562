"""FEMNIST by writer: both file schemas (written here, tiny), the natural partition, writer subsets,
the download path (a file:// URL stands in for TFF's server) and the errors."""

from __future__ import annotations

import json
import os
import tarfile

import h5py
import numpy as np
import pytest

from dp2fedsam_jax import data
from dp2fedsam_jax.data import femnist
from dp2fedsam_jax.data.arrays import NORMALIZATION

# writer id -> number of examples; labels and pixels are made from (writer, example) below.
WRITERS = {'f0000_14': 5, 'f0001_41': 12, 'f0002_07': 3, 'f0003_22': 8}


def _example(w: int, j: int):
  """A 28x28 image in [0, 1] with exact uint8 values (k / 255), and its label in [0, 62)."""
  k = (np.arange(784).reshape(28, 28) * (w + 1) + 7 * j) % 256
  return (k / 255.0).astype(np.float32), (w * 13 + j) % 62


def _writer_arrays(w: int, n: int):
  pix, lab = zip(*(_example(w, j) for j in range(n)))
  return np.stack(pix), np.array(lab, np.int32)


def _write_h5(path, writers):
  with h5py.File(path, 'w') as f:
    for name, n in writers.items():
      pixels, labels = _writer_arrays(list(WRITERS).index(name), n)
      f.create_dataset(f'examples/{name}/pixels', data=pixels)
      f.create_dataset(f'examples/{name}/label', data=labels)


def _write_leaf(path, writers):
  blob = {'users': list(writers), 'num_samples': list(writers.values()), 'user_data': {}}
  for name, n in writers.items():
    pixels, labels = _writer_arrays(list(WRITERS).index(name), n)
    blob['user_data'][name] = {'x': pixels.reshape(n, 784).tolist(), 'y': labels.tolist()}
  with open(path, 'w') as f:
    json.dump(blob, f)


def _check_dataset(ds):
  assert ds.x.shape == (sum(WRITERS.values()), 28, 28, 1) and ds.x.dtype == np.uint8
  assert ds.num_classes == 62
  assert ds.writer_ids == tuple(sorted(WRITERS))
  for i, name in enumerate(ds.writer_ids):
    rows = np.flatnonzero(ds.writers == i)
    assert len(rows) == WRITERS[name]
    pixels, labels = _writer_arrays(list(WRITERS).index(name), WRITERS[name])
    np.testing.assert_array_equal(ds.x[rows, ..., 0], np.rint(pixels * 255).astype(np.uint8))
    np.testing.assert_array_equal(ds.y[rows], labels)
  # Published constants (EMNIST's, flipped), never the writers' own statistics.
  assert (ds.mean, ds.std) == NORMALIZATION['femnist']


def test_tff_h5_round_trip_merges_train_and_test(tmp_path):
  # TFF ships a train and a test file; a writer's examples in both are merged into one pool.
  _write_h5(tmp_path / 'fed_emnist_train.h5', {k: v - 1 for k, v in WRITERS.items()})
  with h5py.File(tmp_path / 'fed_emnist_test.h5', 'w') as f:
    for name, n in WRITERS.items():
      pixels, labels = _writer_arrays(list(WRITERS).index(name), n)
      f.create_dataset(f'examples/{name}/pixels', data=pixels[-1:])
      f.create_dataset(f'examples/{name}/label', data=labels[-1:])
  _check_dataset(data.load_dataset('femnist', data_dir=str(tmp_path)))


@pytest.mark.parametrize('layout', ['flat', 'all_data', 'single_file'])
def test_leaf_json_round_trip(tmp_path, layout):
  names = list(WRITERS)
  target = tmp_path / 'all_data' if layout == 'all_data' else tmp_path
  target.mkdir(exist_ok=True)
  if layout == 'single_file':
    _write_leaf(target / 'all_data_0.json', WRITERS)
    _check_dataset(femnist.load_femnist(str(target / 'all_data_0.json')))
    return
  # LEAF splits writers over several files.
  _write_leaf(target / 'all_data_0.json', {n: WRITERS[n] for n in names[:2]})
  _write_leaf(target / 'all_data_1.json', {n: WRITERS[n] for n in names[2:]})
  _check_dataset(femnist.load_femnist(str(tmp_path)))


def test_natural_partition_one_client_per_writer(tmp_path):
  _write_h5(tmp_path / 'fed_emnist_train.h5', WRITERS)
  ds = femnist.load_femnist(str(tmp_path))
  fed = data.make_federated_data(dataset='femnist', num_clients=4, partition='natural',
                                 data_dir=str(tmp_path), seed=0)
  # All writers chosen, in writer order; each client's examples are exactly its writer's, 90/10.
  sizes = [WRITERS[n] for n in sorted(WRITERS)]
  np.testing.assert_array_equal(np.asarray(fed.train_count + fed.test_count), sizes)
  np.testing.assert_array_equal(np.asarray(fed.train_count),
                                [max(1, int(np.floor(0.9 * n + 0.5))) for n in sizes])
  for i in range(len(WRITERS)):
    own = {ds.x[j].tobytes() for j in np.flatnonzero(ds.writers == i)}
    got = list(fed.train_x[int(fed.train_offsets[i]):int(fed.train_offsets[i + 1])])
    got += list(fed.test_x[int(fed.test_offsets[i]):int(fed.test_offsets[i + 1])])
    assert {np.asarray(g).tobytes() for g in got} == own
  assert fed.num_classes == 62 and fed.input_shape == (28, 28, 1)


def test_writer_subset_is_random_per_seed_and_reproducible():
  writers = np.repeat(np.arange(50), 3)[np.random.default_rng(0).permutation(150)]
  pick = lambda seed: data.natural(writers, 10, np.random.default_rng(seed))
  a, b, c = pick(1), pick(1), pick(2)
  assert len(a) == 10
  for part in a:
    assert len(part) == 3 and len(set(writers[part])) == 1  # whole writers, never split
  chosen = [int(writers[p[0]]) for p in a]
  assert chosen == sorted(chosen) and len(set(chosen)) == 10
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert chosen != [int(writers[p[0]]) for p in c]
  # Over many seeds every writer gets chosen sometimes: the subset is not a fixed prefix.
  seen = {int(writers[p[0]]) for s in range(40) for p in data.natural(writers, 10, np.random.default_rng(s))}
  assert seen == set(range(50))


def test_natural_needs_writers_and_enough_of_them(tmp_path):
  with pytest.raises(ValueError, match=r"config.partition='natural'.*config.dataset='synthetic'"):
    data.make_federated_data(dataset='synthetic', num_clients=4, partition='natural')
  with pytest.raises(ValueError, match='config.num_clients=5.*natural.*\\[1, 4\\]'):
    data.natural(np.array([0, 1, 2, 3, 3]), 5, np.random.default_rng(0))
  with pytest.raises(ValueError, match='splits by writer'):
    data.partition(np.zeros(8, np.int32), 2, 'natural', rng=np.random.default_rng(0))


def test_config_accepts_natural():
  from dp2fedsam_jax.config import choices
  assert 'natural' in choices()['partition']


def test_bad_files_name_the_problem(tmp_path):
  with h5py.File(tmp_path / 'a.h5', 'w') as f:
    f.create_dataset('pixels', data=np.zeros((1, 28, 28)))
  with pytest.raises(ValueError, match='no group "examples"'):
    femnist.read_tff_h5(str(tmp_path / 'a.h5'))
  with h5py.File(tmp_path / 'b.h5', 'w') as f:
    f.create_dataset('examples/w/pixels', data=np.full((2, 28, 28), 2.0))
    f.create_dataset('examples/w/label', data=np.zeros(2, np.int32))
  with pytest.raises(ValueError, match=r'examples/w.*\[0, 1\]'):
    femnist.read_tff_h5(str(tmp_path / 'b.h5'))
  with h5py.File(tmp_path / 'd.h5', 'w') as f:
    f.create_dataset('examples/w/pixels', data=np.zeros((2, 28, 28)))
  with pytest.raises(ValueError, match=r"examples/w has no \['label'\]"):
    femnist.read_tff_h5(str(tmp_path / 'd.h5'))
  blob = {'users': ['u'], 'num_samples': [1], 'user_data': {'u': {'x': [[0.5] * 700], 'y': [1]}}}
  (tmp_path / 'c.json').write_text(json.dumps(blob))
  with pytest.raises(ValueError, match='user u.*784'):
    femnist.read_leaf_json(str(tmp_path / 'c.json'))
  blob['user_data']['u'] = {'x': [[0.5] * 784], 'y': [62]}
  (tmp_path / 'd.json').write_text(json.dumps(blob))
  with pytest.raises(ValueError, match=r'labels must lie in \[0, 62\)'):
    femnist.read_leaf_json(str(tmp_path / 'd.json'))
  (tmp_path / 'e.json').write_text(json.dumps({'users': []}))
  with pytest.raises(ValueError, match='user_data'):
    femnist.read_leaf_json(str(tmp_path / 'e.json'))


def test_missing_files_say_how_to_get_them(tmp_path):
  with pytest.raises(data.DatasetNotFoundError, match=r'fed_emnist_train.h5.*LEAF.*data_dir'):
    femnist.load_femnist(str(tmp_path))
  with pytest.raises(ValueError, match="split='test'"):
    femnist.load_femnist(str(tmp_path), split='test')


def _tff_archive(path, source_dir):
  with tarfile.open(path, 'w:bz2') as tar:
    for name in femnist.TFF_FILES:
      tar.add(source_dir / name, arcname=f'fed_emnist/{name}')  # nested, as any archive may be


def test_download_into_cache_then_offline_failure(tmp_path, monkeypatch):
  src = tmp_path / 'src'
  src.mkdir()
  names = list(WRITERS)
  _write_h5(src / 'fed_emnist_train.h5', {n: WRITERS[n] for n in names[:3]})
  _write_h5(src / 'fed_emnist_test.h5', {n: WRITERS[n] for n in names[3:]})
  _tff_archive(tmp_path / 'fed_emnist.tar.bz2', src)
  cache = tmp_path / 'cache'
  monkeypatch.setattr(femnist, 'DEFAULT_FEMNIST_DIR', str(cache))
  monkeypatch.setattr(femnist, 'TFF_URL', (tmp_path / 'fed_emnist.tar.bz2').as_uri())
  ds = data.load_dataset('femnist')  # data_dir None: the cache, filled by the download
  _check_dataset(ds)
  assert sorted(os.listdir(cache)) == sorted(femnist.TFF_FILES)  # no temporary files left

  # Offline (here: an unreachable URL) with an empty cache: a message naming file and fix.
  empty = tmp_path / 'empty'
  with pytest.raises(data.DatasetNotFoundError, match=r'could not download .*missing.tar.bz2.*extract'):
    femnist.download_tff(str(empty), (tmp_path / 'missing.tar.bz2').as_uri())
  assert not [f for f in os.listdir(empty) if f.endswith('.h5')]
