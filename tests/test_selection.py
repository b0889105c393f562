"""Private selection's accounting (privacy/selection.py) against the theorems computed by hand for a
Gaussian trial, whose RDP is alpha / (2 sigma^2) at every order (Papernot & Steinke 2022, Theorems 2
and 6), and its sampler of K. No JAX: milliseconds each."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from dp2fedsam_jax.privacy import selection
from dp2fedsam_jax.privacy.selection import TrialDistribution
from experiments.report import privacy_tables

SIGMA, DELTA = 3.0, 1e-5
ORDERS = np.asarray(selection.ORDERS)
TRIAL = [dp_accounting.GaussianDpEvent(SIGMA)]
LOG = dict(name='truncated_negative_binomial', eta=0.0)


def _gaussian_rdp(sigma):
  return ORDERS / (2 * sigma ** 2)


def _to_epsilon(rdp, delta):
  """RDP -> (eps, delta) (Canonne, Kamath & Steinke 2020, Prop. 12), orders > 1.01, by hand."""
  a = ORDERS[ORDERS > 1.01]
  r = np.asarray(rdp)[ORDERS > 1.01]
  return max(0.0, float(np.min(r + np.log1p(-1 / a) - np.log(delta * a) / (a - 1))))


def _monotone(curve):
  """RDP is non-decreasing in the order: a lower order's bound is any higher order's."""
  return np.minimum.accumulate(np.asarray(curve)[::-1])[::-1]


def _tnb_by_hand(sigma, eta, gamma, delta):
  """Theorem 2 for K ~ D_{eta, gamma}, lambda and lambda^ over the accountant's orders."""
  eps = _gaussian_rdp(sigma)
  mean = (1 / gamma - 1) / math.log(1 / gamma) if eta == 0 else (
      eta * (1 - gamma) / (gamma * (1 - gamma ** eta)))
  hat = (1 + eta) * np.min((1 - 1 / ORDERS) * eps + math.log(1 / gamma) / ORDERS)
  curve = np.where(ORDERS > 1, eps + hat + math.log(mean) / np.maximum(ORDERS - 1, 1e-300), np.inf)
  return _to_epsilon(_monotone(curve), delta)


def _gaussian_delta(sigma, eps):
  """The exact (eps, delta) curve of the Gaussian mechanism of sensitivity 1 (Balle & Wang 2018)."""
  return (stats.norm.cdf(0.5 / sigma - eps * sigma)
          - math.exp(eps) * stats.norm.cdf(-0.5 / sigma - eps * sigma))


def _rdp_delta(rdp, eps):
  """delta at eps from an RDP curve by hand: min over orders of the KL bound sqrt(1 - e^-r) and
  (for orders > 1.01) e^{(a-1)(r - eps + log(1 - 1/a))} / a (Canonne, Kamath & Steinke 2020)."""
  best = 1.0
  for a, r in zip(ORDERS, rdp):
    best = min(best, math.sqrt(-math.expm1(-r)))
    if a > 1.01:
      best = min(best, math.exp(min(0.0, (a - 1) * (r - eps + math.log1p(-1 / a)) - math.log(a))))
  return best


def _poisson_by_hand(sigma, mu, delta, exact_delta_hat):
  """Theorem 6 for K ~ Poisson(mu), delta^ at e^eps^ = 1 + 1/(lambda-1) from the trial's RDP
  curve, or the Gaussian's exact delta^."""
  eps = _gaussian_rdp(sigma)
  curve = np.full(ORDERS.shape, np.inf)
  for i, a in enumerate(ORDERS):
    if a > 1:
      eps_hat = math.log1p(1 / (a - 1))
      delta_hat = _gaussian_delta(sigma, eps_hat) if exact_delta_hat else _rdp_delta(eps, eps_hat)
      curve[i] = eps[i] + mu * delta_hat + math.log(mu) / (a - 1)
  return _to_epsilon(curve, delta)


@pytest.mark.parametrize('eta,gamma', [(0.0, 0.05), (0.0, 0.3), (1.0, 0.1), (0.5, 0.02)])
def test_truncated_negative_binomial_epsilon_is_theorem_2_by_hand(eta, gamma):
  distribution = TrialDistribution('truncated_negative_binomial', eta=eta, gamma=gamma)
  cost = selection.selection_cost(TRIAL, distribution, DELTA)
  # dp_accounting recovers gamma from E[K] to 1e-9 (conservatively smaller): the same to ~1e-7.
  assert cost.selection_epsilon == pytest.approx(_tnb_by_hand(SIGMA, eta, gamma, DELTA), rel=1e-6)
  assert cost.per_trial_epsilon == pytest.approx(_to_epsilon(_gaussian_rdp(SIGMA), DELTA), rel=1e-9)


