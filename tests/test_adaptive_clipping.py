"""Adaptive clipping (Andrew et al. 2021; privacy/clip_rules.py, docs/privacy.md section 8): the
update's direction, quantile tracking, the count's noise, the pair's accounting as one Gaussian
(against a brute-force computation and dp_accounting), calibration, the refusals, and the clip norm
as server state (round step, train_metrics.jsonl, resume bit for bit)."""

from __future__ import annotations

import json
import math

import chex
import dp_accounting
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, stats

from conftest import tiny_config
from dp2fedsam_jax import canaries, checkpoint, keys, train
from dp2fedsam_jax.config import ConfigError, validate_config
from dp2fedsam_jax.privacy.clip_rules import AdaptiveClip
from dp2fedsam_jax.privacy.mechanism import DPMechanism
from dp2fedsam_jax.privacy.noise_mechanisms import Independent
from dp2fedsam_jax.federated_round import make_round_step


def _adaptive(**overrides):
  return tiny_config(**{'dp.clipping': 'adaptive', **overrides})


# ------------------------------------------------------------------ the clip norm's update
def test_clip_norm_shrinks_when_every_client_is_unclipped_and_grows_when_every_one_is_clipped():
  rule = AdaptiveClip(target_quantile=0.5, clip_lr=0.2, count_noise_std=0.0)
  key, c = jax.random.key(0), jnp.float32(1.0)
  cohort = jnp.int32(8)
  all_in = rule.next_state(key, c, jnp.int32(8), cohort, 8.0)
  none_in = rule.next_state(key, c, jnp.int32(0), cohort, 8.0)
  np.testing.assert_allclose(all_in, math.exp(-0.2 * 0.5), rtol=1e-6)   # b~ = 1: C exp(-eta/2)
  np.testing.assert_allclose(none_in, math.exp(0.2 * 0.5), rtol=1e-6)   # b~ = 0: C exp(+eta/2)


@pytest.mark.parametrize('quantile', [0.2, 0.5, 0.8])
def test_noiseless_tracking_leaves_the_target_quantile_of_known_norms_unclipped(quantile):
  norms = jnp.asarray(np.random.default_rng(0).lognormal(0.0, 1.0, 200), jnp.float32)
  rule = AdaptiveClip(target_quantile=quantile, clip_lr=0.2, count_noise_std=0.0)
  key, c = jax.random.key(0), jnp.float32(100.0)  # far above every norm at the start
  fractions = []
  for _ in range(150):
    unclipped = jnp.sum(norms <= c, dtype=jnp.int32)
    fractions.append(float(unclipped) / norms.size)
    c = rule.next_state(key, c, unclipped, jnp.int32(norms.size), float(norms.size))
  # The last 50 rounds oscillate around the quantile by steps of eta/2 in log C.
  assert abs(np.mean(fractions[-50:]) - quantile) < 0.05, np.mean(fractions[-50:])


def test_the_clip_norm_moves_by_the_noised_count_with_std_s_b_over_m():
  """b~ = (unclipped - |S|/2 + N(0, s_b^2)) / m + 1/2 and C' = C exp(-eta (b~ - gamma)): recovered
  from C' over 4,000 keys, b~ has the mean of the exact fraction and std s_b / m (an un-noised count,
  or a C moved by the un-noised count, has std 0)."""
  rule = AdaptiveClip(target_quantile=0.5, clip_lr=0.2, count_noise_std=2.0)
  unclipped, cohort, divisor = jnp.int32(3), jnp.int32(5), 4.0
  draws = jax.random.split(jax.random.key(1), 4000)
  c = jnp.float32(0.7)
  new = jax.vmap(lambda k: rule.next_state(k, c, unclipped, cohort, divisor))(draws)
  fraction = 0.5 - np.log(np.asarray(new, np.float64) / 0.7) / 0.2
  exact = (3 - 2.5) / 4 + 0.5
  assert abs(fraction.mean() - exact) < 4 * 0.5 / math.sqrt(4000)
  np.testing.assert_allclose(fraction.std(), 2.0 / 4.0, rtol=0.05)
  released = jax.vmap(lambda k: rule.noised_unclipped_fraction(k, unclipped, cohort, divisor))(draws)
  np.testing.assert_allclose(fraction, released, atol=1e-4)  # C moves by the released fraction


