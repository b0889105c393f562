"""The DP mechanism object: what the accountant composes is what the round step executes.

The oracles here take q, N and sigma from the experiment's RoundConfig and the accounted event, never
from the mechanism's own helpers (noise_std, denominator), so a wrong helper cannot vouch for itself.
"""

import dp_accounting
import jax
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import train
from dp2fedsam_jax.algorithms import METHODS

# Each sampler with each placement at least once (the placement does not enter the accounted event).
SETTINGS = [('poisson', 'central'), ('poisson', 'distributed'), ('fixed', 'distributed')]


def _build(sampling, placement, **overrides):
  fields = {'dp.sampling': sampling, 'dp.noise_placement': placement, 'dp.noise_multiplier': 0.8,
            'dp.clip_norm': 0.5, 'dp.delta': 1e-3}
  if sampling == 'fixed':
    fields['dp.accountant'] = 'rdp'
  fields.update(overrides)
  return train.build_experiment(tiny_config(num_clients=10, sampling_rate=0.5, **fields))


@pytest.mark.parametrize('sampling,placement', [('poisson', 'central'), ('fixed', 'distributed')])
def test_epsilon_is_dp_accountings_composition_of_the_mechanisms_event(sampling, placement):
  exp = _build(sampling, placement)
  mech = exp.mechanism
  event = mech.dp_event(7)
  assert isinstance(event, dp_accounting.SelfComposedDpEvent) and event.count == 7
  one = event.event
  if sampling == 'poisson':
    assert isinstance(one, dp_accounting.PoissonSampledDpEvent)
    assert one.sampling_probability == exp.config.sampling_rate
    assert one.event.noise_multiplier == exp.mechanism.noise_multiplier
    accountant = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)
  else:
    assert isinstance(one, dp_accounting.SampledWithoutReplacementDpEvent)
    assert one.source_dataset_size == 10 and one.sample_size == 5
    assert one.event.noise_multiplier == exp.mechanism.noise_multiplier / 2  # replace-one: 2C
    accountant = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  np.testing.assert_allclose(accountant.compose(event).get_epsilon(1e-3),
                             mech.epsilon(7, 1e-3, exp.config.dp.accountant), rtol=1e-3)
  assert exp.epsilon_after(7) == mech.epsilon(7, 1e-3, exp.config.dp.accountant)


def _zero_update_experiment(sampling, placement, **overrides):
  """dp_fedavg with no local epochs: every update is exactly 0, so the release is the noise alone."""
  fields = {'method': 'dp_fedavg', 'local.shared_epochs': 0, 'num_clients': 10, 'sampling_rate': 0.25,
            'dp.sampling': sampling, 'dp.noise_placement': placement, 'dp.accountant': 'rdp',
            'dp.clip_norm': 0.5}
  fields.update(overrides)
  return train.build_experiment(tiny_config(**fields))


def _accounted_cohort(mech):
  """(q, expected cohort size) of the event the accountant composes for this mechanism."""
  event = mech.dp_event(1).event
  if isinstance(event, dp_accounting.PoissonSampledDpEvent):
    return event.sampling_probability, event.sampling_probability * mech.num_clients
  assert isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent), event
  assert event.source_dataset_size == mech.num_clients
  return event.sample_size / mech.num_clients, event.sample_size


