"""TFDS sources under `tfds.testing.mock_data`, their offline errors, and that the core never
imports TensorFlow.

The TFDS tests skip (with the reason) only when the [tfds] extra is not installed; CI installs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dp2fedsam_jax import data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_core_never_imports_tensorflow():
  """A fresh interpreter builds a whole experiment (synthetic data) without TensorFlow."""
  code = textwrap.dedent('''
      import sys
      sys.path.insert(0, 'tests')
      from conftest import tiny_config
      import dp2fedsam_jax
      from dp2fedsam_jax.train import build_experiment
      exp = build_experiment(tiny_config())
      assert exp.data.num_clients == 6
      leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_datasets'))
      assert not leaked, leaked
      print('ok')
  ''')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0 and out.stdout.strip().endswith('ok'), out.stderr[-2000:]


def test_missing_extra_says_how_to_install(monkeypatch):
  from dp2fedsam_jax.data import tfds_source
  for module in ('tensorflow', 'tensorflow_datasets'):
    monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
  with pytest.raises(tfds_source.MissingExtraError, match=r"cifar10.*pip install -e '\.\[tfds\]'"):
    data.load_dataset('cifar10')
  with pytest.raises(ImportError, match="dataset-fashion-mnist"):
    data.load_dataset('tfds:fashion_mnist')


# Everything below needs the extra.
tfds = pytest.importorskip(
    'tensorflow_datasets', reason="needs the [tfds] extra: pip install -e '.[test,tfds]'")


@pytest.mark.parametrize('name, tfds_name, shape, num_classes', [
    ('cifar10', 'cifar10', (32, 32, 3), 10),
    ('cifar100', 'cifar100', (32, 32, 3), 100),
    ('emnist_balanced', 'emnist/balanced', (28, 28, 1), 47),
    ('emnist', 'emnist/byclass', (28, 28, 1), 62),
    ('emnist_digits', 'emnist/digits', (28, 28, 1), 10),
    ('tfds:fashion_mnist', 'fashion_mnist', (28, 28, 1), 10),
])
def test_mock_datasets_load(name, tfds_name, shape, num_classes, tmp_path):
  with tfds.testing.mock_data(num_examples=9):
    ds = data.load_dataset(name, data_dir=str(tmp_path))
    raw = list(tfds.as_numpy(tfds.load(tfds_name, split='train', data_dir=str(tmp_path))))
  assert ds.x.shape == (9, *shape) and ds.x.dtype == np.uint8
  assert ds.y.dtype == np.int32 and ds.num_classes == num_classes
  assert len(ds.mean) == len(ds.std) == shape[-1]
  # Same examples, in order; EMNIST transposed to upright.
  images = np.stack([r['image'] for r in raw])
  if tfds_name.startswith('emnist'):
    images = images.transpose(0, 2, 1, 3)
  np.testing.assert_array_equal(ds.x, images)
  np.testing.assert_array_equal(ds.y, [r['label'] for r in raw])
  assert (ds.mean, ds.std) == data.normalization(tfds_name, shape[-1])  # not from these examples


def test_mock_cifar10_federated(tmp_path):
  with tfds.testing.mock_data(num_examples=40):
    fed = data.make_federated_data(dataset='cifar10', num_clients=4, partition='iid',
                                   data_dir=str(tmp_path), seed=0)
  assert fed.num_clients == 4 and fed.input_shape == (32, 32, 3) and fed.num_classes == 10
  assert int(fed.train_count.sum() + fed.test_count.sum()) == 40


def test_offline_missing_dataset_names_it_and_the_fix(tmp_path):
  with pytest.raises(data.DatasetNotFoundError, match=r"'cifar10' is not prepared in .*download_and_prepare"):
    from dp2fedsam_jax.data import tfds_source
    tfds_source.load_tfds('cifar10', data_dir=str(tmp_path), download=False)


def test_failed_download_names_dataset_cause_and_fix(tmp_path, monkeypatch):
  def offline(self, *args, **kwargs):
    raise ConnectionError('no route to host')
  monkeypatch.setattr(tfds.core.DatasetBuilder, 'download_and_prepare', offline)
  with pytest.raises(data.DatasetNotFoundError,
                     match=r"'fashion_mnist': not in .*download failed \(ConnectionError: no route.*"
                           r"download_and_prepare.*dataset-fashion-mnist"):
    data.load_dataset('tfds:fashion_mnist', data_dir=str(tmp_path))


def test_unknown_tfds_name(tmp_path):
  with pytest.raises(ValueError, match=r"config.dataset: TFDS has no dataset 'no_such_set'"):
    data.load_dataset('tfds:no_such_set', data_dir=str(tmp_path))


def _offline(monkeypatch):
  """No name resolves (whether or not this machine is online), and tfds gives up at once."""
  import socket
  from tensorflow_datasets.core.download import downloader

  def no_dns(*args, **kwargs):
    raise socket.gaierror(socket.EAI_NONAME, 'offline in this test')
  monkeypatch.setattr(socket, 'getaddrinfo', no_dns)
  monkeypatch.setattr(downloader, 'MAX_RETRIES', 0)


def _chain(error: BaseException) -> list[BaseException]:
  chain = []
  while error is not None and error not in chain:
    chain.append(error)
    error = error.__cause__ or error.__context__
  return chain


@pytest.mark.parametrize('name', ['cifar10', 'emnist/balanced'])
def test_real_download_and_prepare_fails_on_the_network_not_on_an_import(name, tmp_path,
                                                                          monkeypatch):
  """The [tfds] extra is complete: download_and_prepare (not mocked) gets as far as the network.

  With tensorflow-datasets 4.9.10 alone it failed first with "No module named
  'importlib_resources'", online or not.
  """
  _offline(monkeypatch)
  builder = tfds.builder(name, data_dir=str(tmp_path / 'data'))
  with pytest.raises(Exception) as info:
    builder.download_and_prepare(download_dir=str(tmp_path / 'downloads'))
  chain = _chain(info.value)
  assert not any(isinstance(e, ImportError) for e in chain), repr(chain)
  assert any('offline in this test' in str(e) for e in chain), repr(chain)


def test_cifar10_through_the_project_says_the_download_failed_on_the_network(tmp_path,
                                                                             monkeypatch):
  _offline(monkeypatch)
  with pytest.raises(data.DatasetNotFoundError, match=r"'cifar10': not in .*download failed") as info:
    data.load_dataset('cifar10', data_dir=str(tmp_path))
  assert 'No module named' not in str(info.value) and 'offline in this test' in str(info.value)
