"""The noise mechanisms of `dp.noise_mechanism`, one small object each.

Each one is what a round's release needs beyond clipping: who is sampled, the noise the server adds
to the round's sum of clipped updates, what it carries to the next round, the public divisor of the
sum, and the dp_accounting event of T rounds. `DPMechanism` (mechanism.py) holds one of them next to
the clip norm, the noise multiplier and the placement, and delegates.

                     sampler                        noise w_t on round t's sum  state    accounted as
    Independent      Poisson q, or m of N           z_t ~ N(0, s^2 C^2)         ()       T sampled Gaussians
    BandMF           Poisson q b in group t mod b   row t of C^-1 Z             b-1 w's  ceil(T/b) Poisson(qb)
    TreeAggregation  block t of the epoch's shuffle P_s - P_{s-1} (tree nodes)  ()       a Gaussian per epoch

Independent is the identity case of the matrix mechanism (C = I, one band): the shape of
jax_privacy's Gaussian privatizer; the math of the correlated two is in correlated.py. A new way of
correlating noise is one more class here and one more entry in NOISE_MECHANISMS.

`check` holds every rule a mechanism sets for the other dp fields; config.validate_config and the
objects themselves both call it, so a rule is written once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import dp_accounting
import jax
import jax.numpy as jnp

from dp2fedsam_jax.errors import ConfigError
from dp2fedsam_jax.privacy import accounting, correlated, noise
from dp2fedsam_jax.privacy import sampling as sampling_lib


class NoiseContext(NamedTuple):
  """Where a round's server randomness comes from: the round's noise stream, the round's index and
  the run's root key (the tree folds its node keys from the root; BandMF and independent noise draw
  from `key`), and the stream of adaptive clipping's count noise."""
  key: jax.Array
  round_index: Any = 0
  root: jax.Array | None = None
  count_key: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Independent:
  """Fresh Gaussian noise every round (DP-FedAvg), Poisson or fixed-size cohorts.

  Attributes:
    num_clients: N.
    sampling_rate: q.
    sampling: 'poisson' (add/remove-one neighbours) | 'fixed' (m = round(q N), replace-one).
    poisson_draw: how a Poisson cohort is drawn, 'per_client' | 'gaps' (sampling.POISSON_DRAWS):
      the same distribution, so the same accounting.
  """
  num_clients: int
  sampling_rate: float
  sampling: str = 'poisson'
  poisson_draw: str = 'per_client'

  name = 'independent'
  correlated = False  # a noise mask (rand-k support) may restrict where its noise goes

  @property
  def neighbours(self) -> str:
    """The neighbouring relation epsilon holds under (docs/privacy.md sections 2 and 7)."""
    return 'add/remove one client' if self.sampling == 'poisson' else 'replace one client'

  def __post_init__(self):
    self.check(sampling=self.sampling)
    if self.poisson_draw not in sampling_lib.POISSON_DRAWS:
      raise ConfigError(f'config.dp.poisson_draw={self.poisson_draw!r}: unknown; choose one of '
                        f'{list(sampling_lib.POISSON_DRAWS)}.')

  @staticmethod
  def check(*, noise_placement='central', sampling='poisson', sampling_rate=None, num_bands=None,
            num_rounds=None) -> None:
    del noise_placement, sampling_rate, num_bands, num_rounds  # any placement; bands unused
    if sampling not in sampling_lib.SAMPLINGS:
      raise ConfigError(f'config.dp.sampling={sampling!r}: unknown; choose one of '
                        f'{list(sampling_lib.SAMPLINGS)}.')

  @property
  def cohort_shape(self) -> str:
    """'fixed' (exactly m) or 'poisson': how federated_round.py sizes a chunk of client slots."""
    return self.sampling

  def sample(self, key: jax.Array, round_index, root) -> jax.Array:
    del round_index, root  # every round alike
    return sampling_lib.sample_cohort(key, self.sampling, self.sampling_rate, self.num_clients,
                                      self.poisson_draw)

  def schedule(self, round_index, root) -> jax.Array:
    """bool[N]: who may be sampled in the round, a public fact (everyone; the draw is secret)."""
    del round_index, root
    return jnp.ones((self.num_clients,), bool)

  def init_state(self, shared):
    del shared
    return ()

  def draw(self, ctx: NoiseContext, like, stddev, state):
    """(w_t, state): N(0, stddev^2) on every coordinate of `like`."""
    return noise.gaussian_like(ctx.key, like, stddev), state

  def divisor(self) -> float:
    """The expected cohort size q N (Poisson) or m (fixed): public."""
    return sampling_lib.cohort_size(self.sampling, self.sampling_rate, self.num_clients)

  def dp_event(self, noise_multiplier: float, rounds: int):
    return accounting.dp_event(noise_multiplier, self.sampling_rate, rounds, sampling=self.sampling,
                               num_clients=self.num_clients)

  def epsilon(self, noise_multiplier, rounds, delta, accountant, event_of_sigma) -> float:
    del event_of_sigma  # accounting.py accounts the sampled Gaussian itself (replace-one for 'fixed')
    return accounting.compute_epsilon(noise_multiplier, self.sampling_rate, rounds, delta,
                                      sampling=self.sampling, accountant=accountant,
                                      num_clients=self.num_clients)

  def calibrate(self, target_epsilon, rounds, delta, accountant, event_of_sigma) -> float:
    del event_of_sigma
    return accounting.calibrate_noise_multiplier(
        target_epsilon, self.sampling_rate, rounds, delta, sampling=self.sampling,
        accountant=accountant, num_clients=self.num_clients)

  def record(self) -> dict:
    """What a run must reproduce on resume beyond its config (nothing: all from the config)."""
    return {}


