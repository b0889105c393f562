"""The experimenter's diagnostics: the per-client accuracy spread of every evaluation, and the
per-round noise_std / signal_to_noise (NON-private: they read the un-noised sum)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import train
from dp2fedsam_jax.evaluation import accuracy_spread
from dp2fedsam_jax.federated_round import make_round_step

SPREAD_KEYS = ('test_accuracy_std', 'test_accuracy_p10', 'test_accuracy_p50', 'test_accuracy_p90',
               'test_accuracy_worst10')


def _numpy_spread(accuracy, has_test):
  a = np.sort(np.asarray(accuracy, np.float64)[has_test])
  worst = max(1, math.ceil(0.1 * len(a)))
  return dict(zip(SPREAD_KEYS, (a.std(), *np.percentile(a, [10, 50, 90]), a[:worst].mean())))


@pytest.mark.parametrize('num_clients,without_test', [(13, (0, 5, 12)), (25, (3,)), (1, ()),
                                                       (4, (1, 2, 3))])
def test_spread_is_numpy_over_the_clients_with_test_data(num_clients, without_test):
  rng = np.random.default_rng(num_clients)
  accuracy = rng.uniform(size=num_clients).astype(np.float32)
  # A client without test data reports 0 (correct / max(count, 1)): it must not count as the worst.
  accuracy[list(without_test)] = 0.0
  has_test = np.ones(num_clients, bool)
  has_test[list(without_test)] = False
  got = jax.jit(accuracy_spread)(jnp.asarray(accuracy), jnp.asarray(has_test))
  for key, want in _numpy_spread(accuracy, has_test).items():
    assert float(got[key]) == pytest.approx(want, rel=1e-5, abs=1e-6), key


def test_spread_is_undefined_without_any_test_data():
  got = accuracy_spread(jnp.zeros(3), jnp.zeros(3, bool))
  assert all(math.isnan(float(got[k])) for k in SPREAD_KEYS)


def _planted_round(method, **overrides):
  """Every client uploads the same planted update of norm 3C (clipped to C), server_lr 1, sgd:
  (metrics, clean sum, released sum, denominator) of one round, float64 on the host."""
  exp = train.build_experiment(tiny_config(method=method, num_clients=8, **overrides))
  rc, state = exp.round_config, exp.init_state()
  leaves, treedef = jax.tree.flatten(state.shared)
  size = sum(x.size for x in leaves)
  planted = [jnp.full(x.shape, 3.0 / math.sqrt(size), x.dtype) for x in leaves]
  hook = lambda client_id, delta: jax.tree.unflatten(treedef, planted)
  step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, rc,
                                 update_hook=hook))
  new, metrics = step(state, exp.data, exp.root_key)
  cohort = int(metrics['cohort_size'])
  denominator = float(rc.mechanism.denominator(jnp.asarray(cohort)))
  scale = min(1.0, rc.mechanism.clip_norm / 3.0) if rc.mechanism.private else 1.0
  flat = lambda tree: np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])
  clean = cohort * scale * flat(planted)
  released = (flat(new.shared) - flat(state.shared)) * denominator
  return metrics, clean, released, denominator, rc.mechanism


@pytest.mark.parametrize('placement', ['central', 'distributed'])
def test_noise_std_and_signal_to_noise_are_those_of_the_noise_on_the_average(placement):
  metrics, clean, released, denominator, mech = _planted_round(
      'dp_fedavg', **{'dp.noise_placement': placement, 'dp.noise_multiplier': 2.0})
  assert int(metrics['cohort_size']) > 0
  noise = released - clean
  rms = np.sqrt(np.mean(noise ** 2)) / denominator
  assert float(metrics['noise_std']) == pytest.approx(rms, rel=1e-3)
  assert float(metrics['signal_to_noise']) == pytest.approx(
      np.linalg.norm(clean) / np.linalg.norm(noise), rel=1e-3)
  # Central or split over the clients, the noise on the sum is N(0, (sigma C)^2) per coordinate.
  assert rms == pytest.approx(mech.noise_multiplier * mech.clip_norm / denominator,
                              rel=5 / math.sqrt(2 * noise.size))


def test_a_non_private_method_has_no_noise_and_an_infinite_signal_to_noise():
  metrics, clean, released, _, _ = _planted_round('fedavg')
  np.testing.assert_allclose(released, clean, rtol=1e-5)
  assert float(metrics['noise_std']) == 0.0 and float(metrics['signal_to_noise']) == math.inf
