"""The random subset a client over its budget trains on (config.local.subset_draw): either draw is a
uniformly random `budget` of the client's examples in uniformly random order, never a duplicate,
independent of the federation's largest client; the default is the draw past runs used."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from conftest import tiny_config
from dp2fedsam_jax import evaluation, local, run_files
from dp2fedsam_jax.algorithms import get_method
from dp2fedsam_jax.config import ConfigError, base_config, validate_config
from dp2fedsam_jax.data import FederatedData, from_flat_arrays
from dp2fedsam_jax.data.federated import SUBSET_DRAWS
from dp2fedsam_jax.models import get_model
from dp2fedsam_jax.privacy.mechanism import DPMechanism
from dp2fedsam_jax.federated_round import make_round_step, round_config_from
from dp2fedsam_jax.state import init_state

KEYS = 20_000
# Five chi-square tests per case, each at this level: at most 1e-4 false alarms in all (Bonferroni).
LEVEL = 2e-5


def _federation(sizes):
  """Clients of the given sizes whose label is the example's row index: a draw's ids are its labels."""
  total = sum(sizes)
  return from_flat_arrays(
      train_x=np.zeros((total, 1, 1, 1), np.uint8), train_y=np.arange(total),
      train_offsets=np.r_[0, np.cumsum(sizes)], test_x=np.zeros((len(sizes), 1, 1, 1), np.uint8),
      test_y=np.zeros(len(sizes), int), test_offsets=np.arange(len(sizes) + 1), num_classes=total,
      mean=(0.5,), std=(0.25,))


def _draws(data, client_id, budget, draw, keys):
  """int [keys, budget]: the example ids (rows of the client) each key's subset holds, in order."""
  start = int(data.train_offsets[client_id])
  take = jax.jit(jax.vmap(lambda k: data.train_examples(client_id, budget, k, draw)[1:]))
  ids, count = take(keys)
  assert (np.asarray(count) == budget).all()
  return np.asarray(ids) - start


@pytest.mark.parametrize('draw', SUBSET_DRAWS)
@pytest.mark.parametrize('n,budget', [(30, 8), (9, 8)])
def test_the_subset_is_uniform_in_uniform_order_without_duplicates(draw, n, budget):
  data = _federation([n, 3, n + 7])  # the client after it is larger: max_train > n
  ids = _draws(data, 0, budget, draw, jax.random.split(jax.random.key(2026), KEYS))
  assert ((ids >= 0) & (ids < n)).all()
  assert (np.diff(np.sort(ids, axis=1), axis=1) > 0).all()  # never a duplicate

  # Inclusion: each example in budget/n of the subsets. The indicators of one subset sum to budget,
  # so their covariance is p(1-p) n/(n-1) (I - 11'/n) and this statistic is chi-square(n - 1).
  p = budget / n
  included = np.bincount(ids.ravel(), minlength=n)
  statistic = ((included - KEYS * p) ** 2).sum() / (KEYS * p * (1 - p) * n / (n - 1))
  assert stats.chi2.sf(statistic, n - 1) > LEVEL, included

  # Order: an example that is drawn sits in any slot alike (first, middle and last stored example;
  # Floyd's algorithm alone puts the last one in the last slot), and slot 0 holds any example alike.
  slot_counts = np.zeros((n, budget), int)
  np.add.at(slot_counts, (ids, np.broadcast_to(np.arange(budget), ids.shape)), 1)
  for example in (0, n // 2, n - 1):
    assert stats.chisquare(slot_counts[example]).pvalue > LEVEL, (example, slot_counts[example])
  assert stats.chisquare(np.bincount(ids[:, 0], minlength=n)).pvalue > LEVEL


@pytest.mark.parametrize('draw', SUBSET_DRAWS)
def test_the_subset_does_not_depend_on_the_largest_client(draw):
  """The same client in a federation padded larger (another client of 40 vs 300) draws the same
  subset from the same key; a client within the budget keeps all its examples in stored order."""
  keys = jax.random.split(jax.random.key(7), 50)
  small, large = _federation([30, 40, 5]), _federation([30, 300, 5])
  assert small.max_train != large.max_train
  np.testing.assert_array_equal(_draws(small, 0, 8, draw, keys), _draws(large, 0, 8, draw, keys))
  _, y, count = jax.jit(lambda k: large.train_examples(2, 8, k, draw))(keys[0])
  assert int(count) == 5
  np.testing.assert_array_equal(y, np.r_[np.arange(330, 335), np.zeros(3, int)])


def _old_subset(data, client_id, budget, key):
  """The draw every run before local.subset_draw made: a uniform per example (fold_in(key, j)) up
  to max_train, argsorted, the first `budget`."""
  start, n = int(data.train_offsets[client_id]), int(data.train_count[client_id])
  every = jnp.arange(data.max_train)
  u = jax.vmap(lambda j: jax.random.uniform(jax.random.fold_in(key, j)))(every)
  return start + np.asarray(jnp.argsort(jnp.where(every < n, u, 2.0))[:budget])


def test_the_default_draw_is_the_one_past_runs_made():
  assert base_config().local.subset_draw == 'argsort'
  assert run_files.ADDED_FIELDS['local.subset_draw'] == 'argsort'
  assert local.LocalConfig.from_config(tiny_config()).subset_draw == 'argsort'
  data = _federation([30, 40, 5])
  for seed in range(5):
    key = jax.random.key(seed)
    _, y, _ = data.train_examples(0, 8, key)  # the draw argument left out
    np.testing.assert_array_equal(y, _old_subset(data, 0, 8, key))


def test_the_draw_is_a_validated_config_field():
  config = tiny_config(**{'local.subset_draw': 'floyd'})
  validate_config(config)
  assert local.LocalConfig.from_config(config).subset_draw == 'floyd'
  with pytest.raises(ConfigError, match=r"config.local.subset_draw='shuffle': unknown; choose one of "
                                        r"\['argsort', 'floyd'\]"):
    validate_config(tiny_config(**{'local.subset_draw': 'shuffle'}))
  with pytest.raises(ValueError, match='config.local.subset_draw'):
    _federation([30, 40]).train_examples(0, 8, jax.random.key(0), 'shuffle')


def test_the_round_step_and_fine_tuning_draw_as_configured(monkeypatch):
  """Both places a client's training examples are gathered pass local.subset_draw on (the one
  that is not the default)."""
  subset_draw = 'floyd'
  drawn = []
  gather = FederatedData.train_examples

  def recording(self, client_id, budget, key=None, draw='argsort'):
    drawn.append(draw)
    return gather(self, client_id, budget, key, draw)

  monkeypatch.setattr(FederatedData, 'train_examples', recording)
  c = tiny_config(method='dp_fedavg_ft', num_clients=3, sampling_rate=1.0,
                  **{'local.max_examples': 8, 'local.subset_draw': subset_draw})
  c.dp.noise_multiplier, c.dp.target_epsilon = 0.0, None
  spec, local_config = get_method(c.method), local.LocalConfig.from_config(c)
  data = _federation([30, 40, 5])
  model = get_model('mlp', data.num_classes, (1, 1, 1), hidden=4)
  state = init_state(spec, model, jax.random.key(0), data.num_clients)
  step = make_round_step(spec, model, local_config,
                         round_config_from(c, DPMechanism.from_config(c, data.num_clients, spec)))
  jax.eval_shape(step, state, data, jax.random.key(1))
  assert drawn and set(drawn) == {subset_draw}
  drawn.clear()
  jax.eval_shape(evaluation.make_evaluate(spec, model, local_config), state, data, jax.random.key(2))
  assert drawn and set(drawn) == {subset_draw}
