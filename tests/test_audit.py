"""The empirical privacy audit: its statistics, and the real round step audited with canary clients.

The audit can fail: the negative control runs a round step that adds half the noise it accounts
for, and the audit's lower bound must exceed the accounted epsilon. The correct round step, audited
the same way, must stay below it -- and come within 0.6 of it.
"""

import dataclasses
import functools
import math
import pathlib

import jax
import jax.numpy as jnp
import dp_accounting
import numpy as np
import pytest
from jax_privacy import auditing as jax_privacy_auditing

from conftest import tiny_config
from dp2fedsam_jax import canaries
from dp2fedsam_jax import config as config_lib
from dp2fedsam_jax import keys
from dp2fedsam_jax import train
from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.privacy import accounting
from dp2fedsam_jax.privacy import auditing
from dp2fedsam_jax.privacy.mechanism import DPMechanism
from dp2fedsam_jax.privacy.noise_mechanisms import BandMF
from experiments.report import privacy_tables
from launch import sweep

DELTA = 1e-5


def _gaussian_scores(sigma, n, seed, shift=1.0):
  """(in, out) scores of the Gaussian mechanism itself: each canary in with probability 1/2."""
  rng = np.random.default_rng(seed)
  included = rng.random(n) < 0.5
  scores = rng.normal(0.0, sigma, n) + shift * included
  return scores[included], scores[~included]


# --- statistics -----------------------------------------------------------------------------------


def _hand_written_clopper_pearson(fp, fn, n_out, n_in, delta, alpha):
  """The bound the audit computed itself before it used jax_privacy (commit 439a847)."""
  from scipy import stats
  upper = lambda k, n: 1.0 if k >= n else stats.beta.ppf(1 - alpha / 2, k + 1, n - k)
  fpr_hi, fnr_hi = upper(fp, n_out), upper(fn, n_in)
  a = math.log(max(1 - delta - fnr_hi, 1e-300) / fpr_hi)
  b = math.log(max(1 - delta - fpr_hi, 1e-300) / fnr_hi)
  return max(a, b, 0.0)


def test_clopper_pearson_from_jax_privacy_reproduces_the_hand_written_bound():
  in_scores, out_scores = _gaussian_scores(0.7, 2000, seed=0)
  all_scores = np.concatenate([in_scores, out_scores])
  for threshold in np.quantile(all_scores, [0.05, 0.3, 0.5, 0.8, 0.99]):
    fp, fn = np.sum(out_scores >= threshold), np.sum(in_scores < threshold)
    ours = auditing.epsilon_clopper_pearson_at(in_scores, out_scores, threshold, DELTA, 0.05)
    np.testing.assert_allclose(ours, _hand_written_clopper_pearson(
        fp, fn, out_scores.size, in_scores.size, DELTA, 0.05), rtol=1e-9, atol=1e-12)
  # A perfect test certifies only what n trials can: log((1 - delta - p) / p), (1 - p)^n = alpha/2.
  n = 500
  p = 1 - 0.025 ** (1 / n)
  perfect = auditing.epsilon_clopper_pearson_at(np.ones(n), np.zeros(n), 0.5, DELTA, 0.05)
  np.testing.assert_allclose(perfect, math.log((1 - DELTA - p) / p), rtol=1e-9)
  # A useless test certifies nothing.
  assert auditing.epsilon_clopper_pearson_at(np.arange(n), np.arange(n), n / 2, DELTA, 0.05) == 0


