"""The device mesh of the 'sharded' executor: client slots split over devices, the rest replicated.

One mesh axis, 'clients', over every device of every process (`jax.devices()` is global after
`jax.distributed.initialize`). Inside the round step the stacked inputs of a chunk of client slots
are constrained to `P('clients')`, so each device trains its own slice of the cohort (a GPU/TPU
vmaps its slice; a CPU device, one per core with `JAX_NUM_CPU_DEVICES`, trains its slots one at a
time, as the sequential executor does: map_one_slot_per_device); the server
state and the federated data are replicated (every device can gather any client), and the sum of
the uploads becomes an all-reduce. The same program runs on 1 device, 8 forced CPU devices, a GPU
host or a TPU pod slice.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
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


def map_one_slot_per_device(f, xs, mesh: Mesh):
  """f over the leading (slot) axis of `xs`, each device running its slots one at a time.

  The CPU form of the sharded executor: slots [S, ...] become rows [S / n, n, ...], row k holding
  the k-th slot of each device's block; a lax.map walks the rows and vmaps each row's n slots, split
  over the n devices, so every device trains one client per step (as the 'sequential' executor does
  on one device), on its own core. Outputs come back in slot order.
  """
  n = num_shards(mesh)
  # Device d holds slots [d S/n, (d + 1) S/n), as P('clients') places them: row k is slot k of each.
  rows = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(n, -1, *x.shape[1:]), 0, 1), xs)
  out = jax.lax.map(lambda row: jax.vmap(f)(*shard_clients(row, mesh)), rows)
  return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1).reshape(-1, *y.shape[2:]), out)


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