class _Correlated:
  """What the correlated mechanisms share: central placement, Poisson in the config, accounting by
  their dp_event under add/remove (or zero-out) neighbours, no noise mask."""
  correlated = True

  @classmethod
  def check(cls, *, noise_placement='central', sampling='poisson', sampling_rate=None,
            num_bands=None, num_rounds=None) -> None:
    del sampling_rate, num_bands, num_rounds
    if noise_placement != 'central':
      raise ConfigError(
          f'config.dp.noise_placement={noise_placement!r}: dp.noise_mechanism={cls.name!r} '
          "correlates the server's noise across rounds; set --config.dp.noise_placement=central "
          '(client shares would need the same clients every round).')
    if sampling != 'poisson':
      raise ConfigError(
          f'config.dp.sampling={sampling!r}: dp.noise_mechanism={cls.name!r} brings its own sampler '
          '(banded: Poisson within a group; tree: a shuffle per epoch); leave '
          '--config.dp.sampling=poisson.')

  @property
  def sampling(self) -> str:
    """The config's dp.sampling these mechanisms take (their neighbours are add/remove or zero-out)."""
    return 'poisson'

  def epsilon(self, noise_multiplier, rounds, delta, accountant, event_of_sigma) -> float:
    return accounting.epsilon_of_event(event_of_sigma, noise_multiplier, rounds, delta, accountant)

  def calibrate(self, target_epsilon, rounds, delta, accountant, event_of_sigma) -> float:
    return accounting.calibrate_event(event_of_sigma, target_epsilon, rounds, delta, accountant)


@dataclasses.dataclass(frozen=True)
class BandMF(_Correlated):
  """BandMF (Choquette-Choo et al. 2023): w_t = row t of C^-1 Z for a b-banded Toeplitz C.

  Attributes:
    num_clients: N.
    sampling_rate: q; a client is in group (round mod b) once per b rounds, at rate q b.
    strategy: C's coefficients c_0..c_{b-1} (||c||_2 = 1; correlated.banded_strategy).
  """
  num_clients: int
  sampling_rate: float
  strategy: tuple[float, ...]

  name = 'banded'
  cohort_shape = 'poisson'
  neighbours = 'add/remove one client'

  def __post_init__(self):
    self.check(sampling_rate=self.sampling_rate, num_bands=self.bands)

  @classmethod
  def check(cls, *, noise_placement='central', sampling='poisson', sampling_rate=None,
            num_bands=None, num_rounds=None) -> None:
    super().check(noise_placement=noise_placement, sampling=sampling)
    if sampling_rate is not None and num_bands is not None and sampling_rate * num_bands > 1 + 1e-12:
      raise ConfigError(
          f'config.dp.num_bands={num_bands!r}: BandMF samples at rate sampling_rate * num_bands = '
          f'{sampling_rate * num_bands:g} within a group, which must be <= 1: set '
          f'--config.dp.num_bands <= {int(1 / sampling_rate)}.')
    if num_bands is not None and num_rounds is not None and num_bands > max(num_rounds, 1):
      raise ConfigError(f'config.dp.num_bands={num_bands!r}: more bands than num_rounds={num_rounds}; '
                        f'set --config.dp.num_bands <= {max(num_rounds, 1)}.')

  @classmethod
  def for_run(cls, num_clients: int, sampling_rate: float, num_rounds: int, bands: int) -> 'BandMF':
    """The strategy optimised for the prefix sums of `num_rounds` rounds (jax_privacy)."""
    return cls(num_clients, sampling_rate, correlated.banded_strategy(num_rounds, bands))

  @property
  def bands(self) -> int:
    return len(self.strategy)

  def sample(self, key: jax.Array, round_index, root) -> jax.Array:
    return correlated.sample_banded(key, round_index, root, self.sampling_rate, self.num_clients,
                                    self.bands)

  def schedule(self, round_index, root) -> jax.Array:
    """bool[N]: group (round mod b), public; who of it is sampled (rate q b) is secret."""
    return correlated.group_of_clients(root, self.num_clients, self.bands) == round_index % self.bands

  def init_state(self, shared):
    """The last b-1 draws w_{t-1}..w_{t-b+1}, zero before round 0."""
    return correlated.init_banded_buffer(self.strategy, shared)

  def draw(self, ctx: NoiseContext, like, stddev, state):
    z = noise.gaussian_like(ctx.key, like, stddev)  # the buffer in `state` is all the history
    return correlated.banded_noise(z, state, self.strategy)

  def divisor(self) -> float:
    """q N: q b |group| averages q N over the groups."""
    return sampling_lib.cohort_size('poisson', self.sampling_rate, self.num_clients)

  def dp_event(self, noise_multiplier: float, rounds: int):
    """ceil(T / b) Poisson(q b)-sampled Gaussians of multiplier sigma / ||c||_2: a client has one
    chance per b rounds and its columns do not overlap (as jax_privacy's DpsgdTrainingAccountant
    with cycle_length b)."""
    sigma = accounting._check_noise_multiplier(noise_multiplier)  # pylint: disable=protected-access
    one = dp_accounting.PoissonSampledDpEvent(
        self.sampling_rate * self.bands,
        dp_accounting.GaussianDpEvent(sigma / correlated.max_column_norm(self.strategy)))
    return dp_accounting.SelfComposedDpEvent(one, math.ceil(rounds / self.bands))

  def record(self) -> dict:
    """The coefficients, which jax_privacy's optimiser computes at every start: a resume must run the
    strategy the run started with (train.py compares them)."""
    return {'noise_mechanism': self.name, 'strategy': list(self.strategy)}


