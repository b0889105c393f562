"""Tests for dp2fedsam_jax.privacy.accounting: agreement with dp_accounting, calibration, the
replace-one sensitivity factor, edge cases and validation."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from scipy.special import ndtr

from dp2fedsam_jax.privacy import accounting
from dp2fedsam_jax.privacy.accounting import calibrate_noise_multiplier, compute_epsilon, dp_event

DELTA = 1e-5
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE
FIXED = dict(sampling='fixed', accountant='rdp')


def _poisson_event(sigma, q, rounds):
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), rounds)


def _rdp_wor_eps(n, m, lib_multiplier, rounds, delta):
  """The library's RDP epsilon for a hand-built without-replacement event."""
  event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(
          n, m, dp_accounting.GaussianDpEvent(lib_multiplier)), rounds)
  return RdpAccountant(neighboring_relation=REPLACE_ONE).compose(event).get_epsilon(delta)


# -- Agreement with a direct dp_accounting computation ---------------------------------------------

@pytest.mark.parametrize('sigma, q, rounds', [(1.1, 0.05, 100), (0.8, 1.0, 3), (2.5, 0.3, 7)])
def test_poisson_pld_matches_direct(sigma, q, rounds, monkeypatch):
  """compute_epsilon keeps one round's PLD and self-composes it: the library's accountant's answer
  at every round count, the first and the ones that reuse the kept round."""
  monkeypatch.setattr(accounting, '_ONE_ROUND_PLD', {})
  for t in (rounds, 1, 2 * rounds):
    expected = PLDAccountant(value_discretization_interval=1e-4).compose(
        _poisson_event(sigma, q, t)).get_epsilon(DELTA)
    got = compute_epsilon(sigma, q, t, DELTA)  # PLD is the default.
    assert got == pytest.approx(expected, rel=1e-12)
    assert 0 < got < 30
  assert len(accounting._ONE_ROUND_PLD) == 1


def test_poisson_rdp_matches_direct():
  sigma, q, rounds = 1.1, 0.05, 100
  expected = RdpAccountant().compose(_poisson_event(sigma, q, rounds)).get_epsilon(DELTA)
  got = compute_epsilon(sigma, q, rounds, DELTA, accountant='rdp')
  assert got == pytest.approx(expected, rel=1e-12)
  assert got > compute_epsilon(sigma, q, rounds, DELTA, accountant='pld')  # RDP is looser.


def test_fixed_rdp_matches_direct_with_halved_multiplier():
  sigma, n, q, rounds = 1.3, 500, 0.04, 50  # m = 20.
  expected = _rdp_wor_eps(n, 20, sigma / 2, rounds, DELTA)
  got = compute_epsilon(sigma, q, rounds, DELTA, num_clients=n, **FIXED)
  assert got == pytest.approx(expected, rel=1e-12)


def test_dp_event_structure():
  assert dp_event(1.5, 0.1, 7) == _poisson_event(1.5, 0.1, 7)
  assert dp_event(1.5, 0.1, 7, sampling='fixed', num_clients=95) == (
      dp_accounting.SelfComposedDpEvent(
          dp_accounting.SampledWithoutReplacementDpEvent(
              95, round(0.1 * 95), dp_accounting.GaussianDpEvent(0.75)), 7))
  # At least one client per round.
  assert dp_event(1.0, 0.001, 1, sampling='fixed', num_clients=10).event.sample_size == 1


# -- Replace-one sensitivity: the factor 2 ---------------------------------------------------------

def _hockey_stick_lower_bound(q, sigma, eps):
  """sup_t P(X > t) - e^eps Q(X > t) for one fixed-size round, in units of C.

  Neighbours: client i's update is +C e in one dataset and -C e in the other, every other update is 0.
  i is in the cohort with probability q, so the noisy sum projected on e is
  P = (1-q) N(0, s^2) + q N(+1, s^2) versus Q = (1-q) N(0, s^2) + q N(-1, s^2).
  A valid (eps, delta) guarantee needs delta >= this value.
  """
  t = np.linspace(-30 * sigma - 2, 30 * sigma + 2, 200_001)
  p = (1 - q) * ndtr(-t / sigma) + q * ndtr(-(t - 1) / sigma)
  qq = (1 - q) * ndtr(-t / sigma) + q * ndtr(-(t + 1) / sigma)
  return float(np.max(p - math.exp(eps) * qq))


