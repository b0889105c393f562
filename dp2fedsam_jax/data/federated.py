"""All clients' data as one ragged data set: flat example arrays plus per-client offsets.

Client i owns rows offsets[i]:offsets[i+1] of a split's flat arrays, so memory follows the total
number of examples, never N times the largest client. The round step gathers the sampled clients'
examples into a fixed [slots, budget] buffer (`train_examples`); the evaluation gathers each block of
clients' test examples the same way, into a buffer that fits the block's largest client. Padding
changes neither updates nor sensitivity: padded slots are zeros and masked out, and the budget
(config.local.max_examples) is a constant.

Two kinds of input share the model: images (uint8 [total, H, W, C], labels int [total]) and token
sequences (uint8 [total, L] token ids, labels [total, L] next-token ids; `pad_id` is ignored in loss
and accuracy, `accuracy_ignore_ids` (EOS, BOS) in accuracy only).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from dp2fedsam_jax.data import sources
from dp2fedsam_jax.data.partition import NATURAL
from dp2fedsam_jax.data.partition import PARTITIONS
from dp2fedsam_jax.data.partition import split_dataset
# Aliased: `make_federated_data` has an argument named `partition`.

INPUT_KINDS = ('image', 'tokens')
# How a client over its budget draws the random subset it trains on (config.local.subset_draw): the
# same distribution, other random numbers. 'argsort': a uniform per example, sorted, O(max_train) per
# client; 'floyd': Floyd's subset then a shuffle of it, O(budget^2) compares, independent of max_train.
SUBSET_DRAWS = ('argsort', 'floyd')


@flax.struct.dataclass
class FederatedData:
  """Per-client train/test data, ragged: each split's examples of all clients in one flat array.

  Client i's training examples are rows train_offsets[i]:train_offsets[i+1] of train_x / train_y
  (likewise for test). Build it with `from_flat_arrays` (or `build_federated_data` from a source).
  """

  train_x: jax.Array        # uint8 [total_train, H, W, C] images | [total_train, L] token ids
  train_y: jax.Array        # int32 [total_train] labels | uint8 [total_train, L] next-token ids
  train_offsets: jax.Array  # int32 [N + 1]
  test_x: jax.Array
  test_y: jax.Array
  test_offsets: jax.Array   # int32 [N + 1]
  num_classes: int = flax.struct.field(pytree_node=False)
  mean: tuple = flax.struct.field(pytree_node=False, default=())   # images: per-channel, of x / 255
  std: tuple = flax.struct.field(pytree_node=False, default=())
  input_kind: str = flax.struct.field(pytree_node=False, default='image')  # one of INPUT_KINDS
  max_train: int = flax.struct.field(pytree_node=False, default=1)  # the largest client's count
  max_test: int = flax.struct.field(pytree_node=False, default=1)   # >= 1: never a zero-size axis
  pad_id: int | None = flax.struct.field(pytree_node=False, default=None)  # tokens: not a target
  accuracy_ignore_ids: tuple = flax.struct.field(pytree_node=False, default=())  # e.g. EOS, BOS

  @property
  def num_clients(self) -> int:
    return int(self.train_offsets.shape[0]) - 1

  @property
  def input_shape(self) -> tuple:
    return tuple(self.train_x.shape[1:])

  @property
  def train_count(self) -> jax.Array:
    return jnp.diff(self.train_offsets)

  @property
  def test_count(self) -> jax.Array:
    return jnp.diff(self.test_offsets)

  @property
  def total_examples(self) -> int:
    return int(self.train_x.shape[0] + self.test_x.shape[0])

  @property
  def nbytes(self) -> int:
    """Bytes of the stored arrays (what the data costs on the device)."""
    return sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(self))

  def normalize(self, x) -> jax.Array:
    """Model inputs: images float32 (x / 255 - mean) / std, channels last; tokens int32 ids."""
    if self.input_kind == 'tokens':
      return jnp.asarray(x, jnp.int32)
    mean = jnp.asarray(self.mean, jnp.float32)
    std = jnp.asarray(self.std, jnp.float32)
    return (jnp.asarray(x, jnp.float32) / 255.0 - mean) / std

  def loss_mask(self, y, example_mask) -> jax.Array:
    """bool, y's shape: the targets the loss counts (real examples; tokens: not pad)."""
    mask = example_mask.reshape(example_mask.shape + (1,) * (y.ndim - example_mask.ndim))
    mask = jnp.broadcast_to(mask, y.shape)
    return mask if self.pad_id is None else mask & (y != self.pad_id)

  def accuracy_mask(self, y, example_mask) -> jax.Array:
    """bool, y's shape: the targets accuracy counts (the loss's, less `accuracy_ignore_ids`)."""
    mask = self.loss_mask(y, example_mask)
    for token in self.accuracy_ignore_ids:
      mask = mask & (y != token)
    return mask

  def train_examples(self, client_id, budget: int, key=None, draw: str = 'argsort'):
    """Client `client_id`'s training examples in a [budget] buffer: (x, y int32, count).

    A client with at most `budget` examples gets all of them, in stored order, zero-padded. One
    with more trains on a uniformly random `budget` of them in uniformly random order, fresh each
    round from `key` (its own examples stream), as TFF's shuffle + take; `draw` (SUBSET_DRAWS) says
    how. `count` is the number of real slots, min(n_i, budget); `budget` is a constant, so
    sensitivity is unchanged.
    """
    if draw not in SUBSET_DRAWS:
      raise ValueError(f'subset draw {draw!r}: choose one of {SUBSET_DRAWS} (config.local.subset_draw).')
    return _gather(self.train_x, self.train_y, self.train_offsets, client_id, budget,
                   self.max_train, key, draw)

  def test_examples(self, client_id, buffer: int | None = None):
    """Client `client_id`'s test examples in a [buffer] buffer (default max_test): (x, y, count).

    All of them, in stored order and zero-padded, when `buffer` holds them (the evaluation picks
    such a buffer for each block of clients: eval_blocks.test_buffer_sizes); a smaller buffer
    keeps the first `buffer` of them.
    """
    size = self.max_test if buffer is None else buffer
    return _gather(self.test_x, self.test_y, self.test_offsets, client_id, size, size, None)

  def client_train(self, client_id: int):
    """One client's whole training set padded to max_train (x, y, count): for tests and tools."""
    return self.train_examples(client_id, self.max_train)