def test_gaussian_trade_off_conversions_agree_with_the_accountant():
  for sigma in (0.5, 1.0, 2.0):
    accounted = accounting.compute_epsilon(sigma, 1.0, 1, DELTA)  # q = 1: the Gaussian mechanism
    np.testing.assert_allclose(auditing.epsilon_of_gdp(1 / sigma, DELTA), accounted, rtol=1e-6)
    # Two Gaussians of one std are the same Gaussian mechanism, either way round and at any scale.
    np.testing.assert_allclose(auditing.gaussian_pair_epsilon(5.0, 3 * sigma, 2.0, 3 * sigma,
                                                                 DELTA), accounted, rtol=1e-5)
    np.testing.assert_allclose(auditing.gaussian_pair_epsilon(2.0, sigma, 3.0, sigma, DELTA),
                               accounted, rtol=1e-5)
  # Nearly equal stds: no cancellation; unequal ones separate more than either std alone would.
  np.testing.assert_allclose(auditing.gaussian_pair_epsilon(1.0, 1.0, 0.0, 1.0 + 1e-9, DELTA),
                             accounting.compute_epsilon(1.0, 1.0, 1, DELTA), rtol=1e-5)
  assert (auditing.gaussian_pair_epsilon(1.0, 1.0, 0.0, 1.1, DELTA)
          > auditing.gaussian_pair_epsilon(1.0, 1.1, 0.0, 1.1, DELTA))
  assert auditing.gaussian_pair_epsilon(0.0, 1.0, 0.0, 1.0, DELTA) == 0.0


@pytest.mark.parametrize('sigma', [0.5, 2.0])
def test_bounds_on_gaussian_scores_stay_below_the_true_epsilon(sigma):
  """Scores of the Gaussian mechanism itself: every bound below its epsilon, the GDP one close."""
  true_eps = accounting.compute_epsilon(sigma, 1.0, 1, DELTA)
  in_scores, out_scores = _gaussian_scores(sigma, 20000, seed=1)
  gdp = auditing.gdp_bound(in_scores, out_scores, DELTA, 0.05)
  assert gdp.mu_lower < 1 / sigma < gdp.mu_upper, gdp
  assert 0.6 * true_eps < gdp.epsilon_lower < true_eps, (gdp, true_eps)
  assert 0 < auditing.epsilon_clopper_pearson(in_scores, out_scores, DELTA, 0.05) < true_eps
  one_in, one_out = _gaussian_scores(sigma, 1000, seed=2)  # one run of 1,000 canaries
  assert 0 < auditing.epsilon_one_run(one_in, one_out, DELTA, 0.05) < true_eps
  assert 0 < auditing.epsilon_one_run_fdp(one_in, one_out, DELTA, 0.05) < true_eps
  fit = auditing.epsilon_gaussian_fit(one_in, one_out, DELTA, num_bootstrap=50)
  assert fit.epsilon_low < fit.epsilon < fit.epsilon_high
  assert 0.5 * true_eps < fit.epsilon < 2 * true_eps, (fit, true_eps)


@pytest.mark.parametrize('noise_scale', [1.0, 0.5])
def test_noise_multiplier_estimate_recovers_the_executed_sigma_at_any_sampling_rate(noise_scale):
  """Per-round scores of a subsampled Gaussian mechanism (q = 0.05, 40 rounds, 1,000 canaries):
  the estimate finds the sigma it ran with, so an accountant fed half the noise it claims is seen."""
  sigma, q, rounds, k = 1.0, 0.05, 40, 1000
  rng = np.random.default_rng(4)
  signs = (rng.random(k) < 0.5).astype(float)  # Poisson: an out canary uploads nothing
  sampled = rng.random((rounds, k)) < q
  projections = sampled * signs + noise_scale * sigma * rng.normal(size=(rounds, k))
  estimate = auditing.noise_multiplier_estimate(projections, sampled, signs, num_bootstrap=100)
  assert estimate.low < noise_scale * sigma < estimate.high, estimate
  assert estimate.high / estimate.low < 1.3, estimate  # a usable estimate: about +-6 % here
  no_signal = auditing.noise_multiplier_estimate(projections - sampled * signs, sampled, signs,
                                                    num_bootstrap=20)
  assert no_signal.high > 5 * sigma, no_signal  # nothing moves towards the canaries


def test_without_noise_every_method_detects_the_canaries():
  in_scores, out_scores = _gaussian_scores(1e-3, 4000, seed=3)
  assert auditing.gdp_bound(in_scores, out_scores, DELTA, 0.05).epsilon_lower > 20
  assert auditing.epsilon_clopper_pearson(in_scores, out_scores, DELTA, 0.05) > 5
  one_in, one_out = in_scores[:500], out_scores[:500]
  assert auditing.epsilon_one_run(one_in, one_out, DELTA, 0.05) > 2.5
  assert auditing.epsilon_one_run_fdp(one_in, one_out, DELTA, 0.05) > 4
  assert auditing.epsilon_gaussian_fit(one_in, one_out, DELTA, num_bootstrap=20).epsilon > 50