@pytest.mark.parametrize('n,m,sigma', [(20, 10, 4.0), (100, 20, 4.0)])
def test_fixed_sampling_respects_replace_one_lower_bound(n, m, sigma):
  eps = compute_epsilon(sigma, m / n, 1, DELTA, num_clients=n, **FIXED)
  assert _hockey_stick_lower_bound(m / n, sigma, eps) <= DELTA
  # Handing the library sigma instead of sigma / 2 claims an epsilon this attack refutes.
  eps_wrong = _rdp_wor_eps(n, m, sigma, 1, DELTA)
  assert eps_wrong < eps
  assert _hockey_stick_lower_bound(m / n, sigma, eps_wrong) > DELTA


@pytest.mark.parametrize('sigma', [1.0, 2.0, 4.0])
def test_fixed_full_cohort_is_gaussian_with_sensitivity_2c(sigma):
  # q = 1: one round is a plain Gaussian with std sigma*C and replace-one sensitivity 2C, whose exact
  # (analytic) epsilon lower-bounds any valid accountant.
  exact = dp_accounting.get_epsilon_gaussian(sigma / 2, DELTA)
  eps = compute_epsilon(sigma, 1.0, 1, DELTA, num_clients=10, **FIXED)
  assert exact <= eps <= 1.5 * exact
  # RDP of that Gaussian: alpha (2C)^2 / (2 (sigma C)^2).
  acct = RdpAccountant(orders=[2.0, 8.0], neighboring_relation=REPLACE_ONE)
  acct.compose(dp_event(sigma, 1.0, 1, sampling='fixed', num_clients=10))
  np.testing.assert_allclose(acct._rdp, np.array([2.0, 8.0]) * 2 / sigma**2)
  assert _rdp_wor_eps(10, 10, sigma, 1, DELTA) < exact  # Without the factor 2: invalid.


# -- Calibration -----------------------------------------------------------------------------------

CAL_CONFIGS = {
    'poisson-pld': (0.1, 30, 2.0, {}),
    'poisson-rdp': (0.05, 200, 4.0, dict(accountant='rdp')),
    'fixed-rdp': (0.03, 100, 3.0, dict(num_clients=1000, **FIXED)),
}


@pytest.mark.parametrize('name', list(CAL_CONFIGS))
def test_calibrate_round_trip(name):
  q, rounds, target, kw = CAL_CONFIGS[name]
  sigma = calibrate_noise_multiplier(target, q, rounds, DELTA, **kw)
  eps = compute_epsilon(sigma, q, rounds, DELTA, **kw)
  assert 0.99 * target <= eps <= target
  assert compute_epsilon(sigma * 0.99, q, rounds, DELTA, **kw) > target  # Near-minimal.


def test_calibrate_pld_fine_grid_fallback(monkeypatch):
  # A very coarse search grid disagrees with the fine one; the fine-grid refinement must fix it.
  # (Both grids are coarsened 10x to keep the test fast; only the control flow is under test.)
  calls = []
  real = accounting._calibrate_with
  monkeypatch.setattr(accounting, 'PLD_VALUE_DISCRETIZATION_INTERVAL', 1e-3)
  monkeypatch.setattr(accounting, '_PLD_COARSE_INTERVAL', 0.1)
  monkeypatch.setattr(accounting, '_calibrate_with', lambda *a, **k: calls.append(1) or real(*a, **k))
  q, rounds, target = 0.2, 5, 2.0
  sigma = calibrate_noise_multiplier(target, q, rounds, DELTA)
  assert len(calls) == 2  # Coarse search, then the fine-grid redo.
  assert compute_epsilon(sigma, q, rounds, DELTA) <= target
  assert compute_epsilon(sigma * 0.99, q, rounds, DELTA) > target


