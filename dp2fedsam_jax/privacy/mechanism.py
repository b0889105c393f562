"""The privatizer of a run, in the shape of jax_privacy's noise_addition: each variant its own object,
and the round step calls the same methods on whichever it holds, reading no feature flag. What the
round executes is what the accountant composes: one object, built by `DPMechanism.from_config`.

    NonPrivate    the non-private methods: no clipping, no noise, the actual cohort as the divisor,
                  epsilon = inf
    DPMechanism   the client-level Gaussian mechanism, a composition of small objects:
      placement   noise.py: CentralNoise (the server adds std sigma C to the sum) | DistributedNoise
                  (|S| client shares N(0, s^2 C^2 / |S|)), from config.dp.noise_placement
      noise       noise_mechanisms.py: the sampler, the noise state the server carries, the noise
                  draw, the public divisor and the dp_event of T rounds -- Independent, BandMF or
                  TreeAggregation (the correlated ones)
      clip rule   clip_rules.py: FixedClip (C every round) | AdaptiveClip (Andrew et al.: C_t in
                  ServerState.clip_state, moved by the noised count of unclipped clients)

Noise on a mask is the round's `support` object (noise.py: EveryCoordinate | OnUploadMask), passed
to both halves. The privatizer's state is one pytree, PrivatizerState(noise_state, clip_state),
which ServerState carries; `init(shared) -> PrivatizerState` starts it (Experiment.init_state).
The five members the round step calls, on either kind (and no others):

    sample        sample(key, round, root) -> bool[N]: who takes part (line 2)
    clip_norm_at  clip_norm_at(state) -> C_t, which the clients' regularizers read
    client half   client(state, key, delta, |S|, support) -> ClientUpload(upload, norm, sums): clip
                  (line 18) and, where the noise is distributed, the client's share (line 19)
                  statistics(state, norms, valid) -> ClientStatistics(clipped, sums): a chunk's
                  clipped bits, and adaptive clipping's count of its unclipped clients
    server half   server(state, ctx, sum, sums, |S|, support) -> Release(released, denominator,
                  state, metrics): the server's noise, the public divisor, the next state
                  (C_{t+1} under adaptive clipping), the noise diagnostics and C_t

`sums` are the privatizer's own entries, which the round adds with a tree add over the cohort and
hands to the server half: the clean uploads where the clients add noise, the unclipped count where
C moves; none for what a privatizer lacks. The halves follow jax_privacy's GradientPrivatizer
(noise_addition: `init(params) -> noise_state`, `privatize(sum_of_clipped_grads, noise_state) ->
(noised sum, noise_state)`), widened by what a federated round adds: the clients' side, the cohort,
the support, the clip state and the divisor.

Beside them sits the accountant's facade (dp_event, neighboring_relation, epsilon, calibrate,
record), which the round never calls. Adaptive clipping's part of the accounting is
`effective_noise_multiplier`: the sum at sigma and the count at s_b are one Gaussian of multiplier
(sigma^-2 + (2 s_b)^-2)^(-1/2).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from absl import logging

from dp2fedsam_jax import trees
from dp2fedsam_jax.errors import ConfigError
from dp2fedsam_jax.privacy import clip_rules, clipping, noise_mechanisms
from dp2fedsam_jax.privacy.clip_rules import AdaptiveClip, FixedClip
from dp2fedsam_jax.privacy.noise import NOISE_PLACEMENTS, PLACEMENTS
from dp2fedsam_jax.privacy.noise_mechanisms import BandMF, Independent, NoiseContext, TreeAggregation

NoiseMechanism = Independent | BandMF | TreeAggregation
ClipRule = FixedClip | AdaptiveClip


class PrivatizerState(NamedTuple):
  """What the server carries for the privatizer between rounds (ServerState's two fields)."""
  noise_state: Any = ()  # the noise mechanism's (BandMF's buffer of b-1 draws); () where none
  clip_state: Any = ()   # the clip rule's (C_t under adaptive clipping); () for a fixed C


class ClientUpload(NamedTuple):
  """The client half's result for one client."""
  upload: Any      # what it sends: clipped, plus its noise share where the noise is distributed
  norm: jax.Array  # the update's global norm before clipping
  sums: dict       # its part of the privatizer's sums: 'clean', the upload before its noise share
                   # where the clients add noise (the diagnostics); else nothing


class ClientStatistics(NamedTuple):
  """What the client half reads off the pre-clip norms of a chunk's clients."""
  clipped: jax.Array  # bool[chunk]: whether clipping moved each update
  sums: dict          # the chunk's part of the privatizer's sums, over its valid slots: 'unclipped',
                      # the count of norms <= C_t, where C moves; else nothing


class Release(NamedTuple):
  """The server half's result: what the server step reads, and what the server carries on."""
  released: Any            # the sum of the uploads with the server's noise
  denominator: jax.Array   # the public divisor of the released sum
  state: PrivatizerState   # the next round's
  metrics: dict            # the noise diagnostics; C_t under adaptive clipping


def noise_diagnostics(clean_sum, released_sum, denominator) -> dict:
  """The round's NON-private diagnostics (they read the un-noised sum): `noise_std`, the root mean
  square over coordinates of the noise on the average (released - clipped sum) / m, and
  `signal_to_noise`, ||mean clipped update|| / ||noise on the average|| (inf without noise)."""
  noise = jax.tree.map(jnp.subtract, released_sum, clean_sum)
  noise_norm = trees.global_norm(noise)
  size = sum(x.size for x in jax.tree.leaves(noise))
  return {'noise_std': noise_norm / math.sqrt(max(size, 1)) / denominator,
          'signal_to_noise': trees.global_norm(clean_sum) / noise_norm}


@dataclasses.dataclass(frozen=True)
class Privatizer:
  """What every privatizer holds (static as from_config builds it: hashable, jit-friendly).

  Attributes:
    noise: the noise mechanism (noise_mechanisms.py), which also holds the sampler's N and q.
    clip_norm: C, the bound on each client's whole shared update (global L2 norm); under adaptive
      clipping C_0, and inside a round step (at_clip_state) the round's C_t, a traced scalar.
    noise_multiplier: sigma; the noise on the sum of clipped updates has std sigma C.
    noise_placement: 'central' (the server adds it) | 'distributed' (each sampled client adds a
      share of std sigma C / sqrt(|S|)); correlated noise is central only.
    delta: the delta epsilon is reported at (config.dp.delta, or 1/N).
    accountant: 'pld' | 'rdp' (config.dp.accountant).
    clipping: the clip rule (clip_rules.py): FixedClip, or AdaptiveClip with its count's noise.
  """
  noise: NoiseMechanism
  clip_norm: float         # C
  noise_multiplier: float  # sigma: noise std on the sum / C
  noise_placement: str = 'central'  # 'central' | 'distributed'
  delta: float | None = None
  accountant: str = 'pld'
  clipping: ClipRule = FixedClip()

  def __post_init__(self):
    if self.noise_placement not in NOISE_PLACEMENTS:
      raise ConfigError(f'config.dp.noise_placement={self.noise_placement!r}: unknown; choose one '
                        f'of {list(NOISE_PLACEMENTS)}.')
    self.noise.check(noise_placement=self.noise_placement, sampling=self.noise.sampling)
    self.clipping.check(noise_mechanism=self.noise.name, noise_placement=self.noise_placement)

  @classmethod
  def from_config(cls, config, num_clients: int, method=None) -> 'Privatizer':
    """The run's privatizer: NonPrivate for a non-private `method`, else the DPMechanism with
    sigma = config.dp.noise_multiplier, or calibrated for config.dp.target_epsilon after num_rounds
    rounds; delta = config.dp.delta or 1/N.

    `method` (an algorithms.MethodSpec) decides which, and checks that it can run the configured
    placement and noise mechanism. When both sigma and a target are set, sigma wins (a command-line
    `--config.dp.noise_multiplier=1.0` on top of a config file that targets an epsilon). Adaptive
    clipping (dp.clipping): C_0 = dp.initial_clip_norm or dp.clip_norm, and a target epsilon
    calibrates the pair's combined multiplier, from which the update's sigma is derived.
    """
    dp = config.dp
    private = True if method is None else method.private
    if method is not None:
      method.check_noise_placement(dp.noise_placement)
      method.check_noise_mechanism(dp.noise_mechanism)
    delta = dp.delta if dp.delta is not None else 1.0 / num_clients
    common = dict(clip_norm=dp.clip_norm, noise_placement=dp.noise_placement, delta=delta,
                  accountant=dp.accountant)
    if not private:
      return NonPrivate(Independent(num_clients, config.sampling_rate, dp.sampling, dp.poisson_draw),
                        noise_multiplier=0.0, **common)
    sigma, target = dp.noise_multiplier, dp.target_epsilon
    if sigma is None and target is None:
      raise ConfigError(
          'config.dp.noise_multiplier=None, config.dp.target_epsilon=None: set one of them (a fixed '
          'sigma, or a target epsilon that sigma is calibrated for).')
    if sigma is not None and target is not None:
      logging.warning('dp.noise_multiplier=%s is set, so dp.target_epsilon=%s is ignored.', sigma,
                      target)
    noise_mechanism = noise_mechanisms.from_config(config, num_clients)
    common.update(clip_norm=clip_rules.initial_clip_norm(config),
                  clipping=clip_rules.from_config(config, noise_mechanism.divisor()))
    mechanism = DPMechanism(noise_mechanism, noise_multiplier=float(sigma or 0.0), **common)
    if sigma is None:
      mechanism = mechanism.with_noise(mechanism.calibrate(target, config.num_rounds))
    return mechanism

  # The sampler's numbers live in the noise mechanism; these read them.
  @property
  def num_clients(self) -> int:
    return self.noise.num_clients

  @property
  def sampling_rate(self) -> float:
    return self.noise.sampling_rate

  @property
  def sampling(self) -> str:
    """config.dp.sampling: 'poisson' (add/remove; the correlated ones too) | 'fixed' (replace-one)."""
    return self.noise.sampling

  @property
  def noise_mechanism(self) -> str:
    """config.dp.noise_mechanism: 'independent' | 'banded' | 'tree'."""
    return self.noise.name

  @property
  def cohort_sampling(self) -> str:
    """The sampler's shape for sizing chunks: 'fixed' (exactly m: fixed, tree) or 'poisson'."""
    return self.noise.cohort_shape

  @property
  def distributed(self) -> bool:
    return self.noise_placement == 'distributed'

  def with_noise(self, noise_multiplier: float) -> 'Privatizer':
    return dataclasses.replace(self, noise_multiplier=float(noise_multiplier))

  def with_num_clients(self, num_clients: int) -> 'Privatizer':
    """The same privatizer over `num_clients` clients (the audit adds its canaries); the class stays."""
    return dataclasses.replace(self, noise=dataclasses.replace(self.noise, num_clients=num_clients))

  # ------------------------------------------------------- what the round step calls, and no more
  def init(self, shared) -> PrivatizerState:
    """What the server carries for this privatizer between rounds: BandMF's noise buffer, C_0 under
    adaptive clipping; () where none."""
    return PrivatizerState(self.init_noise_state(shared), self.init_clip_state())

  def sample(self, key: jax.Array, round_index=0, root: jax.Array | None = None) -> jax.Array:
    """bool[num_clients]: the cohort of round `round_index` (`root`: the run's key, whose public
    schedule the correlated mechanisms' samplers follow)."""
    return self.noise.sample(key, round_index, root)

  def clip_norm_at(self, state: PrivatizerState):
    """The round's C_t (traced under adaptive clipping), which the clients' regularizers read."""
    return self.at_clip_state(state.clip_state).clip_norm

  def client(self, state: PrivatizerState, key: jax.Array, delta, cohort: jax.Array,
             support=None) -> ClientUpload:
    """The client half, for one client: its update clipped to C_t and, where the noise is
    distributed, with its share (on `support` where one is given)."""
    at = self.at_clip_state(state.clip_state)
    upload, norm = at.clip(delta)                                      # line 18
    noised = at.privatize_upload(key, upload, cohort, support)         # line 19 (distributed)
    return ClientUpload(noised, norm, at.placement.client_sums(upload))

  def statistics(self, state: PrivatizerState, norms: jax.Array, valid: jax.Array) -> ClientStatistics:
    """The client half's statistics of a chunk's pre-clip `norms`, `valid` its sampled slots (taken
    on the chunk, outside the mapped clients: XLA's fusion follows the mapped function's outputs)."""
    at = self.at_clip_state(state.clip_state)
    return ClientStatistics(at.clipped(norms), at.clipping.client_sums(norms, valid, at.clip_norm))

  def server(self, state: PrivatizerState, ctx: NoiseContext, total, sums: dict, cohort: jax.Array,
             support=None) -> Release:
    """The server half: (the sum of the uploads and of their `sums`, |S|, the noise support, the
    state, the round's randomness) -> the released sum with its public divisor, the next state and
    the metrics. Central: the server adds all the noise. Distributed: the clients did (the server
    adds it only if nobody was sampled, so the release is the mechanism the accountant assumed)."""
    at = self.at_clip_state(state.clip_state)
    released, noise_state = at.privatize_sum(ctx, total, cohort, support, state.noise_state)
    # Dividing by the *expected* cohort size keeps the sensitivity of the mean fixed (Poisson).
    denominator = at.denominator(cohort)
    diagnostics = noise_diagnostics(sums.get('clean', total), released, denominator)
    clip_state = at.next_clip_state(ctx.count_key, state.clip_state, sums.get('unclipped'), cohort)
    return Release(released, denominator, PrivatizerState(noise_state, clip_state),
                   {**diagnostics, **at.round_metrics()})

  # ------------------------------------------------------------------------------------------------
  def schedule(self, round_index, root: jax.Array) -> jax.Array:
    """bool[num_clients]: who may be sampled in round `round_index`, a public fact (BandMF: the
    round's group; the tree: its block; independent: everyone). The audit's scores may use it."""
    return self.noise.schedule(round_index, root)


@dataclasses.dataclass(frozen=True)
class NonPrivate(Privatizer):
  """The privatizer of the non-private methods: the sum as it is, over the actual cohort.

  It keeps the config's numbers (C, placement, delta) for the run's records; it clips nothing and
  adds nothing, so no client's update is bounded and its epsilon is inf."""
  private = False
  correlated = False
  adaptive = False
  noise_std = 0.0
  effective_noise_multiplier = 0.0

  @property
  def placement(self):
    """CentralNoise's client side: no share on the upload, so no clean sum to keep."""
    return PLACEMENTS['central']

  def init_noise_state(self, shared):
    del shared
    return ()

  def init_clip_state(self):
    return ()

  def at_clip_state(self, clip_state) -> 'NonPrivate':
    del clip_state
    return self

  def clip(self, delta):
    """(the update as it is, its global norm)."""
    return delta, trees.global_norm(delta)

  def privatize_upload(self, key: jax.Array, upload, cohort: jax.Array, support=None):
    del key, cohort, support
    return upload

  def clipped(self, norms: jax.Array) -> jax.Array:
    return jnp.zeros_like(norms, dtype=bool)

  def privatize_sum(self, ctx: NoiseContext, total, cohort: jax.Array, support=None, noise_state=()):
    del ctx, cohort, support
    return total, noise_state

  def denominator(self, cohort: jax.Array) -> jax.Array:
    """The actual cohort size (at least 1): the plain mean of the uploads."""
    return jnp.maximum(cohort, 1).astype(jnp.float32)

  def next_clip_state(self, key: jax.Array, clip_state, unclipped, cohort: jax.Array):
    del key, unclipped, cohort
    return clip_state

  def round_metrics(self) -> dict:
    return {}

  def dp_event(self, rounds: int) -> None:
    del rounds

  def epsilon(self, rounds: int, delta: float | None = None, accountant: str | None = None) -> float:
    del rounds, delta, accountant
    return math.inf

  def calibrate(self, target_epsilon: float, rounds: int, delta: float | None = None,
                accountant: str | None = None) -> float:
    raise ValueError(f'a non-private run adds no noise: no sigma gives epsilon {target_epsilon}.')

  def record(self) -> dict:
    return {}


@dataclasses.dataclass(frozen=True)
class DPMechanism(Privatizer):
  """The client-level Gaussian mechanism: sampling, clipping, noise and accounting of a private run
  (inside a round step `at_clip_state` gives a copy whose clip_norm is the traced C_t).

  The round step executes exactly this object and the accountant composes its `dp_event`, so the
  accounted mechanism cannot drift from the executed one. Built once per run by `from_config`.
  """
  private = True

  @property
  def placement(self):
    """Where the noise is added (noise.py): CentralNoise | DistributedNoise."""
    return PLACEMENTS[self.noise_placement]

  @property
  def correlated(self) -> bool:
    """Noise correlated across rounds (noise_mechanism 'banded' or 'tree')."""
    return self.noise.correlated

  @property
  def noise_std(self) -> float:
    """Std of the Gaussian noise on the sum of clipped updates: sigma C."""
    return self.noise_multiplier * self.clip_norm

  @property
  def adaptive(self) -> bool:
    """A clip norm that moves between rounds (dp.clipping='adaptive')."""
    return self.clipping.adaptive

  @property
  def effective_noise_multiplier(self) -> float:
    """The multiplier of the one Gaussian a round releases: sigma, or with adaptive clipping the
    pair's (sigma^-2 + (2 s_b)^-2)^(-1/2) (clip_rules.py). What the accountant composes."""
    return self.clipping.effective_noise_multiplier(self.noise_multiplier)

  # ---------------------------------------------------------------------------------------- init
  def init_noise_state(self, shared):
    """The noise state a run starts with (BandMF: a buffer of b-1 zero draws; () otherwise)."""
    return self.noise.init_state(shared)

  def init_clip_state(self):
    """What the server carries for the clip rule: C_0 under adaptive clipping, () otherwise."""
    return self.clipping.init_state(self.clip_norm)

  def at_clip_state(self, clip_state) -> 'DPMechanism':
    """This mechanism at the round's clip norm (inside a round step; C itself for a fixed rule)."""
    return dataclasses.replace(self, clip_norm=self.clipping.clip_norm(clip_state, self.clip_norm))

  # --------------------------------------------------------------------------------- client half
  def clip(self, delta):
    """(upload, pre-clip global norm): the update clipped to global norm C."""
    return clipping.clip_by_global_norm(delta, self.clip_norm)

  def client_noise_std(self, cohort: jax.Array) -> jax.Array:
    """A client's share: the |S| shares add up to N(0, (sigma C)^2) on the sum (distributed)."""
    return self.placement.client_noise_std(self.noise_std, cohort)

  def privatize_upload(self, key: jax.Array, upload, cohort: jax.Array, support=None):
    """A client's clipped upload plus its noise share (distributed placement; else unchanged)."""
    return self.placement.add_client_share(key, upload, self.client_noise_std(cohort), support)

  def clipped(self, norms: jax.Array) -> jax.Array:
    """bool[...]: which of these pre-clip norms were clipped."""
    return norms > self.clip_norm

  # --------------------------------------------------------------------------------- server half
  def server_noise_std(self, cohort: jax.Array) -> jax.Array:
    """What the server adds: all of it (central), or all of it only if nobody was sampled."""
    return self.placement.server_noise_std(self.noise_std, cohort)

  def privatize_sum(self, ctx: NoiseContext, total, cohort: jax.Array, support=None,
                    noise_state=()):
    """(the sum of the clipped uploads plus the server's noise, the new noise state). `support`:
    a 0/1 mask where noise goes (a public rand-k mask; the union of private masks for the leaky
    methods; never with correlated noise). The noise mechanism draws w_t of std sigma C from
    `ctx` (the round's noise stream; the run's root key, for the tree's node keys)."""
    if support is not None and self.noise.correlated:
      raise ValueError('correlated noise goes on every coordinate; a noise support is refused.')
    w, noise_state = self.noise.draw(ctx, total, self.server_noise_std(cohort), noise_state)
    if support is not None:
      w = jax.tree.map(lambda z, m: z * m.astype(z.dtype), w, support)
    return jax.tree.map(jnp.add, total, w), noise_state

  def denominator(self, cohort: jax.Array) -> jax.Array:
    """What the noised sum is divided by: the *expected* cohort size, a public constant, so the
    mean's sensitivity does not depend on who was sampled."""
    del cohort
    return jnp.asarray(self.noise.divisor(), jnp.float32)

  def next_clip_state(self, key: jax.Array, clip_state, unclipped, cohort: jax.Array):
    """C_{t+1} from the noised count of the `unclipped` of the `cohort` sampled clients, over the
    update's public divisor (adaptive clipping; the state unchanged for a fixed C)."""
    return self.clipping.next_state(key, clip_state, unclipped, cohort, self.denominator(cohort))

  def round_metrics(self) -> dict:
    return self.clipping.round_metrics(self.clip_norm)

  # ------------------------------------------------------------------------ the accountant's facade
  @property
  def neighboring_relation(self):
    """dp_accounting's relation of the sampler that runs: replace-one for fixed-size sampling,
    add-or-remove-one for Poisson (what the tuner and the report compose a run's event under)."""
    import dp_accounting  # pylint: disable=import-outside-toplevel
    return (dp_accounting.NeighboringRelation.REPLACE_ONE if self.sampling == 'fixed'
            else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)

  def dp_event(self, rounds: int):
    """The dp_accounting event of `rounds` rounds of this mechanism."""
    return self.noise.dp_event(self.effective_noise_multiplier, rounds)

  def epsilon(self, rounds: int, delta: float | None = None, accountant: str | None = None) -> float:
    """Client-level epsilon at `delta` (default: the run's) after `rounds` rounds."""
    return self.noise.epsilon(self.effective_noise_multiplier, rounds, self._delta(delta),
                              accountant or self.accountant, self._event_of_effective(rounds))

  def calibrate(self, target_epsilon: float, rounds: int, delta: float | None = None,
                accountant: str | None = None) -> float:
    """The smallest sigma (to ~1e-3 relative) whose epsilon after `rounds` rounds is <= target:
    under adaptive clipping the update's sigma that leaves the calibrated combined multiplier."""
    effective = self.noise.calibrate(target_epsilon, rounds, self._delta(delta),
                                     accountant or self.accountant, self._event_of_effective(rounds))
    return self.clipping.update_noise_multiplier(effective)

  def _event_of_effective(self, rounds: int):
    """sigma_eff -> the event of `rounds` rounds at that combined multiplier. The noise mechanisms
    search over sigma_eff itself, so the clip rule's conversion must not be applied again here
    (with_noise(s).dp_event would turn s into the pair's multiplier a second time)."""
    return lambda effective: self.noise.dp_event(effective, rounds)

  def _delta(self, delta: float | None) -> float:
    delta = self.delta if delta is None else delta
    if delta is None:
      raise ValueError('DPMechanism: no delta given and none set (DPMechanism.from_config sets it).')
    return delta

  def record(self) -> dict:
    """What a resumed run must find unchanged beyond its config (BandMF's coefficients)."""
    return self.noise.record()