@pytest.mark.parametrize('sampling,placement', SETTINGS)
def test_released_noise_is_the_calibrated_sigma_c_on_every_array_and_fresh_each_round(sampling,
                                                                                       placement):
  """A target-epsilon run: its sigma gives that epsilon under dp_accounting directly, and the release
  of zero updates times (accounted expected cohort) / server_lr is N(0, (sigma C)^2) on every array,
  with no coordinate left unnoised, and uncorrelated from one round to the next. q N = 2.5 is never
  a cohort size, so a release divided by the actual cohort has the wrong std in every round."""
  target, rounds = 2.0, 4
  exp = _zero_update_experiment(sampling, placement, num_rounds=rounds,
                                **{'dp.noise_multiplier': None, 'dp.target_epsilon': target})
  rc = exp.round_config
  mech = rc.mechanism
  sigma, clip, n = mech.noise_multiplier, mech.clip_norm, rc.num_clients
  _, expected_cohort = _accounted_cohort(mech)
  if sampling == 'poisson':
    one = dp_accounting.PoissonSampledDpEvent(mech.sampling_rate, dp_accounting.GaussianDpEvent(sigma))
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
  else:  # replace-one moves the sum by 2C: the library's multiplier is sigma / 2
    one = dp_accounting.SampledWithoutReplacementDpEvent(n, expected_cohort,
                                                         dp_accounting.GaussianDpEvent(sigma / 2))
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
  epsilon = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation).compose(
      dp_accounting.SelfComposedDpEvent(one, rounds)).get_epsilon(exp.mechanism.delta)
  assert 0.98 * target <= epsilon <= target * (1 + 1e-6), (sigma, epsilon)

  step = jax.jit(exp.make_round_step())
  state = exp.init_state()
  noise_by_round, cohorts = [], []
  for _ in range(rounds):
    new, metrics = step(state, exp.data, exp.root_key)
    cohorts.append(int(metrics['cohort_size']))
    noise_by_round.append([(np.asarray(a, np.float64) - np.asarray(b, np.float64)).ravel()
                           * expected_cohort / rc.server_lr
                           for a, b in zip(jax.tree.leaves(new.shared), jax.tree.leaves(state.shared))])
    state = new
  for r, arrays in enumerate(noise_by_round):
    for i, z in enumerate(arrays):
      assert np.all(z != 0), f'round {r}, array {i}: coordinates without noise'
      # 5 standard errors of the sample std and mean of z.size Gaussians.
      assert abs(z.std() / (sigma * clip) - 1) < 5 / np.sqrt(2 * z.size), (r, i, z.std(), sigma * clip)
      assert abs(z.mean()) < 5 * sigma * clip / np.sqrt(z.size), (r, i, z.mean())
      if r and z.size >= 64:
        correlation = np.corrcoef(noise_by_round[r - 1][i], z)[0, 1]
        assert abs(correlation) < 5 / np.sqrt(z.size), f'round {r}, array {i}: the noise of round {r - 1}'
  # Some round had |S| >= 2 clients sharing the noise (seeded): sigma C / |S| != sigma C / sqrt(|S|).
  assert max(cohorts) >= 2


@pytest.mark.parametrize('sampling', ['poisson', 'fixed'])
def test_the_rounds_cohorts_are_the_accounted_sampler(sampling):
  """300 real rounds: the cohort sizes have the mean and variance of the accounted event (N q and
  N q (1 - q) for Poisson; exactly m for fixed), every client is sampled with probability q
  (binomial bounds), and the cohort is fresh each round (a client is in two consecutive cohorts with
  probability q^2). N from the RoundConfig, q and m from the event epsilon composes."""
  rounds = 300
  exp = _zero_update_experiment(sampling, 'central', num_clients=20, **{'dp.noise_multiplier': 1.0})
  rc = exp.round_config
  n = rc.num_clients
  q, expected_cohort = _accounted_cohort(rc.mechanism)
  step = jax.jit(exp.make_round_step())
  state = exp.init_state()
  sampled = []
  for _ in range(rounds):
    new, _ = step(state, exp.data, exp.root_key)
    sampled.append(np.asarray(new.times_sampled - state.times_sampled) > 0)
    state = new
  sampled = np.array(sampled)
  sizes = sampled.sum(axis=1)
  if sampling == 'poisson':
    variance = n * q * (1 - q)
    assert abs(sizes.mean() - expected_cohort) < 5 * np.sqrt(variance / rounds), sizes.mean()
    # The sample variance's standard error is about variance * sqrt(2 / rounds).
    assert abs(sizes.var() - variance) < 5 * variance * np.sqrt(2 / rounds), (sizes.var(), variance)
  else:
    assert set(sizes.tolist()) == {expected_cohort}
  per_client = sampled.sum(axis=0)
  bound = 5 * np.sqrt(rounds * q * (1 - q))
  assert np.all(np.abs(per_client - rounds * q) < bound), per_client
  both = np.mean(sampled[1:] & sampled[:-1])
  assert abs(both - q * q) < 5 * np.sqrt(q * q * (1 - q * q) / (n * (rounds - 1))), (both, q * q)


