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
                                             or the method's server step (server_optimizer.py)
    [adaptive clipping] C <- C exp(-eta (b~ - gamma)), b~ the noised fraction of clients with
                        ||Delta_i|| <= C (privacy/clip_rules.py); C is ServerState.clip_state

Sampling, clipping, noise and the divisor are the methods of one privatizer (privacy/mechanism.py:
NonPrivate or DPMechanism, the same object whose `dp_event` the accountant composes), with a client
half (`privatize_client`, lines 18-19) and a server half (`privatize_sum`, `denominator`,
`next_clip_state`); where the noise goes is the method's support object (privacy/noise.py). The
round asks neither which kind it holds. It is three functions:

    train_client   lines 3-19 for one sampled client -> ClientResult (named fields, no tuple order)
    train_chunk    a chunk of slots through the executor, summed into the ChunkCarry
    release        the server half, the server step (line 25), the new state and the metrics

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
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from dp2fedsam_jax.algorithms.specs import METHODS, MethodSpec
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax import executors, keys, trees
from dp2fedsam_jax.local import LocalConfig
from dp2fedsam_jax.privacy import sampling, sparsify
from dp2fedsam_jax.privacy.mechanism import Privatizer
from dp2fedsam_jax.privacy.noise import noise_support
from dp2fedsam_jax.privacy.noise_mechanisms import NoiseContext
from dp2fedsam_jax import server_optimizer
from dp2fedsam_jax.server_optimizer import ServerStep
from dp2fedsam_jax.state import ServerState

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
  mechanism: Privatizer  # sampling, clipping, noise, divisor: the privatizer that is accounted
  server_lr: float
  executor: executors.Executor = executors.Vmap()  # how the cohort runs: mapping, sizing, placement
  cohort_capacity: int | None = None  # clients per chunk (None: sampling.default_capacity)
  # The step on the released average (line 25): the method's own server step, else the run's
  # config.server_optimizer (server_optimizer.py).
  server_step: ServerStep = server_optimizer.SGDStep()

  @property
  def server_optimizer(self) -> ServerStep:
    """The server step under its former name (train.py's init_state reads it)."""
    return self.server_step

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
    return self.executor.slots(capacity)


def server_step_of(config) -> ServerStep:
  """The run's server step: the method's own (MethodSpec.server_step, with the config's values of
  its knobs), or config.server_optimizer's."""
  spec = METHODS.lookup(config.method).bind(config)
  return spec.server_step if spec.server_step is not None else server_optimizer.from_config(config)


def round_config_from(config, mechanism: Privatizer) -> RoundConfig:
  return RoundConfig(mechanism=mechanism, server_lr=config.server_lr,
                     executor=executors.from_config(config), cohort_capacity=config.cohort_capacity,
                     server_step=server_step_of(config))


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


def _masked_sum(tree, valid):
  """Sum over the leading (client) axis of the entries where valid is True."""
  def leaf_sum(x):
    keep = valid.reshape(valid.shape + (1,) * (x.ndim - 1))
    return jnp.sum(jnp.where(keep, x, 0), axis=0)
  return jax.tree.map(leaf_sum, tree)


def noise_diagnostics(clean_sum, released_sum, denominator) -> dict:
  """The round's NON-private diagnostics (they read the un-noised sum): `noise_std`, the root mean
  square over coordinates of the noise on the average (released - clipped sum) / m, and
  `signal_to_noise`, ||mean clipped update|| / ||noise on the average|| (inf without noise)."""
  noise = jax.tree.map(jnp.subtract, released_sum, clean_sum)
  noise_norm = trees.global_norm(noise)
  size = sum(x.size for x in jax.tree.leaves(noise))
  return {'noise_std': noise_norm / math.sqrt(max(size, 1)) / denominator,
          'signal_to_noise': trees.global_norm(clean_sum) / noise_norm}


class RoundEnv(NamedTuple):
  """What every client of a round reads. It is handed to each client explicitly, never through a
  closure: the sharded CPU executor gives it to every device as a replicated input."""
  state: ServerState
  data: Any         # the FederatedData
  streams: Any      # the round's keys.RoundKeys
  cohort: jax.Array  # |S|
  round_mask: Any   # a public rand-k mask, the same for every client (None if the method has none)


class ClientResult(NamedTuple):
  """One sampled client's part of the round (stacked over a chunk's slots by the executor)."""
  upload: Any            # clipped, plus its noise share where the noise is distributed
  clean: Any             # the upload before its noise share (the diagnostics; None if un-noised)
  personal: Any          # its new personal head (the old one if its training diverged)
  norm: jax.Array        # the global norm of its update before clipping
  train_loss: jax.Array  # 0 if its training diverged
  support: Any           # where the server's noise may go on its upload (None: everywhere)
  finite: jax.Array      # False if its local training diverged


class ChunkCarry(NamedTuple):
  """The loop over a round's chunks of sampled clients: what each chunk adds to."""
  index: jax.Array  # the chunk's number k (its clients are ranks k capacity .. (k + 1) capacity - 1)
  upload_sum: Any
  support: Any      # the union of the clients' noise supports (None: noise everywhere)
  personal: Any     # every client's personal head; the sampled ones' written back
  stats: dict       # the training statistics, summed