# ------------------------------------------------------------------ accounting
def _mechanism(sigma, count_noise_std, q=1.0, clip_norm=0.3):
  return DPMechanism(Independent(100, q), clip_norm=clip_norm, noise_multiplier=sigma, delta=1e-5,
                     clipping=AdaptiveClip(0.5, 0.2, count_noise_std))


def _gaussian_epsilon(mu, delta):
  """Exact epsilon of a Gaussian mechanism whose neighbours' means lie mu noise stds apart."""
  def delta_at(eps):
    return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
  return optimize.brentq(lambda eps: delta_at(eps) - delta, 0.0, 100.0)


def test_one_round_of_the_pair_is_the_two_dimensional_gaussian_computed_by_hand():
  """q = 1, T = 1, no library: the release (sum + N(0, (s C)^2), count + N(0, s_b^2)) of neighbours
  differs by at most (C, 1/2) -- a removed client takes its clipped update and its centred bit
  b - 1/2 = +-1/2 -- so it is a Gaussian with mu = ||(C / (s C), (1/2) / s_b)||; its exact epsilon must
  be the accountant's."""
  mech = _mechanism(sigma=1.0, count_noise_std=0.6)
  mu = math.hypot(mech.clip_norm / mech.noise_std, 0.5 / mech.clipping.count_noise_std)
  np.testing.assert_allclose(mech.epsilon(1), _gaussian_epsilon(mu, 1e-5), rtol=2e-3)
  np.testing.assert_allclose(mech.effective_noise_multiplier, 1 / mu, rtol=1e-12)


def test_the_pair_composes_as_two_gaussians_in_dp_accounting():
  """q = 1, three rounds: the PLD of the two Gaussians (sum at s, count at 2 s_b) composed in every
  round equals the PLD of the mechanism's one Gaussian; sampled (q < 1), the pair costs more than the
  update's Gaussian alone."""
  sigma, count_std, rounds = 1.3, 0.8, 3
  mech = _mechanism(sigma, count_std)
  pair = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(sigma),
                                        dp_accounting.GaussianDpEvent(2 * count_std)])
  accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  expected = accountant.compose(dp_accounting.SelfComposedDpEvent(pair, rounds)).get_epsilon(1e-5)
  np.testing.assert_allclose(mech.epsilon(rounds), expected, rtol=2e-3)
  sampled = _mechanism(sigma, count_std, q=0.1)
  fixed = DPMechanism(Independent(100, 0.1), clip_norm=0.3, noise_multiplier=sigma, delta=1e-5)
  assert sampled.epsilon(rounds) > 1.05 * fixed.epsilon(rounds)
  np.testing.assert_allclose(sampled.epsilon(rounds),
                             fixed.with_noise(sampled.effective_noise_multiplier).epsilon(rounds))


def test_a_target_epsilon_calibrates_the_pair_and_derives_the_updates_sigma():
  config = _adaptive(num_rounds=20, **{'dp.noise_multiplier': None, 'dp.target_epsilon': 2.0,
                                       'dp.count_noise_multiplier': 2.0, 'dp.delta': 1e-3})
  mech = DPMechanism.from_config(config, config.num_clients)
  effective = mech.effective_noise_multiplier
  np.testing.assert_allclose(mech.noise_multiplier, (effective ** -2 - 4.0 ** -2) ** -0.5, rtol=1e-9)
  assert 0.99 * 2.0 < mech.epsilon(20) <= 2.0
  config.dp.count_noise_multiplier = 0.1  # 2 s_b below the combined multiplier: out of reach
  with pytest.raises(ConfigError, match=r'^config\.dp\.count_noise_multiplier=0\.1: .* set '):
    DPMechanism.from_config(config, config.num_clients)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize('field, value', [
    ('dp.target_quantile', 0.0), ('dp.target_quantile', 1.0), ('dp.clip_lr', -0.1),
    ('dp.count_noise_multiplier', -1.0), ('dp.initial_clip_norm', 0.0),
    ('dp.initial_clip_norm', -2.0)])
