"""Client-level DP accounting for federated rounds (a thin layer over `dp_accounting`).

Mechanism per round: sample a cohort, clip each sampled client's update to L2 norm C, sum, add
N(0, (noise_multiplier * C)^2 I) to the sum. The unit of privacy is one client.

* sampling='poisson': each client joins with probability q; add/remove-one neighbours; PLD (default)
  or RDP accountant.
* sampling='fixed': exactly m = max(1, round(q * N)) clients without replacement; replace-one
  neighbours; RDP only (dp_accounting's PLD accountant has no sampled-without-replacement event).

Why 'fixed' hands the library noise_multiplier / 2: dp_accounting never rescales a Gaussian multiplier
by the neighbouring relation. `RdpAccountant._maybe_compose` (rdp/rdp_privacy_accountant.py) passes
the raw multiplier of a `SampledWithoutReplacementDpEvent`'s Gaussian to
`_compute_rdp_sample_wor_gaussian`, which documents it as "std of the noise / l2-sensitivity" and
uses alpha / (2 s^2) as the base mechanism's RDP; WBK19 Thm 27, which it implements, takes that RDP
between *replace-one* neighbours. (The PLD Gaussian under REPLACE_ONE likewise shifts by
sensitivity=1: pld/privacy_loss_distribution.py `from_gaussian_mechanism`.) So the library's
multiplier is std / (replace-one sensitivity). Swapping one client moves our sum by up to 2C, hence
(noise_multiplier * C) / (2C) = noise_multiplier / 2.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, Optional

import dp_accounting
from dp_accounting import pld as _pld
from dp_accounting.pld import privacy_loss_distribution as _pld_lib
from dp_accounting import rdp as _rdp

from dp2fedsam_jax.privacy import sampling

ACCOUNTANTS = ('pld', 'rdp')  # config.dp.accountant; the samplers are sampling.SAMPLINGS

# The library default: ~0.9 s for q=0.05, 200 rounds, sigma=1 on 2 CPU cores, and it agrees with
# 1e-3 to ~1e-5 relative, so nothing is gained by coarsening compute_epsilon.
PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-4
# Grid for the PLD calibration search only (~10x cheaper); the result is re-checked on the fine grid.
_PLD_COARSE_INTERVAL = 1e-3
_CALIBRATION_RTOL = 1e-3  # Relative precision of a calibrated noise multiplier.
_MAX_BRACKET_STEPS = 40

_ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
_REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE


# ---------------------------------------------------------------------------------------------------
# Validation: every message names the config field and says what fixes it.
# ---------------------------------------------------------------------------------------------------
def _as_float(x) -> float:
  try:
    return float(x)
  except (TypeError, ValueError):
    return math.nan


def _is_int(x) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_noise_multiplier(noise_multiplier) -> float:
  s = _as_float(noise_multiplier)
  if not 0.0 <= s < math.inf:
    raise ValueError(f'dp.noise_multiplier={noise_multiplier!r}: the noise multiplier must be a '
                     'finite number >= 0 (0 means no privacy); set dp.noise_multiplier accordingly.')
  return s


def _check_sampling_rate(sampling_rate) -> float:
  q = _as_float(sampling_rate)
  if not 0.0 < q <= 1.0:
    raise ValueError(f'sampling_rate={sampling_rate!r}: the client sampling rate q must lie in '
                     '(0, 1]; set sampling_rate to the cohort fraction.')
  return q


def _check_num_rounds(num_rounds) -> int:
  if not _is_int(num_rounds) or num_rounds < 0:
    raise ValueError(f'num_rounds={num_rounds!r}: the number of rounds must be an integer >= 0; '
                     'set num_rounds accordingly.')
  return int(num_rounds)


def _check_delta(delta) -> float:
  d = _as_float(delta)
  if not 0.0 < d < 1.0:
    raise ValueError(f'dp.delta={delta!r}: delta must lie in (0, 1) (typically < 1/num_clients); '
                     'set dp.delta accordingly.')
  return d


def _check_target_epsilon(target_epsilon) -> float:
  e = _as_float(target_epsilon)
  if not 0.0 < e < math.inf:
    raise ValueError(f'dp.target_epsilon={target_epsilon!r}: the target epsilon must be a finite '
                     'number > 0; set dp.target_epsilon accordingly.')
  return e


def _check_sampling(value) -> str:
  if value not in sampling.SAMPLINGS:
    raise ValueError(f'dp.sampling={value!r}: must be one of {sampling.SAMPLINGS}.')
  return value


def _check_accountant(accountant, sampling: str) -> str:
  if accountant not in ACCOUNTANTS:
    raise ValueError(f'dp.accountant={accountant!r}: must be one of {ACCOUNTANTS}.')
  if sampling == 'fixed' and accountant == 'pld':
    raise ValueError("dp.accountant='pld': fixed-size sampling (dp.sampling='fixed') is accounted "
                     "with RDP under replace-one neighbours; set dp.accountant='rdp' (or use "
                     "dp.sampling='poisson' with PLD).")
  return accountant


def _check_num_clients(num_clients, sampling: str) -> Optional[int]:
  if num_clients is None:
    if sampling == 'fixed':
      raise ValueError("num_clients=None: dp.sampling='fixed' needs the total number of clients "
                       '(cohort size = round(sampling_rate * num_clients)); pass num_clients.')
    return None  # Poisson sampling does not need it.
  if not _is_int(num_clients) or num_clients < 1:
    raise ValueError(f'num_clients={num_clients!r}: must be a positive integer (the total number '
                     'of clients).')
  return int(num_clients)


def _fixed_cohort_size(q: float, n: int) -> int:
  # The sampler's own rule, so the accounted m is the sampled m.
  return int(sampling.cohort_size('fixed', q, n))


def _validate(sampling_rate, num_rounds, delta, sampling, accountant, num_clients):
  q = _check_sampling_rate(sampling_rate)
  t = _check_num_rounds(num_rounds)
  d = _check_delta(delta)
  sampling = _check_sampling(sampling)
  accountant = _check_accountant(accountant, sampling)
  n = _check_num_clients(num_clients, sampling)
  return q, t, d, sampling, accountant, n


# ---------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------
def dp_event(noise_multiplier, sampling_rate, num_rounds, *, sampling='poisson',
             num_clients=None) -> dp_accounting.DpEvent:
  """The DpEvent of `num_rounds` rounds of the client-sampled Gaussian sum.

  Args:
    noise_multiplier: sigma, the noise std on the sum of clipped updates divided by C.
    sampling_rate: q, each client's probability (Poisson) or the cohort fraction (fixed).
    num_rounds: T.
    sampling: 'poisson' (add/remove neighbours) or 'fixed' (cohort of round(qN) without
      replacement; replace-one neighbours, so the event's Gaussian carries sigma / 2: sensitivity 2C).
    num_clients: N, required for sampling='fixed'.

  Returns:
    The SelfComposedDpEvent of T sampled Gaussian rounds; account a 'fixed' event under
    NeighboringRelation.REPLACE_ONE.
  """
  s = _check_noise_multiplier(noise_multiplier)
  q = _check_sampling_rate(sampling_rate)
  t = _check_num_rounds(num_rounds)
  sampling = _check_sampling(sampling)
  n = _check_num_clients(num_clients, sampling)
  if sampling == 'poisson':
    one_round = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s))
  else:
    one_round = dp_accounting.SampledWithoutReplacementDpEvent(
        n, _fixed_cohort_size(q, n), dp_accounting.GaussianDpEvent(s / 2.0))
  return dp_accounting.SelfComposedDpEvent(one_round, t)


def _make_accountant(sampling: str, accountant: str) -> dp_accounting.PrivacyAccountant:
  if sampling == 'fixed':
    return _rdp.RdpAccountant(neighboring_relation=_REPLACE_ONE)
  if accountant == 'rdp':
    return _rdp.RdpAccountant(neighboring_relation=_ADD_OR_REMOVE)
  return _pld.PLDAccountant(neighboring_relation=_ADD_OR_REMOVE,
                            value_discretization_interval=PLD_VALUE_DISCRETIZATION_INTERVAL)


# Results already computed in this process, by everything they depend on: a run asks for the same
# epsilon in its header and at each evaluation, a test suite for the same small mechanism many times,
# and one PLD accounting takes 0.5-2 s (a calibration ~10 of them). attrs reprs of events are exact.
_MEMO: dict[tuple, float] = {}
_MEMO_MAX = 4096


def _cached(cache: dict, limit: int, key: tuple, compute: Callable[[], object]):
  """cache[key], computed on a miss; the cache is emptied when it holds `limit` entries."""
  if key not in cache:
    if len(cache) >= limit:
      cache.clear()
    cache[key] = compute()
  return cache[key]


def _memoized(key: tuple, compute: Callable[[], float]) -> float:
  return _cached(_MEMO, _MEMO_MAX, key, lambda: float(compute()))


def _epsilon_key(event: dp_accounting.DpEvent, sampling: str, accountant: str, d: float) -> tuple:
  return ('epsilon', repr(event), sampling, accountant, PLD_VALUE_DISCRETIZATION_INTERVAL, d)


def _accounted_epsilon(event: dp_accounting.DpEvent, sampling: str, accountant: str,
                       d: float) -> float:
  """epsilon at d of `event` under _make_accountant(sampling, accountant), memoized per process."""
  return _memoized(_epsilon_key(event, sampling, accountant, d),
                   lambda: _make_accountant(sampling, accountant).compose(event).get_epsilon(d))


# One round's PLD of the Poisson-sampled Gaussian, by (sigma, q, grid): building it is most of an
# accounting (1.1 of 1.7 s for Shakespeare's sigma and q), and a run accounts the same round at each
# evaluation's round count. Each PLD holds ~10^5 floats, so few are kept.
_ONE_ROUND_PLD: dict[tuple, object] = {}
_ONE_ROUND_PLD_MAX = 16


def _poisson_gaussian_pld_epsilon(s: float, q: float, t: int, d: float) -> float:
  """What PLDAccountant computes for dp_event(s, q, t) (tests/test_accounting.py checks equality),
  from a kept one-round PLD self-composed t times."""
  one_round = _cached(_ONE_ROUND_PLD, _ONE_ROUND_PLD_MAX, (s, q, PLD_VALUE_DISCRETIZATION_INTERVAL),
                      lambda: _pld_lib.from_gaussian_mechanism(
                          standard_deviation=s,
                          value_discretization_interval=PLD_VALUE_DISCRETIZATION_INTERVAL,
                          sampling_prob=q, neighboring_relation=_ADD_OR_REMOVE))
  identity = _pld_lib.identity(value_discretization_interval=PLD_VALUE_DISCRETIZATION_INTERVAL)
  return identity.compose(one_round.self_compose(t)).get_epsilon_for_delta(d)


def _epsilon(s, q, t, d, sampling, accountant, n) -> float:
  """compute_epsilon on validated arguments."""
  if t == 0:
    return 0.0
  if s == 0:
    return math.inf  # No noise: no privacy; the library is not needed.
  event = dp_event(s, q, t, sampling=sampling, num_clients=n)
  if sampling == 'poisson' and accountant == 'pld':
    return _memoized(_epsilon_key(event, sampling, accountant, d),
                     lambda: _poisson_gaussian_pld_epsilon(s, q, t, d))
  return _accounted_epsilon(event, sampling, accountant, d)


def compute_epsilon(noise_multiplier, sampling_rate, num_rounds, delta, *, sampling='poisson',
                    accountant='pld', num_clients=None) -> float:
  """Client-level epsilon of `dp_event(...)` at `delta`.

  Args:
    noise_multiplier, sampling_rate, num_rounds, sampling, num_clients: as in `dp_event`.
    delta: the target delta in (0, 1).
    accountant: 'pld' (tight, default) or 'rdp' (an upper bound; 'fixed' always uses RDP).

  Returns:
    epsilon (0 for zero rounds, inf for sigma = 0).

  Raises:
    ValueError naming the argument and its allowed range.
  """
  s = _check_noise_multiplier(noise_multiplier)
  return _epsilon(s, *_validate(sampling_rate, num_rounds, delta, sampling, accountant,
                                num_clients))


def _initial_guess(target_eps, q, t, d, sampling, n) -> float:
  # Moments-accountant estimate eps ~ q sqrt(2 T log(1/d)) / sigma; it only seeds the bracket search.
  if sampling == 'fixed':
    q = 2.0 * _fixed_cohort_size(q, n) / n  # 2: replace-one sensitivity.
  return max(0.5, q * math.sqrt(2.0 * t * math.log(1.0 / d)) / target_eps)


class _MemoAccountant(dp_accounting.PrivacyAccountant):
  """Delegates to a fresh real accountant, memoizing epsilon per (ledger, delta) in `cache`.

  calibrate_dp_mechanism re-evaluates the bracket endpoints and its root, and we verify the root
  again; one shared cache makes each of those free instead of a full (~0.5-1 s) accounting.
  """

  def __init__(self, make_inner: Callable[[], dp_accounting.PrivacyAccountant], cache: dict):
    self._make_inner = make_inner
    self._cache = cache
    super().__init__(make_inner().neighboring_relation)

  def _maybe_compose(self, event, count, do_compose):
    # Only the support check; the base class records the event in the ledger.
    return None if self._make_inner().supports(event) else self.CompositionErrorDetails(
        invalid_event=event, error_message='unsupported by the underlying accountant')

  def get_epsilon(self, target_delta: float) -> float:
    key = (repr(self.ledger), float(target_delta))  # attrs reprs are exact and deterministic.
    if key not in self._cache:
      self._cache[key] = float(self._make_inner().compose(self.ledger).get_epsilon(target_delta))
    return self._cache[key]


def _calibrate_with(make_inner, make_event, target, delta, guess, step) -> float:
  """Brackets the answer by geometric steps from `guess`, then runs calibrate_dp_mechanism.

  The step factor starts at `step` and squares after each miss (capped at 2), so a guess that is
  already close is bracketed tightly and a poor one still quickly. Returns a sigma whose epsilon
  under `make_inner()` accountants is verified to be <= target.
  """
  cache = {}

  def make_accountant():
    return _MemoAccountant(make_inner, cache)

  def eps_at(x):
    return make_accountant().compose(make_event(x)).get_epsilon(delta)

  # Walk towards the answer and stop at the first sign change: PLD cost grows fast as sigma -> 0,
  # so we never probe far below it.
  s = guess
  if eps_at(s) > target:
    lo = s
    for _ in range(_MAX_BRACKET_STEPS):
      s *= step
      step = min(step * step, 2.0)
      if eps_at(s) <= target:
        break
      lo = s
    else:
      raise ValueError(f'dp.target_epsilon={target!r} is out of reach: even noise_multiplier={s:g} '
                       'exceeds it; raise dp.target_epsilon or dp.delta, or lower num_rounds.')
    hi = s
  else:
    hi = s
    for _ in range(_MAX_BRACKET_STEPS):
      s /= step
      step = min(step * step, 2.0)
      if eps_at(s) > target:
        break
      hi = s
    else:
      return hi  # Even a tiny sigma meets the target.
    lo = s

  tol = _CALIBRATION_RTOL * lo  # Absolute tolerance; lo <= answer, so ~rtol relative.
  sigma = float(dp_accounting.calibrate_dp_mechanism(
      make_fresh_accountant=make_accountant, make_event_from_param=make_event,
      target_epsilon=target, target_delta=delta,
      bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi), tol=tol))
  # calibrate_dp_mechanism already returns a non-positive gap; re-check through our own function and
  # step up towards hi (verified) should numerical noise disagree.
  for _ in range(20):
    if eps_at(sigma) <= target:
      return sigma
    sigma = min(sigma + tol, hi)
  return hi


def calibrate_noise_multiplier(target_epsilon, sampling_rate, num_rounds, delta, *,
                               sampling='poisson', accountant='pld', num_clients=None) -> float:
  """The noise multiplier that spends exactly `target_epsilon`.

  Args:
    target_epsilon: epsilon > 0 to reach after `num_rounds` rounds at `delta`.
    sampling_rate, num_rounds, delta, sampling, accountant, num_clients: as in `compute_epsilon`.

  Returns:
    The smallest sigma (to ~1e-3 relative) with compute_epsilon(sigma, ...) <= target_epsilon.
  """
  target = _check_target_epsilon(target_epsilon)
  args = _validate(sampling_rate, num_rounds, delta, sampling, accountant, num_clients)
  return _memoized(('calibrate', target, *args, PLD_VALUE_DISCRETIZATION_INTERVAL,
                    _PLD_COARSE_INTERVAL, _CALIBRATION_RTOL), lambda: _calibrate(target, *args))


def _calibrate(target, q, t, d, sampling, accountant, n) -> float:
  """calibrate_noise_multiplier on validated arguments."""
  if t == 0:
    return 0.0  # Zero rounds cost nothing at any sigma.

  def make_event(x):
    return dp_event(x, q, t, sampling=sampling, num_clients=n)

  def make_fine():
    return _make_accountant(sampling, accountant)

  guess = _initial_guess(target, q, t, d, sampling, n)
  if accountant == 'rdp':
    return _calibrate_with(make_fine, make_event, target, d, guess, step=2.0)

  # PLD: search on the coarse grid, then confirm on the fine grid that compute_epsilon uses.
  def make_coarse():
    return _pld.PLDAccountant(neighboring_relation=_ADD_OR_REMOVE,
                              value_discretization_interval=_PLD_COARSE_INTERVAL)

  sigma = _calibrate_with(make_coarse, make_event, target, d, guess, step=2.0)
  def eps_fine(x):
    return _epsilon(x, q, t, d, sampling, accountant, n)

  if eps_fine(sigma) <= target < eps_fine(sigma * (1.0 - _CALIBRATION_RTOL)):
    return sigma
  # Rare: the grids disagree by more than the tolerance; redo the search on the fine grid nearby.
  return _calibrate_with(make_fine, make_event, target, d, sigma,
                         step=1.0 + 4.0 * _CALIBRATION_RTOL)


# ---------------------------------------------------------------------------------------------------
# Any mechanism given as sigma -> DpEvent (the correlated-noise mechanisms, noise_mechanisms.py), PLD
# or RDP under the ADD_OR_REMOVE_ONE relation. BandMF's guarantee is add/remove-one; the tree's is
# zero-out (a client's uploads replaced by 0 in its public rounds: REPLACE_SPECIAL), whose curve for
# its unsampled Gaussians equals add/remove's -- the relation its epsilon holds under is zero-out.
# ---------------------------------------------------------------------------------------------------
def _checked_event_args(num_rounds, delta, accountant) -> tuple[int, float, str]:
  """(T, delta, accountant) of an event-given mechanism, each checked."""
  return (_check_num_rounds(num_rounds), _check_delta(delta),
          _check_accountant(accountant, 'poisson'))


def epsilon_of_event(make_event: Callable[[float], dp_accounting.DpEvent], noise_multiplier,
                     num_rounds, delta, accountant='pld') -> float:
  """Epsilon at `delta` of make_event(noise_multiplier) (0 for zero rounds, inf for sigma = 0)."""
  s = _check_noise_multiplier(noise_multiplier)
  t, d, accountant = _checked_event_args(num_rounds, delta, accountant)
  if t == 0:
    return 0.0
  if s == 0:
    return math.inf
  return _accounted_epsilon(make_event(s), 'poisson', accountant, d)


def calibrate_event(make_event: Callable[[float], dp_accounting.DpEvent], target_epsilon,
                    num_rounds, delta, accountant='pld') -> float:
  """The smallest sigma (to ~1e-3 relative) with epsilon_of_event(make_event, sigma) <= target."""
  target = _check_target_epsilon(target_epsilon)
  t, d, accountant = _checked_event_args(num_rounds, delta, accountant)
  if t == 0:
    return 0.0
  guess = max(0.5, math.sqrt(2.0 * math.log(1.0 / d)) / target)  # only seeds the bracket search
  if accountant == 'rdp':
    return _calibrate_with(lambda: _make_accountant('poisson', 'rdp'), make_event, target, d, guess,
                           step=2.0)

  def make_coarse():
    return _pld.PLDAccountant(neighboring_relation=_ADD_OR_REMOVE,
                              value_discretization_interval=_PLD_COARSE_INTERVAL)

  def make_fine():
    return _make_accountant('poisson', 'pld')

  sigma = _calibrate_with(make_coarse, make_event, target, d, guess, step=2.0)

  def eps_fine(x):
    return epsilon_of_event(make_event, x, t, d, 'pld')

  if eps_fine(sigma) <= target < eps_fine(sigma * (1.0 - _CALIBRATION_RTOL)):
    return sigma
  return _calibrate_with(make_fine, make_event, target, d, sigma, step=1.0 + 4.0 * _CALIBRATION_RTOL)