def test_jax_privacy_epsilon_from_gdp_is_not_a_lower_bound_and_ours_is():
  """Why gdp_bound is written here: the library's |mu| reads the reversed test off upper bounds."""
  sigma = 2.0
  true_eps = accounting.compute_epsilon(sigma, 1.0, 1, DELTA)
  library, ours = 0, 0
  for seed in range(40):
    in_scores, out_scores = _gaussian_scores(sigma, 10000, seed=seed)
    auditor = jax_privacy_auditing.CanaryScoreAuditor(in_scores, out_scores)
    library += auditor.epsilon_from_gdp(0.05, DELTA) > true_eps
    gdp = auditing.gdp_bound(in_scores, out_scores, DELTA, 0.05, seed=seed)
    ours += gdp.epsilon_lower > true_eps
  assert library >= 10, library  # 95 % confidence claimed; measured 18 of 40 above the truth
  assert ours <= 2, ours          # at most alpha/2 expected


# --- the harness ----------------------------------------------------------------------------------


def test_canary_directions_are_orthonormal_and_limited_by_the_dimension():
  directions = canaries.canary_directions(jax.random.key(0), 300, 40)
  np.testing.assert_allclose(directions @ directions.T, np.eye(40), atol=1e-5)
  with pytest.raises(ValueError, match='cannot be orthogonal'):
    canaries.canary_directions(jax.random.key(0), 30, 40)


def test_audit_keys_are_distinct_streams():
  streams = keys.audit_keys(0, 3)
  data = [jax.random.key_data(k).tobytes() for k in
          (streams.directions, streams.inclusion, *streams.runs)]
  assert len(set(data)) == len(data)


@dataclasses.dataclass(frozen=True)
class HalfNoiseMechanism(DPMechanism):
  """A broken mechanism: it adds half the noise its accountant (noise_multiplier) assumes."""

  @property
  def noise_std(self) -> float:
    return 0.5 * super().noise_std


@functools.lru_cache(maxsize=None)
def _experiment(sigma, broken=False):
  # One local step per epoch: the audit depends on clipping, sampling and noise, not on training.
  exp = train.build_experiment(tiny_config(**{
      'dp.noise_multiplier': sigma, 'dp.delta': DELTA, 'sampling_rate': 1.0, 'num_rounds': 1,
      'local.batch_size': 256}))
  if broken:
    mechanism = HalfNoiseMechanism(**{f.name: getattr(exp.mechanism, f.name)
                                      for f in dataclasses.fields(exp.mechanism)})
    exp = dataclasses.replace(exp, round_config=dataclasses.replace(exp.round_config,
                                                                    mechanism=mechanism))
  return exp


def test_canary_clients_join_the_federation_and_its_accounting():
  exp = _experiment(1.0, broken=True)
  audited = canaries.with_canary_clients(exp, 7)
  assert audited.data.num_clients == exp.data.num_clients + 7 == audited.mechanism.num_clients
  assert type(audited.mechanism) is HalfNoiseMechanism  # a broken mechanism stays broken
  np.testing.assert_array_equal(audited.data.train_count[-7:],
                                exp.data.train_count[np.arange(7) % exp.data.num_clients])
  assert audited.epsilon_after(1) == exp.epsilon_after(1)  # Poisson: epsilon does not depend on N


def test_a_canary_uploads_its_vector_even_when_its_own_training_diverges():
  """Canaries train on copies of real clients' data; one that diverges still uploads C v_i (the
  adversary controls its upload), instead of the zero a diverged client uploads."""
  exp = train.build_experiment(tiny_config(**{
      'dp.noise_multiplier': 0.02, 'dp.accountant': 'rdp',  # PLD takes minutes at sigma this small
      'dp.delta': DELTA, 'sampling_rate': 1.0, 'num_rounds': 1, 'local.batch_size': 256}))
  audited = canaries.with_canary_clients(exp, 20)
  x = audited.data.train_x.astype(jnp.float32)
  audited = dataclasses.replace(audited, data=audited.data.replace(
      # every canary's training diverges (canaries' rows follow the real clients' ones)
      train_x=x.at[int(exp.data.train_offsets[-1]):].set(jnp.nan)))
  scores = canaries.audit_scores(audited, canaries.AuditSettings(num_trials=1, num_canaries=20))
  projections, included = scores.projections[0, 0], scores.included[0]
  assert included.any() and not included.all()
  np.testing.assert_allclose(projections[included], 1.0, atol=0.1)  # noise std 0.02
  np.testing.assert_allclose(projections[~included], 0.0, atol=0.1)