def test_calibrate_zero_rounds_needs_no_noise():
  assert calibrate_noise_multiplier(1.0, 0.1, 0, DELTA) == 0.0


# -- Monotonicity and edge cases -------------------------------------------------------------------

KWS = [{}, dict(accountant='rdp'), dict(num_clients=200, **FIXED)]


@pytest.mark.parametrize('kw', KWS, ids=['poisson-pld', 'poisson-rdp', 'fixed-rdp'])
def test_epsilon_monotone(kw):
  by_sigma = [compute_epsilon(s, 0.1, 20, DELTA, **kw) for s in (1.2, 2.0, 4.0)]
  assert all(a > b for a, b in zip(by_sigma, by_sigma[1:]))
  by_rounds = [compute_epsilon(2.0, 0.1, 1, DELTA, **kw), by_sigma[1],
               compute_epsilon(2.0, 0.1, 40, DELTA, **kw)]
  assert all(a < b for a, b in zip(by_rounds, by_rounds[1:]))


@pytest.mark.parametrize('kw', KWS, ids=['poisson-pld', 'poisson-rdp', 'fixed-rdp'])
def test_zero_noise_and_zero_rounds_skip_the_library(kw, monkeypatch):
  def boom(*args, **kwargs):
    raise AssertionError('the accountant should not be built')

  monkeypatch.setattr(accounting, '_make_accountant', boom)
  assert compute_epsilon(0.0, 0.1, 10, DELTA, **kw) == math.inf
  assert compute_epsilon(0, 0.1, 0, DELTA, **kw) == 0.0
  assert compute_epsilon(1.0, 0.1, 0, DELTA, **kw) == 0.0


def test_numpy_scalars_accepted():
  got = compute_epsilon(np.float64(1.5), np.float64(0.1), np.int64(10), np.float64(DELTA),
                        accountant='rdp', num_clients=np.int64(100))
  assert got == compute_epsilon(1.5, 0.1, 10, DELTA, accountant='rdp')


# -- Validation ------------------------------------------------------------------------------------

def _call(fn, names, defaults, bad):
  args = {**defaults, **bad}
  positional = [args.pop(k) for k in names]
  return fn(*positional, **args)


COMPUTE_NAMES = ('noise_multiplier', 'sampling_rate', 'num_rounds', 'delta')
COMPUTE_DEFAULTS = dict(noise_multiplier=1.0, sampling_rate=0.1, num_rounds=10, delta=DELTA)
BAD_COMPUTE = [
    (dict(noise_multiplier=-0.1), 'dp.noise_multiplier'),
    (dict(noise_multiplier=float('nan')), 'dp.noise_multiplier'),
    (dict(noise_multiplier='big'), 'dp.noise_multiplier'),
    (dict(sampling_rate=0.0), 'sampling_rate'),
    (dict(sampling_rate=1.5), 'sampling_rate'),
    (dict(sampling_rate=-0.1), 'sampling_rate'),
    (dict(num_rounds=-1), 'num_rounds'),
    (dict(num_rounds=2.5), 'num_rounds'),
    (dict(delta=0.0), 'dp.delta'),
    (dict(delta=1.0), 'dp.delta'),
    (dict(sampling='uniform'), 'dp.sampling'),
    (dict(accountant='moments'), 'dp.accountant'),
    (dict(FIXED), 'num_clients'),
    (dict(num_clients=0, **FIXED), 'num_clients'),
    (dict(num_clients=-5), 'num_clients'),
    (dict(sampling='fixed', accountant='pld', num_clients=100), 'dp.accountant'),
]


@pytest.mark.parametrize('bad,field', BAD_COMPUTE)
def test_compute_epsilon_validation(bad, field):
  with pytest.raises(ValueError, match=field.replace('.', r'\.')):
    _call(compute_epsilon, COMPUTE_NAMES, COMPUTE_DEFAULTS, bad)


def test_pld_with_fixed_says_use_rdp():
  with pytest.raises(ValueError, match="accountant='rdp'"):
    compute_epsilon(1.0, 0.1, 10, DELTA, sampling='fixed', num_clients=100)


