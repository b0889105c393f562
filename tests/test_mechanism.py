"""The DP mechanism object: what the accountant composes is what the round step executes."""

import dp_accounting
import jax
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import train

SETTINGS = [('poisson', 'central'), ('poisson', 'distributed'), ('fixed', 'central'),
            ('fixed', 'distributed')]


def _build(sampling, placement, **overrides):
  fields = {'dp.sampling': sampling, 'dp.noise_placement': placement, 'dp.noise_multiplier': 0.8,
            'dp.clip_norm': 0.5, 'dp.delta': 1e-3}
  if sampling == 'fixed':
    fields['dp.accountant'] = 'rdp'
  fields.update(overrides)
  return train.build_experiment(tiny_config(num_clients=10, sampling_rate=0.5, **fields))


@pytest.mark.parametrize('sampling,placement', SETTINGS)
def test_dp_event_is_the_executed_sampler_and_what_epsilon_composes(sampling, placement):
  exp = _build(sampling, placement)
  mech = exp.mechanism
  event = mech.dp_event(7)
  assert isinstance(event, dp_accounting.SelfComposedDpEvent) and event.count == 7
  one = event.event
  cohorts = [int(np.sum(np.asarray(mech.sample(jax.random.key(s))))) for s in range(200)]
  if sampling == 'poisson':
    assert isinstance(one, dp_accounting.PoissonSampledDpEvent)
    assert one.sampling_probability == exp.config.sampling_rate
    assert one.event.noise_multiplier == exp.privacy.noise_multiplier
    accountant = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)
    assert 3.5 < np.mean(cohorts) < 6.5 and np.std(cohorts) > 0
  else:
    assert isinstance(one, dp_accounting.SampledWithoutReplacementDpEvent)
    assert one.source_dataset_size == 10
    assert set(cohorts) == {one.sample_size}  # the accounted m is the sampled m
    assert one.event.noise_multiplier == exp.privacy.noise_multiplier / 2  # replace-one: 2C
    accountant = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  np.testing.assert_allclose(accountant.compose(event).get_epsilon(1e-3),
                             mech.epsilon(7, 1e-3, exp.config.dp.accountant), rtol=1e-3)
  assert exp.epsilon_after(7) == mech.epsilon(7, 1e-3, exp.config.dp.accountant)


@pytest.mark.parametrize('sampling,placement', SETTINGS)
def test_round_step_adds_the_noise_std_the_mechanism_states(sampling, placement):
  """Zero updates: the released sum (update * denominator / server_lr) is the noise; on *every*
  array its std is sigma C, and a fresh draw each round (no correlation across rounds)."""
  exp = _build(sampling, placement, **{'local.lr_body': 0.0, 'local.lr_head': 0.0})
  mech = exp.mechanism
  assert mech.noise_std == pytest.approx(0.8 * 0.5)
  step = jax.jit(exp.round_step())
  state = exp.init_state()
  released_by_round = []
  for _ in range(3):
    new, metrics = step(state, exp.data, exp.root_key)
    scale = float(mech.denominator(metrics['cohort_size'])) / exp.round_config.server_lr
    released_by_round.append([np.asarray(a - b).ravel() * scale for a, b in
                              zip(jax.tree.leaves(new.shared), jax.tree.leaves(state.shared))])
    state = new
  for i in range(len(released_by_round[0])):
    arrays = [r[i] for r in released_by_round]
    values = np.concatenate(arrays)
    if values.size < 300:
      continue
    assert np.all(values != 0), f'array {i} has coordinates without noise'
    np.testing.assert_allclose(values.std(), mech.noise_std, rtol=0.15)
    assert abs(np.corrcoef(arrays[0], arrays[1])[0, 1]) < 0.2, 'the same noise in two rounds'