def test_audit_of_the_real_round_step_is_below_and_close_to_the_accounted_epsilon():
  result = canaries.run_audit(_experiment(1.0), canaries.AuditSettings(num_trials=8, num_canaries=500))
  assert result.epsilon_accounted == pytest.approx(4.377, abs=0.01)
  assert not result.exceeded(), result
  assert all(value > 0 for value in result.bounds().values()), result
  assert result.best_bound == result.epsilon_gdp_lower >= 0.6 * result.epsilon_accounted, result
  assert result.gdp_mu_lower < 1.0 < result.gdp_mu_upper, result  # mu = 1 / sigma
  # The one-run estimate (500 canaries) is no bound, but its interval holds the accounted epsilon.
  fit = (result.epsilon_gaussian_fit_low, result.epsilon_gaussian_fit_high)
  assert fit[0] < result.epsilon_accounted < fit[1], result
  # So does the white-box estimate of the executed sigma, and the epsilon it implies.
  sigma = (result.noise_multiplier_estimate_low, result.noise_multiplier_estimate_high)
  assert sigma[0] < 1.0 < sigma[1], result
  noise = (result.epsilon_noise_estimate_low, result.epsilon_noise_estimate_high)
  assert noise[0] < result.epsilon_accounted < noise[1], result


def _white_box_mu_range(mechanism_name, sigma, rounds, bands):
  """(lowest, highest) GDP mu of a canary's white-box score at q b = 1 (banded) or one round an
  epoch of two (tree), from the strategy alone. banded (the matched filter of C U): ||C s|| / sigma
  for the canary's rounds s, C from jax_privacy's optimiser -- sqrt(2) / sigma for groups whose
  columns are whole, less for the one whose last column is cut off at T; tree (the prefix sum):
  each epoch's sum carries one node's noise, so sqrt(epochs) / sigma for every canary."""
  if mechanism_name == 'tree':
    return (math.sqrt(rounds / 2) / sigma,) * 2
  from jax_privacy.matrix_factorization import toeplitz
  coefs = np.asarray(toeplitz.optimize_banded_toeplitz(rounds, bands), np.float64)
  coefs /= np.linalg.norm(coefs)
  strategy = sum(c * np.eye(rounds, k=-j) for j, c in enumerate(coefs))
  mus = [np.linalg.norm(strategy[:, group::bands].sum(axis=1)) / sigma for group in range(bands)]
  return min(mus), max(mus)


@pytest.mark.parametrize('mechanism_name', ['banded', 'tree'])
def test_audit_of_correlated_noise_stays_below_the_accounted_epsilon(mechanism_name):
  """The audit with each correlated mechanism, at the rates where its accountant claims a Gaussian
  (BandMF's within-group rate q b = 1; the tree claims no amplification): the GDP bound is
  computed and below the accounted epsilon, and its mu interval meets the scores' mu. Under BandMF
  the matched filter's mu is the accounted one (so the audit comes close); the tree's prefix-sum
  score sees sqrt(2) less than its accountant's worst case L = 2 nodes a round."""
  sigma, rounds, bands = 1.0, 4, 2
  exp = train.build_experiment(tiny_config(**{
      'dp.noise_multiplier': sigma, 'dp.delta': DELTA, 'sampling_rate': 0.5, 'num_rounds': rounds,
      'local.batch_size': 256, 'dp.noise_mechanism': mechanism_name, 'dp.num_bands': bands}))
  result = canaries.run_audit(exp, canaries.AuditSettings(num_trials=3, num_canaries=500,
                                                    num_rounds=rounds))
  # Accounted mu: two Gaussians of sigma / ||c|| (banded), two epochs of sigma / sqrt(2) (tree).
  accounted_mu = math.sqrt(2) / sigma if mechanism_name == 'banded' else 2 / sigma
  assert result.epsilon_accounted == pytest.approx(
      dp_accounting.get_epsilon_gaussian(1 / accounted_mu, DELTA), rel=1e-2)
  assert not result.exceeded(), result
  assert result.best_bound == result.epsilon_gdp_lower > 0, result
  low, high = _white_box_mu_range(mechanism_name, sigma, rounds, bands)
  assert high <= accounted_mu + 1e-9
  assert result.gdp_mu_lower < high and low < result.gdp_mu_upper, result
  if mechanism_name == 'banded':
    assert result.epsilon_gdp_lower >= 0.6 * result.epsilon_accounted, result