def _floyd_subset(key, n, budget: int) -> jax.Array:
  """int32[budget]: a uniformly random `budget` of range(n) (n >= budget) in uniformly random order.

  Floyd's algorithm: for j = n - budget, ..., n - 1 take a uniform t in [0, j], or j itself if t is
  already taken; every budget-subset comes out equally likely. Its order is not uniform (j lands
  late), so the chosen positions are shuffled. Nothing depends on max_train, only on n and key.
  """
  subset_key, order_key = jax.random.split(key)

  def take(i, chosen):
    j = n - budget + i
    t = jax.random.randint(jax.random.fold_in(subset_key, i), (), 0, j + 1)
    return chosen.at[i].set(jnp.where(jnp.any(chosen == t), j, t))

  chosen = jax.lax.fori_loop(0, budget, take, jnp.full((budget,), -1, jnp.int32))
  return jax.random.permutation(order_key, chosen)


def _gather(x, y, offsets, client_id, budget: int, max_count: int, key, draw: str = 'argsort'):
  """Rows offsets[id]:offsets[id+1] of (x, y) into a [budget] buffer; see train_examples."""
  start = offsets[client_id]
  n = offsets[client_id + 1] - start
  slots = jnp.arange(budget)
  positions = slots
  if budget < max_count:  # some client may hold more than the budget: a random subset of them
    if key is None:
      raise ValueError(f'a budget of {budget} < {max_count} examples needs a key to choose them.')
    # Either draw depends on key and n only, never on max_count (padding: another federation's
    # largest client), so a client's subset is its own; one within the budget keeps its order.
    if draw == 'floyd':
      chosen = _floyd_subset(key, n.astype(jnp.int32), budget)
    else:  # each example's sort key comes from fold_in(key, j)
      every = jnp.arange(max_count)
      u = jax.vmap(lambda j: jax.random.uniform(jax.random.fold_in(key, j)))(every)
      chosen = jnp.argsort(jnp.where(every < n, u, 2.0))[:budget]
    positions = jnp.where(n > budget, chosen, slots)
  count = jnp.minimum(n, budget).astype(jnp.int32)
  real = slots < count
  if x.shape[0] == 0:  # a split without any example (e.g. train_fraction=1: no test data)
    return (jnp.zeros((budget, *x.shape[1:]), x.dtype), jnp.zeros((budget, *y.shape[1:]), jnp.int32),
            count)
  rows = jnp.where(real, start + positions, 0)
  # Padded slots are zeros, never another client's rows (a NaN there would reach the masked loss).
  keep = lambda a: jnp.where(real.reshape(real.shape + (1,) * (a.ndim - 1)), a, 0)
  return keep(x[rows]), keep(y[rows]).astype(jnp.int32), count