@pytest.mark.parametrize('mu', [1.0, 3.0, 10.0, 30.0])
def test_poisson_epsilon_is_theorem_6_by_hand(mu):
  cost = selection.selection_cost(TRIAL, TrialDistribution('poisson', mu=mu), DELTA)
  assert cost.selection_epsilon == pytest.approx(_poisson_by_hand(SIGMA, mu, DELTA, False), rel=1e-9)
  # The Gaussian's exact delta^ is smaller than the RDP curve's: a tighter, still valid bound.
  assert _poisson_by_hand(SIGMA, mu, DELTA, True) <= cost.selection_epsilon


def test_the_selection_costs_more_than_one_trial_and_less_than_naive_composition():
  for distribution in (TrialDistribution('poisson', mu=10.0),
                       TrialDistribution.from_dict({**LOG, 'mean': 10.0})):
    cost = selection.selection_cost(TRIAL, distribution, DELTA)
    assert cost.naive_trials == 10
    assert cost.per_trial_epsilon < cost.selection_epsilon < cost.naive_epsilon
    naive_by_hand = _to_epsilon(10 * _gaussian_rdp(SIGMA), DELTA)
    assert cost.naive_epsilon == pytest.approx(naive_by_hand, rel=1e-9)


def test_one_expected_trial_costs_about_one_trial():
  # The logarithmic law at gamma -> 1 is K = 1 almost surely: the bound tends to one trial's.
  near_one = TrialDistribution('truncated_negative_binomial', eta=0.0, gamma=0.999)
  assert near_one.mean == pytest.approx(1.0, abs=1e-3)
  cost = selection.selection_cost(TRIAL, near_one, DELTA)
  assert cost.per_trial_epsilon < cost.selection_epsilon < cost.per_trial_epsilon * 1.01
  # Poisson(1): eps' = eps + delta^ (log 1 = 0), but delta^ is taken at eps^ = log(1 + 1/(lambda-1)),
  # large at low orders: 12 % over one trial here, more than running K = 1 trial outright.
  one = selection.selection_cost(TRIAL, TrialDistribution('poisson', mu=1.0), DELTA)
  assert one.naive_trials == 1 and one.naive_epsilon == one.per_trial_epsilon
  assert one.per_trial_epsilon * 1.05 < one.selection_epsilon < one.per_trial_epsilon * 1.2


def test_epsilon_grows_with_the_expected_trials_and_falls_with_the_noise():
  for make in (lambda m: TrialDistribution('poisson', mu=m),
               lambda m: TrialDistribution.from_dict({**LOG, 'mean': m})):
    eps = [selection.selection_cost(TRIAL, make(m), DELTA).selection_epsilon for m in (1.5, 5, 20, 80)]
    assert all(a < b for a, b in zip(eps, eps[1:])), eps
  by_sigma = [selection.selection_cost([dp_accounting.GaussianDpEvent(s)],
                                       TrialDistribution('poisson', mu=10.0), DELTA).selection_epsilon
              for s in (1.0, 2.0, 4.0, 8.0)]
  assert all(a > b for a, b in zip(by_sigma, by_sigma[1:])), by_sigma


def test_trials_of_different_mechanisms_are_bounded_by_the_worst_curve():
  weak, strong = dp_accounting.GaussianDpEvent(2.0), dp_accounting.GaussianDpEvent(6.0)
  distribution = TrialDistribution('poisson', mu=5.0)
  both = selection.selection_cost([strong, weak], distribution, DELTA)
  assert both == selection.selection_cost([weak], distribution, DELTA)
  assert both.selection_epsilon > selection.selection_cost([strong], distribution, DELTA).selection_epsilon


def test_an_event_without_an_rdp_curve_is_refused():
  pld_only = dp_accounting.TruncatedSubsampledGaussianDpEvent(100, 0.1, 5, 1.0)
  with pytest.raises(ValueError, match="needs each trial's RDP curve.*TruncatedSubsampled"):
    selection.selection_cost([pld_only], TrialDistribution('poisson', mu=10.0), DELTA)


