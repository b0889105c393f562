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

Sampling, clipping, noise and the divisor are one privatizer's (privacy/mechanism.py: NonPrivate or
DPMechanism, the same object whose `dp_event` the accountant composes). The round calls five of its
members and asks neither which kind it holds: `sample` (line 2), `clip_norm_at` (C_t, which the
clients' regularizers read), the client half `client` (lines 18-19, for one client) and
`statistics` (its clipped bits and own sums, on a chunk's norms), and the server half `server` (the
server's noise, the public divisor, the next privatizer state, its metrics). Where the noise goes
is the method's support object (privacy/noise.py). The round reads one bag per role: RoundConfig
(static), Hyperparameters (the searched scalars, traced in a search; None: the config's) and the
ServerState. It is three functions:

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
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from dp2fedsam_jax.algorithms import pieces
from dp2fedsam_jax.algorithms.specs import METHODS, MethodSpec
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax import executors, keys
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


class Hyperparameters(NamedTuple):
  """The round's searched scalars, one pytree: Python floats from the config in a run, traced where a
  search maps its trials (search_program.py), so one compile serves every trial."""
  lr_shared: Any    # the clients' shared-phase learning rate
  lr_personal: Any  # their head-phase learning rate
  sam_rho: Any      # SAM's radius
  server_lr: Any    # line 25's step
  clip_norm: Any    # C (C_0 under adaptive clipping)
  penalty_weight: Any = 0.0  # lam of the shared phase's penalty (BLUR, DSU's norm, PMTL; 0: none)


@dataclasses.dataclass(frozen=True)
class RoundConfig:
  """Everything static a round needs: the privatizer, the server step, how the cohort runs, and the
  method's pieces (make_round_step fills spec, model, local_config and update_hook)."""
  mechanism: Privatizer  # sampling, clipping, noise, divisor: the privatizer that is accounted
  server_lr: float
  executor: executors.Executor = executors.Vmap()  # how the cohort runs: mapping, sizing, placement
  cohort_capacity: int | None = None  # clients per chunk (None: sampling.default_capacity)
  # The step on the released average (line 25): the method's own server step, else the run's
  # config.server_optimizer (server_optimizer.py).
  server_step: ServerStep = server_optimizer.SGDStep()
  spec: MethodSpec | None = None      # the method's pieces (shared part, optimizers, masks)
  model: Any = None                   # the SplitModel
  local_config: LocalConfig | None = None  # the clients' local training
  # `(client_id, delta) -> delta` before clipping: the privacy audit's canary; training sets none.
  update_hook: Callable | None = None

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

  @property
  def support(self):
    """Where the method's noise goes (noise.py: EveryCoordinate | OnUploadMask)."""
    return noise_support(self.spec.noise_on_mask)

  @property
  def hyperparameters(self) -> Hyperparameters:
    """The searched scalars as this config holds them."""
    lc = self.local_config
    weighted = self.spec is not None and penalty_weight_field(self.spec) is not None
    weight = self.spec.regularizer.lam if weighted else 0.0
    return Hyperparameters(lc.lr_shared, lc.lr_personal, lc.sam_rho, self.server_lr,
                           self.mechanism.clip_norm, weight)

  def with_hyperparameters(self, hp: Hyperparameters) -> 'RoundConfig':
    """This config with `hp` in place of its scalars (the engine only does arithmetic on them)."""
    local_config = None if self.local_config is None else self.local_config.with_hyperparameters(hp)
    spec = self.spec
    if spec is not None and penalty_weight_field(spec) is not None:
      spec = dataclasses.replace(spec, regularizer=dataclasses.replace(spec.regularizer,
                                                                       lam=hp.penalty_weight))
    return dataclasses.replace(self, server_lr=hp.server_lr, local_config=local_config, spec=spec,
                               mechanism=dataclasses.replace(self.mechanism, clip_norm=hp.clip_norm))


def penalty_weight_field(spec: MethodSpec) -> str | None:
  """The config field of the penalty's weight lam (e.g. 'blur_lambda'), None where it has none."""
  return dict(pieces.knob_pairs(spec.regularizer)).get('lam')


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


def _zero_stats() -> dict:
  """The round's training statistics before its first chunk."""
  return {'norm_sum': jnp.zeros(()), 'clipped': jnp.zeros((), jnp.int32),
          'loss_sum': jnp.zeros(()), 'nonfinite': jnp.zeros((), jnp.int32)}


class RoundEnv(NamedTuple):
  """What every client of a round reads. It is handed to each client explicitly, never through a
  closure: the sharded CPU executor gives it to every device as a replicated input."""
  state: ServerState
  data: Any          # the FederatedData
  streams: Any       # the round's keys.RoundKeys
  cohort: jax.Array  # |S|
  round_mask: Any    # a public rand-k mask, the same for every client (None if the method has none)
  hyperparameters: Hyperparameters | None = None  # traced scalars (None: the config's own)


class ClientResult(NamedTuple):
  """One sampled client's part of the round (stacked over a chunk's slots by the executor). The
  fields keep the order the mapped function's outputs had before the privatizer's halves: XLA's
  fusion, and with it the order of the cohort's float sums, follows it (the exact golden)."""
  upload: Any            # clipped, plus its noise share where the noise is distributed
  privatizer_sums: dict  # its part of the privatizer's sums (ClientUpload.sums)
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
  privatizer_sums: dict  # the privatizer's own sums (its client half's `sums`), for its server half


def at_hyperparameters(rc: RoundConfig, hyperparameters: Hyperparameters | None) -> RoundConfig:
  """The round's config at its traced scalars (None: the config's own, so a run compiles as ever)."""
  return rc if hyperparameters is None else rc.with_hyperparameters(hyperparameters)


def train_client(rc: RoundConfig, env: RoundEnv, personal, client_id) -> ClientResult:
  """Lines 3-19 for one sampled client: gather its data, train, clip and (distributed) noise."""
  rc = at_hyperparameters(rc, env.hyperparameters)
  spec, local_config, privatizer = rc.spec, rc.local_config, rc.mechanism
  state, data, streams, cohort, round_mask, _ = env
  privatizer_state = state.privatizer_state
  client_update = make_client_update(spec, rc.model, local_config, data.normalize,
                                     target_mask=data.loss_mask,
                                     clip_norm=privatizer.clip_norm_at(privatizer_state))
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
  if rc.update_hook is not None:  # after the check: an audit canary uploads its vector even if
    delta = rc.update_hook(client_id, delta)  # its own training diverged
  new_personal = jax.tree.map(lambda new, old: jnp.where(finite, new, old), result.personal, personal)
  mask = spec.upload_mask.client_mask(delta, result.mask, round_mask)
  if mask is not None:
    delta = sparsify.apply_mask(delta, mask)
  support = rc.support.client_support(mask)
  # line 18: clip to C_t; line 19: [distributed] plus the client's share of the noise
  sent = privatizer.client(privatizer_state, upload_key, delta, cohort, support)
  upload = spec.postprocess.client(sent.upload)  # e.g. top-k of its noised upload
  return ClientResult(upload, sent.sums, new_personal, sent.norm,
                      jnp.where(finite, result.train_loss, 0.0), support, finite)


def zero_privatizer_sums(privatizer: Privatizer, env: RoundEnv, zeros) -> dict:
  """The privatizer's sums before the first chunk: zeros shaped as its client half reports them."""
  state = env.state.privatizer_state
  # Only shapes are traced, but with a key of its own: no round stream is used twice, even here.
  sums = jax.eval_shape(lambda: {
      **privatizer.client(state, jax.random.key(0), zeros, env.cohort).sums,
      **privatizer.statistics(state, jnp.zeros((1,)), jnp.ones((1,), bool)).sums})
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums)


def train_chunk(rc: RoundConfig, num_clients: int, capacity: int, id_blocks, env: RoundEnv,
                carry: ChunkCarry) -> ChunkCarry:
  """Trains the chunk's sampled clients (padded to `capacity` slots) and adds them to the carry."""
  k, privatizer = carry.index, at_hyperparameters(rc, env.hyperparameters).mechanism
  ids = chunk_ids(id_blocks, k * capacity, capacity, num_clients)
  valid = k * capacity + jnp.arange(capacity) < env.cohort
  safe_ids = jnp.where(valid, ids, 0)
  take = lambda tree: jax.tree.map(lambda a: a[safe_ids], tree)
  clients = rc.executor.map_clients(functools.partial(train_client, rc), env, take(carry.personal),
                                    safe_ids)
  # Only sampled clients' heads are written; padded slots point past the end and are dropped.
  write_ids = jnp.where(valid, ids, num_clients)
  personal = jax.tree.map(lambda p, new: p.at[write_ids].set(new, mode='drop'),
                          carry.personal, clients.personal)
  counted = valid & clients.finite  # training statistics are over the clients that did not diverge
  of_norms = privatizer.statistics(env.state.privatizer_state, clients.norm, valid)
  stats = jax.tree.map(jnp.add, carry.stats, {
      'norm_sum': jnp.sum(jnp.where(counted, clients.norm, 0.0)),
      'clipped': jnp.sum(counted & of_norms.clipped, dtype=jnp.int32),
      'loss_sum': jnp.sum(jnp.where(counted, clients.train_loss, 0.0)),
      'nonfinite': jnp.sum(valid & ~clients.finite, dtype=jnp.int32),
  })
  # The privatizer's sums are over every valid slot. Adaptive clipping's bits b_i = 1[||Delta_i||
  # <= C] are of the update as sent to clipping: a diverged client's zero counts as unclipped, as
  # under TFF's zeroing ahead of its adaptive DP sum. Divergence then shrinks C and the noise; bit 0
  # instead ran away (docs/privacy.md s. 8).
  privatizer_sums = jax.tree.map(jnp.add, carry.privatizer_sums,
                                 {**_masked_sum(clients.privatizer_sums, valid), **of_norms.sums})
  return ChunkCarry(k + 1, jax.tree.map(jnp.add, carry.upload_sum, _masked_sum(clients.upload, valid)),
                    rc.support.merge(carry.support, clients.support, valid), personal, stats,
                    privatizer_sums)


def release(rc: RoundConfig, env: RoundEnv, key, sampled, done: ChunkCarry):
  """After the chunks: the privatizer's server half (noise on the sum, the public divisor, the next
  privatizer state) and the server step (line 25); -> (the new ServerState, the round's metrics)."""
  state, streams, cohort, stats = env.state, env.streams, env.cohort, done.stats
  # [central] + N(0, s^2 C_t^2) on the sum; the public divisor; [adaptive] C_{t+1}
  ctx = NoiseContext(streams.noise, state.round, key, streams.count_noise)
  out = rc.mechanism.server(state.privatizer_state, ctx, done.upload_sum, done.privatizer_sums, cohort,
                            done.support)
  released = rc.spec.postprocess.server(out.released)  # e.g. top-k of it
  shared, server_opt_state = rc.server_step.apply(                               # line 25
      state.shared, released, out.denominator, rc.server_lr, state.server_opt_state)
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
      **out.metrics,  # the noise diagnostics; under adaptive clipping the C this round clipped to
      'finite': _all_finite(shared),  # the run stops only if the release itself is non-finite
  }
  new_state = ServerState(round=state.round + 1, shared=shared, personal=done.personal,
                          times_sampled=state.times_sampled + sampled.astype(jnp.int32),
                          noise_state=out.state.noise_state, server_opt_state=server_opt_state,
                          clip_state=out.state.clip_state)
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
    `round_step(state, data, key, hyperparameters=None) -> (state, metrics)`, a pure function to
    jit: `state` a ServerState, `data` the FederatedData, `key` the run's root key (the round's
    streams are folded from it and `state.round`, see keys.py), `hyperparameters` the searched
    scalars as a traced Hyperparameters (None: the config's); `metrics` the round's scalars
    (train_loss, cohort_size, mean_update_norm, clipped_fraction, nonfinite_clients, finite, and
    the NON-private diagnostics noise_std and signal_to_noise of mechanism.noise_diagnostics).
  """
  if rc.mechanism.private != spec.private:
    raise ValueError(f'method {spec.name!r} cannot run with a {type(rc.mechanism).__name__} '
                     'privatizer: build both from one config.')
  rc = dataclasses.replace(rc, spec=spec, model=model, local_config=local_config,
                           update_hook=update_hook)
  capacity = rc.capacity

  def round_step(state: ServerState, data, key, hyperparameters: Hyperparameters | None = None):
    config = at_hyperparameters(rc, hyperparameters)
    streams = keys.round_keys(key, state.round)
    sampled = config.mechanism.sample(streams.sample, state.round, key)         # line 2
    cohort = jnp.sum(sampled, dtype=jnp.int32)
    # A public rand-k mask, the same for every client: drawn from its own stream, never from data.
    round_mask = spec.upload_mask.round_mask(streams.public_mask, state.shared)
    env = RoundEnv(state, data, streams, cohort, round_mask, hyperparameters)
    # Sampled ids (ascending), a chunk at a time, padded with the out-of-range id N: no sort over N.
    chunk = functools.partial(train_chunk, rc, sampled.shape[0], capacity, sampled_id_blocks(sampled),
                              env)
    zeros = jax.tree.map(jnp.zeros_like, state.shared)
    start = ChunkCarry(jnp.zeros((), jnp.int32), zeros,
                       config.support.round_support(round_mask, state.shared), state.personal,
                       _zero_stats(), zero_privatizer_sums(config.mechanism, env, zeros))
    done = jax.lax.while_loop(lambda carry: carry.index * capacity < cohort, chunk, start)
    new_state, metrics = release(config, env, key, sampled, done)
    return rc.executor.constrain((new_state, metrics))

  return round_step
