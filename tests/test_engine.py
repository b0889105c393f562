"""The round step's DP and correctness invariants, on tiny synthetic data and an MLP."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import train
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax.privacy import clipping
from dp2fedsam_jax.privacy.clipping import global_norm
from dp2fedsam_jax.round import make_round_step


def build(**overrides):
  return train.build_experiment(tiny_config(**overrides))


def run_rounds(exp, rounds=1, round_config=None, key=None):
  rc = round_config or exp.round_config
  step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, rc))
  state = exp.init_state()
  key = exp.root_key if key is None else key
  metrics = None
  for _ in range(rounds):
    state, metrics = step(state, exp.data, key)
  return state, metrics


def tree_sub(a, b):
  return jax.tree.map(jnp.subtract, a, b)


# ---------------------------------------------------------------- clipping


def test_clip_by_global_norm_bounds_huge_updates():
  tree = {'a': jnp.full((30, 7), 1e30), 'b': {'c': -jnp.full((5,), 3e29)}}
  clipped, norm = clipping.clip_by_global_norm(tree, 0.1)
  assert norm > 1e30
  assert float(global_norm(clipped)) <= 0.1 * (1 + 1e-6)
  # Global, not per tensor: the direction is kept.
  np.testing.assert_allclose(clipped['a'][0, 0] / clipped['b']['c'][0], -10 / 3, rtol=1e-5)


def test_clip_leaves_small_updates_unchanged():
  tree = {'a': jnp.array([0.03, 0.04])}
  clipped, norm = clipping.clip_by_global_norm(tree, 1.0)
  chex.assert_trees_all_close(clipped, tree)
  np.testing.assert_allclose(norm, 0.05, rtol=1e-6)


def test_round_clips_whole_shared_update_of_adversarial_clients():
  """Huge local steps: every upload must still have global norm <= C, so ||sum|| <= m C."""
  exp = build(**{'local.lr_body': 1e4, 'dp.noise_multiplier': 0.0, 'dp.sampling': 'fixed',
                 'dp.accountant': 'rdp', 'dp.clip_norm': 0.3})
  state0 = exp.init_state()
  state, metrics = run_rounds(exp)
  m = int(metrics['cohort_size'])
  assert m == 3 and float(metrics['clipped_fraction']) == 1.0
  upload_sum = jax.tree.map(lambda d: d * m, tree_sub(state.shared, state0.shared))  # server_lr 1, /m
  assert float(global_norm(upload_sum)) <= m * 0.3 * (1 + 1e-5)
  assert float(metrics['mean_update_norm']) > 100 * 0.3


# ---------------------------------------------------------------- noise


@pytest.mark.parametrize('placement', ['central', 'distributed'])
def test_noise_std_on_the_sum_is_sigma_c(placement):
  """With a zero learning rate every update is 0, so new - old = noise / m exactly."""
  sigma, clip = 2.0, 0.5
  exp = build(**{'local.lr_body': 0.0, 'local.lr_head': 0.0, 'dp.noise_multiplier': sigma,
                 'dp.clip_norm': clip, 'dp.noise_placement': placement, 'num_clients': 6,
                 'sampling_rate': 0.5})
  state0 = exp.init_state()
  state, metrics = run_rounds(exp)
  assert int(metrics['cohort_size']) > 0
  expected_cohort = 0.5 * 6  # Poisson: divide by the expected cohort size
  noise = np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree_sub(state.shared, state0.shared))])
  noise = noise * expected_cohort
  assert noise.size > 1000
  np.testing.assert_allclose(noise.std(), sigma * clip, rtol=0.05)
  assert abs(noise.mean()) < 0.1 * sigma * clip


def test_non_private_method_adds_no_noise():
  exp = build(**{'method': 'p_fedsam', 'local.lr_body': 0.0, 'local.lr_head': 0.0})
  state0 = exp.init_state()
  state, _ = run_rounds(exp)
  chex.assert_trees_all_equal(state.shared, state0.shared)
  assert exp.privacy.epsilon == float('inf')


# ---------------------------------------------------------------- padding


def test_padding_does_not_change_a_client_update():
  exp = build()
  data, state = exp.data, exp.init_state()
  update = jax.jit(make_client_update(exp.spec, exp.model, exp.local_config, data.normalize))
  x, y, n = data.train_x[0], data.train_y[0], data.train_count[0]
  personal = jax.tree.map(lambda p: p[0], state.personal)
  key = jax.random.key(3)
  n_real = int(n)
  extra = 37
  x_more = jnp.concatenate([x[:n_real], jnp.full((extra,) + x.shape[1:], 255, x.dtype)])
  y_more = jnp.concatenate([y[:n_real], jnp.full((extra,), 1, y.dtype)])
  a = update(state.shared, personal, x[:n_real], y[:n_real], n, key, 0)
  b = update(state.shared, personal, x_more, y_more, n, key, 0)
  chex.assert_trees_all_close(a, b, atol=1e-6, rtol=1e-6)


def test_padded_cohort_slots_do_not_change_the_update():
  """A capacity larger than the cohort adds padded slots; they must not contribute."""
  exp = build(**{'dp.sampling': 'fixed', 'dp.accountant': 'rdp'})
  tight, _ = run_rounds(exp)
  roomy, _ = run_rounds(exp, round_config=dataclasses.replace(exp.round_config, cohort_capacity=6))
  chex.assert_trees_all_close(tight, roomy, atol=1e-6)


# ---------------------------------------------------------------- executors and chunks


@pytest.mark.parametrize('variant', [dict(executor='sequential'), dict(chunk_size=2),
                                     dict(cohort_capacity=1)])
def test_executors_and_chunking_give_the_vmap_state(variant):
  exp = build(**{'sampling_rate': 0.7, 'executor': 'vmap'})  # not 'auto': sequential on CPU
  reference, metrics = run_rounds(exp, rounds=2)
  other, other_metrics = run_rounds(exp, rounds=2,
                                    round_config=dataclasses.replace(exp.round_config, **variant))
  chex.assert_trees_all_close(reference, other, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(metrics['train_loss'], other_metrics['train_loss'], rtol=1e-5)


def test_poisson_overflow_processes_every_sampled_client():
  """q = 1 samples all clients; a capacity of 2 forces 3 chunks and none may be dropped."""
  exp = build(**{'sampling_rate': 1.0, 'num_clients': 6})
  rc = dataclasses.replace(exp.round_config, cohort_capacity=2)
  state0 = exp.init_state()
  state, metrics = run_rounds(exp, round_config=rc)
  assert int(metrics['cohort_size']) == 6
  changed = np.any(np.asarray(state.personal['head']['kernel'] != state0.personal['head']['kernel']),
                   axis=(1, 2))
  assert changed.all()


def test_unsampled_clients_keep_their_heads():
  exp = build(**{'dp.sampling': 'fixed', 'dp.accountant': 'rdp', 'sampling_rate': 0.34})
  state0 = exp.init_state()
  state, metrics = run_rounds(exp)
  leaves0, leaves = jax.tree.leaves(state0.personal), jax.tree.leaves(state.personal)
  changed = np.zeros(exp.data.num_clients, bool)
  for a, b in zip(leaves0, leaves):
    changed |= np.any(np.asarray(a != b).reshape(a.shape[0], -1), axis=1)
  assert changed.sum() == int(metrics['cohort_size']) == 2


def test_round_step_traces_once_over_rounds():
  exp = build(**{'num_rounds': 4})
  traces = []
  inner = exp.round_step()

  def counted(state, data, key):
    traces.append(1)
    return inner(state, data, key)

  step = jax.jit(counted, donate_argnums=0)
  state = exp.init_state()
  for _ in range(4):
    state, _ = step(state, exp.data, exp.root_key)
  assert int(state.round) == 4
  assert len(traces) == 1


def test_same_seed_same_state_different_seed_different_state():
  a, _ = run_rounds(build(), rounds=2)
  b, _ = run_rounds(build(), rounds=2)
  chex.assert_trees_all_equal(a, b)
  c, _ = run_rounds(build(seed=1), rounds=2)
  assert not np.allclose(jax.tree.leaves(a.shared)[0], jax.tree.leaves(c.shared)[0])


def test_centaur_and_dp2fedsam_differ_only_in_the_extractor_optimizer():
  d, c = build(), build(method='centaur')
  assert dataclasses.replace(d.spec, name='x', paper='') == dataclasses.replace(
      c.spec, name='x', paper='', body_optimizer='sam')
  sd, _ = run_rounds(d)
  sc, _ = run_rounds(c)
  # Same head phase (SGD, same keys) -> same heads; different extractor optimizer -> different phi.
  chex.assert_trees_all_close(sd.personal, sc.personal)
  assert not np.allclose(jax.tree.leaves(sd.shared)[0], jax.tree.leaves(sc.shared)[0])


# ---------------------------------------------------------------- sampler vs accountant


@pytest.mark.parametrize('q,n', [(0.1, 50), (0.03, 333), (1.0, 7)])
def test_sampler_and_accountant_agree(q, n):
  from dp2fedsam_jax.privacy import accounting, sampling
  keys = jax.random.split(jax.random.key(0), 400)
  poisson = jax.vmap(lambda k: sampling.sample_cohort(k, 'poisson', q, n))(keys)
  event = accounting.dp_event(1.0, q, 3, sampling='poisson').event
  assert event.sampling_probability == q
  # Each client's inclusion frequency is q (binomial tolerance, 5 std over 400 draws).
  np.testing.assert_allclose(poisson.mean(), q, atol=5 * np.sqrt(q * (1 - q) / (400 * n)) + 1e-9)
  fixed = jax.vmap(lambda k: sampling.sample_cohort(k, 'fixed', q, n))(keys)
  event = accounting.dp_event(1.0, q, 3, sampling='fixed', num_clients=n).event
  assert event.source_dataset_size == n
  assert set(np.asarray(fixed.sum(axis=1)).tolist()) == {event.sample_size}
  # Without replacement and uniform: every client equally likely.
  np.testing.assert_allclose(fixed.mean(axis=0), event.sample_size / n, atol=0.1)


def test_evaluation_reports_participation_and_the_participants_accuracy():
  """Hand-computed: each client's own-head accuracy on its real test examples; the plain mean over
  clients with test data, and the mean over those sampled at least once."""
  exp = build(num_clients=6, sampling_rate=0.4)
  state, metrics = run_rounds(exp, rounds=1)
  took_part = np.asarray(state.times_sampled) > 0
  assert took_part.sum() == int(metrics['cohort_size']) and 0 < took_part.sum() < 6
  data = exp.data
  accuracies = []
  for i in range(data.num_clients):
    n = int(data.test_count[i])
    head = jax.tree.map(lambda h: h[i], state.personal)
    logits = exp.model.apply({**state.shared, **head}, data.normalize(data.test_x[i, :n]))
    accuracies.append(float(np.mean(np.argmax(np.asarray(logits), -1) == np.asarray(data.test_y[i, :n]))))
  accuracies = np.array(accuracies)
  result = jax.jit(exp.evaluate())(state, data, exp.eval_key(1))
  np.testing.assert_allclose(float(result['participation']), took_part.mean(), rtol=1e-6)
  np.testing.assert_allclose(float(result['test_accuracy']), accuracies.mean(), rtol=1e-5)
  np.testing.assert_allclose(float(result['test_accuracy_participated']),
                             accuracies[took_part].mean(), rtol=1e-5)


# ---------------------------------------------------------------- the local config at the boundary


def test_local_config_is_frozen_and_the_engine_refuses_the_configdict():
  from dp2fedsam_jax.evaluation import make_evaluate
  from dp2fedsam_jax.local import LocalConfig
  exp = build()
  lc = exp.local_config
  assert lc == LocalConfig.from_config(exp.config) and hash(lc) == hash(LocalConfig.from_config(exp.config))
  assert dataclasses.asdict(lc) == exp.config.local.to_dict()
  with pytest.raises(dataclasses.FrozenInstanceError):
    lc.lr_body = 1.0
  for make in (lambda l: make_client_update(exp.spec, exp.model, l, exp.data.normalize),
               lambda l: make_evaluate(exp.spec, exp.model, l)):
    with pytest.raises(TypeError, match=r'LocalConfig\.from_config\(config\), not config\.local'):
      make(exp.config.local)
  step = make_round_step(exp.spec, exp.model, exp.config.local, exp.round_config)
  with pytest.raises(TypeError, match='LocalConfig'):  # when the step is traced
    jax.eval_shape(step, exp.init_state(), exp.data, exp.root_key)
  extra = tiny_config()
  extra.local.unlock()
  extra.local.warmup = 1
  with pytest.raises(ValueError, match='config.local has fields'):
    LocalConfig.from_config(extra)
