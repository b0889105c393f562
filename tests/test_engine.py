"""The round step's DP and correctness invariants, on tiny synthetic data and an MLP."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import executors, local, train
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax.protocol import DEFAULT_PROTOCOL, Protocol
from dp2fedsam_jax.privacy.mechanism import DPMechanism
from dp2fedsam_jax.privacy.noise_mechanisms import Independent
from dp2fedsam_jax.federated_round import make_round_step


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


# ---------------------------------------------------------------- clipping and aggregation


def float64_norm(tree) -> float:
  """The oracle: the L2 norm of all arrays concatenated, in float64 NumPy (not trees.global_norm)."""
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree))))


def _clip_cases():
  """Three arrays, norms (a, b, d) scaled: below C = 0.25, above C with every array below C, above
  C with one array below, huge (squares overflow float32), zero."""
  rng = np.random.default_rng(0)
  base = {'a': rng.normal(size=(6, 5)), 'b': {'c': rng.normal(size=(7,))}, 'd': rng.normal(size=(2, 3, 2))}
  for scales in [(1e-2, 3e-2, 1e-3), (0.1, 0.09, 0.08), (0.2, 0.2, 0.2), (2.0, 0.01, 0.5),
                 (1e29, 3e29, 1e28), (0, 0, 0)]:
    yield jax.tree.map(lambda x, s: jnp.asarray(x * s / np.linalg.norm(x), jnp.float32),
                       base, {'a': scales[0], 'b': {'c': scales[1]}, 'd': scales[2]})


def test_clipping_matches_a_float64_oracle_of_all_arrays_concatenated():
  """clip(u) = u min(1, C / ||u||) with one scale for the whole update, ||clip(u)|| = min(||u||, C),
  and the reported pre-clip norm is ||u||, every norm from float64 NumPy."""
  clip = 0.25
  mech = DPMechanism(Independent(num_clients=10, sampling_rate=0.5), clip_norm=clip,
                     noise_multiplier=1.0)
  for tree in _clip_cases():
    norm = float64_norm(tree)
    clipped, reported = mech.clip(tree)
    np.testing.assert_allclose(float(reported), norm, rtol=1e-5)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    for got, raw in zip(jax.tree.leaves(clipped), jax.tree.leaves(tree)):
      np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(raw, np.float64) * scale,
                                 rtol=1e-5, atol=1e-7 * clip)
    np.testing.assert_allclose(float64_norm(clipped), min(norm, clip), rtol=1e-5)


def test_round_releases_the_clipped_sum_over_the_expected_cohort():
  """Client i uploads a known update a_i (planted before clipping) and sigma = 0, so the release is
  exactly server_lr * sum_{i in S} a_i min(1, C / ||a_i||) / (q N), computed here in float64 with q,
  N, C and server_lr from the RoundConfig. Clients have unequal sample counts, q N = 2.5 is never a
  cohort size, and a capacity of N leaves padded slots: weighting by counts, dividing by |S|,
  counting padded slots or clipping per array all change the release."""
  exp = build(method='dp_fedavg', num_clients=10, sampling_rate=0.25, partition='dirichlet',
              cohort_capacity=10, **{'local.shared_epochs': 0, 'dp.noise_multiplier': 0.0,
                                     'dp.clip_norm': 0.5})
  rc = exp.round_config
  mech, n = rc.mechanism, rc.num_clients
  state = exp.init_state()
  rng = np.random.default_rng(1)
  leaves, treedef = jax.tree.flatten(state.shared)
  # Client i's update has norm C (0.35 + 0.3 i), spread over the arrays in random proportions.
  shares = rng.dirichlet(np.ones(len(leaves)), size=n)
  planted = []
  for j, leaf in enumerate(leaves):
    direction = rng.normal(size=(n,) + leaf.shape)
    direction /= np.sqrt(np.sum(direction ** 2, axis=tuple(range(1, direction.ndim)), keepdims=True))
    size = mech.clip_norm * (0.35 + 0.3 * np.arange(n)) * np.sqrt(shares[:, j])
    planted.append((direction * size.reshape((n,) + (1,) * leaf.ndim)).astype(np.float32))
  table = [jnp.asarray(p) for p in planted]
  hook = lambda client_id, delta: jax.tree.unflatten(treedef, [t[client_id] for t in table])
  step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, rc,
                                 update_hook=hook))

  planted64 = [p.astype(np.float64) for p in planted]
  norms = np.sqrt(sum(np.sum(p ** 2, axis=tuple(range(1, p.ndim))) for p in planted64))
  clipped = [p * np.minimum(1.0, mech.clip_norm / norms).reshape((n,) + (1,) * (p.ndim - 1))
             for p in planted64]
  counts = np.asarray(exp.data.train_count)
  informative = 0
  for _ in range(4):
    new, metrics = step(state, exp.data, exp.root_key)
    cohort = np.asarray(new.times_sampled - state.times_sampled) > 0
    assert int(metrics['cohort_size']) == cohort.sum()
    for got_new, got_old, c in zip(jax.tree.leaves(new.shared), jax.tree.leaves(state.shared), clipped):
      released = np.asarray(got_new, np.float64) - np.asarray(got_old, np.float64)
      expected = rc.server_lr * c[cohort].sum(axis=0) / (mech.sampling_rate * n)
      np.testing.assert_allclose(released, expected, rtol=1e-4, atol=1e-6)
    if cohort.any():
      np.testing.assert_allclose(float(metrics['mean_update_norm']), norms[cohort].mean(), rtol=1e-5)
      np.testing.assert_allclose(float(metrics['clipped_fraction']),
                                 np.mean(norms[cohort] > mech.clip_norm), rtol=1e-6)
    informative += (2 <= cohort.sum() < n and len(set(counts[cohort])) > 1
                    and (norms[cohort] > mech.clip_norm).any())
    state = new
  # The rounds above had a cohort that tells the wrong aggregations apart (seeded, so always).
  assert informative >= 1


def test_personal_heads_train_but_never_reach_the_release():
  """dp2fedsam with no shared-phase epochs and sigma = 0: the heads learn, and the release (the
  noised sum of the shared updates) must stay exactly where it was."""
  exp = build(sampling_rate=1.0, **{'local.shared_epochs': 0, 'local.personal_epochs': 1,
                                    'local.lr_personal': 0.5, 'dp.noise_multiplier': 0.0})
  state0 = exp.init_state()
  state, metrics = run_rounds(exp)
  assert int(metrics['cohort_size']) == exp.data.num_clients
  moved = np.zeros(exp.data.num_clients, bool)
  for a, b in zip(jax.tree.leaves(state0.personal), jax.tree.leaves(state.personal)):
    moved |= np.any(np.asarray(a != b).reshape(a.shape[0], -1), axis=1)
  assert moved.all()
  for a, b in zip(jax.tree.leaves(state0.shared), jax.tree.leaves(state.shared)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---------------------------------------------------------------- noise


def test_non_private_method_adds_no_noise():
  exp = build(**{'method': 'p_fedsam', 'local.lr_shared': 0.0, 'local.lr_personal': 0.0})
  state0 = exp.init_state()
  state, _ = run_rounds(exp)
  chex.assert_trees_all_equal(state.shared, state0.shared)
  assert exp.epsilon == float('inf')


# ---------------------------------------------------------------- padding


def test_padding_does_not_change_a_client_update():
  exp = build()
  data, state = exp.data, exp.init_state()
  update = jax.jit(make_client_update(exp.spec, exp.model, exp.local_config, data.normalize))
  x, y, n = data.client_train(0)
  personal = jax.tree.map(lambda p: p[0], state.personal)
  key = jax.random.key(3)
  n_real = int(n)
  extra = 37
  x_more = jnp.concatenate([x[:n_real], jnp.full((extra,) + x.shape[1:], 255, x.dtype)])
  y_more = jnp.concatenate([y[:n_real], jnp.full((extra,), 1, y.dtype)])
  a = update(state.shared, personal, x[:n_real], y[:n_real], n, key, 0)
  b = update(state.shared, personal, x_more, y_more, n, key, 0)
  chex.assert_trees_all_close(a, b, atol=1e-6, rtol=1e-6)


def test_padded_steps_are_skipped_not_computed_in_a_client_loop():
  """A client with 5 real of 40 slots (batch 5) trains 1 step an epoch; the 7 padded steps must not
  run a forward pass at all under the sequential executor (a cond, not a select)."""
  calls = []

  def loss_fn(w, x, y, mask):
    jax.debug.callback(lambda: calls.append(1))
    return jnp.sum(jnp.where(mask, (x @ w - y) ** 2, 0.0)) / jnp.maximum(mask.sum(), 1)

  x, y = jnp.ones((40, 3)), jnp.zeros((40,))
  phase = local.Phase(epochs=2, batch_size=5)
  run = jax.jit(lambda w, n: local.run_phase(phase, loss_fn, w, x, y, n, jax.random.key(0), 0.1))
  w, loss = run(jnp.ones((3,)), jnp.int32(5))
  jax.effects_barrier()
  assert len(calls) == 2  # one active step in each of the two epochs
  assert float(loss) > 0 and not np.allclose(np.asarray(w), 1.0)


def test_padded_cohort_slots_do_not_change_the_update():
  """A capacity larger than the cohort adds padded slots; they must not contribute."""
  exp = build(**{'dp.sampling': 'fixed', 'dp.accountant': 'rdp'})
  tight, _ = run_rounds(exp)
  roomy, _ = run_rounds(exp, round_config=dataclasses.replace(exp.round_config, cohort_capacity=6))
  chex.assert_trees_all_close(tight, roomy, atol=1e-6)


# ---------------------------------------------------------------- executors and chunks


@pytest.mark.parametrize('variant', [dict(executor=executors.Sequential()),
                                     dict(executor=executors.Vmap(chunk_size=2)), dict(cohort_capacity=1)])
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
  inner = exp.make_round_step()

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
      c.spec, name='x', paper='', shared_optimizer=local.SAM())
  sd, _ = run_rounds(d)
  sc, _ = run_rounds(c)
  # Same head phase (SGD, same keys) -> same heads; different extractor optimizer -> different phi.
  chex.assert_trees_all_close(sd.personal, sc.personal)
  assert not np.allclose(jax.tree.leaves(sd.shared)[0], jax.tree.leaves(sc.shared)[0])


# ---------------------------------------------------------------- evaluation


def test_evaluation_is_the_mean_own_head_accuracy_over_clients_with_test_data():
  """Hand-computed: each client's accuracy with its own head on its real test examples; the mean
  over clients with test data, and over those sampled at least once. Padded test slots are labelled
  with what the model predicts and client 2 keeps its examples but has a count of 0: counting
  either would move the means."""
  exp = build(num_clients=6, sampling_rate=0.4, partition='dirichlet')
  state, metrics = run_rounds(exp, rounds=1)
  took_part = np.asarray(state.times_sampled) > 0
  assert took_part.sum() == int(metrics['cohort_size']) and 0 < took_part.sum() < 6
  data = exp.data
  counts = np.asarray(data.test_count).copy()
  assert (counts < data.max_test).any()  # some client has padded test slots
  accuracies = []
  for i in range(data.num_clients):
    head = jax.tree.map(lambda h, i=i: h[i], state.personal)
    x, labels, n = data.test_examples(i)
    predicted = np.argmax(np.asarray(exp.model.apply({**state.shared, **head},
                                                     data.normalize(x))), -1)
    accuracies.append(np.mean(predicted[:n] == np.asarray(labels)[:n]))
  # Client 2 loses its test examples (its rows leave the flat arrays).
  offsets = np.asarray(data.test_offsets)
  keep = np.r_[0:offsets[2], offsets[3]:offsets[-1]]
  counts[2] = 0
  data = data.replace(test_x=data.test_x[keep], test_y=data.test_y[keep],
                      test_offsets=jnp.asarray(np.r_[0, np.cumsum(counts)], jnp.int32))
  tested = counts > 0
  accuracies = np.array(accuracies)
  result = jax.jit(exp.make_evaluate())(state, data, exp.eval_key(1))
  np.testing.assert_allclose(float(result['participation']), took_part.mean(), rtol=1e-6)
  np.testing.assert_allclose(float(result['test_accuracy']), accuracies[tested].mean(), rtol=1e-5)
  np.testing.assert_allclose(float(result['test_accuracy_participated']),
                             accuracies[tested & took_part].mean(), rtol=1e-5)


# ---------------------------------------------------------------- the local config at the boundary


def test_finetune_evaluation_is_the_same_one_client_at_a_time():
  """-FT evaluations loop over clients where the round does (eval_blocks.evaluation_batch:
  sequential, or sharded on CPU devices); the result is the vmapped one up to float rounding."""
  from dp2fedsam_jax.eval_blocks import evaluation_batch
  from dp2fedsam_jax.evaluation import make_evaluate
  # On CPU devices (this test): the sequential and sharded executors loop, vmap does not.
  sequential, vmap, sharded = (executors.from_name(n) for n in ('sequential', 'vmap', 'sharded'))
  assert sequential.loops_over_clients and sharded.loops_over_clients
  assert not vmap.loops_over_clients
  exp = build(method='dp_fedavg_ft', **{'local.finetune_epochs': 1})
  batch = lambda spec, executor, protocol=DEFAULT_PROTOCOL: evaluation_batch(
      executor, protocol.for_method(spec, exp.local_config).own_weights)[0]
  assert batch(exp.spec, sequential) == 1
  assert batch(exp.spec, sharded) == 1  # this test runs on CPU
  assert batch(exp.spec, vmap) > 1
  refit = Protocol(adapt_epochs=1, adapt_lr=0.1)
  dp2fedsam = train.get_method('dp2fedsam')
  assert [batch(dp2fedsam, e, refit) for e in (sharded, vmap)] == [1, 64]
  assert batch(dp2fedsam, sequential) > 1  # forward only
  assert evaluation_batch(sharded, True)[1] is not None and evaluation_batch(vmap, True)[1] is None
  state, _ = run_rounds(exp)
  key = exp.eval_key(1)
  looped, vmapped = (jax.device_get(jax.jit(make_evaluate(
      exp.spec, exp.model, exp.local_config, clients_per_batch=b))(state, exp.data, key)) for b in (1, 64))
  for name in ('test_accuracy', 'test_loss'):
    np.testing.assert_allclose(looped[name], vmapped[name], rtol=1e-5)


def test_local_config_is_frozen_and_the_engine_refuses_the_configdict():
  from dp2fedsam_jax.evaluation import make_evaluate
  from dp2fedsam_jax.local import LocalConfig
  exp = build()
  lc = exp.local_config
  assert lc == LocalConfig.from_config(exp.config) and hash(lc) == hash(LocalConfig.from_config(exp.config))
  assert dataclasses.asdict(lc) == exp.config.local.to_dict()
  with pytest.raises(dataclasses.FrozenInstanceError):
    lc.lr_shared = 1.0
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


# ---------------------------------------------------------------- fitting the cohort to memory


def test_fitting_chunk_size_extrapolates_the_affine_memory_of_a_round():
  from dp2fedsam_jax.federated_round import fitting_chunk_size
  # 100 fixed + 10 per client; a budget of 0.8 * 1000 = 800 holds 70 clients.
  assert fitting_chunk_size(64, 110, 120, memory_bytes=1000) is None  # 740 fits
  assert fitting_chunk_size(256, 110, 120, memory_bytes=1000) == 70
  assert fitting_chunk_size(256, 110, 120, memory_bytes=1000, headroom=0.5) == 40
  with pytest.raises(ValueError, match='executor=sequential'):
    fitting_chunk_size(256, 110, 120, memory_bytes=100)


def test_fit_chunk_size_keeps_the_compiled_round_within_a_fake_device_memory():
  from dp2fedsam_jax.federated_round import program_bytes
  exp = build(**{'sampling_rate': 1.0, 'num_clients': 8, 'executor': 'vmap'})

  def bytes_at(chunk_size):
    rc = dataclasses.replace(exp.round_config, executor=executors.Vmap(chunk_size))
    step = make_round_step(exp.spec, exp.model, exp.local_config, rc)
    return program_bytes(jax.jit(step, donate_argnums=0).lower(
        jax.eval_shape(exp.init_state), exp.data, exp.root_key).compile())

  whole, one = bytes_at(None), bytes_at(1)
  assert one < whole
  assert train.fit_chunk_size(exp, memory_bytes=2 * whole) is None  # the whole cohort fits
  fake = (one + whole) / 2 / 0.8  # room for some clients, not all 8
  chunk = train.fit_chunk_size(exp, memory_bytes=fake)
  assert 1 <= chunk < 8 and bytes_at(chunk) <= 0.8 * fake
  if jax.default_backend() == 'cpu':  # no memory size reported: nothing to fit, nothing compiled
    assert train.device_memory_bytes() is None and train.fit_chunk_size(exp) is None


def test_one_compiled_step_runs_each_configs_hyperparameters_as_traced_data():
  """round_step(state, data, key, Hyperparameters): the searched scalars (local lrs, SAM's rho, the
  server lr, C) as traced data. One compiled step at another config's values computes that
  config's own rounds (to float32 rounding: constants fold differently), and compiles once."""
  from dp2fedsam_jax.federated_round import Hyperparameters  # pylint: disable=import-outside-toplevel
  base = build(**{'dp.clip_norm': 5.0})
  other = build(**{'server_lr': 0.5, 'dp.clip_norm': 0.05, 'local.lr_shared': 0.03,
                   'local.lr_personal': 0.02, 'local.sam_rho': 0.1})
  step = jax.jit(base.make_round_step())
  for exp in (base, other):
    config = dataclasses.replace(exp.round_config, local_config=exp.local_config)
    traced = Hyperparameters(*(jnp.float32(v) for v in config.hyperparameters))
    want_state, want = run_rounds(exp, rounds=2)
    state = exp.init_state()
    for _ in range(2):
      state, metrics = step(state, base.data, base.root_key, traced)
    for name in ('train_loss', 'mean_update_norm', 'clipped_fraction', 'cohort_size'):
      np.testing.assert_allclose(metrics[name], want[name], rtol=1e-4, err_msg=name)
    chex.assert_trees_all_close(state.shared, want_state.shared, rtol=1e-4, atol=1e-6)
    assert float(metrics['clipped_fraction']) == (1.0 if exp is other else 0.0)  # C is the traced one
  assert step._cache_size() == 1  # pylint: disable=protected-access
