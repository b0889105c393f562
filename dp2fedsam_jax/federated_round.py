"""One federated round, from sampling to the new server state, as one pure function to jit.

The data flow (Algorithm 2 of dp2-fedsam.txt, docs/papers.md; WORKSPACE.md, "One round as data flow"):

    sample cohort S (mask over N)            line 2
    for each chunk of S (all of S in one chunk unless Poisson overflowed the capacity):
      gather data + personal heads           line 3 (each client's [budget] examples)
      client_update (head phase, SAM phase)  lines 5-17
      clip Delta_i to global L2 norm C       line 18
      [distributed] + N(0, s^2 C^2 / |S|)    line 19
      sum the clipped updates; write back the sampled clients' heads (lines 22-24 keep the rest)
    [central] + N(0, s^2 C^2) on the sum
    phi <- phi + server_lr * sum / m         line 25 (m = expected cohort size for Poisson);
                                             or another server optimizer (server_optimizer.py)
    [adaptive clipping] C <- C exp(-eta (b~ - gamma)), b~ the noised fraction of clients with
                        ||Delta_i|| <= C (privacy/clip_rules.py); C is ServerState.clip_state

Sampling, clipping, noise and the divisor are the methods of one `DPMechanism` (privacy/mechanism.py),
the same object whose `dp_event` the accountant composes.

Random streams: `keys.round_keys(root, round)` gives the round's named streams (sample, clients,
noise, public mask), each a distinct `fold_in` constant of the round key; a client's key (folded by
client id) gives its training, upload-noise and example-subset streams. No key is both split and
folded (keys.py).

A client whose local training diverged (a non-finite update, loss or head) uploads a zero update and
keeps its old head: the zero is a function of its own data with norm 0 <= C, so the guarantee holds;
the round counts such clients in `nonfinite_clients`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp

from dp2fedsam_jax.algorithms.specs import MethodParams, MethodSpec
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax import keys, sharding, trees
from dp2fedsam_jax.local import LocalConfig
from dp2fedsam_jax.privacy import sampling, sparsify
from dp2fedsam_jax.privacy.mechanism import DPMechanism
from dp2fedsam_jax.privacy.noise_mechanisms import NoiseContext
from dp2fedsam_jax.server_optimizer import ServerOptimizer
from dp2fedsam_jax.state import ServerState

EXECUTORS = ('auto', 'vmap', 'sequential', 'sharded')


def resolve_executor(executor: str, backend: str | None = None) -> str:
  """'auto' -> the executor that fits `backend` (default: JAX's default backend); others as given.

  CPU: 'sequential', a loop over the clients (with chunk_size, a loop over chunks of it). A CPU has
  no idle hardware for a client batch axis to fill, and vmapped per-client weights turn each GEMM
  into a batched one with a 5-10x larger working set: benchmarks/README.md measures sequential 1.37x
  faster than the whole-cohort vmap at cohort 50, and vmapped sub-chunks of 2 no faster than it.
  GPU/TPU: 'vmap', where one client's small GEMMs would leave most of the chip idle.
  """
  if executor not in EXECUTORS:
    raise ValueError(f'config.executor={executor!r}: unknown; choose one of {list(EXECUTORS)}.')
  if executor != 'auto':
    return executor
  backend = backend or jax.default_backend()
  return 'sequential' if backend == 'cpu' else 'vmap'


def program_bytes(compiled) -> int:
  """Device memory a compiled program needs at once: arguments, outputs and temporaries (XLA's
  memory analysis; a donated argument that becomes an output is counted once)."""
  m = compiled.memory_analysis()
  return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
             + m.temp_size_in_bytes)


def fitting_chunk_size(capacity: int, bytes_at_1: int, bytes_at_2: int, memory_bytes: int,
                       headroom: float = 0.8) -> int | None:
  """How many clients to vmap at once so that a round fits `headroom` of the device's memory.

  A round's memory is affine in the clients vmapped at once (the state and data, plus each client's
  activations and update): measured at chunk sizes 1 and 2, extrapolated to `capacity`. Returns None
  when the whole chunk of `capacity` clients fits, else the largest chunk size that does.
  """
  per_client = max(bytes_at_2 - bytes_at_1, 1)
  fixed = bytes_at_1 - per_client
  budget = headroom * memory_bytes
  if fixed + capacity * per_client <= budget:
    return None
  chunk = int((budget - fixed) // per_client)
  if chunk < 1:
    raise ValueError(
        f'one vmapped client needs ~{bytes_at_1 / 2**30:.2f} GiB with the state and data, more than '
        f'{headroom:.0%} of the device\'s {memory_bytes / 2**30:.2f} GiB: use a smaller '
        '--config.local.batch_size or model, or --config.executor=sequential.')
  return min(chunk, capacity)


@dataclasses.dataclass(frozen=True)
class RoundConfig:
  """Everything static a round needs, resolved from the experiment config."""
  mechanism: DPMechanism  # sampling, clipping, noise, divisor: the mechanism that is accounted
  server_lr: float
  executor: str = 'vmap'  # 'vmap' | 'sequential' | 'sharded' (slots over all devices) | 'auto'
  chunk_size: int | None = None     # clients vmapped at once (None: the whole chunk)
  cohort_capacity: int | None = None  # clients per chunk (None: sampling.default_capacity)
  server_optimizer: ServerOptimizer = ServerOptimizer()  # the step on the released average

  @property
  def num_clients(self) -> int:
    return self.mechanism.num_clients

  @property
  def capacity(self) -> int:
    m = self.mechanism
    if self.cohort_capacity is not None:
      capacity = min(self.cohort_capacity, m.num_clients)
    else:
      capacity = sampling.default_capacity(m.cohort_sampling, m.sampling_rate, m.num_clients)
    if self.chunk_size is not None:
      # A chunk's uploads ([slots, params]) are summed before the next chunk trains: slots beyond
      # chunk_size would only hold more of them in memory at once.
      capacity = min(capacity, self.chunk_size)
    if self.executor == 'sharded':  # the same number of slots on every device
      capacity = sharding.round_up(capacity, sharding.num_shards())
    return capacity


def round_config_from(config, mechanism: DPMechanism) -> RoundConfig:
  return RoundConfig(mechanism=mechanism, server_lr=config.server_lr,
                     executor=resolve_executor(config.executor),
                     chunk_size=config.chunk_size, cohort_capacity=config.cohort_capacity,
                     server_optimizer=ServerOptimizer.from_config(config))


def client_mapper(executor: str, chunk_size: int | None) -> Callable:
  """map_clients(f, env, *stacked_args): f(env, *one_slot_args) over the stacked slots, `env` (the
  round's values every client reads) shared by all: the one place where executors differ."""
  executor = resolve_executor(executor)
  if executor == 'vmap' and chunk_size is None:
    return lambda f, env, *xs: jax.vmap(functools.partial(f, env))(*xs)
  if executor == 'vmap':  # memory-bounded: a sequential loop over vmapped sub-chunks
    return lambda f, env, *xs: jax.lax.map(lambda a: f(env, *a), xs, batch_size=chunk_size)
  if executor == 'sequential':
    return lambda f, env, *xs: jax.lax.map(lambda a: f(env, *a), xs)
  # sharded: each device trains its slice of the slots (capacity <= chunk_size), the way one device
  # of its kind is fastest: a GPU/TPU vmaps it, a CPU device (one per core) loops over it
  mesh = sharding.client_mesh()
  if sharding.loops_over_clients(executor):
    return lambda f, env, *xs: sharding.map_slots_on_each_device(f, env, xs, mesh)
  return lambda f, env, *xs: jax.vmap(functools.partial(f, env))(*sharding.shard_clients(xs, mesh))


# Clients per block of the sampled-id search: a round reduces N booleans to N / _ID_BLOCK counts, then
# reads only the blocks that hold the chunk's ids (no sort and no cumulative sum over N).
_ID_BLOCK = 1024


def sampled_id_blocks(sampled: jax.Array):
  """(blocks bool[N / B, B], counts int32[N / B], rank of each block's first sampled client)."""
  blocks = jnp.pad(sampled, (0, -sampled.shape[0] % _ID_BLOCK)).reshape(-1, _ID_BLOCK)
  counts = jnp.sum(blocks, axis=1, dtype=jnp.int32)
  return blocks, counts, jnp.cumsum(counts) - counts


def chunk_ids(id_blocks, start, capacity: int, fill: int) -> jax.Array:
  """int32[capacity]: the sampled ids of ranks start .. start + capacity - 1, ascending, then `fill`
  (= jnp.nonzero(sampled, size=...)[0][start:start + capacity]); O(N / B + capacity B)."""
  blocks, counts, first = id_blocks
  end = start + capacity
  # A non-empty block that overlaps the ranks holds at least one of them: at most `capacity` blocks.
  hit = (counts > 0) & (first < end) & (first + counts > start)
  num_blocks = blocks.shape[0]
  which = jnp.nonzero(hit, size=min(capacity, num_blocks), fill_value=num_blocks)[0]
  rows = blocks.at[which].get(mode='fill', fill_value=False)
  rank = (first.at[which].get(mode='fill', fill_value=0)[:, None]
          + jnp.cumsum(rows, axis=1, dtype=jnp.int32) - 1)
  ids = which[:, None] * _ID_BLOCK + jnp.arange(_ID_BLOCK, dtype=jnp.int32)
  slot = jnp.where(rows & (rank >= start) & (rank < end), rank - start, capacity)
  return jnp.full((capacity,), fill, jnp.int32).at[slot].set(ids, mode='drop')


def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _masked_max(tree, valid):
  """Elementwise max over the leading (client) axis of the entries where valid is True (0 if none)."""
  def leaf_max(x):
    keep = valid.reshape(valid.shape + (1,) * (x.ndim - 1))
    return jnp.max(jnp.where(keep, x, 0), axis=0)
  return jax.tree.map(leaf_max, tree)


def _masked_sum(tree, valid):
  """Sum over the leading (client) axis of the entries where valid is True."""
  def leaf_sum(x):
    keep = valid.reshape(valid.shape + (1,) * (x.ndim - 1))
    return jnp.sum(jnp.where(keep, x, 0), axis=0)
  return jax.tree.map(leaf_sum, tree)


def unclipped_count(norms, valid, clip_norm) -> jax.Array:
  """Adaptive clipping's count of sampled clients with ||Delta_i|| <= C: over the chunk's valid
  slots only (a padded slot is nobody; counting it would move C as if the capacity were sampled)."""
  return jnp.sum(valid & (norms <= clip_norm), dtype=jnp.int32)


def noise_diagnostics(clipped_sum, released_sum, denominator) -> dict:
  """The round's NON-private diagnostics (they read the un-noised sum): `noise_std`, the root mean
  square over coordinates of the noise on the average (released - clipped sum) / m, and
  `signal_to_noise`, ||mean clipped update|| / ||noise on the average|| (inf without noise)."""
  noise = jax.tree.map(jnp.subtract, released_sum, clipped_sum)
  noise_norm = trees.global_norm(noise)
  size = sum(x.size for x in jax.tree.leaves(noise))
  return {'noise_std': noise_norm / math.sqrt(max(size, 1)) / denominator,
          'signal_to_noise': trees.global_norm(clipped_sum) / noise_norm}


def make_round_step(spec: MethodSpec, model, local_config: LocalConfig, rc: RoundConfig,
                    params: MethodParams = MethodParams(), *, update_hook=None):
  """Builds one round of Algorithm 2 (sample, train the cohort, clip, noise, average, update).

  Args:
    spec: the method's pieces (which parameters are shared, local optimizers, post-processing).
    model: the SplitModel (feature extractor + personal head).
    local_config: the clients' local training (epochs, batch size, learning rates, SAM rho).
    rc: the DP mechanism and how the cohort is executed (executor, chunk size, capacity).
    params: method-specific hyperparameters (regularizer lambda, keep fraction, ...).
    update_hook: `(client_id, delta) -> delta`, applied to a client's raw update before clipping;
      the privacy audit plants its canary with it, training never sets it.

  Returns:
    `round_step(state, data, key) -> (state, metrics)`, a pure function to jit: `state` a
    ServerState, `data` the FederatedData, `key` the run's root key (the round's streams are folded
    from it and `state.round`, see keys.py); `metrics` the round's scalars (train_loss,
    cohort_size, mean_update_norm, clipped_fraction, nonfinite_clients, finite, and the NON-private
    diagnostics noise_std and signal_to_noise of `noise_diagnostics`).
  """
  mech = rc.mechanism
  if mech.private != spec.private:
    raise ValueError(f'method {spec.name!r} is {"" if spec.private else "not "}private but its '
                     f'round mechanism is {"" if mech.private else "not "}: build both from one config.')
  capacity = rc.capacity
  map_clients = client_mapper(rc.executor, rc.chunk_size)

  def round_pieces(state: ServerState, data):
    """The round's mechanism (its C traced under adaptive clipping) and one client's training."""
    mech = rc.mechanism.at_clip_state(state.clip_state)
    client_update = make_client_update(spec, model, local_config, data.normalize, params,
                                       target_mask=data.loss_mask, clip_norm=mech.clip_norm)
    return mech, client_update

  def one_client(env, personal, client_id):
    # Everything a client reads comes in `env`, never from a closure: the sharded CPU executor
    # hands it to every device as an explicit, replicated input.
    state, data, streams, cohort, round_mask = env
    mech, client_update = round_pieces(state, data)
    budget = local_config.budget(data.max_train)  # examples per client slot (static)
    # Keys belong to client ids, not to slots, so chunking and executors cannot change a client's
    # run; its examples are gathered here, so a slot holds [budget] examples, never the data.
    client_key = keys.client_key(streams.clients, client_id)
    x, y, count = data.train_examples(client_id, budget, keys.examples_key(client_key),
                                       local_config.subset_draw)
    train_key, upload_key = keys.train_and_upload(client_key)
    result = client_update(state.shared, personal, x, y, count, train_key, state.round)
    # A diverged client is a failed client: it uploads zero and keeps its old head.
    finite = _all_finite((result.delta, result.personal, result.train_loss))
    delta = jax.tree.map(lambda d: jnp.where(finite, d, 0), result.delta)
    if update_hook is not None:  # after the check: an audit canary uploads its vector even if
      delta = update_hook(client_id, delta)  # its own training diverged
    new_personal = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                result.personal, personal)
    mask = spec.upload_mask.client_mask(delta, result.mask, round_mask, params.keep_fraction)
    if mask is not None:
      delta = sparsify.apply_mask(delta, mask)
    support = mask if spec.noise_on_mask else None
    upload, norm = mech.clip(delta)                                            # line 18
    clean = upload if mech.distributed else None  # for the diagnostics' un-noised sum
    upload = mech.privatize_upload(upload_key, upload, cohort, support)       # line 19 (distributed)
    upload = spec.postprocess.client(upload, params.keep_fraction)  # e.g. top-k of its noised upload
    return (upload, new_personal, norm, jnp.where(finite, result.train_loss, 0.0), support, finite,
            clean)

  def round_step(state: ServerState, data, key):
    mech, _ = round_pieces(state, data)
    streams = keys.round_keys(key, state.round)
    sampled = mech.sample(streams.sample, state.round, key)                      # line 2
    cohort = jnp.sum(sampled, dtype=jnp.int32)
    # Sampled ids (ascending), a chunk at a time, padded with the out-of-range id N: no sort over N.
    id_blocks = sampled_id_blocks(sampled)
    # A public rand-k mask, the same for every client: drawn from its own stream, never from data.
    round_mask = spec.upload_mask.round_mask(streams.public_mask, state.shared, params.keep_fraction)
    env = (state, data, streams, cohort, round_mask)

    def chunk(carry):
      k, upload_sum, support, personal, stats = carry
      ids = chunk_ids(id_blocks, k * capacity, capacity, mech.num_clients)
      valid = k * capacity + jnp.arange(capacity) < cohort
      safe_ids = jnp.where(valid, ids, 0)
      take = lambda tree: jax.tree.map(lambda a: a[safe_ids], tree)
      uploads, new_personal, norms, losses, masks, finite, clipped_uploads = map_clients(
          one_client, env, take(personal), safe_ids)
      upload_sum = jax.tree.map(jnp.add, upload_sum, _masked_sum(uploads, valid))
      if spec.noise_on_mask:  # coordinates any sampled client kept: where central noise goes
        support = jax.tree.map(jnp.maximum, support, _masked_max(masks, valid))
      # Only sampled clients' heads are written; padded slots point past the end and are dropped.
      write_ids = jnp.where(valid, ids, mech.num_clients)
      personal = jax.tree.map(lambda p, new: p.at[write_ids].set(new, mode='drop'),
                              personal, new_personal)
      clipped = (norms > mech.clip_norm) if mech.private else jnp.zeros_like(valid)
      counted = valid & finite  # training statistics are over the clients that did not diverge
      stats = jax.tree.map(jnp.add, stats, {
          'norm_sum': jnp.sum(jnp.where(counted, norms, 0.0)),
          'clipped': jnp.sum(counted & clipped, dtype=jnp.int32),
          'loss_sum': jnp.sum(jnp.where(counted, losses, 0.0)),
          'nonfinite': jnp.sum(valid & ~finite, dtype=jnp.int32),
          'clipped_sum': _masked_sum(clipped_uploads, valid),
          # Adaptive clipping's bits b_i = 1[||Delta_i|| <= C] of the update as sent to clipping:
          # a diverged client's zero counts as unclipped, as under TFF's zeroing ahead of its
          # adaptive DP sum. Divergence then shrinks C and the noise; bit 0 instead ran away
          # (docs/privacy.md section 8).
          'unclipped': unclipped_count(norms, valid, mech.clip_norm) if mech.adaptive else None,
      })
      return k + 1, upload_sum, support, personal, stats

    zeros = jax.tree.map(jnp.zeros_like, state.shared)
    stats0 = {'norm_sum': jnp.zeros(()), 'clipped': jnp.zeros((), jnp.int32),
              'loss_sum': jnp.zeros(()), 'nonfinite': jnp.zeros((), jnp.int32),
              'clipped_sum': zeros if mech.distributed else None,
              'unclipped': jnp.zeros((), jnp.int32) if mech.adaptive else None}
    support0 = None
    if spec.noise_on_mask:
      # A public mask is noised even when nobody was sampled: an exact zero would reveal an empty
      # cohort, which the accountant does not allow for.
      support0 = round_mask if round_mask is not None else jax.tree.map(
          lambda x: jnp.zeros(x.shape, jnp.float32), state.shared)
    _, upload_sum, support, personal, stats = jax.lax.while_loop(
        lambda carry: carry[0] * capacity < cohort, chunk,
        (jnp.zeros((), jnp.int32), zeros, support0, state.personal, stats0))

    clipped_sum = stats['clipped_sum'] if mech.distributed else upload_sum
    # Central: the server adds all the noise. Distributed: the clients did (the server adds it only
    # if nobody was sampled, so the release is the mechanism the accountant assumed).
    upload_sum, noise_state = mech.privatize_sum(NoiseContext(streams.noise, state.round, key),
                                                 upload_sum, cohort, support, state.noise_state)
    # Dividing by the *expected* cohort size keeps the sensitivity of the mean fixed (Poisson).
    denominator = mech.denominator(cohort)
    diagnostics = noise_diagnostics(clipped_sum, upload_sum, denominator)
    upload_sum = spec.postprocess.server(upload_sum, params.keep_fraction)  # e.g. top-k of the noised sum
    shared, server_opt_state = rc.server_optimizer.apply(                       # line 25
        state.shared, upload_sum, denominator, rc.server_lr, state.server_opt_state)
    clip_state = mech.next_clip_state(streams.count_noise, state.clip_state, stats['unclipped'],
                                      cohort)

    n = jnp.maximum(cohort - stats['nonfinite'], 1).astype(jnp.float32)
    metrics = {
        'cohort_size': cohort,
        'train_loss': stats['loss_sum'] / n,
        'mean_update_norm': stats['norm_sum'] / n,
        'clipped_fraction': stats['clipped'] / n,
        'nonfinite_clients': stats['nonfinite'],
        **diagnostics,
        **({'clip_norm': mech.clip_norm} if mech.adaptive else {}),  # the C this round clipped to
        'finite': _all_finite(shared),  # the run stops only if the release itself is non-finite
    }
    new_state = ServerState(round=state.round + 1, shared=shared, personal=personal,
                            times_sampled=state.times_sampled + sampled.astype(jnp.int32),
                            noise_state=noise_state, server_opt_state=server_opt_state,
                            clip_state=clip_state)
    if rc.executor == 'sharded':  # the server state and metrics stay whole on every device
      new_state, metrics = jax.lax.with_sharding_constraint(
          (new_state, metrics), sharding.replicated(sharding.client_mesh()))
    return new_state, metrics

  return round_step
