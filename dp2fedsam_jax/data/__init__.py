"""Data: sources -> partitions -> FederatedData (ragged: flat examples + per-client offsets)."""

from dp2fedsam_jax.data.arrays import ArrayDataset
from dp2fedsam_jax.data.arrays import DatasetNotFoundError
from dp2fedsam_jax.data.arrays import NORMALIZATION
from dp2fedsam_jax.data.arrays import normalization
from dp2fedsam_jax.data.federated import FederatedData
from dp2fedsam_jax.data.federated import build_federated_data
from dp2fedsam_jax.data.federated import from_flat_arrays
from dp2fedsam_jax.data.federated import padded_bytes
from dp2fedsam_jax.data.federated import select_clients
from dp2fedsam_jax.data.federated import split_validation
from dp2fedsam_jax.data.federated import make_federated_data
from dp2fedsam_jax.data.partition import NATURAL
from dp2fedsam_jax.data.partition import PARTITIONS
from dp2fedsam_jax.data.partition import Partition
from dp2fedsam_jax.data.partition import dirichlet
from dp2fedsam_jax.data.partition import iid
from dp2fedsam_jax.data.partition import natural
from dp2fedsam_jax.data.partition import partition
from dp2fedsam_jax.data.partition import pathological
from dp2fedsam_jax.data.partition import split_dataset
from dp2fedsam_jax.data.sources import DATASETS
from dp2fedsam_jax.data.sources import DATASETS_WITH_WRITERS
from dp2fedsam_jax.data.sources import DatasetSource
from dp2fedsam_jax.data.sources import DEFAULT_FASHION_MNIST_DIR
from dp2fedsam_jax.data.sources import TFDS_DATASETS
from dp2fedsam_jax.data.sources import dataset_names
from dp2fedsam_jax.data.sources import load_dataset
from dp2fedsam_jax.data.sources import load_fashion_mnist
from dp2fedsam_jax.data.sources import read_idx
from dp2fedsam_jax.data.sources import synthetic

__all__ = [
    'ArrayDataset',
    'DATASETS',
    'DatasetSource',
    'DATASETS_WITH_WRITERS',
    'DEFAULT_FASHION_MNIST_DIR',
    'DatasetNotFoundError',
    'NORMALIZATION',
    'FederatedData',
    'NATURAL',
    'PARTITIONS',
    'Partition',
    'TFDS_DATASETS',
    'build_federated_data',
    'from_flat_arrays',
    'padded_bytes',
    'select_clients',
    'split_validation',
    'dataset_names',
    'dirichlet',
    'iid',
    'load_dataset',
    'load_fashion_mnist',
    'make_federated_data',
    'normalization',
    'natural',
    'partition',
    'pathological',
    'split_dataset',
    'read_idx',
    'synthetic',
]