CALIBRATE_NAMES = ('target_epsilon', 'sampling_rate', 'num_rounds', 'delta')
CALIBRATE_DEFAULTS = dict(target_epsilon=1.0, sampling_rate=0.1, num_rounds=10, delta=DELTA)
BAD_CALIBRATE = [
    (dict(target_epsilon=0.0), 'dp.target_epsilon'),
    (dict(target_epsilon=-1.0), 'dp.target_epsilon'),
    (dict(target_epsilon=float('inf')), 'dp.target_epsilon'),
    (dict(sampling_rate=0.0), 'sampling_rate'),
    (dict(num_rounds=-3), 'num_rounds'),
    (dict(delta=2.0), 'dp.delta'),
    (dict(sampling='shuffle'), 'dp.sampling'),
    (dict(accountant='gdp'), 'dp.accountant'),
    (dict(FIXED), 'num_clients'),
    (dict(sampling='fixed', num_clients=100), 'dp.accountant'),
]


@pytest.mark.parametrize('bad,field', BAD_CALIBRATE)
def test_calibrate_validation(bad, field):
  with pytest.raises(ValueError, match=field.replace('.', r'\.')):
    _call(calibrate_noise_multiplier, CALIBRATE_NAMES, CALIBRATE_DEFAULTS, bad)


EVENT_NAMES = ('noise_multiplier', 'sampling_rate', 'num_rounds')
EVENT_DEFAULTS = dict(noise_multiplier=1.0, sampling_rate=0.1, num_rounds=10)


@pytest.mark.parametrize('bad,field', [
    (dict(noise_multiplier=-1.0), 'dp.noise_multiplier'),
    (dict(sampling_rate=2.0), 'sampling_rate'),
    (dict(num_rounds=-1), 'num_rounds'),
    (dict(sampling='x'), 'dp.sampling'),
    (dict(sampling='fixed'), 'num_clients'),
])
def test_dp_event_validation(bad, field):
  with pytest.raises(ValueError, match=field.replace('.', r'\.')):
    _call(dp_event, EVENT_NAMES, EVENT_DEFAULTS, bad)


def test_fixed_sampling_at_poissons_sigma_is_far_looser():
  """docs/privacy.md sections 2 and 3: equal sigma is not equal privacy across samplers (the default
  experiment's sigma = 0.634, q = 0.02, T = 40, delta = 1e-3), and one distributed share of the
  default cohort (|S| = 20) is a Gaussian of multiplier sigma / sqrt(20)."""
  fixed = compute_epsilon(0.634, 0.02, 40, 1e-3, sampling='fixed', accountant='rdp', num_clients=1000)
  poisson = compute_epsilon(0.634, 0.02, 40, 1e-3, accountant='rdp')
  assert fixed == pytest.approx(120.7, abs=0.05) and poisson == pytest.approx(2.97, abs=0.01)
  assert fixed > 40 * poisson
  assert compute_epsilon(0.634 / math.sqrt(20), 1.0, 1, 1e-3) == pytest.approx(45.8, abs=0.05)


def test_accounting_is_memoized_per_process_by_everything_it_depends_on(monkeypatch):
  """A repeated epsilon or calibration is not accounted again, and no memoized result answers a
  question that differs in sigma, rounds, delta, accountant, sampling or grid."""
  built = []  # every accounting: the PLD path for Poisson, an accountant for the rest
  for name in ('_make_accountant', '_poisson_gaussian_pld_epsilon'):
    real = getattr(accounting, name)
    monkeypatch.setattr(accounting, name, lambda *a, real=real: built.append(a) or real(*a))
  monkeypatch.setattr(accounting, '_MEMO', {})
  args = (1.3, 0.07, 9, DELTA)
  first = compute_epsilon(*args)
  assert len(built) == 1 and compute_epsilon(*args) == first and len(built) == 1
  sigma = calibrate_noise_multiplier(first, *args[1:])
  n = len(built)
  assert calibrate_noise_multiplier(first, *args[1:]) == sigma and len(built) == n
  others = [compute_epsilon(1.4, 0.07, 9, DELTA), compute_epsilon(1.3, 0.07, 10, DELTA),
            compute_epsilon(1.3, 0.07, 9, DELTA / 2), compute_epsilon(*args, accountant='rdp'),
            compute_epsilon(*args, sampling='fixed', accountant='rdp', num_clients=100)]
  assert len(set(others + [first])) == 6
  monkeypatch.setattr(accounting, 'PLD_VALUE_DISCRETIZATION_INTERVAL', 1e-2)
  assert compute_epsilon(*args) != first  # another grid, another answer


