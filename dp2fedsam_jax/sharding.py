"""The device mesh of the 'sharded' executor: client slots split over devices, the rest replicated.

One mesh axis, 'clients', over every device of every process (`jax.devices()` is global after
`jax.distributed.initialize`). Inside the round step the stacked inputs of a chunk of client slots
are constrained to `P('clients')`, so each device trains its own slice of the cohort; the server
state and the federated data are replicated (every device can gather any client), and the sum of
the uploads becomes an all-reduce. The same program runs on 1 device, 8 forced CPU devices, a GPU
host or a TPU pod slice.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = 'clients'


def client_mesh(devices=None) -> Mesh:
  """A 1-D mesh named 'clients' over `devices` (default: all devices of all processes)."""
  devices = jax.devices() if devices is None else list(devices)
  return Mesh(np.asarray(devices), (AXIS,))


def num_shards(mesh: Mesh | None = None) -> int:
  return (mesh or client_mesh()).shape[AXIS]


def round_up(capacity: int, shards: int) -> int:
  """Client slots per chunk, rounded up so that every device gets the same number of slots."""
  return -(-capacity // shards) * shards


def client_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (client-slot) axis split over the mesh; other axes whole."""
  return NamedSharding(mesh, P(AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def shard_clients(tree, mesh: Mesh):
  """Inside jit: constrain the leading axis of every leaf to be split over 'clients'."""
  return jax.lax.with_sharding_constraint(tree, client_sharding(mesh))


def replicate(tree, mesh: Mesh | None = None):
  """Places host/process-local values, identical on every process, replicated over the mesh.

  `make_array_from_process_local_data` (rather than `device_put`) also works when the mesh spans
  devices of other processes (multi-host): each process contributes its copy.
  """
  mesh = mesh or client_mesh()
  sharding = replicated(mesh)

  def one(x):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      impl = jax.random.key_impl(x)
      return jax.random.wrap_key_data(one(jax.random.key_data(x)), impl=impl)
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))
  return jax.tree.map(one, tree)
