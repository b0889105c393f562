"""How the evaluation walks its clients, beside the executors' device placement (sharding.py).

The clients are tested in blocks, largest test sets first, each block in the smallest of
`test_buffer_sizes` that holds its first (largest) client: the cost follows the real test rows, not
N x max_test. A forward-only block of buffer b holds TEST_ROWS_PER_BLOCK // b clients (at most
clients_per_batch, at least one), so the large buffers do not pad many smaller clients to them; a
block of clients that train their own models holds clients_per_batch (their cost is the training).
A block of one is a plain call, not a vmap (what a loop over clients runs); where such clients have
a mesh of several devices, each device loops over its share instead (sharding.map_slots_on_each_device).
Padding changes no result beyond float rounding (tests/test_evaluation_buckets.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dp2fedsam_jax import sharding

# Clients vmapped at once by the evaluation. Forward-only evaluations share one extractor, so a
# vmapped block of clients is one big batched forward pass.
CLIENTS_PER_BATCH = 64
# The smallest test buffer: a block of clients with fewer test examples is padded to it. Image
# federations of equal clients (a few test examples each) keep one buffer: one compiled forward.
SMALLEST_TEST_BUFFER = 8
# Forward-only evaluations test a block of clients in about this many buffer rows: clients_per_batch
# clients of the small buffers, fewer of the large ones (Shakespeare: 64 of 8 rows, 6 of 152).
TEST_ROWS_PER_BLOCK = 1024


def evaluation_batch(executor, own_weights: bool):
  """(clients_per_batch, mesh) of an evaluation under the round's executor (executors.py). Clients
  that test their own trained weights (an -FT fine-tune, a test-time re-fit, local_only) go one at a
  time where the round loops over clients (sequential, or sharded on CPU; a Fashion-MNIST
  paper-regime evaluation of 1,000 clients: 70.8 s instead of 108.5 s on 2 cores; Shakespeare's
  DP-FedAvg-FT, 200 roles: 4.95 s instead of 24.1 s, benchmarks/README.md), and the sharded
  executor's devices share them (mesh; None: one device)."""
  return executor.evaluation_batch(own_weights, CLIENTS_PER_BATCH), executor.evaluation_mesh()


def test_buffer_sizes(max_test: int) -> tuple[int, ...]:
  """The test buffers the evaluation compiles: powers of two from SMALLEST_TEST_BUFFER below
  max_test, then max_test (Shakespeare's 152: 8, 16, 32, 64, 128, 152). A block of clients whose
  largest holds n test examples is tested in the smallest buffer >= n: under 2n rows (or 8) a
  client, as fedjax's padded batch-size buckets."""
  sizes, size = [], SMALLEST_TEST_BUFFER
  while size < max_test:
    sizes.append(size)
    size *= 2
  return (*sizes, max_test)


def one_at_a_time(f):
  """f over a block of one client, called on the client itself (jax.vmap's contract, no vmap)."""
  def call(*block):
    return jax.tree.map(lambda v: v[None], f(*jax.tree.map(lambda v: v[0], block)))
  return call


def over_block(size: int):
  return jax.vmap if size > 1 else one_at_a_time


def test_clients(model_of, test, env, ids, test_count, max_test: int, clients_per_batch: int,
                 forward_only: bool, mesh, dtypes):
  """Per-client results of `test(env, client_id, params, buffer)` (a tuple of scalars, of `dtypes`)
  for each client of `ids` with the model `model_of(env, client_id)`, in `ids` order. `env`: what
  every client reads (jax arrays); `test_count`: each client's test rows. forward_only: the model
  is built inside the test's block (the method's own, as it is); otherwise outside, once a block."""
  num = ids.shape[0]
  sizes = test_buffer_sizes(max_test)
  cap = max(1, min(clients_per_batch, num))
  per_block = [max(1, min(cap, TEST_ROWS_PER_BLOCK // b)) if forward_only else cap for b in sizes]
  order = jnp.argsort(-test_count[ids], stable=True)
  spread = not forward_only and cap == 1 and mesh is not None and sharding.num_shards(mesh) > 1
  # The sorted ids, then repeats of the smallest client filling the last block, or the last
  # device's share (dropped).
  slots = sharding.round_up(num, sharding.num_shards(mesh)) if spread else num + max(per_block)
  sorted_ids = ids[jnp.concatenate([order, jnp.full(slots - num, order[-1])])]
  if spread:
    results = _spread_over_devices(model_of, test, env, sorted_ids, test_count, sizes, mesh)
  else:
    results = _loop_over_blocks(model_of, test, env, sorted_ids, test_count[sorted_ids], sizes,
                                per_block, num, forward_only, dtypes)
  return tuple(jnp.zeros(num, dtype).at[order].set(r[:num].astype(dtype))
               for r, dtype in zip(results, dtypes))


def _loop_over_blocks(model_of, test, env, sorted_ids, sorted_count, sizes, per_block, num,
                      forward_only, dtypes):
  """The blocks one after the other (a while loop): a block's test data is gathered inside, never
  all clients' at once."""

  def test_block(buffer, k, block_ids):
    if forward_only:
      return over_block(k)(lambda i: test(env, i, model_of(env, i), buffer))(block_ids)
    models = over_block(k)(lambda i: model_of(env, i))(block_ids)
    return over_block(k)(lambda i, p: test(env, i, p, buffer))(block_ids, models)

  def branch(buffer, k):
    def run(start, results):
      out = test_block(buffer, k, jax.lax.dynamic_slice_in_dim(sorted_ids, start, k))
      return start + k, tuple(jax.lax.dynamic_update_slice_in_dim(r, o.astype(r.dtype), start, 0)
                              for r, o in zip(results, out))
    return run

  branches = [branch(b, k) for b, k in zip(sizes, per_block)]

  def next_block(carry):
    start, results = carry
    # The smallest buffer that holds the block's largest (first) test set.
    size_index = jnp.searchsorted(jnp.asarray(sizes), sorted_count[start])
    return jax.lax.switch(size_index, branches, start, results)

  empty = tuple(jnp.zeros(sorted_ids.shape[0], dtype) for dtype in dtypes)
  return jax.lax.while_loop(lambda carry: carry[0] < num, next_block,
                            (jnp.zeros((), jnp.int32), empty))[1]


def _spread_over_devices(model_of, test, env, sorted_ids, test_count, sizes, mesh):
  """Blocks of one client, the clients spread over the mesh's devices: slot s on device s mod n, so
  each device gets a like share of the clients sorted by test rows (sorted_ids: a multiple of n
  slots); each client in the smallest buffer that holds its test rows, as its block of one is."""

  def test_client(env_and_count, client_id):
    env, test_count = env_and_count  # read on each device, as the env (shard_map: not a closure)
    params = model_of(env, client_id)
    size_index = jnp.searchsorted(jnp.asarray(sizes), test_count[client_id])
    return jax.lax.switch(size_index, [lambda b=b: test(env, client_id, params, b) for b in sizes])

  return sharding.map_slots_on_each_device(test_client, (env, test_count), (sorted_ids,), mesh)