# -- One epsilon for a run: the tuner's route (dp_event) and the run's (epsilon / calibrate) ------

# Every noise mechanism x sampler x clip rule a config can run (adaptive clipping is independent
# noise only), under both accountants where the sampler allows a choice ('fixed' is RDP only).
ROUTE_CASES = [(m, s, c, a) for m, s, c in (
    ('independent', 'poisson', 'fixed'), ('independent', 'poisson', 'adaptive'),
    ('independent', 'fixed', 'fixed'), ('independent', 'fixed', 'adaptive'),
    ('banded', 'poisson', 'fixed'), ('tree', 'poisson', 'fixed'))
    for a in (('rdp',) if s == 'fixed' else ('pld', 'rdp'))]


def _route_config(noise_mechanism, sampling, clipping, accountant):
  from conftest import tiny_config  # pylint: disable=import-outside-toplevel
  fields = {'num_clients': 20, 'sampling_rate': 0.2, 'num_rounds': 12, 'dp.noise_multiplier': None,
            'dp.target_epsilon': 4.0, 'dp.delta': 1e-3, 'dp.noise_mechanism': noise_mechanism,
            'dp.sampling': sampling, 'dp.clipping': clipping, 'dp.accountant': accountant}
  if noise_mechanism == 'banded':
    fields['dp.num_bands'] = 2
  if clipping == 'adaptive':  # the count's noise must stay above the pair's combined multiplier
    fields['dp.count_noise_multiplier'] = 10.0
  return tiny_config(**fields)


@pytest.mark.parametrize('noise_mechanism,sampling,clipping,accountant', ROUTE_CASES)
def test_dp_event_composed_by_dp_accounting_is_the_runs_epsilon(noise_mechanism, sampling,
                                                               clipping, accountant):
  """A run reports epsilon() after calibrate() chose its sigma; the tuner composes dp_event(T). The
  two routes must give one epsilon: dp_event(T) composed by dp_accounting's own accountant (the
  relation each sampler is accounted under: replace-one for 'fixed', add/remove otherwise) equals
  epsilon(T), at the calibrated sigma that spends the target."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.privacy.mechanism import DPMechanism  # pylint: disable=import-outside-toplevel
  from launch import tune  # pylint: disable=import-outside-toplevel
  config = _route_config(noise_mechanism, sampling, clipping, accountant)
  mech = DPMechanism.from_config(config, config.num_clients, METHODS[config.method])
  rounds, delta = config.num_rounds, config.dp.delta
  assert (mech.noise_mechanism, mech.sampling, mech.adaptive) == (
      noise_mechanism, sampling, clipping == 'adaptive')
  if sampling == 'fixed' or accountant == 'rdp':
    relation = REPLACE_ONE if sampling == 'fixed' else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    library = RdpAccountant(neighboring_relation=relation)
  else:
    library = PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                            value_discretization_interval=accounting.PLD_VALUE_DISCRETIZATION_INTERVAL)
  event = mech.dp_event(rounds)
  composed = library.compose(event).get_epsilon(delta)
  assert composed == pytest.approx(mech.epsilon(rounds), rel=1e-6)
  # calibrate() spent the target by the same count (sigma to ~1e-3 relative).
  assert 0.97 * 4.0 <= composed <= 4.0 * (1 + 1e-9)
  # And the tuner's trial event is this event, under this relation.
  tuned, tuned_relation, tuned_delta, _ = tune.trial_event(config)
  assert (tuned, tuned_delta) == (event, delta)
  assert tuned_relation == library.neighboring_relation