@pytest.mark.parametrize('spec,match', [
    ({'name': 'poisson', 'mu': 0.5}, 'mu >= 1'),
    ({'name': 'truncated_negative_binomial', 'eta': -0.5, 'gamma': 0.1}, 'eta >= 0'),
    ({'name': 'truncated_negative_binomial', 'eta': 0.0, 'gamma': 1.0}, r'\(0, 1\)'),
    ({'name': 'geometric', 'mu': 3}, 'choose one of'),
    ({'name': 'poisson', 'mean': 3}, 'unknown parameters'),
    ({'name': 'fixed', 'k': 0}, 'whole number of trials >= 1'),
    ({'name': 'fixed', 'k': 2.5}, 'whole number of trials >= 1'),
])
def test_bad_trial_distributions_are_refused(spec, match):
  with pytest.raises(ValueError, match=match):
    TrialDistribution.from_dict(spec)


@pytest.mark.parametrize('spec', [{'name': 'poisson', 'mu': 4.0}, {**LOG, 'gamma': 0.05},
                                  {'name': 'truncated_negative_binomial', 'eta': 2.0, 'gamma': 0.3}])
def test_the_sampler_draws_k_from_its_distribution(spec):
  distribution = TrialDistribution.from_dict(spec)
  assert sum(distribution.pmf(k) for k in range(2000)) == pytest.approx(1.0, abs=1e-9)
  draws = [distribution.sample(np.random.default_rng([7, i])) for i in range(4000)]
  assert draws == [distribution.sample(np.random.default_rng([7, i])) for i in range(4000)]
  counts = np.bincount(draws, minlength=60)[:60]
  expected = np.array([distribution.pmf(k) for k in range(60)]) * len(draws)
  keep = expected > 20  # a chi-square test on the well-filled cells
  chi2 = np.sum((counts[keep] - expected[keep]) ** 2 / expected[keep])
  assert stats.chi2.sf(chi2, keep.sum() - 1) > 1e-4, (counts[:15], expected[:15])
  if distribution.name == 'truncated_negative_binomial':
    assert min(draws) >= 1  # truncated: K = 0 never happens


def test_a_fixed_k_is_always_k_and_no_private_selection_takes_it():
  """A non-private search's law: K = k on every draw; a private selection's accounting refuses it
  (no theorem bounds releasing the best of a fixed number of private trials)."""
  fixed = TrialDistribution.from_dict({'name': 'fixed', 'k': 16.0})
  assert fixed.k == 16 and fixed.mean == 16.0 and not fixed.private
  assert {fixed.sample(np.random.default_rng([3, i])) for i in range(50)} == {16}
  assert [fixed.pmf(k) for k in (15, 16, 17)] == [0.0, 1.0, 0.0]
  assert TrialDistribution.from_dict(fixed.to_dict()) == fixed
  event = dp_accounting.GaussianDpEvent(5.0)
  with pytest.raises(ValueError, match='no private-selection bound'):
    selection.selection_cost([event], fixed, DELTA)


def test_from_dict_with_a_mean_finds_gamma_and_round_trips():
  distribution = TrialDistribution.from_dict({**LOG, 'mean': 10.0})
  assert distribution.mean == pytest.approx(10.0, rel=1e-6)
  assert TrialDistribution.from_dict(distribution.to_dict()) == distribution


def test_the_cost_tables_claims_hold():
  """docs/privacy.md section 9 (its table generated by experiments/report/privacy_tables.py): each
  trial's sigma gives the PLD epsilon of its row; ten logarithmic trials cost about half the naive
  release of ten; at equal E[K] the logarithmic law costs least and Poisson most; at E[K] = 1 Poisson
  costs more than one trial released."""
  for sigma, target in zip(privacy_tables.COST_SIGMAS, (1.0, 0.25)):
    assert privacy_tables.run_pld_epsilon(sigma) == pytest.approx(target, abs=0.005)
    trial = [privacy_tables.trial_event(sigma)]
    cost = {name: selection.selection_cost(trial, privacy_tables.law(name, 10), 1e-3)
            for name in ('Poisson', 'logarithmic', 'geometric (eta = 1)')}
    assert 0.4 < cost['logarithmic'].selection_epsilon / cost['logarithmic'].naive_epsilon < 0.65
    assert (cost['logarithmic'].selection_epsilon < cost['geometric (eta = 1)'].selection_epsilon
            < cost['Poisson'].selection_epsilon)
    one = selection.selection_cost(trial, privacy_tables.law('Poisson', 1), 1e-3)
    assert one.selection_epsilon > one.naive_epsilon