@dataclasses.dataclass(frozen=True)
class RoundParts:
  """The static pieces of a round step: the method, its model and local training, the privatizer of
  the run and where the method's noise goes (noise.py: EveryCoordinate | OnUploadMask)."""
  spec: MethodSpec
  model: Any
  local_config: LocalConfig
  privatizer: Privatizer
  support: Any
  update_hook: Callable | None = None


def train_client(parts: RoundParts, env: RoundEnv, personal, client_id) -> ClientResult:
  """Lines 3-19 for one sampled client: gather its data, train, clip and (distributed) noise."""
  spec, local_config = parts.spec, parts.local_config
  state, data, streams, cohort, round_mask = env
  privatizer = parts.privatizer.at_clip_state(state.clip_state)  # C_t, traced under adaptive clipping
  client_update = make_client_update(spec, parts.model, local_config, data.normalize,
                                     target_mask=data.loss_mask, clip_norm=privatizer.clip_norm)
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
  if parts.update_hook is not None:  # after the check: an audit canary uploads its vector even if
    delta = parts.update_hook(client_id, delta)  # its own training diverged
  new_personal = jax.tree.map(lambda new, old: jnp.where(finite, new, old), result.personal, personal)
  mask = spec.upload_mask.client_mask(delta, result.mask, round_mask)
  if mask is not None:
    delta = sparsify.apply_mask(delta, mask)
  support = parts.support.client_support(mask)
  # line 18: clip to C; line 19: [distributed] plus the client's share of the noise
  sent = privatizer.privatize_client(upload_key, delta, cohort, support)
  upload = spec.postprocess.client(sent.upload)  # e.g. top-k of its noised upload
  return ClientResult(upload, sent.clean, new_personal, sent.norm,
                      jnp.where(finite, result.train_loss, 0.0), support, finite)


def zero_stats(privatizer: Privatizer, zeros) -> dict:
  """The round's statistics before its first chunk, with the privatizer's own sums (None where it
  keeps none: the clean sum under central noise, the unclipped count for a fixed C)."""
  return {'norm_sum': jnp.zeros(()), 'clipped': jnp.zeros((), jnp.int32),
          'loss_sum': jnp.zeros(()), 'nonfinite': jnp.zeros((), jnp.int32),
          **privatizer.zero_sums(zeros)}


def train_chunk(parts: RoundParts, privatizer: Privatizer, map_clients: Callable, capacity: int,
                id_blocks, env: RoundEnv, carry: ChunkCarry) -> ChunkCarry:
  """Trains the chunk's sampled clients (padded to `capacity` slots) and adds them to the carry."""
  k, num_clients = carry.index, privatizer.num_clients
  ids = chunk_ids(id_blocks, k * capacity, capacity, num_clients)
  valid = k * capacity + jnp.arange(capacity) < env.cohort
  safe_ids = jnp.where(valid, ids, 0)
  take = lambda tree: jax.tree.map(lambda a: a[safe_ids], tree)
  clients = map_clients(functools.partial(train_client, parts), env, take(carry.personal), safe_ids)
  # Only sampled clients' heads are written; padded slots point past the end and are dropped.
  write_ids = jnp.where(valid, ids, num_clients)
  personal = jax.tree.map(lambda p, new: p.at[write_ids].set(new, mode='drop'),
                          carry.personal, clients.personal)
  counted = valid & clients.finite  # training statistics are over the clients that did not diverge
  stats = jax.tree.map(jnp.add, carry.stats, {
      'norm_sum': jnp.sum(jnp.where(counted, clients.norm, 0.0)),
      'clipped': jnp.sum(counted & privatizer.clipped(clients.norm), dtype=jnp.int32),
      'loss_sum': jnp.sum(jnp.where(counted, clients.train_loss, 0.0)),
      'nonfinite': jnp.sum(valid & ~clients.finite, dtype=jnp.int32),
      'clean_sum': _masked_sum(clients.clean, valid),
      # Adaptive clipping's bits b_i = 1[||Delta_i|| <= C] of the update as sent to clipping: a
      # diverged client's zero counts as unclipped, as under TFF's zeroing ahead of its adaptive DP
      # sum. Divergence then shrinks C and the noise; bit 0 instead ran away (docs/privacy.md s. 8).
      'unclipped': privatizer.count_unclipped(clients.norm, valid),
  })
  return ChunkCarry(k + 1, jax.tree.map(jnp.add, carry.upload_sum, _masked_sum(clients.upload, valid)),
                    parts.support.merge(carry.support, clients.support, valid), personal, stats)


