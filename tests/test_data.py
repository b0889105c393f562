"""Tests for dp2fedsam_jax.data: IDX reader, sources, partitions, FederatedData."""

import gzip
import os
import struct
import sys

import chex
import jax
import jax.numpy as jnp
import math

import numpy as np
import pytest

from dp2fedsam_jax import data
from dp2fedsam_jax.data import sources

_FMNIST_DIR = data.DEFAULT_FASHION_MNIST_DIR
_HAVE_FMNIST = all(
    os.path.exists(os.path.join(_FMNIST_DIR, f)) for f in (
        'train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
        't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'))
needs_fmnist = pytest.mark.skipif(
    not _HAVE_FMNIST,
    reason=f'Fashion-MNIST IDX files not in {_FMNIST_DIR} (sudo apt-get install dataset-fashion-mnist)')


def _idx_bytes(arr: np.ndarray) -> bytes:
  code = {np.dtype('u1'): 0x08, np.dtype('i1'): 0x09, np.dtype('>i2'): 0x0B,
          np.dtype('>i4'): 0x0C, np.dtype('>f4'): 0x0D, np.dtype('>f8'): 0x0E}[arr.dtype]
  header = bytes([0, 0, code, arr.ndim]) + struct.pack(f'>{arr.ndim}I', *arr.shape)
  return header + arr.tobytes()


def _write(path, payload: bytes, compress: bool):
  with (gzip.open(path, 'wb') if compress else open(path, 'wb')) as f:
    f.write(payload)
  return path


# ---------------------------------------------------------------- IDX reader

@pytest.mark.parametrize('compress', [True, False])
@pytest.mark.parametrize('dtype', ['u1', '>i4', '>f4'])
def test_read_idx_round_trip(tmp_path, compress, dtype):
  arr = (np.arange(2 * 3 * 4) - 5).reshape(2, 3, 4)
  arr = (arr % 256 if dtype == 'u1' else arr).astype(dtype)
  path = _write(tmp_path / ('a.idx.gz' if compress else 'a.idx'), _idx_bytes(arr), compress)
  out = data.read_idx(path)
  assert out.shape == (2, 3, 4)
  assert out.dtype == np.dtype(dtype).newbyteorder('=')
  np.testing.assert_array_equal(out, arr)
  out[0, 0, 0] = 1  # writable copy, not a view of the file buffer


def test_read_idx_1d_labels(tmp_path):
  labels = np.array([3, 1, 4, 1, 5], np.uint8)
  out = data.read_idx(_write(tmp_path / 'l.gz', _idx_bytes(labels), True))
  np.testing.assert_array_equal(out, labels)


@pytest.mark.parametrize('payload, match', [
    (b'\x01\x02\x08\x01\x00\x00\x00\x01\x07', 'not an IDX file'),  # bad magic
    (b'\x00\x00\x42\x01\x00\x00\x00\x01\x07', 'not an IDX file'),  # bad type byte
    (b'\x00\x00\x08\x02\x00\x00\x00\x02', 'truncated IDX header'),
    (b'\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02', 'truncated or corrupt'),  # 2 of 5 bytes
    (b'\x00\x00', 'too short'),
])
def test_read_idx_corrupt(tmp_path, payload, match):
  with pytest.raises(ValueError, match=match):
    data.read_idx(_write(tmp_path / 'bad.idx', payload, False))