def test_a_bad_adaptive_field_is_refused_naming_it(field, value):
  with pytest.raises(ConfigError, match='^config.' + field.replace('.', r'\.') + '='):
    validate_config(_adaptive(**{field: value}))


@pytest.mark.parametrize('field, value, fix', [
    ('dp.noise_mechanism', 'banded', '--config.dp.noise_mechanism=independent'),
    ('dp.noise_mechanism', 'tree', '--config.dp.noise_mechanism=independent'),
    ('dp.noise_placement', 'distributed', '--config.dp.noise_placement=central')])
def test_correlated_noise_and_distributed_placement_are_refused_with_the_fix(field, value, fix):
  with pytest.raises(ConfigError) as error:
    validate_config(_adaptive(**{field: value, 'dp.num_bands': 2}))
  message = str(error.value)
  assert message.startswith(f'config.{field}={value!r}') and fix in message and '\n' not in message


# ------------------------------------------------------------------ the clip norm as server state
def test_the_round_step_clips_to_the_state_and_moves_it_by_the_rounds_noised_count():
  exp = train.build_experiment(_adaptive(
      sampling_rate=1.0, **{'dp.initial_clip_norm': 0.3, 'dp.count_noise_multiplier': 1.5}))
  state = exp.init_state()
  np.testing.assert_array_equal(state.clip_state, np.float32(0.3))
  new, metrics = jax.jit(exp.make_round_step())(state, exp.data, exp.root_key)
  assert float(metrics['clip_norm']) == pytest.approx(0.3)
  cohort = int(metrics['cohort_size'])
  unclipped = round(cohort * (1.0 - float(metrics['clipped_fraction'])))  # no client diverged
  assert int(metrics['nonfinite_clients']) == 0
  expected = exp.mechanism.clipping.next_state(
      keys.round_keys(exp.root_key, 0).count_noise, state.clip_state, jnp.int32(unclipped),
      jnp.int32(cohort), exp.mechanism.denominator(cohort))
  np.testing.assert_allclose(new.clip_state, expected, rtol=1e-6)
  noiseless = 0.3 * math.exp(-0.2 * (unclipped / cohort - 0.5))
  assert abs(float(new.clip_state) - noiseless) > 1e-4  # the count was noised


def test_a_diverged_client_reports_the_bit_of_the_zero_it_uploads():
  """Client 2's training diverges (NaN data) under a clip norm every finite update fits: it moves C
  as the same client uploading an honest zero does, unclipped (count = cohort), not as clipped."""
  exp = train.build_experiment(_adaptive(
      sampling_rate=1.0, **{'dp.delta': 0.1, 'dp.initial_clip_norm': 1e6}))
  state = exp.init_state()
  float_data = exp.data.replace(train_x=exp.data.train_x.astype(jnp.float32))
  rows = slice(*np.asarray(exp.data.train_offsets[2:4]))  # client 2's examples
  poisoned = float_data.replace(train_x=float_data.train_x.at[rows].set(jnp.nan))
  zero_hook = lambda cid, d: jax.tree.map(lambda x: jnp.where(cid == 2, 0.0, x), d)
  zero_step = make_round_step(exp.spec, exp.model, exp.local_config, exp.round_config,
                              update_hook=zero_hook)
  nan_state, nan_metrics = jax.jit(exp.make_round_step())(state, poisoned, exp.root_key)
  zero_state, zero_metrics = jax.jit(zero_step)(state, float_data, exp.root_key)
  assert int(nan_metrics['nonfinite_clients']) == 1 and int(zero_metrics['nonfinite_clients']) == 0
  cohort = int(nan_metrics['cohort_size'])
  next_clip = lambda unclipped: exp.mechanism.clipping.next_state(
      keys.round_keys(exp.root_key, 0).count_noise, state.clip_state, jnp.int32(unclipped),
      jnp.int32(cohort), exp.mechanism.denominator(cohort))
  np.testing.assert_allclose(zero_state.clip_state, next_clip(cohort), rtol=1e-6)
  np.testing.assert_array_equal(nan_state.clip_state, zero_state.clip_state)
  assert abs(float(next_clip(cohort - 1)) - float(nan_state.clip_state)) > 1e-3  # one bit shows


