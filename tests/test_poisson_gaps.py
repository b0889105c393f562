"""dp.poisson_draw='gaps': Poisson sampling from geometric gaps between the sampled ids, O(cohort)
random numbers a round, the distribution of dp.poisson_draw='per_client' (one uniform per client).

Statistical checks at fixed keys with tolerances of about 1e-4 false alarms: deterministic, not flaky.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from conftest import tiny_config
from dp2fedsam_jax.algorithms import get_method
from dp2fedsam_jax.privacy import sampling
from dp2fedsam_jax.privacy.mechanism import DPMechanism

ALARM = 1e-4  # the p-value below which a statistic fails


def _masks(num_clients, q, draws, block=None, seed=0):
  keys = jax.random.split(jax.random.key(seed), draws)
  sample = jax.jit(jax.vmap(lambda k: sampling.poisson_by_gaps(k, q, num_clients, block)))
  return np.asarray(sample(keys))


def _chi2_p(observed, expected, variance):
  return stats.chi2.sf(np.sum((observed - expected) ** 2 / variance), observed.size)


@pytest.mark.parametrize('block', [None, 2])  # one block a draw; many (the while_loop goes on)
def test_each_client_alone_and_every_pair_at_q_and_q_squared(block):
  num_clients, q, draws = 40, 0.15, 6000
  masks = _masks(num_clients, q, draws, block)
  counts = masks.sum(0)
  assert _chi2_p(counts, draws * q, draws * q * (1 - q)) > ALARM
  # Independence: neighbours (a wrong gap law shows there first) and every pair at q^2.
  together = masks[:, :-1] & masks[:, 1:]
  p2 = q * q
  disjoint = together[:, ::2].sum(0)  # pairs (0, 1), (2, 3), ...: independent counts
  assert _chi2_p(disjoint, draws * p2, draws * p2 * (1 - p2)) > ALARM
  correlation = np.corrcoef(masks.T.astype(np.float64))[np.triu_indices(num_clients, 1)]
  # Each ~ N(0, 1/draws) under independence; 780 pairs, so a two-sided bound of ~5.3 sigma.
  assert np.max(np.abs(correlation)) * np.sqrt(draws) < stats.norm.isf(ALARM / 780 / 2)


@pytest.mark.parametrize('num_clients,q', [(3000, 0.03), (20000, 5e-5)])  # qN = 90 and 1
def test_cohort_size_is_binomial(num_clients, q):
  draws = 3000
  sizes = _masks(num_clients, q, draws, seed=1).sum(1)
  support = np.arange(num_clients + 1)
  expected = draws * stats.binom.pmf(support, num_clients, q)
  # Bins of >= 5 expected draws: sizes below, inside and above the central ones.
  central = support[expected >= 5]
  low, high = central[0], central[-1]
  observed = np.r_[np.sum(sizes < low), [np.sum(sizes == k) for k in central], np.sum(sizes > high)]
  wanted = np.r_[expected[:low].sum(), expected[central], expected[high + 1:].sum()]
  keep = wanted > 0
  chi2 = np.sum((observed[keep] - wanted[keep]) ** 2 / wanted[keep])
  assert stats.chi2.sf(chi2, keep.sum() - 1) > ALARM
  assert abs(sizes.mean() - num_clients * q) < 4 * np.sqrt(num_clients * q / draws)


def test_exponentials_are_exp1_and_q_one_takes_everyone():
  e = np.asarray(sampling._exponentials(jax.random.key(3), (200_000,)), np.float64)
  assert stats.kstest(e, 'expon').pvalue > ALARM and e.min() > 0 and np.isfinite(e).all()
  assert bool(sampling.poisson_by_gaps(jax.random.key(0), 1.0, 7).all())
  # The block fits int32 positions: block * (N + 1) + N < 2^31.
  for n, q in ((10**6, 0.5), (10**8, 0.1), (1000, 1e-3)):
    assert 1 <= sampling.gap_block(q, n) and sampling.gap_block(q, n) * (n + 1) + n < 2**31


def test_per_client_draw_is_unchanged_and_the_config_picks_the_draw():
  key = jax.random.key(4)
  np.testing.assert_array_equal(sampling.sample_cohort(key, 'poisson', 0.3, 50),
                                jax.random.uniform(key, (50,)) < 0.3)  # past runs' numbers
  np.testing.assert_array_equal(sampling.sample_cohort(key, 'poisson', 0.3, 50, 'gaps'),
                                sampling.poisson_by_gaps(key, 0.3, 50))
  with pytest.raises(ValueError, match='dp.poisson_draw'):
    sampling.sample_cohort(key, 'poisson', 0.3, 50, 'other')
  for draw in sampling.POISSON_DRAWS:
    for private in (True, False):
      config = tiny_config(**{'dp.poisson_draw': draw},
                           **({} if private else {'method': 'fedavg'}))
      mechanism = DPMechanism.from_config(config, config.num_clients, get_method(config.method))
      assert mechanism.private == private
      np.testing.assert_array_equal(
          mechanism.noise.sample(key, jnp.int32(0), key),
          sampling.sample_cohort(key, 'poisson', config.sampling_rate, config.num_clients, draw))