def _check_split(name: str, x, y, offsets, num_clients: int | None) -> np.ndarray:
  offsets = np.asarray(offsets, np.int64).reshape(-1)
  if offsets.size < 2 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
    raise ValueError(f'{name}_offsets must start at 0 and never decrease (client i owns rows '
                     f'offsets[i]:offsets[i+1]); got {offsets[:5]}...')
  if offsets[-1] != len(x) or len(x) != len(y):
    raise ValueError(f'{name}: offsets end at {offsets[-1]} but {name}_x has {len(x)} rows and '
                     f'{name}_y {len(y)}: they must all agree.')
  if num_clients is not None and offsets.size - 1 != num_clients:
    raise ValueError(f'{name}_offsets has {offsets.size - 1} clients, the train split '
                     f'{num_clients}: one offsets entry per client + 1 in both.')
  if offsets[-1] >= 2**31:
    raise ValueError(f'{name}: {offsets[-1]} examples exceed int32 offsets (2**31 - 1).')
  return offsets


def from_flat_arrays(*, train_x, train_y, train_offsets, test_x, test_y, test_offsets,
                     num_classes: int, input_kind: str = 'image', mean: Sequence[float] = (),
                     std: Sequence[float] = (), pad_id: int | None = None,
                     accuracy_ignore_ids: Sequence[int] = ()) -> FederatedData:
  """FederatedData from each split's flat arrays and per-client offsets (the one constructor).

  Args:
    train_x, test_x: uint8 [total, H, W, C] images, or uint8 [total, L] token ids.
    train_y, test_y: int [total] labels, or [total, L] next-token ids (uint8 suffices).
    train_offsets, test_offsets: int [N + 1]: client i owns rows offsets[i]:offsets[i+1].
    num_classes: classes, or the vocabulary size.
    input_kind: 'image' (normalized with mean/std of x / 255) or 'tokens' (ids, cast to int32).
    mean, std: per-channel statistics of the images.
    pad_id: tokens only: a target id ignored in loss and accuracy.
    accuracy_ignore_ids: tokens only: further ids ignored in accuracy (EOS, BOS), not in the loss.
  """
  if input_kind not in INPUT_KINDS:
    raise ValueError(f'input_kind={input_kind!r}: choose one of {list(INPUT_KINDS)}.')
  if input_kind == 'image' and len(mean) != (np.shape(train_x)[-1] if np.ndim(train_x) > 1 else 0):
    raise ValueError(f'mean/std need one entry per image channel; got {len(mean)} for x of shape '
                     f'{np.shape(train_x)}.')
  train_offsets = _check_split('train', train_x, train_y, train_offsets, None)
  test_offsets = _check_split('test', test_x, test_y, test_offsets, train_offsets.size - 1)
  train_counts = np.diff(train_offsets)
  empty = np.flatnonzero(train_counts == 0)
  if empty.size:
    raise ValueError(
        f'client {empty[0]} has no training examples; change config.num_clients, config.partition, '
        f'config.classes_per_client or config.dirichlet_alpha so every client gets data.')
  label_dtype = lambda y: np.uint8 if np.asarray(y).dtype == np.uint8 else np.int32
  as_device = lambda a, dtype: jnp.asarray(np.asarray(a).astype(dtype, copy=False))
  return FederatedData(
      train_x=as_device(train_x, np.uint8), train_y=as_device(train_y, label_dtype(train_y)),
      train_offsets=as_device(train_offsets, np.int32),
      test_x=as_device(test_x, np.uint8), test_y=as_device(test_y, label_dtype(test_y)),
      test_offsets=as_device(test_offsets, np.int32),
      num_classes=int(num_classes), mean=tuple(float(m) for m in mean),
      std=tuple(float(s) for s in std), input_kind=input_kind,
      max_train=int(train_counts.max()), max_test=max(1, int(np.diff(test_offsets).max())),
      pad_id=None if pad_id is None else int(pad_id),
      accuracy_ignore_ids=tuple(int(t) for t in accuracy_ignore_ids))