def test_the_clip_norm_is_checkpointed_and_a_resumed_run_repeats_it_bit_for_bit(tmp_path):
  exp = train.build_experiment(_adaptive(**{'dp.count_noise_multiplier': 0.5}))
  step = jax.jit(exp.make_round_step())
  state, resumed = exp.init_state(), None
  for r in range(4):
    if r == 2:
      checkpoint.save(str(tmp_path), state, [])
      resumed, _ = checkpoint.restore(str(tmp_path), exp.init_state())
    state, _ = step(state, exp.data, exp.root_key)
    if resumed is not None:
      resumed, _ = step(resumed, exp.data, exp.root_key)
  assert float(state.clip_state) != 1.0
  chex.assert_trees_all_equal(resumed, state)


def test_clip_norm_is_written_every_round_with_the_count_noise_as_run(tmp_path):
  train.train_and_evaluate(_adaptive(num_rounds=3, eval_every=3), str(tmp_path))
  with open(tmp_path / 'train_metrics.jsonl') as f:
    norms = [json.loads(line)['clip_norm'] for line in f]
  assert len(norms) == 3 and norms[0] == pytest.approx(1.0) and len(set(norms)) == 3
  with open(tmp_path / 'config.json') as f:  # unset: the expected cohort q N = 3, over 20
    assert json.load(f)['dp']['count_noise_multiplier'] == pytest.approx(3 / 20)


def test_dry_run_shows_both_noise_parts_and_the_one_they_make():
  info = train.describe(_adaptive(**{'dp.count_noise_multiplier': 0.75}))
  assert info['clipping'] == 'adaptive' and info['count_noise_multiplier'] == 0.75
  np.testing.assert_allclose(info['effective_noise_multiplier'], (1.0 + 1.5 ** -2) ** -0.5)
  assert 'clipping' not in train.describe(tiny_config())


def test_the_audit_with_adaptive_clipping_stays_below_the_pairs_accounted_epsilon():
  """Canaries through the real round step with C moving (every canary is clipped, so C grows): at
  q = 1 the white-box score (each round's projection over its own C_t) sees the update's Gaussian,
  mu = sqrt(T) / sigma, below the pair's accounted sqrt(T) / sigma_eff; no bound exceeds the
  accounted epsilon, and the GDP mu interval meets the update's mu."""
  sigma, rounds = 1.0, 2
  exp = train.build_experiment(_adaptive(**{
      'dp.noise_multiplier': sigma, 'dp.count_noise_multiplier': 0.5, 'dp.delta': 1e-5,
      'sampling_rate': 1.0, 'num_rounds': rounds, 'local.batch_size': 256}))
  result = canaries.run_audit(exp, canaries.AuditSettings(num_trials=2, num_canaries=500,
                                                          num_rounds=rounds))
  assert result.epsilon_accounted == pytest.approx(
      dp_accounting.get_epsilon_gaussian(1 / (math.sqrt(rounds) / 0.5 ** 0.5), 1e-5), rel=1e-2)
  assert not result.exceeded(), result
  assert result.gdp_mu_lower < math.sqrt(rounds) / sigma < result.gdp_mu_upper, result
  assert 'adaptive' in result.row()


@flax.struct.dataclass
class _StateBeforeClipState:
  """ServerState as checkpoints written before adaptive clipping hold it (no clip_state)."""
  round: jax.Array
  shared: object
  personal: object
  times_sampled: jax.Array
  noise_state: object = ()
  server_opt_state: object = ()


def test_a_checkpoint_written_before_clip_state_existed_resumes_with_a_fixed_c(tmp_path):
  exp = train.build_experiment(tiny_config())
  state = exp.init_state().replace(round=jnp.int32(3))
  old = _StateBeforeClipState(state.round, state.shared, state.personal, state.times_sampled)
  checkpoint.save(str(tmp_path), old, [{'round': 3}])
  restored = checkpoint.restore_run(str(tmp_path), exp.init_state())
  chex.assert_trees_all_equal(restored.state, state)
  assert restored.records == [{'round': 3}] and restored.state.clip_state == ()
  adaptive = train.build_experiment(_adaptive()).init_state()  # C_t cannot be made up: refused
  with pytest.raises(checkpoint.CheckpointError, match='clip_state'):
    checkpoint.restore_run(str(tmp_path), adaptive)