def test_negative_control_half_the_noise_is_caught():
  """The proof the audit can fail: the same audit of a round step with half the accounted noise."""
  result = canaries.run_audit(_experiment(1.0, broken=True),
                           canaries.AuditSettings(num_trials=2, num_canaries=500))
  assert result.epsilon_accounted == pytest.approx(4.377, abs=0.01)  # what the accountant claims
  assert 'epsilon_gdp_lower' in result.exceeded(), result
  assert result.gdp_mu_lower > 1.0, result  # the executed mechanism has mu = 2
  assert result.noise_multiplier_estimate_high < 0.75, result  # it ran with sigma 0.5, not 1
  assert result.epsilon_noise_estimate_low > result.epsilon_accounted, result


def test_one_run_estimates_along_the_run():
  """Estimates after every round of one run, each against the epsilon accounted by then."""
  exp = train.build_experiment(tiny_config(**{
      'dp.noise_multiplier': 1.0, 'dp.delta': DELTA, 'sampling_rate': 0.5, 'num_rounds': 3,
      'local.batch_size': 256}))
  result = canaries.run_audit(exp, canaries.AuditSettings(num_trials=1, num_canaries=300, num_rounds=3,
                                                    estimate_every=1))
  assert [e.round for e in result.along_run] == [1, 2, 3]
  accounted = [e.epsilon_accounted for e in result.along_run]
  assert accounted == sorted(accounted) and accounted[-1] == result.epsilon_accounted
  assert accounted[0] == pytest.approx(exp.epsilon_after(1))
  assert result.along_run[-1].noise_multiplier == result.noise_multiplier_estimate
  for e in result.along_run:
    assert e.noise_multiplier_low < e.noise_multiplier < e.noise_multiplier_high, e
    assert e.epsilon_one_run < e.epsilon_accounted, e
  table = result.along_run_table().splitlines()
  assert len(table) == 2 + 3 and table[2].startswith('| 1 | ')


def test_audit_config_and_table_grid_validate():
  from experiments.configs import audit as audit_config
  for entry in audit_config.audit_grid():
    config = audit_config.get_config(sweep.arg_string(entry))
    config_lib.validate_config(config, set(METHODS))
    settings = canaries.AuditSettings.from_config(config)
    assert settings.num_rounds == config.num_rounds == entry.get('rounds', 1)
    assert config.dp.noise_multiplier == entry['sigma'] and config.dp.delta == DELTA
  with pytest.raises(ValueError, match='unknown config argument'):
    audit_config.get_config('eps=1')
  bad = audit_config.get_config(None)
  bad.audit.num_rounds = 3
  with pytest.raises(ValueError, match='config.num_rounds'):
    canaries.AuditSettings.from_config(bad)


def test_the_default_experiments_audit_is_the_default_experiment_plus_canaries():
  from experiments.configs import audit_default
  from experiments.configs import default
  config = audit_default.get_config('method=centaur,every=5')
  config_lib.validate_config(config, set(METHODS))
  settings = canaries.AuditSettings.from_config(config)
  assert settings.estimate_rounds() == [5, 10, 15, 20, 25, 30, 35, 40]
  assert (settings.num_trials, settings.num_canaries) == (1, 1000)
  plain = default.get_config('method=centaur')
  del config['audit']
  assert config.to_dict() == plain.to_dict()


def test_importing_the_audit_binary_defines_no_flags():
  from absl import flags
  import experiments.audit  # noqa: F401
  assert 'table' not in flags.FLAGS