@dataclasses.dataclass(frozen=True)
class TreeAggregation(_Correlated):
  """DP-FTRL tree aggregation (Kairouz et al. 2021), restarted every epoch, each client once per epoch.

  Attributes:
    num_clients: N.
    sampling_rate: q; cohorts of m = round(q N) from a public shuffle per epoch of E = ceil(N / m).
  """
  num_clients: int
  sampling_rate: float

  name = 'tree'
  cohort_shape = 'fixed'
  # A client's uploads replaced by 0 in its (public) rounds: dp_accounting's REPLACE_SPECIAL.
  neighbours = 'zero-out one client'

  @property
  def epoch_length(self) -> int:
    return correlated.tree_epoch_length(self.sampling_rate, self.num_clients)

  def sample(self, key: jax.Array, round_index, root) -> jax.Array:
    del key  # the epoch's shuffle comes from the run's key: a public schedule
    return correlated.sample_tree(round_index, root, self.sampling_rate, self.num_clients)

  def schedule(self, round_index, root) -> jax.Array:
    """bool[N]: the round's block of the shuffle; the schedule is the sample (no secret draw)."""
    return correlated.sample_tree(round_index, root, self.sampling_rate, self.num_clients)

  def init_state(self, shared):
    del shared  # stateless: a node's noise comes from its own key
    return ()

  def draw(self, ctx: NoiseContext, like, stddev, state):
    return correlated.tree_noise(ctx.root, ctx.round_index, like, stddev, self.epoch_length), state

  def divisor(self) -> float:
    """m, the cohort of every full round."""
    return correlated.tree_cohort_size(self.sampling_rate, self.num_clients)

  def dp_event(self, noise_multiplier: float, rounds: int):
    """Per epoch (each complete one, and the rounds of the current one) a Gaussian of multiplier
    sigma / sqrt(L), L the nodes a round is in: dp_accounting's SingleEpochTreeAggregationDpEvent,
    in a form PLD also composes. Neighbours: zero-out (REPLACE_SPECIAL, docs/privacy.md section 7)."""
    sigma = accounting._check_noise_multiplier(noise_multiplier)  # pylint: disable=protected-access
    full, rest = divmod(rounds, self.epoch_length)
    per_epoch = lambda length: dp_accounting.GaussianDpEvent(
        sigma / math.sqrt(correlated.tree_sensitivity_squared(length)))
    events = [dp_accounting.SelfComposedDpEvent(per_epoch(self.epoch_length), full)] if full else []
    if rest:
      events.append(per_epoch(rest))
    return dp_accounting.ComposedDpEvent(events)

  def record(self) -> dict:
    return {}


# config.dp.noise_mechanism -> its class.
NOISE_MECHANISMS = {cls.name: cls for cls in (Independent, BandMF, TreeAggregation)}


def from_config(config, num_clients: int):
  """The noise mechanism `config.dp` names, for `num_clients` clients (checked with `check`)."""
  dp = config.dp
  check_config(config)
  if dp.noise_mechanism == 'banded':
    return BandMF.for_run(num_clients, config.sampling_rate, config.num_rounds, dp.num_bands)
  if dp.noise_mechanism == 'tree':
    return TreeAggregation(num_clients, config.sampling_rate)
  return Independent(num_clients, config.sampling_rate, dp.sampling, dp.poisson_draw)


def check_config(config) -> None:
  """The rules `config.dp.noise_mechanism` sets for the other fields, one line naming the field."""
  dp = config.dp
  if dp.noise_mechanism not in NOISE_MECHANISMS:
    raise ConfigError(f'config.dp.noise_mechanism={dp.noise_mechanism!r}: unknown; choose one of '
                      f'{list(NOISE_MECHANISMS)}.')
  NOISE_MECHANISMS[dp.noise_mechanism].check(
      noise_placement=dp.noise_placement, sampling=dp.sampling, sampling_rate=config.sampling_rate,
      num_bands=dp.num_bands, num_rounds=config.num_rounds)
