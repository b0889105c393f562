"""The device mesh of the 'sharded' executor: client slots split over devices, the rest replicated.

One mesh axis, 'clients', over every device of every process (`jax.devices()` is global after
`jax.distributed.initialize`). Inside the round step the stacked inputs of a chunk of client slots
are constrained to `P('clients')`, so each device trains its own slice of the cohort (a GPU/TPU
vmaps its slice; a CPU device, one per core (one_cpu_device_per_core), loops over its slots as the
sequential executor does: map_slots_on_each_device); the server
state and the federated data are replicated (every device can gather any client), and the sum of
the uploads becomes an all-reduce (on a CPU, where the slots run in a shard_map, a gather of the
uploads). The same program runs on 1 device, 8 forced CPU devices, a GPU
host or a TPU pod slice.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = 'clients'


def one_cpu_device_per_core() -> int | None:
  """Asks JAX for one CPU device per core, so that a sharded run on a CPU keeps every core busy
  (one device would loop over the whole cohort on one core's worth of small GEMMs).

  Call it right after `import jax`. Leaves the count alone (returns None) when it was chosen
  (JAX_NUM_CPU_DEVICES, jax_num_cpu_devices, or XLA_FLAGS' --xla_force_host_platform_device_count)
  or when JAX has started its backends (the count is then fixed); else returns the cores it set.
  On a GPU/TPU host the CPU devices go unused.
  """
  if (jax.config.jax_num_cpu_devices >= 0
      or 'xla_force_host_platform_device_count' in os.environ.get('XLA_FLAGS', '')):
    return None
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  try:
    jax.config.update('jax_num_cpu_devices', cores or 1)
  except RuntimeError:  # backends already started
    return None
  return cores or 1


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


def map_slots_on_each_device(f, env, xs, mesh: Mesh):
  """f(env, *slot) over the leading (slot) axis of `xs`, each device looping over its own slots
  (jax.shard_map); `env`, what every slot reads, enters replicated.

  The CPU form of the sharded executor: inside the shard_map each device runs a lax.map over its
  slots, as the 'sequential' executor does on one device, so a padded step or an empty slot stays a
  real lax.cond and is skipped (a vmap would turn it into a select and compute both branches: on
  ragged clients, e.g. Shakespeare's roles, most steps are padding). Slot s goes to device s mod n:
  a chunk's sampled clients fill its first slots, and this spreads them evenly. Outputs come back
  in slot order. f must read the round's arrays from `env`, not from a closure: inside shard_map a
  closed-over array still carries the outer (auto) mesh, which jax refuses to mix with the manual one.
  """
  n = num_shards(mesh)

  def by_device(x):  # slot s = k n + d  ->  position d S/n + k
    return jnp.swapaxes(x.reshape(-1, n, *x.shape[1:]), 0, 1).reshape(x.shape)

  def by_slot(y):  # the inverse
    return jnp.swapaxes(y.reshape(n, -1, *y.shape[1:]), 0, 1).reshape(y.shape)

  def each_device(env, local):
    return jax.lax.map(lambda a: f(env, *a), local)

  out = jax.shard_map(each_device, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P(AXIS),
                      check_vma=False)(env, jax.tree.map(by_device, tuple(xs)))
  return jax.tree.map(by_slot, out)


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