def test_read_idx_corrupt_gzip(tmp_path):
  good = gzip.compress(_idx_bytes(np.zeros((10, 10), np.uint8)))
  path = _write(tmp_path / 'bad.gz', good[: len(good) // 2], False)
  with pytest.raises(ValueError, match='gzip'):
    data.read_idx(path)


# ---------------------------------------------------------------- sources

@pytest.fixture(scope='module')
def fmnist_train():
  return data.load_fashion_mnist(split='train')


@needs_fmnist
def test_fashion_mnist_real(fmnist_train):
  ds = fmnist_train
  assert ds.x.shape == (60000, 28, 28, 1) and ds.x.dtype == np.uint8
  assert ds.y.shape == (60000,) and ds.y.dtype == np.int32
  assert ds.num_classes == 10
  np.testing.assert_array_equal(np.bincount(ds.y), np.full(10, 6000))
  np.testing.assert_allclose(ds.x.mean() / 255.0, ds.mean[0], atol=1e-3)
  np.testing.assert_allclose((ds.x / 255.0).std(), ds.std[0], atol=1e-3)


@needs_fmnist
def test_fashion_mnist_test_split():
  ds = data.load_dataset('fashion_mnist', split='test')
  assert ds.x.shape == (10000, 28, 28, 1)
  np.testing.assert_array_equal(np.bincount(ds.y), np.full(10, 1000))


def test_fashion_mnist_custom_dir_and_plain_files(tmp_path):
  # A --config.data_dir holding tiny files, one of them already gunzipped.
  images = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
  labels = np.array([9, 0, 4], np.uint8)
  _write(tmp_path / 't10k-images-idx3-ubyte.gz', _idx_bytes(images), True)
  _write(tmp_path / 't10k-labels-idx1-ubyte', _idx_bytes(labels), False)
  ds = data.load_fashion_mnist(str(tmp_path), split='test')
  np.testing.assert_array_equal(ds.x[..., 0], images)
  np.testing.assert_array_equal(ds.y, labels)


def test_fashion_mnist_missing_dir(tmp_path):
  missing = tmp_path / 'nowhere'
  with pytest.raises(data.DatasetNotFoundError) as info:
    data.load_fashion_mnist(str(missing))
  msg = str(info.value)
  assert os.path.join(str(missing), 'train-images-idx3-ubyte.gz') in msg
  assert 'apt-get install dataset-fashion-mnist' in msg and '--config.data_dir' in msg
  assert isinstance(info.value, FileNotFoundError)


def test_fashion_mnist_bad_split():
  with pytest.raises(ValueError, match='split'):
    data.load_fashion_mnist(split='validation')


def test_load_dataset_unknown_name():
  with pytest.raises(ValueError, match=r"config.dataset='xyz': unknown dataset;.*fashion_mnist.*synthetic"):
    data.load_dataset('xyz')


def test_no_tensorflow_imported():
  assert 'tensorflow' not in sys.modules


def test_synthetic_shapes_and_determinism():
  a = data.synthetic(num_examples=103, image_shape=(5, 6, 3), num_classes=4, seed=1)
  b = data.load_dataset('synthetic', num_examples=103, image_shape=(5, 6, 3), num_classes=4, seed=1)
  assert a.x.shape == (103, 5, 6, 3) and a.x.dtype == np.uint8 and a.y.dtype == np.int32
  assert len(a.mean) == len(a.std) == 3
  np.testing.assert_array_equal(a.x, b.x)
  np.testing.assert_array_equal(a.y, b.y)
  assert np.bincount(a.y).max() - np.bincount(a.y).min() <= 1  # balanced


def test_normalization_does_not_depend_on_the_data():
  """The statistics every released model is normalised with are published constants:
  other examples (another seed, another size) give the same ones, so they release nothing."""
  a = data.synthetic(num_examples=103, image_shape=(5, 6, 3), seed=1)
  b = data.synthetic(num_examples=40, image_shape=(5, 6, 3), seed=7, noise_std=5.0)
  assert not np.array_equal(a.x.mean(), b.x.mean())
  assert a.mean == b.mean == (0.5,) * 3 and a.std == b.std == (0.35,) * 3
  assert data.normalization('cifar10', 3) == data.NORMALIZATION['cifar10']
  assert data.normalization('unknown_dataset', 2) == ((0.5,) * 2, (0.5,) * 2)


def test_synthetic_is_learnable():
  # Nearest class mean, fit on 'train', scored on an independent 'test' draw: far above chance (0.25).
  train = data.synthetic(num_examples=400, seed=3)
  test = data.synthetic(num_examples=400, seed=3, split='test')
  assert not np.array_equal(train.x, test.x)
  flat = lambda x: x.reshape(len(x), -1).astype(np.float32)
  centroids = np.stack([flat(train.x)[train.y == c].mean(0) for c in range(4)])
  dist = ((flat(test.x)[:, None, :] - centroids[None]) ** 2).sum(-1)
  accuracy = (dist.argmin(1) == test.y).mean()
  assert accuracy > 0.9, accuracy


# ---------------------------------------------------------------- partitions

def _labels(num_classes=5, per_class=40, seed=0):
  return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def _check_disjoint(parts, labels, num_clients):
  assert len(parts) == num_clients
  for p in parts:
    assert p.dtype == np.int64 and p.ndim == 1
  allidx = np.concatenate(parts)
  assert len(np.unique(allidx)) == len(allidx), 'clients overlap'
  assert allidx.min() >= 0 and allidx.max() < len(labels)
  return allidx


def test_iid():
  labels = _labels()
  parts = data.iid(labels, 7, np.random.default_rng(0))
  allidx = _check_disjoint(parts, labels, 7)
  np.testing.assert_array_equal(np.sort(allidx), np.arange(len(labels)))
  sizes = [len(p) for p in parts]
  assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize('num_clients, s', [(10, 2), (5, 1), (3, 5), (7, 3), (2, 2)])
def test_pathological(num_clients, s):
  labels = _labels(num_classes=5, per_class=40)
  parts = data.pathological(labels, num_clients, s, np.random.default_rng(1))
  allidx = _check_disjoint(parts, labels, num_clients)
  for p in parts:
    assert len(np.unique(labels[p])) == s
  used = np.unique(np.concatenate([np.unique(labels[p]) for p in parts]))
  # Every example of every class some client holds is handed out.
  np.testing.assert_array_equal(np.sort(allidx), np.flatnonzero(np.isin(labels, used)))
  if num_clients * s >= 5:
    assert len(used) == 5


def test_pathological_balanced_class_use():
  labels = _labels(num_classes=10, per_class=100)
  parts = data.pathological(labels, 100, 2, np.random.default_rng(0))
  holders = np.zeros(10, int)
  for p in parts:
    holders[np.unique(labels[p])] += 1
  np.testing.assert_array_equal(holders, np.full(10, 20))  # N*S/K each
  sizes = [len(p) for p in parts]
  assert min(sizes) == max(sizes) == 10


@pytest.mark.parametrize('s', [2, 5, 10])
def test_pathological_deals_random_shards_so_label_sets_vary(s):
  """FedRep shards: many distinct label sets (a cyclic assignment gives only K), every client
  exactly S classes, equal sizes for equal classes, and every example handed out once."""
  labels = _labels(num_classes=10, per_class=600)
  parts = data.pathological(labels, 100, s, np.random.default_rng(3))
  allidx = _check_disjoint(parts, labels, 100)
  np.testing.assert_array_equal(np.sort(allidx), np.arange(len(labels)))
  label_sets = {tuple(np.unique(labels[p])) for p in parts}
  assert all(len(np.unique(labels[p])) == s for p in parts)
  assert len(label_sets) >= min(40, math.comb(10, s))  # all 45 pairs occur for S = 2
  assert {len(p) for p in parts} == {60}
  # Each class's examples are split evenly over its N S / K shards.
  for c in range(10):
    held = [np.sum(labels[p] == c) for p in parts if np.any(labels[p] == c)]
    assert len(held) == 10 * s and set(held) == {600 // (10 * s)}


def test_pathological_too_few_examples_per_class():
  labels = np.repeat(np.arange(2), 3)
  with pytest.raises(ValueError, match='config.num_clients'):
    data.pathological(labels, 6, 2, np.random.default_rng(0))  # 6 holders per class, 3 examples


@pytest.mark.parametrize('alpha', [0.1, 0.5, 100.0])
def test_dirichlet(alpha):
  labels = _labels(num_classes=5, per_class=40)
  parts = data.dirichlet(labels, 8, alpha, np.random.default_rng(2), min_size=3)
  allidx = _check_disjoint(parts, labels, 8)
  np.testing.assert_array_equal(np.sort(allidx), np.arange(len(labels)))
  assert min(len(p) for p in parts) >= 3


def test_dirichlet_skew_depends_on_alpha():
  labels = _labels(num_classes=5, per_class=200)
  def mean_classes(alpha):
    parts = data.dirichlet(labels, 10, alpha, np.random.default_rng(0))
    return np.mean([len(np.unique(labels[p])) for p in parts])
  assert mean_classes(0.05) < mean_classes(100.0) == 5.0


def test_dirichlet_impossible():
  labels = _labels(num_classes=4, per_class=50)
  # alpha -> 0 gives each class to ~one client: 4 classes cannot feed 10 clients.
  with pytest.raises(ValueError, match=r'config.dirichlet_alpha.*config.num_clients.*larger'):
    data.dirichlet(labels, 10, 1e-4, np.random.default_rng(0), max_tries=5)
  # Not enough examples for min_size each: fails at once.
  with pytest.raises(ValueError, match='config.num_clients'):
    data.dirichlet(labels[:10], 6, 1.0, np.random.default_rng(0), min_size=2)


def test_partition_dispatch_and_determinism():
  labels = _labels()
  for kind in data.PARTITIONS:
    if data.PARTITIONS[kind].needs_writers:  # 'natural' splits by writer: tests/test_femnist.py
      continue
    a = data.partition(labels, 4, kind, rng=np.random.default_rng(5))
    b = data.partition(labels, 4, kind, rng=np.random.default_rng(5))
    _check_disjoint(a, labels, 4)
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize('kwargs, field', [
    (dict(kind='random'), 'config.partition'),
    (dict(kind='iid', num_clients=0), 'config.num_clients'),
    (dict(kind='iid', num_clients=201), 'config.num_clients'),
    (dict(kind='pathological', num_clients=2.5), 'config.num_clients'),
    (dict(kind='pathological', classes_per_client=0), 'config.classes_per_client'),
    (dict(kind='pathological', classes_per_client=6), 'config.classes_per_client'),
    (dict(kind='dirichlet', dirichlet_alpha=0.0), 'config.dirichlet_alpha'),
    (dict(kind='dirichlet', dirichlet_alpha=-1.0), 'config.dirichlet_alpha'),
])
def test_partition_invalid_fields(kwargs, field):
  kwargs = dict(num_clients=4) | kwargs
  with pytest.raises(ValueError, match=field):
    data.partition(_labels(), kwargs.pop('num_clients'), kwargs.pop('kind'),
                   rng=np.random.default_rng(0), **kwargs)


# ---------------------------------------------------------------- FederatedData

def _toy_dataset(n=60, shape=(2, 2, 1)):
  x = (np.arange(n)[:, None, None, None] + 1) * np.ones((1, *shape), np.int64)
  return data.ArrayDataset(x=x.astype(np.uint8), y=(np.arange(n) % 3).astype(np.int32),
                           num_classes=3, mean=(0.5,), std=(0.25,))


def test_build_federated_data():
  ds = _toy_dataset()
  clients = [np.arange(0, 20), np.arange(20, 30), np.arange(30, 35), np.array([35]), np.arange(36, 60)]
  fd = data.build_federated_data(ds, clients, rng=np.random.default_rng(0))
  assert fd.num_clients == 5 and fd.input_shape == (2, 2, 1) and fd.num_classes == 3
  # Half-up rounding of 0.9 n, at least one train example.
  np.testing.assert_array_equal(fd.train_count, [18, 9, 5, 1, 22])
  np.testing.assert_array_equal(fd.test_count, [2, 1, 0, 0, 2])
  # Ragged: flat arrays of all clients' examples (memory = total examples), offsets per client.
  chex.assert_shape(fd.train_x, (55, 2, 2, 1))
  chex.assert_shape(fd.test_x, (5, 2, 2, 1))
  assert (fd.max_train, fd.max_test) == (22, 2)
  np.testing.assert_array_equal(fd.train_offsets, [0, 18, 27, 32, 33, 55])
  chex.assert_type([fd.train_x, fd.test_x], jnp.uint8)
  chex.assert_type([fd.train_y, fd.test_y, fd.train_offsets, fd.test_offsets], jnp.int32)
  for i, idx in enumerate(clients):
    train_x, train_y, nt = map(np.asarray, fd.client_train(i))
    test_x, test_y, ne = map(np.asarray, fd.test_examples(i))
    assert train_x.shape[0] == 22 and test_x.shape[0] == 2
    assert not train_x[nt:].any() and not train_y[nt:].any()  # zero padding
    assert not test_x[ne:].any() and not test_y[ne:].any()
    # x encodes the example id as value - 1, so the split can be read back.
    got_train = train_x[:nt, 0, 0, 0].astype(int) - 1
    got_test = test_x[:ne, 0, 0, 0].astype(int) - 1
    assert not set(got_train) & set(got_test)
    np.testing.assert_array_equal(np.sort(np.concatenate([got_train, got_test])), idx)
    np.testing.assert_array_equal(train_y[:nt], ds.y[got_train])
    np.testing.assert_array_equal(test_y[:ne], ds.y[got_test])


def test_build_federated_data_shuffles():
  ds = _toy_dataset()
  fd = data.build_federated_data(ds, [np.arange(60)], rng=np.random.default_rng(0))
  ids = np.asarray(fd.train_x)[:, 0, 0, 0].astype(int) - 1
  assert not np.array_equal(ids, np.arange(54))  # test set is not always the tail


def test_build_federated_data_all_train():
  fd = data.build_federated_data(_toy_dataset(), [np.arange(3), np.arange(3, 6)], train_fraction=1.0,
                                 rng=np.random.default_rng(0))
  np.testing.assert_array_equal(fd.test_count, [0, 0])
  chex.assert_shape(fd.test_x, (0, 2, 2, 1))
  x, y, n = fd.test_examples(1)  # max_test >= 1: never a zero-size axis
  chex.assert_shape(x, (1, 2, 2, 1))
  assert int(n) == 0 and not np.asarray(x).any()


def test_build_federated_data_empty_client():
  with pytest.raises(ValueError, match=r'client 1 has no examples.*config.num_clients.*config.partition'):
    data.build_federated_data(_toy_dataset(), [np.arange(5), np.array([], np.int64)],
                              rng=np.random.default_rng(0))


def test_federated_data_is_pytree():
  fd = data.build_federated_data(_toy_dataset(), [np.arange(10), np.arange(10, 20)],
                                 rng=np.random.default_rng(0))
  assert len(jax.tree.leaves(fd)) == 6  # the flat arrays and offsets; the rest is static
  copy = jax.tree.map(jnp.copy, fd)
  assert copy.num_clients == 2 and copy.mean == fd.mean and copy.max_train == fd.max_train == 9


def test_normalize_known_value():
  fd = data.build_federated_data(_toy_dataset(), [np.arange(10)], rng=np.random.default_rng(0))
  x = jnp.full((3, 4, 2, 2, 1), 255, jnp.uint8)
  out = jax.jit(lambda d, x: d.normalize(x))(fd, x)
  chex.assert_type(out, jnp.float32)
  chex.assert_shape(out, x.shape)
  np.testing.assert_allclose(out, 2.0, rtol=1e-6)  # (1 - 0.5) / 0.25
  np.testing.assert_allclose(fd.normalize(np.zeros((2, 2, 1), np.uint8)), -2.0, rtol=1e-6)
  # Per channel.
  fd3 = fd.replace(mean=(0.0, 0.5, 1.0), std=(1.0, 0.5, 0.25))
  np.testing.assert_allclose(fd3.normalize(np.full((1, 1, 3), 51, np.uint8))[0, 0],
                             [0.2, -0.6, -3.2], rtol=1e-6)


def test_make_federated_data_synthetic():
  kw = dict(dataset='synthetic', num_clients=6, partition='pathological', classes_per_client=2,
            seed=3, num_examples=300, num_classes=4)
  fd = data.make_federated_data(**kw)
  again = data.make_federated_data(**kw)
  chex.assert_trees_all_equal(fd, again)
  assert fd.num_clients == 6 and fd.num_classes == 4 and fd.input_shape == (8, 8, 1)
  assert int(fd.train_count.sum() + fd.test_count.sum()) == 300
  for i in range(6):
    assert len(np.unique(np.asarray(fd.train_y)[int(fd.train_offsets[i]):int(fd.train_offsets[i + 1])])) <= 2
  other = data.make_federated_data(**(kw | dict(seed=4)))
  assert not np.array_equal(np.asarray(fd.train_y), np.asarray(other.train_y))


@needs_fmnist
def test_make_federated_data_fashion_mnist():
  fd = data.make_federated_data(dataset='fashion_mnist', num_clients=20, partition='pathological',
                                classes_per_client=2)
  assert fd.num_clients == 20 and fd.input_shape == (28, 28, 1) and fd.num_classes == 10
  np.testing.assert_array_equal(fd.train_count, 2700)  # 3000 each (20 * 2 / 10 = 4 per class)
  np.testing.assert_array_equal(fd.test_count, 300)
  assert sources.FASHION_MNIST_MEAN == fd.mean


def _row_id_federation(counts, test_counts):
  """Image rows whose pixel 0 (and label) encodes the row's index: a row is found by its content."""
  total, total_test = sum(counts), sum(test_counts)
  x = np.zeros((total, 2, 2, 1), np.uint8)
  x[:, 0, 0, 0] = np.arange(total) % 251
  x[:, 0, 1, 0] = np.arange(total) // 251
  tx = np.full((total_test, 2, 2, 1), 255, np.uint8)
  return data.from_flat_arrays(
      train_x=x, train_y=np.arange(total) % 7, train_offsets=np.concatenate([[0], np.cumsum(counts)]),
      test_x=tx, test_y=np.zeros(total_test, np.int32),
      test_offsets=np.concatenate([[0], np.cumsum(test_counts)]), num_classes=7, mean=(0.5,),
      std=(0.25,))


def test_validation_split_carves_each_clients_own_rows_seeded_and_leaves_test_alone():
  counts, test_counts = [1, 2, 5, 10, 40], [1, 0, 2, 3, 4]
  fed = _row_id_federation(counts, test_counts)
  train, validation = data.split_validation(fed, 0.25, seed=3)
  row = lambda x: np.asarray(x)[:, 0, 0, 0].astype(int) + 251 * np.asarray(x)[:, 0, 1, 0]
  n_val = np.diff(np.asarray(validation.test_offsets))
  np.testing.assert_array_equal(n_val, [0, 1, 1, 3, 10])  # round half up, one training row kept
  np.testing.assert_array_equal(np.diff(np.asarray(train.train_offsets)), np.array(counts) - n_val)
  offsets = np.concatenate([[0], np.cumsum(counts)])
  t_off, v_off = train.train_offsets, validation.test_offsets
  for i in range(len(counts)):
    kept = row(train.train_x[int(t_off[i]):int(t_off[i + 1])])
    held = row(validation.test_x[int(v_off[i]):int(v_off[i + 1])])
    own = np.arange(offsets[i], offsets[i + 1])
    assert not set(kept) & set(held)  # disjoint, and together exactly the client's rows
    np.testing.assert_array_equal(np.sort(np.concatenate([kept, held])), own)
    assert list(kept) == sorted(kept) and list(held) == sorted(held)  # stored order kept
  np.testing.assert_array_equal(np.asarray(train.train_y), row(train.train_x) % 7)
  # The test split is the original one, and the validation data trains on the same rows.
  for a, b in ((train.test_x, fed.test_x), (train.test_offsets, fed.test_offsets),
               (validation.train_x, train.train_x), (validation.train_offsets, train.train_offsets)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert (train.max_train, validation.max_test) == (30, 10)
  again, _ = data.split_validation(fed, 0.25, seed=3)
  other, _ = data.split_validation(fed, 0.25, seed=4)
  np.testing.assert_array_equal(np.asarray(again.train_x), np.asarray(train.train_x))
  assert not np.array_equal(np.asarray(other.train_x), np.asarray(train.train_x))
  with pytest.raises(ValueError, match='validation_fraction'):
    data.split_validation(fed, 0.0, seed=3)


def test_validation_split_is_keyed_per_client_so_a_removal_leaves_the_others_splits():
  """Each client's held rows come from its own (seed, key) draw, the key by default its own rows:
  removing client 1 leaves every other client's split, as does passing ids or names that each
  client keeps; a client's split follows its key, not its position."""
  counts = [3, 7, 5, 10, 40]
  fed = _row_id_federation(counts, [1, 1, 1, 1, 1])
  row = lambda x: np.asarray(x)[:, 0, 0, 0].astype(int) + 251 * np.asarray(x)[:, 0, 1, 0]

  def held(validation, i):
    off = np.asarray(validation.test_offsets)
    return list(row(validation.test_x[off[i]:off[i + 1]]))
  _, everyone = data.split_validation(fed, 0.3, seed=3)
  kept = [0, 2, 3, 4]
  _, without = data.split_validation(data.select_clients(fed, kept), 0.3, seed=3)
  assert [held(without, j) for j in range(4)] == [held(everyone, i) for i in kept]
  _, by_id = data.split_validation(fed, 0.3, seed=3, client_keys=range(5))
  _, by_id_without = data.split_validation(data.select_clients(fed, kept), 0.3, seed=3,
                                           client_keys=kept)
  assert [held(by_id_without, j) for j in range(4)] == [held(by_id, i) for i in kept]
  # By name as by id; another key (or seed) another draw.
  names = [f'play/ROLE{i}' for i in range(5)]
  _, by_name = data.split_validation(fed, 0.3, seed=3, client_keys=names)
  _, reversed_names = data.split_validation(data.select_clients(fed, kept[::-1]), 0.3, seed=3,
                                            client_keys=[names[i] for i in kept[::-1]])
  assert [held(reversed_names, j) for j in range(4)] == [held(by_name, i) for i in kept[::-1]]
  _, other_seed = data.split_validation(fed, 0.3, seed=4)
  assert held(other_seed, 4) != held(everyone, 4)
  with pytest.raises(ValueError, match='4 client keys for 5 clients'):
    data.split_validation(fed, 0.3, seed=3, client_keys=kept)
