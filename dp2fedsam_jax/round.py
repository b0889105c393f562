"""One federated round, from sampling to the new server state, as one pure function to jit.

The data flow (Algorithm 2 of dp2-fedsam.txt; DESIGN §3):

    sample cohort S (mask over N)            line 2
    for each chunk of S (all of S in one chunk unless Poisson overflowed the capacity):
      gather data + personal heads           line 3
      client_update (head phase, SAM phase)  lines 5-17
      clip Delta_i to global L2 norm C       line 18
      [distributed] + N(0, s^2 C^2 / |S|)    line 19
      sum the clipped updates; write back the sampled clients' heads (lines 22-24 keep the rest)
    [central] + N(0, s^2 C^2) on the sum
    phi <- phi + server_lr * sum / m         line 25 (m = expected cohort size for Poisson)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp

from dp2fedsam_jax.algorithms.specs import MethodParams, MethodSpec
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax.local import LocalConfig
from dp2fedsam_jax import sharding
from dp2fedsam_jax.privacy import clipping, noise, sampling, sparsify
from dp2fedsam_jax.state import ServerState

EXECUTORS = ('vmap', 'sequential', 'sharded')


@dataclasses.dataclass(frozen=True)
class RoundConfig:
  """Everything static a round needs, resolved from the experiment config."""
  num_clients: int
  sampling: str          # 'poisson' | 'fixed'
  sampling_rate: float
  clip_norm: float
  noise_multiplier: float  # noise std on the sum / clip_norm; 0 for non-private methods
  noise_placement: str   # 'central' | 'distributed'
  server_lr: float
  executor: str = 'vmap'  # 'vmap' | 'sequential' | 'sharded' (slots split over all devices)
  chunk_size: int | None = None     # clients vmapped at once (None: the whole chunk)
  cohort_capacity: int | None = None  # clients per chunk (None: sampling.default_capacity)

  @property
  def capacity(self) -> int:
    if self.cohort_capacity is not None:
      capacity = min(self.cohort_capacity, self.num_clients)
    else:
      capacity = sampling.default_capacity(self.sampling, self.sampling_rate, self.num_clients)
    if self.chunk_size is not None:
      # A chunk's uploads ([slots, params]) are summed before the next chunk trains: slots beyond
      # chunk_size would only hold more of them in memory at once.
      capacity = min(capacity, self.chunk_size)
    if self.executor == 'sharded':  # the same number of slots on every device
      capacity = sharding.round_up(capacity, sharding.num_shards())
    return capacity


def round_config_from(config, num_clients: int, noise_multiplier: float) -> RoundConfig:
  return RoundConfig(
      num_clients=num_clients, sampling=config.dp.sampling, sampling_rate=config.sampling_rate,
      clip_norm=config.dp.clip_norm, noise_multiplier=noise_multiplier,
      noise_placement=config.dp.noise_placement, server_lr=config.server_lr,
      executor=config.executor, chunk_size=config.chunk_size,
      cohort_capacity=config.cohort_capacity)


def client_mapper(executor: str, chunk_size: int | None) -> Callable:
  """map_clients(f, *stacked_args): the one place where executors differ; f is the same client fn."""
  if executor == 'vmap' and chunk_size is None:
    return lambda f, *xs: jax.vmap(f)(*xs)
  if executor == 'vmap':  # memory-bounded: a sequential loop over vmapped sub-chunks
    return lambda f, *xs: jax.lax.map(lambda a: f(*a), xs, batch_size=chunk_size)
  if executor == 'sequential':
    return lambda f, *xs: jax.lax.map(lambda a: f(*a), xs)
  if executor == 'sharded':  # each device vmaps its slice of the slots (capacity <= chunk_size)
    mesh = sharding.client_mesh()
    return lambda f, *xs: jax.vmap(f)(*sharding.shard_clients(xs, mesh))
  raise ValueError(f'config.executor={executor!r}: unknown; choose one of {list(EXECUTORS)}.')


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


def upload_mask(spec: MethodSpec, delta, client_mask, round_mask, sparsity: float):
  """The mask a client multiplies its update with before clipping (None: no mask)."""
  if spec.upload_mask == 'randk':
    return round_mask                                 # public: from the round key only
  if spec.upload_mask == 'topk':
    return sparsify.topk_mask(delta, sparsity)        # private: from the client's own update
  if spec.upload_mask == 'dsu':
    return client_mask                                # private: DSU's M^tau
  return None


def make_round_step(spec: MethodSpec, model, local_config: LocalConfig, rc: RoundConfig,
                    params: MethodParams = MethodParams(), *, update_hook=None):
  """Returns round_step(state, data, key) -> (state, metrics). `key` is the run's root key.

  `update_hook(client_id, delta) -> delta`, if given, replaces a client's raw update before clipping:
  the privacy audit uses it to plant a canary; training never sets it.
  """
  params = dataclasses.replace(params, clip_norm=rc.clip_norm)  # one C for clipping and regularizers
  private = spec.private
  noise_std = rc.noise_multiplier * rc.clip_norm if private else 0.0
  capacity = rc.capacity
  num_chunks_max = math.ceil(rc.num_clients / capacity)
  map_clients = client_mapper(rc.executor, rc.chunk_size)
  distributed = rc.noise_placement == 'distributed'

  def round_step(state: ServerState, data, key):
    client_update = make_client_update(spec, model, local_config, data.normalize, params)
    round_key = jax.random.fold_in(key, state.round)
    sample_key, clients_key, noise_key = jax.random.split(round_key, 3)
    sampled = sampling.sample_cohort(sample_key, rc.sampling, rc.sampling_rate, rc.num_clients)
    cohort = jnp.sum(sampled, dtype=jnp.int32)
    # Keys belong to client ids, not to slots, so chunking and executors cannot change a client's run.
    client_keys = jax.random.split(clients_key, rc.num_clients)
    # Sampled ids first (ascending), then the rest; padded with the out-of-range id N.
    order = jnp.argsort(~sampled, stable=True)
    order = jnp.pad(order, (0, num_chunks_max * capacity - rc.num_clients),
                    constant_values=rc.num_clients)
    # Distributed noise: each client adds its share, so the sum carries N(0, noise_std^2) in total.
    client_noise_std = noise_std / jnp.sqrt(jnp.maximum(cohort, 1).astype(jnp.float32))
    # A public rand-k mask, the same for every client: drawn from the round key, never from data.
    round_mask = (sparsify.randk_mask(jax.random.fold_in(noise_key, 1), state.shared, params.sparsity)
                  if spec.upload_mask == 'randk' else None)

    def one_client(x, y, count, personal, client_key, client_id):
      train_key, upload_key = jax.random.split(client_key)
      result = client_update(state.shared, personal, x, y, count, train_key, state.round)
      delta = result.delta
      if update_hook is not None:
        delta = update_hook(client_id, delta)
      mask = upload_mask(spec, delta, result.mask, round_mask, params.sparsity)
      if mask is not None:
        delta = sparsify.apply_mask(delta, mask)
      if private:
        upload, norm = clipping.clip_by_global_norm(delta, rc.clip_norm)
      else:
        upload, norm = delta, clipping.global_norm(delta)
      if private and distributed:
        upload = noise.add_gaussian_noise(upload_key, upload, client_noise_std,
                                          mask if spec.noise_on_mask else None)
        if spec.postprocess == 'topk':  # the paper's client-side top-k of its own noised upload
          upload = sparsify.apply_mask(upload, sparsify.topk_mask(upload, params.sparsity))
      support = mask if spec.noise_on_mask else None
      return upload, result.personal, norm, result.train_loss, support

    def chunk(carry):
      k, upload_sum, support, personal, stats = carry
      ids = jax.lax.dynamic_slice(order, (k * capacity,), (capacity,))
      valid = k * capacity + jnp.arange(capacity) < cohort
      safe_ids = jnp.where(valid, ids, 0)
      take = lambda tree: jax.tree.map(lambda a: a[safe_ids], tree)
      uploads, new_personal, norms, losses, masks = map_clients(
          one_client, data.train_x[safe_ids], data.train_y[safe_ids], data.train_count[safe_ids],
          take(personal), client_keys[safe_ids], safe_ids)
      upload_sum = jax.tree.map(jnp.add, upload_sum, _masked_sum(uploads, valid))
      if spec.noise_on_mask:  # coordinates any sampled client kept: where central noise goes
        support = jax.tree.map(jnp.maximum, support, _masked_max(masks, valid))
      # Only sampled clients' heads are written; padded slots point past the end and are dropped.
      write_ids = jnp.where(valid, ids, rc.num_clients)
      personal = jax.tree.map(lambda p, new: p.at[write_ids].set(new, mode='drop'),
                              personal, new_personal)
      clipped = (norms > rc.clip_norm) if private else jnp.zeros_like(valid)
      stats = jax.tree.map(jnp.add, stats, {
          'norm_sum': jnp.sum(jnp.where(valid, norms, 0.0)),
          'clipped': jnp.sum(valid & clipped, dtype=jnp.int32),
          'loss_sum': jnp.sum(jnp.where(valid, losses, 0.0)),
      })
      return k + 1, upload_sum, support, personal, stats

    stats0 = {'norm_sum': jnp.zeros(()), 'clipped': jnp.zeros((), jnp.int32),
              'loss_sum': jnp.zeros(())}
    zeros = jax.tree.map(jnp.zeros_like, state.shared)
    support0 = None
    if spec.noise_on_mask:
      # A public mask is noised even when nobody was sampled: an exact zero would reveal an empty
      # cohort, which the accountant does not allow for.
      support0 = round_mask if round_mask is not None else jax.tree.map(
          lambda x: jnp.zeros(x.shape, jnp.float32), state.shared)
    _, upload_sum, support, personal, stats = jax.lax.while_loop(
        lambda carry: carry[0] * capacity < cohort, chunk,
        (jnp.zeros((), jnp.int32), zeros, support0, state.personal, stats0))

    if private:
      # Central: the server adds all the noise. Distributed: the clients did; if nobody was sampled
      # the server adds it so the release is the same mechanism the accountant assumed.
      server_std = noise_std if not distributed else jnp.where(cohort == 0, noise_std, 0.0)
      upload_sum = noise.add_gaussian_noise(noise_key, upload_sum, server_std, support)
      if spec.postprocess == 'topk' and not distributed:  # post-processing of the noised sum
        upload_sum = sparsify.apply_mask(upload_sum, sparsify.topk_mask(upload_sum, params.sparsity))
      # Dividing by the *expected* cohort size keeps the sensitivity of the mean fixed (Poisson).
      denominator = sampling.cohort_size(rc.sampling, rc.sampling_rate, rc.num_clients)
    else:
      denominator = jnp.maximum(cohort, 1).astype(jnp.float32)
    shared = jax.tree.map(lambda p, s: p + rc.server_lr * s / denominator, state.shared, upload_sum)

    n = jnp.maximum(cohort, 1).astype(jnp.float32)
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(shared)]))
    metrics = {
        'cohort_size': cohort,
        'train_loss': stats['loss_sum'] / n,
        'mean_update_norm': stats['norm_sum'] / n,
        'clipped_fraction': stats['clipped'] / n,
        'finite': finite & jnp.isfinite(stats['loss_sum']),
    }
    new_state = ServerState(round=state.round + 1, shared=shared, personal=personal)
    if rc.executor == 'sharded':  # the server state and metrics stay whole on every device
      new_state, metrics = jax.lax.with_sharding_constraint(
          (new_state, metrics), sharding.replicated(sharding.client_mesh()))
    return new_state, metrics

  return round_step