def test_at_q_below_one_the_noise_is_sigma_c_t_and_the_count_is_over_valid_slots_and_the_public_m():
  """q < 1 (padded cohort slots exist) and C_t = 4 C_0 in the state: every client uploads zero (a
  hook), so the released change of the shared part is server_lr * noise / m, whose std over all
  coordinates must be sigma C_t / m, with m = q N from the config (not sigma C_0, not |S|); and C
  moves by the noised count of the |S| sampled clients' bits (all unclipped: |S|, not the capacity)
  over m, recomputed in float64 from the round's count-noise draw."""
  sigma, s_b, c0, lr, q, n = 1.0, 0.5, 0.2, 0.5, 0.3, 10
  exp = train.build_experiment(_adaptive(
      method='dp_fedavg', num_clients=n, sampling_rate=q, cohort_capacity=n, seed=3,
      **{'dp.noise_multiplier': sigma, 'dp.count_noise_multiplier': s_b, 'dp.clip_norm': c0,
         'dp.clip_lr': lr}))
  c_t = 4.0 * c0
  state = exp.init_state().replace(clip_state=jnp.float32(c_t))
  zero_hook = lambda cid, d: jax.tree.map(jnp.zeros_like, d)
  step = make_round_step(exp.spec, exp.model, exp.local_config, exp.round_config,
                         update_hook=zero_hook)
  new, metrics = jax.jit(step)(state, exp.data, exp.root_key)
  cohort, m = int(metrics['cohort_size']), q * n
  assert exp.config.server_lr == 1.0 and exp.config.server_optimizer == 'sgd'
  assert 0 < cohort < exp.round_config.capacity and cohort != m  # padded slots; |S| differs from m
  change = np.concatenate([np.ravel(np.asarray(b, np.float64) - np.asarray(a, np.float64))
                           for a, b in zip(jax.tree.leaves(state.shared), jax.tree.leaves(new.shared))])
  assert change.size > 2000
  # The server step is phi + server_lr * sum / m (server_lr = 1 here); 5 std errors of a std.
  np.testing.assert_allclose(change.std(), sigma * c_t / m, rtol=5 / math.sqrt(2 * change.size))
  assert abs(change.mean()) < 5 * sigma * c_t / m / math.sqrt(change.size)
  z = float(jax.random.normal(keys.round_keys(exp.root_key, 0).count_noise, (), jnp.float32))
  fraction = (cohort - 0.5 * cohort + s_b * z) / m + 0.5  # every bit 1: zero updates are unclipped
  expected = c_t * math.exp(-lr * (fraction - 0.5))
  np.testing.assert_allclose(float(new.clip_state), expected, rtol=1e-5)


@pytest.mark.parametrize('mechanism', ['banded', 'tree'])
def test_sigma_eff_is_applied_once_on_the_correlated_mechanisms_event_path(mechanism, monkeypatch):
  """The correlated mechanisms account through an event function of sigma; with a clip rule whose
  pair multiplier differs from sigma (adaptive clipping, refused with them today), epsilon must be
  that of the event at sigma_eff, and calibration must return the update's sigma whose sigma_eff
  meets the target -- not sigma_eff applied twice."""
  monkeypatch.setattr(AdaptiveClip, 'check', staticmethod(lambda **unused: None))
  config = _adaptive(num_clients=100, sampling_rate=0.1, num_rounds=20,
                     **{'dp.noise_mechanism': mechanism, 'dp.num_bands': 2, 'dp.delta': 1e-5,
                        'dp.noise_multiplier': 2.0, 'dp.count_noise_multiplier': 2.0})
  mech = DPMechanism.from_config(config, config.num_clients)
  effective = mech.effective_noise_multiplier
  assert effective < 0.95 * mech.noise_multiplier
  expected = mech.noise.epsilon(effective, 20, 1e-5, 'pld',
                                lambda s: mech.noise.dp_event(s, 20))
  np.testing.assert_allclose(mech.epsilon(20), expected, rtol=1e-9)
  sigma = mech.calibrate(5.0, 20)
  assert 0.98 * 5.0 < mech.with_noise(sigma).epsilon(20) <= 5.0