def select_clients(data: FederatedData, client_ids) -> FederatedData:
  """The data of `client_ids` (repeats allowed), in that order, as a new FederatedData."""
  client_ids = np.asarray(client_ids, np.int64)

  def split(x, y, offsets):
    offsets = np.asarray(offsets, np.int64)
    starts, counts = offsets[client_ids], np.diff(offsets)[client_ids]
    rows = np.concatenate([np.arange(s, s + c) for s, c in zip(starts, counts)] or [np.zeros(0, int)])
    return x[rows], y[rows], np.concatenate([[0], np.cumsum(counts)])

  train_x, train_y, train_offsets = split(data.train_x, data.train_y, data.train_offsets)
  test_x, test_y, test_offsets = split(data.test_x, data.test_y, data.test_offsets)
  return data.replace(
      train_x=train_x, train_y=train_y, train_offsets=jnp.asarray(train_offsets, jnp.int32),
      test_x=test_x, test_y=test_y, test_offsets=jnp.asarray(test_offsets, jnp.int32),
      max_train=int(np.diff(train_offsets).max()),
      max_test=max(1, int(np.diff(test_offsets).max())))


# The stream of numpy's generator that carves the validation rows (beside config.seed).
VALIDATION_STREAM = 44


def _client_entropy(key) -> int:
  """A client's key as a SeedSequence word: an int >= 0 as is, a name or bytes by their SHA-256."""
  if isinstance(key, (int, np.integer)) and key >= 0:
    return int(key)
  if isinstance(key, str):
    key = key.encode()
  if isinstance(key, bytes):
    return int.from_bytes(hashlib.sha256(key).digest()[:16], 'little')
  raise ValueError(f'split_validation: client key {key!r}: give an int >= 0, a name or bytes.')


def _rows_key(x: np.ndarray, y: np.ndarray) -> bytes:
  """A client's identity from its own training rows: nothing of another client enters it."""
  return np.ascontiguousarray(x).tobytes() + np.ascontiguousarray(y).tobytes()