def release(parts: RoundParts, rc: RoundConfig, privatizer: Privatizer, env: RoundEnv, key,
            sampled, done: ChunkCarry):
  """After the chunks: the privatizer's server half (noise on the sum, the public divisor, the next
  clip state) and the server step (line 25); -> (the new ServerState, the round's metrics)."""
  state, streams, cohort, stats = env.state, env.streams, env.cohort, done.stats
  clean_sum = done.upload_sum if stats['clean_sum'] is None else stats['clean_sum']
  # Central: the server adds all the noise. Distributed: the clients did (the server adds it only
  # if nobody was sampled, so the release is the mechanism the accountant assumed).
  released, noise_state = privatizer.privatize_sum(NoiseContext(streams.noise, state.round, key),
                                                   done.upload_sum, cohort, done.support,
                                                   state.noise_state)
  # Dividing by the *expected* cohort size keeps the sensitivity of the mean fixed (Poisson).
  denominator = privatizer.denominator(cohort)
  diagnostics = noise_diagnostics(clean_sum, released, denominator)
  released = parts.spec.postprocess.server(released)  # e.g. top-k of it
  shared, server_opt_state = rc.server_step.apply(                               # line 25
      state.shared, released, denominator, rc.server_lr, state.server_opt_state)
  clip_state = privatizer.next_clip_state(streams.count_noise, state.clip_state, stats['unclipped'],
                                          cohort)
  finite_clients = cohort - stats['nonfinite']
  n = jnp.maximum(finite_clients, 1).astype(jnp.float32)
  # Means over the clients that trained; none did (an empty cohort, or every client diverged): NaN,
  # never a 0 that reads as a perfect loss.
  mean = lambda total: jnp.where(finite_clients > 0, total / n, jnp.nan)
  metrics = {
      'cohort_size': cohort,
      'train_loss': mean(stats['loss_sum']),
      'mean_update_norm': mean(stats['norm_sum']),
      'clipped_fraction': mean(stats['clipped']),
      'nonfinite_clients': stats['nonfinite'],
      **diagnostics,
      **privatizer.round_metrics(),  # under adaptive clipping the C this round clipped to
      'finite': _all_finite(shared),  # the run stops only if the release itself is non-finite
  }
  new_state = ServerState(round=state.round + 1, shared=shared, personal=done.personal,
                          times_sampled=state.times_sampled + sampled.astype(jnp.int32),
                          noise_state=noise_state, server_opt_state=server_opt_state,
                          clip_state=clip_state)
  return new_state, metrics


def make_round_step(spec: MethodSpec, model, local_config: LocalConfig, rc: RoundConfig,
                    *, update_hook=None):
  """Builds one round of Algorithm 2 (sample, train the cohort, clip, noise, average, update).

  Args:
    spec: the method's pieces (which parameters are shared, local optimizers, post-processing).
    model: the SplitModel (feature extractor + personal head).
    local_config: the clients' local training (epochs, batch size, learning rates, SAM rho).
    rc: the privatizer and how the cohort is executed (the executor object, capacity).
    update_hook: `(client_id, delta) -> delta`, applied to a client's raw update before clipping;
      the privacy audit plants its canary with it, training never sets it.

  Returns:
    `round_step(state, data, key) -> (state, metrics)`, a pure function to jit: `state` a
    ServerState, `data` the FederatedData, `key` the run's root key (the round's streams are folded
    from it and `state.round`, see keys.py); `metrics` the round's scalars (train_loss,
    cohort_size, mean_update_norm, clipped_fraction, nonfinite_clients, finite, and the NON-private
    diagnostics noise_std and signal_to_noise of `noise_diagnostics`).
  """
  if rc.mechanism.private != spec.private:
    raise ValueError(f'method {spec.name!r} cannot run with a {type(rc.mechanism).__name__} '
                     'privatizer: build both from one config.')
  parts = RoundParts(spec, model, local_config, rc.mechanism,
                     noise_support(spec.noise_on_mask), update_hook)
  capacity = rc.capacity

  def round_step(state: ServerState, data, key):
    privatizer = rc.mechanism.at_clip_state(state.clip_state)
    streams = keys.round_keys(key, state.round)
    sampled = privatizer.sample(streams.sample, state.round, key)                # line 2
    cohort = jnp.sum(sampled, dtype=jnp.int32)
    # A public rand-k mask, the same for every client: drawn from its own stream, never from data.
    round_mask = spec.upload_mask.round_mask(streams.public_mask, state.shared)
    env = RoundEnv(state, data, streams, cohort, round_mask)
    # Sampled ids (ascending), a chunk at a time, padded with the out-of-range id N: no sort over N.
    chunk = functools.partial(train_chunk, parts, privatizer, rc.executor.map_clients, capacity,
                              sampled_id_blocks(sampled), env)
    zeros = jax.tree.map(jnp.zeros_like, state.shared)
    start = ChunkCarry(jnp.zeros((), jnp.int32), zeros, parts.support.round_support(round_mask, state.shared),
                       state.personal, zero_stats(privatizer, zeros))
    done = jax.lax.while_loop(lambda carry: carry.index * capacity < cohort, chunk, start)
    new_state, metrics = release(parts, rc, privatizer, env, key, sampled, done)
    return rc.executor.constrain((new_state, metrics))

  return round_step
