"""How a round runs its cohort: an executor object, chosen once from `config.executor`.

The model is fedjax's `ForEachClientBackend` (core/for_each_client.py): the round asks its executor
and never which kind it holds. Every executor runs the same client function; each owns

    slots(capacity)      the round's sizing: client slots per chunk (at most chunk_size; sharded:
                         the same number on every device)
    map_clients          one client function over a chunk's stacked slots (what differs)
    place / constrain    where the round's state, data and keys live (sharded: whole on every device
                         of the mesh), and the sharding of the round's output
    loops_over_clients   whether a device trains one client at a time (the evaluation's batch)
    evaluation_batch     the clients an evaluation that gives each client its own weights vmaps at once
    evaluation_mesh      the devices that share such an evaluation's clients (sharded only)

    Sequential   a lax.map over the slots: one client at a time ('auto' on a CPU)
    Vmap         the slots vmapped at once, or (chunk_size) a lax.map over vmapped sub-chunks
                 ('auto' on a GPU/TPU)
    Sharded      the slots split over a 'clients' mesh of all devices (sharding.py): a GPU/TPU
                 vmaps its slice, a CPU device loops over its own

The config keeps the name (a string in config.json); `from_name` is the one place it is read.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Callable, ClassVar

import jax

from dp2fedsam_jax import sharding

NAMES = ('auto', 'vmap', 'sequential', 'sharded')


@dataclasses.dataclass(frozen=True)
class Executor(abc.ABC):
  """The base: one device, the round's arrays where they are. `chunk_size`: clients trained per
  chunk at most (None: the whole capacity); a chunk's uploads ([slots, params]) are summed before the
  next chunk trains, so slots beyond it would only hold more of them in memory at once."""
  chunk_size: int | None = None
  name: ClassVar[str]

  def slots(self, capacity: int) -> int:
    """Client slots per chunk for a round that needs `capacity`."""
    return capacity if self.chunk_size is None else min(capacity, self.chunk_size)

  @abc.abstractmethod
  def map_clients(self, f: Callable, env, *xs):
    """f(env, *one_slot) over the leading (slot) axis of `xs`; `env`, what every client of the
    round reads, shared by all (each executor's own way: the one place where they differ)."""

  def place(self, tree):
    """The round's state, data or key, placed where the compiled round step reads them."""
    return tree

  def constrain(self, tree):
    """Inside the round step: the sharding of its output (the new state and the metrics)."""
    return tree

  @property
  def loops_over_clients(self) -> bool:
    """Whether each device trains one client at a time. Work that gives every client its own weights
    outside the round (fine-tuning and adaptation evaluations, local_only) loops there too: vmapped
    per-client weights make every GEMM a batched one, 4-5x slower on 2 CPU cores
    (benchmarks/README.md)."""
    return False

  def evaluation_batch(self, own_weights: bool, default: int) -> int:
    """Clients an evaluation vmaps at once: one where each client gets its own weights and the round
    loops over clients; `default` otherwise (a forward-only evaluation shares one extractor)."""
    return 1 if own_weights and self.loops_over_clients else default

  def evaluation_mesh(self):
    """The devices that share an evaluation's one-at-a-time clients (None: one device loops)."""
    return None

  @property
  def vmaps_whole_chunk(self) -> bool:
    """Whether one device vmaps a whole chunk at once: what fitting to device memory may split."""
    return False

  def with_chunk_size(self, chunk_size: int | None) -> Executor:
    return dataclasses.replace(self, chunk_size=chunk_size)


@dataclasses.dataclass(frozen=True)
class Sequential(Executor):
  """A loop over the slots (lax.map): a padded step or an empty slot stays a real lax.cond and is
  skipped, which a vmap would turn into a select computing both branches."""
  name: ClassVar[str] = 'sequential'

  def map_clients(self, f, env, *xs):
    return jax.lax.map(lambda a: f(env, *a), xs)

  @property
  def loops_over_clients(self) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Vmap(Executor):
  """The slots vmapped at once; with chunk_size, a sequential loop over vmapped sub-chunks of it
  (memory-bounded)."""
  name: ClassVar[str] = 'vmap'

  def map_clients(self, f, env, *xs):
    if self.chunk_size is None:
      return jax.vmap(functools.partial(f, env))(*xs)
    return jax.lax.map(lambda a: f(env, *a), xs, batch_size=self.chunk_size)

  @property
  def vmaps_whole_chunk(self) -> bool:
    return self.chunk_size is None


@dataclasses.dataclass(frozen=True)
class Sharded(Executor):
  """Client slots split over a 'clients' mesh of every device of every process; the server state,
  the data and the keys whole on every device (sharding.py). Each device trains its slice the way
  one device of its kind is fastest: a GPU/TPU vmaps it, a CPU device (one per core) loops over it
  (sharding.map_slots_on_each_device)."""
  name: ClassVar[str] = 'sharded'

  def slots(self, capacity: int) -> int:
    return sharding.round_up(super().slots(capacity), sharding.num_shards())

  def map_clients(self, f, env, *xs):
    mesh = sharding.client_mesh()
    if self.loops_over_clients:
      return sharding.map_slots_on_each_device(f, env, xs, mesh)
    return jax.vmap(functools.partial(f, env))(*sharding.shard_clients(xs, mesh))

  def place(self, tree):
    return sharding.replicate(tree)

  def constrain(self, tree):  # the server state and metrics stay whole on every device
    return jax.lax.with_sharding_constraint(tree, sharding.replicated(sharding.client_mesh()))

  @property
  def loops_over_clients(self) -> bool:
    return jax.default_backend() == 'cpu'

  def evaluation_mesh(self):
    return sharding.client_mesh()


_BY_NAME = {kind.name: kind for kind in (Vmap, Sequential, Sharded)}
# The executors 'auto' chooses from: a resumed 'auto' run keeps the one its config.json records.
AUTO_CHOICES = ('sequential', 'vmap')


def resolve_name(name: str, backend: str | None = None) -> str:
  """'auto' -> the executor that fits `backend` (default: JAX's default backend); others as given.

  CPU: 'sequential', a loop over the clients (with chunk_size, a loop over chunks of it). A CPU has
  no idle hardware for a client batch axis to fill, and vmapped per-client weights turn each GEMM
  into a batched one with a 5-10x larger working set: benchmarks/README.md measures sequential 1.37x
  faster than the whole-cohort vmap at cohort 50, and vmapped sub-chunks of 2 no faster than it.
  GPU/TPU: 'vmap', where one client's small GEMMs would leave most of the chip idle.
  """
  if name not in NAMES:
    raise ValueError(f'config.executor={name!r}: unknown; choose one of {list(NAMES)}.')
  if name != 'auto':
    return name
  return 'sequential' if (backend or jax.default_backend()) == 'cpu' else 'vmap'


def from_name(name: str, chunk_size: int | None = None, backend: str | None = None) -> Executor:
  """The executor object of a config's `executor` name ('auto' resolved for `backend`)."""
  return _BY_NAME[resolve_name(name, backend)](chunk_size=chunk_size)


def from_config(config) -> Executor:
  return from_name(config.executor, config.chunk_size)


def choose_for_run(name: str, chunk_size: int | None, recorded: dict,
                   backend: str | None = None) -> tuple[str, int | None, str]:
  """(the executor name a run uses, its chunk_size, how it was chosen: '' when given). `recorded`:
  the config.json of the checkpointed run in the workdir ({} if none). A resumed 'auto' run keeps the
  executor (and, unless set, the chunk size) its config.json records (also on another backend, or if
  started before 'auto' existed), so that the resume repeats the run exactly."""
  if name != 'auto':
    return name, chunk_size, ''
  if recorded.get('executor') in AUTO_CHOICES:
    chunk_size = recorded.get('chunk_size') if chunk_size is None else chunk_size
    return recorded['executor'], chunk_size, 'auto: that of the checkpointed run'
  return resolve_name('auto', backend), chunk_size, f'auto on {backend or jax.default_backend()}'