def test_private_mask_methods_release_exactly_zero_for_an_empty_cohort():
  """One of the leaks the epsilon_caveat of fed_smp_topk / dp_pfeddsu covers (docs/privacy.md); the
  public rand-k mask is noised even then (tests/test_methods.py)."""
  exp = train.build_experiment(tiny_config(method='fed_smp_topk', sampling_rate=1e-9))
  state0 = exp.init_state()
  state, metrics = jax.jit(exp.make_round_step())(state0, exp.data, exp.root_key)
  assert int(metrics['cohort_size']) == 0
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               state.shared, state0.shared)
  assert 'released without noise' in exp.privacy_caveat


def test_banded_white_box_score_uses_the_public_schedule_not_who_was_sampled():
  """Under BandMF at q b < 1 who was sampled is secret: the score must not change with it (it reads
  the canary's group rounds); at q b = 1 that schedule is exactly who was sampled."""
  rounds, k, trials, bands = 6, 5, 4, 2
  mechanism = DPMechanism(BandMF.for_run(10, 0.25, rounds, bands), clip_norm=1.0,
                          noise_multiplier=1.0)
  rng = np.random.default_rng(0)
  group = rng.integers(0, bands, (trials, 1, k))
  scheduled = np.arange(rounds)[None, :, None] % bands == group
  projections = rng.normal(size=(trials, rounds, k))
  included = np.ones((trials, k), bool)
  scores = lambda sampled: canaries.white_box_scores(mechanism, canaries.CanaryScores(
      projections, projections, sampled, included, np.ones((trials, k)), scheduled))
  everyone = scores(scheduled)
  for _ in range(3):
    np.testing.assert_array_equal(scores(scheduled & (rng.random(scheduled.shape) < 0.5)), everyone)
  # The matched filter itself: <C p, C s> / ||C s|| with s the schedule (q b = 1: the sampled rounds).
  c = sum(coef * np.eye(rounds, k=-j) for j, coef in enumerate(mechanism.noise.strategy))
  p, s = projections[1, :, 2], scheduled[1, :, 2].astype(float)
  np.testing.assert_allclose(everyone[1, 2], (c @ p) @ (c @ s) / np.linalg.norm(c @ s), rtol=1e-12)


def test_the_three_seed_audit_says_what_its_records_show():
  """docs/privacy.md section 5's sentences about its generated block (experiments/report/privacy_tables.py),
  held to the committed records: sigma-hat is unbiased, its seeds spread about twice as much as on
  ideal scores, and no lower bound reaches the accounted epsilon."""
  records = privacy_tables.load_records(str(pathlib.Path(__file__).resolve().parent.parent))
  ends = [r['along_run'][-1] for r in records]
  assert len(records) == 3 and all(e['round'] == r['num_rounds'] == 40 for r, e in zip(records, ends))
  executed = records[0]['noise_multiplier']
  sigmas = np.array([e['noise_multiplier'] for e in ends])
  assert abs(sigmas.mean() / executed - 1) < 0.02
  accounted = np.mean([e['epsilon_accounted'] for e in ends])
  assert accounted == pytest.approx(2.0, abs=0.005)
  assert abs(np.mean([e['epsilon_noise_estimate'] for e in ends]) - accounted) < 0.1
  ideal = privacy_tables.ideal_spread(executed, 40, records[0]['num_canaries'], records[0]['sampling_rate'],
                                    seeds=20)
  assert 1.5 < sigmas.std(ddof=1) / ideal.std < 3.0  # "about twice"
  bounds = [max(r['epsilon_clopper_pearson'], e['epsilon_one_run']) for r, e in zip(records, ends)]
  assert max(bounds) < accounted


def test_sigma_hat_is_unbiased_and_its_interval_covers_on_ideal_scores():
  """The generator's ideal-score reference at the default audit's T, k, q and sigma: the
  estimator is unbiased and its nominal 95 % interval holds sigma in about 95 % of the seeds."""
  sigma = 0.634
  ideal = privacy_tables.ideal_spread(sigma, 40, 1000, 0.02, seeds=30)
  assert abs(ideal.mean - sigma) < 3 * ideal.std / math.sqrt(ideal.seeds)
  assert 0.85 <= ideal.coverage <= 1.0