def test_each_privatizer_kind_answers_the_rounds_calls_without_a_flag():
  """from_config builds the kind the method needs; each answers the client and server halves itself:
  NonPrivate passes the update through and releases the sum over the actual cohort (epsilon inf),
  DPMechanism clips and, only where the noise is distributed, adds the client's share and reports
  the clean upload; its server half noises the sum (central) and divides by q N."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.privacy.mechanism import DPMechanism, NonPrivate, PrivatizerState
  from dp2fedsam_jax.privacy.noise_mechanisms import NoiseContext
  update, cohort, key = {'w': np.full((4,), 3.0, np.float32)}, jax.numpy.int32(3), jax.random.key(0)
  ctx = NoiseContext(jax.random.key(1), 0, key, jax.random.key(2))
  plain = DPMechanism.from_config(tiny_config(method='fedavg'), 10, METHODS['fedavg'])
  assert isinstance(plain, NonPrivate) and plain.dp_event(5) is None and plain.epsilon(5) == np.inf
  state = plain.init({'w': update['w']})
  assert state == PrivatizerState((), ())
  sent = plain.client(state, key, update, cohort)
  of_norms = plain.statistics(state, jax.numpy.asarray([6.0, 1.0]), jax.numpy.asarray([True, True]))
  assert sent.sums == {} and float(sent.norm) == 6.0 and of_norms.sums == {}
  assert not np.any(of_norms.clipped)  # nothing is clipped without privacy
  np.testing.assert_array_equal(sent.upload['w'], update['w'])
  out = plain.server(state, ctx, update, {}, cohort)
  np.testing.assert_array_equal(out.released['w'], update['w'])
  assert float(out.denominator) == 3.0 and out.state == state and float(out.metrics['noise_std']) == 0
  for placement in ('central', 'distributed'):
    private = DPMechanism.from_config(tiny_config(**{'dp.noise_placement': placement,
                                                     'dp.clip_norm': 1.5}), 10, METHODS['dp2fedsam'])
    assert isinstance(private, DPMechanism) and private.dp_event(5) is not None
    state = private.init({'w': update['w']})
    sent = private.client(state, key, update, cohort)
    clipped = update['w'] / 4  # norm 6 clipped to 1.5
    of_norms = private.statistics(state, jax.numpy.asarray([6.0, 1.0]), jax.numpy.asarray([True, True]))
    assert float(sent.norm) == 6.0 and list(np.asarray(of_norms.clipped)) == [True, False]
    if placement == 'central':
      assert sent.sums == {}
      np.testing.assert_allclose(sent.upload['w'], clipped, rtol=1e-6)
    else:
      np.testing.assert_allclose(sent.sums['clean']['w'], clipped, rtol=1e-6)
      assert np.all(np.asarray(sent.upload['w']) != np.asarray(sent.sums['clean']['w']))
    out = private.server(state, ctx, sent.upload, sent.sums, cohort)
    assert float(out.denominator) == 5.0  # q N, whoever was sampled
    server_noised = np.any(np.asarray(out.released['w']) != np.asarray(sent.upload['w']))
    assert server_noised == (placement == 'central')  # distributed: the clients added it all
    assert float(out.metrics['noise_std']) > 0


def test_a_round_refuses_a_privatizer_of_the_other_kind():
  """A private method never runs with the non-private privatizer (nor the reverse): both come from
  one config, and the round step checks that they agree before it is built."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.privacy.mechanism import NonPrivate  # pylint: disable=import-outside-toplevel
  exp = _build('poisson', 'central')
  fields = {f.name: getattr(exp.mechanism, f.name) for f in dataclasses.fields(exp.mechanism)}
  exp = dataclasses.replace(exp, round_config=dataclasses.replace(exp.round_config,
                                                                  mechanism=NonPrivate(**fields)))
  with pytest.raises(ValueError, match='cannot run with a NonPrivate privatizer'):
    exp.make_round_step()


COVERED_VARIANTS = sorted(name for name in METHODS if name.endswith('_safe'))


@pytest.mark.parametrize('method', COVERED_VARIANTS)
def test_a_safe_variant_noises_every_coordinate_of_the_shared_update(method):
  """A `_safe` variant is its paper form with noise on every coordinate, so no coordinate of the
  release is an exact function of the private masks: after a round in which the clients trained
  (their masks are real), every shared weight moved. A variant whose noise covered only the
  union of its clients' masks would leave the coordinates no mask kept exactly unchanged."""
  assert COVERED_VARIANTS, 'no _safe method registered'
  exp = train.build_experiment(tiny_config(method=method, num_clients=10, sampling_rate=0.3,
                                           **{'dp.noise_placement': 'central', 'dp.clip_norm': 0.5}))
  state = exp.init_state()
  new, metrics = jax.jit(exp.make_round_step())(state, exp.data, exp.root_key)
  assert int(metrics['cohort_size']) > 0
  for i, (a, b) in enumerate(zip(jax.tree.leaves(new.shared), jax.tree.leaves(state.shared))):
    unchanged = int(np.sum(np.asarray(a) == np.asarray(b)))
    assert unchanged == 0, f'{method}: array {i} has {unchanged} coordinates without noise'
