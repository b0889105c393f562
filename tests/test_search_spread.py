"""experiments/studies/search_spread.py against brute force: the tuning curve by enumerating every
k-tuple of a small pool, the simulated search against its closed form where K is fixed, the rule."""

import itertools
import math

import numpy as np
import pytest

from dp2fedsam_jax.privacy.selection import TrialDistribution
from experiments.studies import search_spread as ss

POOL = ss.Pool.of(validation=[0.5, 0.9, 0.7, 0.1], test=[0.52, 0.80, 0.75, 0.10])


@pytest.mark.parametrize('k', [1, 2, 3])
def test_expected_best_is_the_mean_over_every_k_tuple_of_the_validation_best_test_accuracy(k):
  tuples = list(itertools.product(range(len(POOL)), repeat=k))
  brute = np.mean([POOL.test[max(t, key=lambda i: POOL.validation[i])] for t in tuples])
  assert ss.expected_best(POOL, k) == pytest.approx(brute, abs=1e-12)


def test_the_tuning_curve_rises_to_the_pools_validation_best_and_its_band_holds_the_mean():
  curve = ss.tuning_curve(POOL, 40, np.random.default_rng(0), resamples=300)
  assert curve.mean[0] == pytest.approx(POOL.test.mean())
  assert np.all(np.diff(curve.mean) >= -1e-12) and curve.mean[-1] == pytest.approx(0.80, abs=1e-4)
  assert np.all(curve.low <= curve.mean + 1e-12) and np.all(curve.mean <= curve.high + 1e-12)
  assert list(curve.to_dict()['k'][:3]) == [1.0, 2.0, 3.0]


def test_a_noiseless_search_with_one_trial_is_a_uniform_draw_from_the_pool():
  one = TrialDistribution.from_dict({'name': 'truncated_negative_binomial', 'eta': 1.0,
                                     'mean': 1.0 + 1e-9})
  chosen = ss.simulated_searches(POOL, one, 0.0, np.random.default_rng(1), resamples=4000)
  assert set(np.round(chosen, 6)) <= set(np.round(POOL.test, 6))
  assert chosen.mean() == pytest.approx(POOL.test.mean(), abs=0.02)
  assert ss.search_sd(POOL, one, 0.0, np.random.default_rng(2), 4000) == pytest.approx(
      POOL.test.std(), abs=0.02)


def test_more_trials_or_less_score_noise_narrow_the_search():
  rng = lambda: np.random.default_rng(3)  # noqa: E731
  small = TrialDistribution.from_dict({'name': 'poisson', 'mu': 2.0})
  large = TrialDistribution.from_dict({'name': 'poisson', 'mu': 16.0})
  assert ss.search_sd(POOL, large, 0.0, rng()) < ss.search_sd(POOL, small, 0.0, rng())
  assert ss.search_sd(POOL, large, 0.0, rng()) < ss.search_sd(POOL, large, 1.0, rng())


def test_the_rule_adds_the_searches_spread_to_the_seeds():
  a, b = [0.80, 0.81, 0.82, 0.80, 0.81], [0.78, 0.79, 0.80, 0.78, 0.79]
  label, d, s = ss.paired_rule(a, b, 0.0, 0.0)
  assert (label, d, s) == ('helps', pytest.approx(0.02), pytest.approx(0.0))
  label, d, s = ss.paired_rule(a, b, 0.01, 0.01)
  assert label == 'level' and s == pytest.approx(math.sqrt(2) * 0.01)
  assert ss.paired_rule(b, a, 0.0, 0.0)[0] == 'hurts'
  with pytest.raises(ValueError, match='the same seeds'):
    ss.paired_rule(a, b[:4], 0.0, 0.0)


def test_rank_stability_is_spearmans_rho():
  assert ss.rank_stability([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
  assert ss.rank_stability([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)


def test_a_rows_search_record_reads_its_trials_and_a_failed_trial_ranks_last():
  trials = [{'run': f'trial={i}', 'values': {'x': i}, 'status': 'finished', 'metric': v,
             'test_accuracy': t} for i, (v, t) in enumerate(zip(POOL.validation, POOL.test))]
  trials.append({'run': 'trial=4', 'values': {'x': 4}, 'status': 'failed', 'score': None})
  law = TrialDistribution.from_dict({'name': 'poisson', 'mu': 3.0})
  record = ss.search_record(trials, law, 0.01, seed=0, resamples=200)
  assert record['pool_size'] == 5 and record['covered_by_epsilon'] is False
  assert record['pool_best'] == {'run': 'trial=1', 'values': {'x': 1}, 'validation_accuracy': 0.9,
                                 'test_accuracy': 0.8}
  curve = record['tuning_curve']
  assert curve['k'] == [1, 2, 3, 4, 5]
  pool = ss.Pool.of(list(POOL.validation) + [-math.inf], list(POOL.test) + [0.0])
  assert curve['mean'][0] == pytest.approx(float(np.mean(pool.test)))  # one draw: the pool's mean
  assert 0 < record['search_sd'] < 0.4
  nothing = ss.search_record(trials[4:], law, 0.01, seed=0, resamples=50)
  assert nothing['pool_best'] is None and nothing['tuning_curve']['mean'] == [0.0]
  assert ss.search_record([], law, 0.01, seed=0)['pool_size'] == 0


def test_a_published_record_recomputes_from_its_pool_alone():
  trials = [{'run': f'trial={i}', 'values': {'x': i}, 'status': 'finished', 'metric': v,
             'test_accuracy': t, 'score': v + 0.05} for i, (v, t) in enumerate(zip(POOL.validation,
                                                                                  POOL.test))]
  law = TrialDistribution.from_dict({'name': 'poisson', 'mu': 3.0})
  record = ss.search_record(trials, law, 0.01, seed=3, resamples=100)
  assert all('score' not in trial for trial in record['pool'])  # only the selected score is released
  assert ss.recomputed(record, law) == record
  stored_elsewhere = {**record, 'search_sd': 0.0, 'tuning_curve': None}
  assert ss.recomputed(stored_elsewhere, law) == record  # what is shown comes from the trials
  moved = {**record, 'pool': [{**t, 'test_accuracy': 0.99} if t['run'] == 'trial=1' else t
                              for t in record['pool']]}
  assert ss.recomputed(moved, law)['pool_best']['test_accuracy'] == 0.99
  with pytest.raises(ValueError, match='pool'):
    ss.recomputed({k: v for k, v in record.items() if k != 'pool'}, law)
