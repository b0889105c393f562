"""Splitting one dataset's examples over N clients (IID, pathological (N, S), Dirichlet(alpha)),
or by writer ('natural', for datasets whose examples carry their writer, e.g. FEMNIST).

numpy only. Every function returns `num_clients` disjoint int64 index arrays into the examples,
each sorted. PARTITIONS, the name -> Partition registry, holds them (and a user's, api.register_partition).
"""

from __future__ import annotations

import dataclasses
import numbers
import types
from typing import Any, Callable, Sequence

import numpy as np

from dp2fedsam_jax.errors import ConfigError
from dp2fedsam_jax.registries import RegistrationError, Registry

# One client per writer: a property of the data, not of its labels (see `natural`).
NATURAL = 'natural'


def _as_labels(labels) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f'labels must be a 1-D integer array; got {labels.dtype} {labels.shape}.')
  return labels


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_num_clients(labels: np.ndarray, num_clients) -> None:
  if not _is_int(num_clients) or not 1 <= num_clients <= len(labels):
    raise ValueError(
        f'config.num_clients={num_clients!r}: must be an integer in [1, {len(labels)}] '
        f'(the number of training examples).')


def _sorted_int64(parts) -> list[np.ndarray]:
  return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid(labels, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
  """Shuffles all examples and deals them into `num_clients` near-equal shares."""
  labels = _as_labels(labels)
  _check_num_clients(labels, num_clients)
  return _sorted_int64(np.array_split(rng.permutation(len(labels)), num_clients))


def _shards_per_class(sizes: np.ndarray, total: int, cap: int, rng: np.random.Generator) -> np.ndarray:
  """`total` shards over classes in proportion to their sizes (largest remainder, ties at random),
  at most `cap` per class."""
  exact = total * sizes / sizes.sum()
  counts = np.floor(exact).astype(np.int64)
  tiebreak = rng.permutation(len(sizes))
  for c in np.lexsort((tiebreak, -(exact - counts)))[:total - counts.sum()]:
    counts[c] += 1
  while np.any(counts > cap):  # a class too large for distinct holders gives shards to the others
    excess = int(np.sum(np.maximum(counts - cap, 0)))
    counts = np.minimum(counts, cap)
    room = np.flatnonzero(counts < cap)
    if len(room) == 0:
      break
    for c in room[np.argsort(-sizes[room] / (counts[room] + 1), kind='stable')][:excess]:
      counts[c] += 1
  return counts


def _deal_distinct(shard_classes: np.ndarray, num_clients: int, per_client: int,
                   rng: np.random.Generator) -> np.ndarray:
  """A random [num_clients, per_client] arrangement of the shards in which no client holds two
  shards of one class: shuffle, then swap each repeated shard with a random one that fits (of a
  class the client lacks, from a client that lacks the repeated class), so no swap repeats a
  class anywhere and clients already fixed stay fixed.
  """
  slots = rng.permutation(len(shard_classes)).reshape(num_clients, per_client)
  for i in range(num_clients):
    while True:
      row = shard_classes[slots[i]]
      repeated = [a for a in range(per_client) if row[a] in row[:a]]
      if not repeated:
        break
      a = repeated[0]
      held = shard_classes[slots]
      fits = ~np.isin(held, row) & ~np.any(held == row[a], axis=1, keepdims=True)
      candidates = np.argwhere(fits)
      if len(candidates) == 0:
        raise RuntimeError('could not deal the shards with distinct classes per client')
      j, b = candidates[rng.integers(len(candidates))]
      slots[i, a], slots[j, b] = slots[j, b], slots[i, a]
  return slots


def pathological(labels, num_clients: int, classes_per_client: int,
                 rng: np.random.Generator) -> list[np.ndarray]:
  """FedRep-style (N, S) split: every client gets S shards of S distinct classes, disjoint samples.

  The examples of each class are shuffled and cut into shards, N*S shards in all (a class's share
  in proportion to its size); each client is dealt S random shards of distinct classes. So label
  sets vary across clients (about K^S / S! of them occur, not K), and client sizes are balanced.
  """
  labels = _as_labels(labels)
  _check_num_clients(labels, num_clients)
  classes, sizes = np.unique(labels, return_counts=True)
  k = len(classes)
  if not _is_int(classes_per_client) or not 1 <= classes_per_client <= k:
    raise ValueError(
        f'config.classes_per_client={classes_per_client!r}: must be an integer in [1, {k}] '
        f'(the number of classes in the data).')

  total = num_clients * classes_per_client
  counts = _shards_per_class(sizes, total, num_clients, rng)
  if counts.sum() != total or np.any(counts > sizes):
    c = int(np.argmax(counts - sizes))
    raise ValueError(
        f'config.num_clients={num_clients}, config.classes_per_client={classes_per_client}: '
        f'{total} shards of distinct classes per client do not fit the data (class '
        f'{int(classes[c])} has {sizes[c]} examples for {counts[c]} shards); use fewer clients or '
        'fewer classes per client.')
  shards, shard_classes = [], []
  for c, n in zip(classes, counts):
    idx = rng.permutation(np.flatnonzero(labels == c))
    shards += np.array_split(idx, n) if n else []
    shard_classes += [c] * n
  slots = _deal_distinct(np.asarray(shard_classes), num_clients, classes_per_client, rng)
  return _sorted_int64(np.concatenate([shards[j] for j in row]) for row in slots)


def dirichlet(labels, num_clients: int, alpha: float, rng: np.random.Generator,
              min_size: int = 2, max_tries: int = 100) -> list[np.ndarray]:
  """Label-skewed split: per class, client shares ~ Dirichlet(alpha * 1_N).

  Redraws the whole split until every client has at least `min_size` examples (so each can still be
  split into train and test), giving up after `max_tries` draws.
  """
  labels = _as_labels(labels)
  _check_num_clients(labels, num_clients)
  if not isinstance(alpha, numbers.Real) or isinstance(alpha, bool) or not np.isfinite(alpha) or alpha <= 0:
    raise ValueError(f'config.dirichlet_alpha={alpha!r}: must be a number > 0.')
  if num_clients * min_size > len(labels):
    raise ValueError(
        f'config.num_clients={num_clients}: {num_clients} clients with at least {min_size} examples '
        f'each need {num_clients * min_size} examples but the data has {len(labels)}; use fewer clients.')

  by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
  for _ in range(max_tries):
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for idx in by_class:
      idx = rng.permutation(idx)
      p = rng.dirichlet(np.full(num_clients, float(alpha)))
      if not np.all(np.isfinite(p)):  # guard: tiny alpha can underflow
        p = np.zeros(num_clients)
        p[rng.integers(num_clients)] = 1.0
      cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
      for i, share in enumerate(np.split(idx, cuts)):
        parts[i].append(share)
    result = _sorted_int64(np.concatenate(p) for p in parts)
    if min(len(r) for r in result) >= min_size:
      return result
  raise ValueError(
      f'config.dirichlet_alpha={alpha}, config.num_clients={num_clients}: no Dirichlet split in '
      f'{max_tries} tries gave every client at least {min_size} examples; use a larger '
      f'config.dirichlet_alpha (less skew) or fewer config.num_clients.')


def natural(writers, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
  """One client per writer: `num_clients` writers drawn without replacement (rng), in writer order.

  With num_clients equal to the number of writers every writer is a client (the draw is then only
  a permutation, undone by the sort).
  """
  writers = np.asarray(writers)
  if writers.ndim != 1 or not np.issubdtype(writers.dtype, np.integer):
    raise ValueError(f'writers must be a 1-D integer array; got {writers.dtype} {writers.shape}.')
  ids, inverse = np.unique(writers, return_inverse=True)
  if not _is_int(num_clients) or not 1 <= num_clients <= len(ids):
    raise ValueError(
        f'config.num_clients={num_clients!r}: with config.partition={NATURAL!r} each client is one '
        f'writer; must be an integer in [1, {len(ids)}] (the writers in the data).')
  chosen = np.sort(rng.choice(len(ids), size=num_clients, replace=False))
  order = np.argsort(inverse, kind='stable')
  starts = np.searchsorted(inverse[order], np.arange(len(ids) + 1))
  return _sorted_int64(order[starts[w]:starts[w + 1]] for w in chosen)


@dataclasses.dataclass(frozen=True)
class Partition:
  """A registered way to split a dataset's examples over clients.

  `split(dataset, num_clients, rng, **options)` returns `num_clients` int index arrays into the
  dataset's examples (disjoint, none empty); `dataset` has `.y` (int labels) and `.writers` (int
  writer ids, or None); `options` are the config's partition fields (`classes_per_client`,
  `dirichlet_alpha`): take those you need by name and `**_` the rest. All randomness comes from
  `rng` (seeded from config.seed). `needs_writers`: it splits by writer, so only datasets that
  carry writers take it.
  """
  split: Callable[..., Sequence[np.ndarray]]
  needs_writers: bool = False

  def __post_init__(self):
    if not callable(self.split):
      raise RegistrationError(f'split={self.split!r} is not callable.')


# Every partition, the package's and those a user's file registers (api.register_partition).
PARTITIONS: Registry[Partition] = Registry('partition', 'partition')
PARTITIONS.register('iid', Partition(lambda ds, n, rng, **_: iid(ds.y, n, rng)),
                    description='shuffled and dealt in near-equal shares')
PARTITIONS.register('pathological', Partition(
    lambda ds, n, rng, *, classes_per_client, **_: pathological(ds.y, n, classes_per_client, rng)),
                    description='FedRep (N, S): each client S shards of S distinct classes '
                                '(config.classes_per_client)')
PARTITIONS.register('dirichlet', Partition(
    lambda ds, n, rng, *, dirichlet_alpha, **_: dirichlet(ds.y, n, dirichlet_alpha, rng)),
                    description='per class, client shares ~ Dirichlet(config.dirichlet_alpha)')
PARTITIONS.register(NATURAL, Partition(lambda ds, n, rng, **_: natural(ds.writers, n, rng),
                                       needs_writers=True),
                    description='one client per writer (datasets with writers: femnist, shakespeare)')


def split_dataset(dataset: Any, num_clients: int, kind: str, *, rng: np.random.Generator,
                  **options) -> list[np.ndarray]:
  """The registered partition `kind` of `dataset` (`.y`, `.writers`) over `num_clients` clients,
  each client's indices as a sorted int64 array."""
  part = PARTITIONS.lookup(kind)
  if part.needs_writers and getattr(dataset, 'writers', None) is None:
    raise ConfigError(f'config.partition={kind!r} splits by writer: the data has no writers.')
  parts = list(part.split(dataset, num_clients, rng, **options))
  if len(parts) != num_clients:
    raise ValueError(f'config.partition={kind!r} made {len(parts)} clients for '
                     f'config.num_clients={num_clients}.')
  return _sorted_int64(parts)


def partition(labels, num_clients: int, kind: str, *, classes_per_client: int = 2,
              dirichlet_alpha: float = 0.5, rng: np.random.Generator) -> list[np.ndarray]:
  """The partition `kind` of a label array (one that needs no writers); see split_dataset."""
  if PARTITIONS.lookup(kind).needs_writers:
    raise ValueError(
        f"config.partition={kind!r} splits by writer, not by label: use partition.natural(writers, "
        "...) (make_federated_data does, for datasets with writers such as 'femnist').")
  return split_dataset(types.SimpleNamespace(y=labels, writers=None), num_clients, kind, rng=rng,
                       classes_per_client=classes_per_client, dirichlet_alpha=dirichlet_alpha)