def split_validation(data: FederatedData, fraction: float, seed: int,
                     client_keys=None) -> tuple[FederatedData, FederatedData]:
  """(training data, validation data): a seeded share of each client's training rows set aside.

  Client i with n_i training rows gives min(n_i - 1, round(fraction * n_i)) of them (half up; at
  least one row stays for training), chosen uniformly by its own generator
  np.random.default_rng([seed, VALIDATION_STREAM, key_i]), to its validation split; both keep the
  rows' stored order. key_i is client_keys[i] (an int >= 0, or a name, hashed), by default the
  SHA-256 of the client's own training rows (not its position, which a removal shifts). A client's
  split so depends on its own rows (and key) only: removing or adding a client leaves every other
  client's split unchanged. The test split is never touched. The validation data is the training data with its
  validation rows as the test split, so the evaluation tests it unchanged (and fine-tunes on the
  remaining training rows only).
  """
  if not 0.0 < fraction < 1.0:
    raise ValueError(f'config.validation_fraction={fraction!r}: must lie in (0, 1) to split.')
  offsets = np.asarray(data.train_offsets, np.int64)
  counts = np.diff(offsets)
  n_val = np.minimum(counts - 1, np.floor(fraction * counts + 0.5).astype(np.int64))
  x, y = np.asarray(data.train_x), np.asarray(data.train_y)
  if client_keys is not None and len(client_keys) != counts.size:
    raise ValueError(f'split_validation: {len(client_keys)} client keys for {counts.size} clients.')
  is_val = np.zeros(int(offsets[-1]), bool)
  for i, (start, count, held) in enumerate(zip(offsets[:-1], counts, n_val)):
    if held > 0:  # the client's held rows: the `held` smallest of its own uniforms
      key = (_rows_key(x[start:start + count], y[start:start + count]) if client_keys is None
             else client_keys[i])
      u = np.random.default_rng([seed, VALIDATION_STREAM, _client_entropy(key)]).random(count)
      is_val[start + np.argsort(u, kind='stable')[:held]] = True
  new_offsets = lambda c: jnp.asarray(np.concatenate([[0], np.cumsum(c)]), jnp.int32)
  train = data.replace(train_x=jnp.asarray(x[~is_val]), train_y=jnp.asarray(y[~is_val]),
                       train_offsets=new_offsets(counts - n_val),
                       max_train=int((counts - n_val).max()))
  validation = train.replace(test_x=jnp.asarray(x[is_val]), test_y=jnp.asarray(y[is_val]),
                             test_offsets=new_offsets(n_val), max_test=max(1, int(n_val.max())))
  return train, validation


def padded_bytes(offsets, example_bytes: int) -> tuple[int, int]:
  """(padded, ragged) bytes of one split: N x the largest client against the total.

  padded = N * max_i n_i * example_bytes (the stacked layout this module used before), ragged =
  sum_i n_i * example_bytes + 4 (N + 1) for the int32 offsets.
  """
  counts = np.diff(np.asarray(offsets, np.int64))
  return (int(counts.size * counts.max() * example_bytes),
          int(counts.sum() * example_bytes + 4 * (counts.size + 1)))


