"""The empirical privacy audit: its statistics, and the real round step audited both ways.

Either audit of the real round fails if the mechanism is not what the accountant assumes: too little
noise (or clipping that lets the 10 C canary through) pushes eps_lower above the accounted epsilon;
an audit that cannot see anything fails the near-zero-noise test.
"""

import math

import jax
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import config as config_lib
from dp2fedsam_jax import train
from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax import audit
from dp2fedsam_jax.privacy import accounting
from dp2fedsam_jax.privacy import audit as audit_stats
from launch import sweep

DELTA = 1e-5


def test_clopper_pearson_bounds_and_the_epsilon_formula():
  n, alpha = 500, 0.05
  # Zero successes: the bound solves (1 - p)^n = level.
  np.testing.assert_allclose(audit_stats.clopper_pearson_upper(0, n, alpha / 2),
                             1 - (alpha / 2) ** (1 / n), rtol=1e-9)
  assert audit_stats.clopper_pearson_upper(n, n, alpha / 2) == 1.0
  assert audit_stats.clopper_pearson_upper(50, n, alpha / 2) > 50 / n
  # A perfect test certifies only what n trials can: log((1 - delta - p) / p).
  p = 1 - (alpha / 2) ** (1 / n)
  eps, fpr_hi, fnr_hi = audit_stats.epsilon_lower_bound(0, 0, n, n, DELTA, alpha)
  np.testing.assert_allclose(eps, math.log((1 - DELTA - p) / p), rtol=1e-9)
  # A useless test (half wrong both ways) certifies nothing.
  assert audit_stats.epsilon_lower_bound(n // 2, n // 2, n, n, DELTA, alpha)[0] == 0.0


@pytest.mark.parametrize('sigma', [0.7, 1.5])
def test_epsilon_from_scores_stays_below_the_gaussian_mechanism(sigma):
  """Scores of the Gaussian mechanism itself: the bound is positive but never above the true eps."""
  rng = np.random.default_rng(0)
  n = 20000
  with_canary = rng.normal(1.0, sigma, n)
  without = rng.normal(0.0, sigma, n)
  eps, *_ = audit_stats.epsilon_from_scores(with_canary, without, DELTA, 0.05)
  true_eps = accounting.compute_epsilon(sigma, 1.0, 1, DELTA)  # q = 1: the plain Gaussian mechanism
  assert 0.3 < eps <= true_eps, (eps, true_eps)


def _audit(sigma, accountant, trials=1000):
  exp = train.build_experiment(tiny_config(**{
      'dp.noise_multiplier': sigma, 'dp.delta': DELTA, 'sampling_rate': 1.0,
      'dp.accountant': accountant, 'num_rounds': 1}))
  return audit.run_audit(exp, audit.AuditSettings(num_trials=trials, batch_trials=trials))


def test_audit_of_the_real_round_step_respects_the_accounted_epsilon():
  result = _audit(1.0, 'pld')
  assert result.epsilon_accounted == pytest.approx(4.377, abs=0.01)
  assert 0.0 < result.epsilon_lower <= result.epsilon_accounted, result


def test_audit_detects_the_canary_when_there_is_almost_no_noise():
  result = _audit(0.05, 'rdp')  # PLD is slow at tiny sigma; eps_accounted is huge either way
  assert result.fpr + result.fnr < 0.01, result
  # More than sigma = 1 accounts for: the test above has room to fail.
  assert result.epsilon_lower > 4.5, result


def test_audit_config_and_table_grid_validate():
  from experiments.configs import audit as audit_config
  for entry in audit_config.audit_grid():
    config = audit_config.get_config(sweep.arg_string(entry))
    config_lib.validate_config(config, set(METHODS))
    settings = audit.AuditSettings.from_config(config)
    assert settings.num_rounds == config.num_rounds == entry.get('rounds', 1)
    assert config.dp.noise_multiplier == entry['sigma'] and config.dp.delta == DELTA
  with pytest.raises(ValueError, match='unknown config argument'):
    audit_config.get_config('eps=1')
  bad = audit_config.get_config(None)
  bad.audit.num_rounds = 3
  with pytest.raises(ValueError, match='config.num_rounds'):
    audit.AuditSettings.from_config(bad)


def test_importing_the_audit_binary_defines_no_flags():
  from absl import flags
  import experiments.audit  # noqa: F401
  assert 'table' not in flags.FLAGS


def test_private_mask_methods_release_exactly_zero_for_an_empty_cohort():
  """One of the leaks the epsilon_caveat of fed_smp_topk / dp_pfeddsu covers (docs/privacy.md); the
  public rand-k mask is noised even then (tests/test_methods.py)."""
  exp = train.build_experiment(tiny_config(method='fed_smp_topk', sampling_rate=1e-9))
  state0 = exp.init_state()
  state, metrics = jax.jit(exp.round_step())(state0, exp.data, exp.root_key)
  assert int(metrics['cohort_size']) == 0
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               state.shared, state0.shared)
  assert 'released without noise' in exp.privacy_caveat
