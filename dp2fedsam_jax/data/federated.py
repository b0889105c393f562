"""All clients' data stacked and padded into fixed-shape device arrays.

Clients have unequal sizes; padding to the largest keeps one compiled shape for every client, and the
per-client counts let the engine mask the padding out (it must change neither updates nor sensitivity).
"""

from __future__ import annotations

from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from dp2fedsam_jax.data import sources
from dp2fedsam_jax.data.partition import NATURAL
from dp2fedsam_jax.data.partition import natural as _natural
# Aliased: `make_federated_data` has an argument named `partition`.
from dp2fedsam_jax.data.partition import partition as _partition


@flax.struct.dataclass
class FederatedData:
  """Per-client train/test data, stacked over clients and zero-padded.

  Example j of client i is real iff j < train_count[i] (resp. test_count[i]).
  """

  train_x: jax.Array  # uint8 [N, max_train, H, W, C]
  train_y: jax.Array  # int32 [N, max_train]
  train_count: jax.Array  # int32 [N]
  test_x: jax.Array  # uint8 [N, max_test, H, W, C]
  test_y: jax.Array  # int32 [N, max_test]
  test_count: jax.Array  # int32 [N]
  num_classes: int = flax.struct.field(pytree_node=False)
  mean: tuple = flax.struct.field(pytree_node=False)
  std: tuple = flax.struct.field(pytree_node=False)

  @property
  def num_clients(self) -> int:
    return int(self.train_count.shape[0])

  @property
  def input_shape(self) -> tuple:
    return tuple(self.train_x.shape[2:])

  def normalize(self, x) -> jax.Array:
    """float32 (x / 255 - mean) / std, channels last, any leading dims."""
    mean = jnp.asarray(self.mean, jnp.float32)
    std = jnp.asarray(self.std, jnp.float32)
    return (jnp.asarray(x, jnp.float32) / 255.0 - mean) / std


def _stack_padded(x: np.ndarray, y: np.ndarray, groups: list[np.ndarray], width: int):
  """Gathers x[g], y[g] for each group into zero-padded [len(groups), width, ...] arrays."""
  out_x = np.zeros((len(groups), width, *x.shape[1:]), np.uint8)
  out_y = np.zeros((len(groups), width), np.int32)
  for i, g in enumerate(groups):
    out_x[i, :len(g)] = x[g]
    out_y[i, :len(g)] = y[g]
  counts = np.array([len(g) for g in groups], np.int32)
  return jnp.asarray(out_x), jnp.asarray(out_y), jnp.asarray(counts)


def build_federated_data(dataset: sources.ArrayDataset, client_indices: Sequence[np.ndarray], *,
                         train_fraction: float = 0.9, rng: np.random.Generator) -> FederatedData:
  """Splits each client's examples into train/test and stacks all clients on device.

  Each client's examples are shuffled; the first max(1, round(train_fraction * n)) are its training
  set, the rest (possibly none) its test set. Rounding is half-up, so 0.9 * 5 = 4.5 -> 5.
  """
  if not 0.0 < train_fraction <= 1.0:
    raise ValueError(f'train_fraction={train_fraction!r}: must lie in (0, 1].')
  if len(client_indices) == 0:
    raise ValueError('config.num_clients: there must be at least one client.')
  n_total = len(dataset)
  train_groups, test_groups = [], []
  for i, idx in enumerate(client_indices):
    idx = np.asarray(idx, np.int64).reshape(-1)
    if idx.size == 0:
      raise ValueError(
          f'client {i} has no examples; change config.num_clients, config.partition, '
          f'config.classes_per_client or config.dirichlet_alpha so every client gets data.')
    if idx.min() < 0 or idx.max() >= n_total:
      raise ValueError(f'client {i}: indices must lie in [0, {n_total}); got [{idx.min()}, {idx.max()}].')
    idx = rng.permutation(idx)
    n_train = min(len(idx), max(1, int(np.floor(train_fraction * len(idx) + 0.5))))
    train_groups.append(idx[:n_train])
    test_groups.append(idx[n_train:])

  max_train = max(len(g) for g in train_groups)
  max_test = max(1, max(len(g) for g in test_groups))  # never a zero-size axis
  train_x, train_y, train_count = _stack_padded(dataset.x, dataset.y, train_groups, max_train)
  test_x, test_y, test_count = _stack_padded(dataset.x, dataset.y, test_groups, max_test)
  return FederatedData(
      train_x=train_x, train_y=train_y, train_count=train_count,
      test_x=test_x, test_y=test_y, test_count=test_count,
      num_classes=int(dataset.num_classes),
      mean=tuple(float(m) for m in dataset.mean),
      std=tuple(float(s) for s in dataset.std),
  )


def make_federated_data(*, dataset: str, num_clients: int, partition: str, classes_per_client: int = 2,
                        dirichlet_alpha: float = 0.5, seed: int = 0, data_dir: str | None = None,
                        train_fraction: float = 0.9, **source_kwargs) -> FederatedData:
  """Loads the training split of `dataset`, partitions it over clients, splits each 90/10.

  All randomness (partition and per-client split) comes from np.random.default_rng(seed). Extra
  `source_kwargs` go to the source (e.g. `num_examples=500` for 'synthetic'). Partition 'natural'
  makes each of `num_clients` writers drawn with that rng a client (datasets with writers only).
  """
  if partition == NATURAL and dataset not in sources.DATASETS_WITH_WRITERS:
    # Checked before loading: the data may take minutes to read.
    raise ValueError(
        f'config.partition={NATURAL!r} (one client per writer) needs a dataset whose examples carry '
        f'their writer, one of {list(sources.DATASETS_WITH_WRITERS)}; config.dataset={dataset!r} has '
        "none. Use config.partition='iid', 'pathological' or 'dirichlet'.")
  ds = sources.load_dataset(dataset, data_dir=data_dir, split='train', **source_kwargs)
  rng = np.random.default_rng(seed)
  if partition == NATURAL:
    if ds.writers is None:
      raise ValueError(f'config.partition={NATURAL!r}: the loaded {dataset!r} data has no writers.')
    client_indices = _natural(ds.writers, num_clients, rng)
  else:
    client_indices = _partition(
        ds.y, num_clients, partition, classes_per_client=classes_per_client,
        dirichlet_alpha=dirichlet_alpha, rng=rng)
  return build_federated_data(ds, client_indices, train_fraction=train_fraction, rng=rng)