def build_federated_data(dataset: sources.ArrayDataset, client_indices: Sequence[np.ndarray], *,
                         train_fraction: float = 0.9, rng: np.random.Generator) -> FederatedData:
  """Splits each client's examples into train/test and lays all clients out flat on device.

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

  def flat(groups):
    rows = np.concatenate(groups)
    return dataset.x[rows], dataset.y[rows], np.concatenate([[0], np.cumsum([len(g) for g in groups])])

  train_x, train_y, train_offsets = flat(train_groups)
  test_x, test_y, test_offsets = flat(test_groups)
  return from_flat_arrays(
      train_x=train_x, train_y=np.asarray(train_y, np.int32), train_offsets=train_offsets,
      test_x=test_x, test_y=np.asarray(test_y, np.int32), test_offsets=test_offsets,
      num_classes=int(dataset.num_classes), mean=dataset.mean, std=dataset.std)


def make_federated_data(*, dataset: str, num_clients: int, partition: str, classes_per_client: int = 2,
                        dirichlet_alpha: float = 0.5, seed: int = 0, data_dir: str | None = None,
                        train_fraction: float = 0.9, **source_kwargs) -> FederatedData:
  """Loads the training split of `dataset`, partitions it over clients, splits each 90/10.

  All randomness (partition and per-client split) comes from np.random.default_rng(seed). Extra
  `source_kwargs` go to the source (e.g. `num_examples=500` for 'synthetic'). Partition 'natural'
  makes each of `num_clients` writers drawn with that rng a client (datasets with writers only).
  A token dataset (sources.TOKEN_DATASETS) takes `load_token_clients`' clients with their own split.
  """
  if dataset in sources.TOKEN_DATASETS:
    return token_federated_data(load_token_clients(
        dataset=dataset, num_clients=num_clients, partition=partition, seed=seed, data_dir=data_dir,
        **source_kwargs))
  if PARTITIONS.lookup(partition).needs_writers and dataset not in sources.DATASETS_WITH_WRITERS:
    # Checked before loading: the data may take minutes to read.
    raise ValueError(
        f'config.partition={partition!r} (one client per writer) needs a dataset whose examples carry '
        f'their writer, one of {list(sources.DATASETS_WITH_WRITERS)}; config.dataset={dataset!r} has '
        "none. Use config.partition='iid', 'pathological' or 'dirichlet'.")
  ds = sources.load_dataset(dataset, data_dir=data_dir, split='train', **source_kwargs)
  rng = np.random.default_rng(seed)
  if PARTITIONS[partition].needs_writers and ds.writers is None:
    raise ValueError(f'config.partition={partition!r}: the loaded {dataset!r} data has no writers.')
  client_indices = split_dataset(ds, num_clients, partition, rng=rng,
                                 classes_per_client=classes_per_client, dirichlet_alpha=dirichlet_alpha)
  return build_federated_data(ds, client_indices, train_fraction=train_fraction, rng=rng)


def load_token_clients(*, dataset: str, num_clients: int, partition: str = NATURAL, seed: int = 0,
                       data_dir: str | None = None, **source_kwargs):
  """The clients of token dataset `dataset` a run trains: `num_clients` of its natural clients.

  Partition 'natural' only: one client per speaking role, each with the train/test split the source
  made. `num_clients` roles are drawn without replacement with np.random.default_rng(seed) and kept in
  the source's order (as FEMNIST's writers); num_clients equal to the source's count takes them all.
  """
  if partition != NATURAL:
    raise ValueError(
        f'config.partition={partition!r}: config.dataset={dataset!r} has natural clients (one per '
        f"speaking role, each with its own train/test split); set config.partition='{NATURAL}'.")
  full = sources.load_token_dataset(dataset, data_dir, **source_kwargs)
  if not isinstance(num_clients, (int, np.integer)) or not 1 <= num_clients <= full.num_clients:
    raise ValueError(
        f'config.num_clients={num_clients!r}: {dataset!r} has {full.num_clients} clients (speaking '
        f'roles); set an integer in [1, {full.num_clients}] ({full.num_clients} takes every role).')
  if num_clients == full.num_clients:
    return full
  chosen = np.random.default_rng(seed).choice(full.num_clients, size=num_clients, replace=False)
  return full.subset(np.sort(chosen))


def token_federated_data(tokens) -> FederatedData:
  """FederatedData of a TokenDataset: each split's flat rows and offsets as they are; pad is no
  target, BOS and EOS no accuracy target (`ignored_in_accuracy`)."""
  return from_flat_arrays(
      train_x=tokens.train.x, train_y=tokens.train.y, train_offsets=tokens.train.offsets,
      test_x=tokens.test.x, test_y=tokens.test.y, test_offsets=tokens.test.offsets,
      num_classes=tokens.num_classes, input_kind='tokens', pad_id=tokens.pad_id,
      accuracy_ignore_ids=tokens.ignored_in_accuracy)
