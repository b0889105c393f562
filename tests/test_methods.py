"""Each method runs end to end, and the piece that makes it different does what its paper says."""

import dataclasses
import functools
import json
import math
import os

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import config as config_lib
from dp2fedsam_jax import local, train
from dp2fedsam_jax.algorithms import METHODS, pieces
from dp2fedsam_jax.algorithms import specs
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax.evaluation import make_evaluate
from dp2fedsam_jax.models.registry import SplitModel
from dp2fedsam_jax.privacy import sparsify
from dp2fedsam_jax.config import ConfigError
from dp2fedsam_jax.federated_round import make_round_step
from experiments.configs import _common

ISSUE_METHODS = ('fedavg', 'fedsam', 'fedrep', 'dp_fedavg', 'dp_fedavg_ft', 'dp_fedsam',
                 'dp_fedsam_ft', 'dp_fedsam_topk', 'fed_smp_randk', 'fed_smp_topk', 'dp_fedavg_blur',
                 'dp_fedavg_blurs', 'centaur', 'dp2fedsam', 'p_fedsam', 'dp_pfeddsu', 'dp_fedavg_fb',
                 'ppsgd', 'pmtl_ft')


def build(**overrides):
  return train.build_experiment(tiny_config(**overrides))


def one_round(exp, data=None, key=None):
  step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, exp.round_config))
  state = exp.init_state()
  new, _ = step(state, exp.data if data is None else data, exp.root_key if key is None else key)
  return state, new


def shared_change(old, new):
  return jax.tree.map(jnp.subtract, new.shared, old.shared)


def flat(tree):
  return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])


def test_every_issue_method_is_registered():
  assert set(ISSUE_METHODS) <= set(METHODS)


@pytest.mark.parametrize('name', sorted(METHODS))
def test_two_round_run_writes_metrics(name, tmp_path):
  config = tiny_config(method=name, num_rounds=2, eval_every=2, num_clients=4,
                       **{'dp.noise_placement': _common.noise_placement_for(name)})
  final = train.train_and_evaluate(config, str(tmp_path))
  with open(os.path.join(tmp_path, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  assert [r['round'] for r in records] == [2]
  assert 0.0 <= final['test_accuracy'] <= 1.0
  assert 0.0 <= final['test_accuracy_pooled'] <= 1.0
  if not METHODS[name].federated:  # local_only: no round, nothing released
    assert final['epsilon'] == 0.0 and 'train_loss' not in final
    return
  assert math.isfinite(final['train_loss'])
  # Non-private methods report epsilon = inf; private ones a finite epsilon.
  assert math.isinf(final['epsilon']) == (not METHODS[name].private)


# ---------------------------------------------------------------- the pieces, one by one


def test_topk_of_the_noised_sum_keeps_exactly_ceil_pd_coordinates():
  """Central placement: DP-FedSAM-topk's update is top-k of exactly DP-FedSAM's noised update."""
  dense_old, dense_new = one_round(build(method='dp_fedsam', keep_fraction=0.3))
  old, new = one_round(build(method='dp_fedsam_topk_server', keep_fraction=0.3))
  dense, sparse = shared_change(dense_old, dense_new), shared_change(old, new)
  d = flat(sparse).size
  assert np.count_nonzero(flat(sparse)) == math.ceil(0.3 * d)
  chex.assert_trees_all_close(sparse, sparsify.apply_mask(dense, sparsify.topk_mask(dense, 0.3)),
                              atol=1e-7)


def test_topk_of_each_noised_upload_in_distributed_placement():
  """The paper's placement: each client top-k's its own noised upload (k coordinates each)."""
  exp = build(method='dp_fedsam_topk', keep_fraction=0.2, **{'dp.noise_placement': 'distributed'},
              sampling_rate=1.0, num_clients=1, **{'dp.delta': 0.01})
  old, new = one_round(exp)
  change = flat(shared_change(old, new))
  assert np.count_nonzero(change) == math.ceil(0.2 * change.size)
  assert 'sigma/sqrt(m)' in exp.privacy_caveat
  assert build(method='dp_fedsam_topk_server').privacy_caveat == ''
  # Option II with central noise would sparsify the clean update: refused, naming the fix.
  with pytest.raises(ConfigError, match='noise_placement=distributed.*dp_fedsam_topk_server'):
    build(method='dp_fedsam_topk')


def test_topk_mask_counts_with_ties():
  tree = {'a': jnp.ones((7, 3)), 'b': jnp.zeros(5)}
  for p in (0.01, 0.4, 1.0):
    assert int(flat(sparsify.topk_mask(tree, p)).sum()) == math.ceil(p * 26)


@pytest.mark.parametrize('size', [1, 26, 70_000])
def test_radix_select_mask_is_the_mask_of_lax_top_k(size):
  """The radix select keeps exactly the coordinates lax.top_k's indices name, ties included (the
  first by position), at every k from 1 to the whole size, under jit and vmap."""
  key = jax.random.key(size)
  normal = jnp.abs(jax.random.normal(key, (size,)))
  inputs = {'distinct': normal, 'ties': jnp.round(normal * 4) / 4, 'zeros': jnp.zeros(size),
            'tiny and huge': normal * jnp.where(jnp.arange(size) % 2 == 0, 1e-38, 3e38),
            'uniform': jax.random.uniform(key, (size,))}
  for k in sorted({min(2, size), 1, size // 3 or 1, size - 1 or 1, size}):
    ours = functools.partial(sparsify.radix_select_mask, k=k)
    reference = functools.partial(sparsify.top_k_scatter, k=k)
    for name, scores in inputs.items():
      chex.assert_trees_all_equal(jax.jit(ours)(scores), reference(scores),
                                  custom_message=f'{name}, k={k}')
    batch = jnp.stack([inputs['distinct'], inputs['ties']])
    chex.assert_trees_all_equal(jax.vmap(ours)(batch), jax.vmap(reference)(batch))


@pytest.mark.skipif(jax.default_backend() != 'cpu', reason='the radix select is the CPU choice')
def test_a_cpu_mask_takes_the_radix_select_only_where_it_pays():
  """On a CPU, DP-pFedDSU's masks of emnist_cnn's fc0 and second conv kernels (the 2x speed-up) go
  through the radix select; a few hundred kept of a few thousand go through top_k (8,000 vmapped
  such masks took 149 s with the radix select's batched histograms, 11 s with top_k)."""
  uses_top_k = lambda size, k: 'top_k' in str(jax.make_jaxpr(
      lambda s: sparsify._mask_from_scores(s, k))(jnp.zeros(size)))  # pylint: disable=protected-access
  for size, keep in ((524_288, 0.02), (51_200, 0.05)):
    assert sparsify.radix_select_pays(size, sparsify.num_kept(keep, size))
    assert not uses_top_k(size, sparsify.num_kept(keep, size))
  for size, k in ((2_000, 200), (800, 400), (51_200, 512)):
    assert not sparsify.radix_select_pays(size, k) and uses_top_k(size, k)


def test_randk_mask_does_not_depend_on_the_data():
  key = jax.random.key(3)
  a = {'w': jnp.arange(12.0).reshape(3, 4)}
  b = {'w': -jnp.ones((3, 4)) * 1e6}
  chex.assert_trees_all_equal(sparsify.randk_mask(key, a, 0.5), sparsify.randk_mask(key, b, 0.5))
  # In the round: two different data sets, same keys -> the same coordinates move (mask + noise).
  exp = build(method='fed_smp_randk', keep_fraction=0.25)
  other = build(method='fed_smp_randk', keep_fraction=0.25, seed=0, **{'partition': 'pathological'})
  old, new = one_round(exp)
  _, new_other = one_round(exp, data=other.data)
  moved = flat(shared_change(old, new)) != 0
  moved_other = flat(shared_change(old, new_other)) != 0
  np.testing.assert_array_equal(moved, moved_other)
  assert moved.sum() == math.ceil(0.25 * moved.size)


def test_randk_noises_its_public_mask_even_when_nobody_is_sampled():
  exp = build(method='fed_smp_randk', keep_fraction=0.25, sampling_rate=0.01, num_clients=4)
  step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, exp.round_config))
  state = exp.init_state()
  for seed in range(20):  # P(empty cohort) = 0.99**4: the first seeds find one
    new, metrics = step(state, exp.data, jax.random.key(seed))
    if int(metrics['cohort_size']) == 0:
      break
  assert int(metrics['cohort_size']) == 0
  change = flat(shared_change(state, new))
  assert np.count_nonzero(change) == math.ceil(0.25 * change.size)


def test_fed_smp_topk_noise_only_on_private_masks_and_the_safe_variant_everywhere():
  leaky = build(method='fed_smp_topk', keep_fraction=0.1, sampling_rate=1.0, num_clients=2)
  safe = build(method='fed_smp_topk_safe', keep_fraction=0.1, sampling_rate=1.0, num_clients=2)
  old, new = one_round(leaky)
  moved = np.count_nonzero(flat(shared_change(old, new)))
  d = flat(old.shared).size
  assert 0 < moved <= 2 * math.ceil(0.1 * d)  # at most the union of two clients' top-k masks
  old, new = one_round(safe)
  assert np.count_nonzero(flat(shared_change(old, new))) == d
  assert 'does not cover' in leaky.privacy_caveat and safe.privacy_caveat == ''


def test_blur_penalty_has_a_gradient_only_beyond_the_clip_norm():
  reg = pieces.BLUR(lam=2.0, clip_norm=1.0)
  received = {'w': jnp.zeros(4)}
  inside = {'w': jnp.array([0.3, 0.0, 0.4, 0.0])}  # ||Delta|| = 0.5 < C
  outside = {'w': jnp.array([3.0, 0.0, 4.0, 0.0])}  # ||Delta|| = 5 > C
  grad = lambda t: jax.grad(lambda t: reg(t, received))(t)['w']
  np.testing.assert_array_equal(grad(inside), 0.0)
  # d/dDelta (lam/2)(||Delta|| - C)^2 = lam (||Delta|| - C) Delta / ||Delta||.
  np.testing.assert_allclose(grad(outside), 2.0 * 4.0 * outside['w'] / 5.0, rtol=1e-5)
  assert float(reg(inside, received)) == 0.0


def test_adaptive_norm_and_proximal_penalties():
  received = {'w': jnp.zeros(2)}
  theta = {'w': jnp.array([3.0, 4.0])}
  mask = {'w': jnp.array([1.0, 0.0])}
  dsu = pieces.AdaptiveNorm(lam=0.2, clip_norm=1.0)
  np.testing.assert_allclose(dsu(theta, received, mask), 0.1 * abs(3.0 - 1.0), rtol=1e-6)
  prox = pieces.Proximal(lam=0.2, clip_norm=1.0)
  np.testing.assert_allclose(prox(theta, received), 0.2 * 25.0, rtol=1e-6)  # lam ||.||^2


def test_each_piece_holds_its_own_hyperparameters_and_the_config_overrides_them():
  """A piece's paper default is its field; the config default is the same number, and
  MethodSpec.bind(config) gives the row whose pieces carry the config's values (config names kept)."""
  base = config_lib.base_config()
  for spec in METHODS.values():
    for piece in spec.pieces.values():
      for name, path in pieces.knob_pairs(piece):
        assert getattr(piece, name) == functools.reduce(getattr, path.split('.'), base), (spec.name, path)
  overrides = {'keep_fraction': 0.25, 'blur_lambda': 2.5, 'pmtl_lambda': 0.3, 'dsu.lam': 0.7,
               'dsu.keep_fraction': 0.2, 'dsu.masked_layers': 2}
  config = tiny_config(**overrides)
  bound = {name: spec.bind(config) for name, spec in METHODS.items()}
  assert bound['dp_fedavg_blurs'].regularizer.lam == 2.5
  assert bound['dp_fedavg_blurs'].upload_mask.keep_fraction == 0.25
  assert bound['fed_smp_randk'].upload_mask.keep_fraction == 0.25
  assert bound['dp_fedsam_topk'].postprocess.keep_fraction == 0.25
  assert bound['dp_fedsam_topk_server'].postprocess.keep_fraction == 0.25
  assert bound['pmtl_ft'].regularizer.lam == 0.3
  dsu = bound['dp_pfeddsu']
  assert (dsu.regularizer.lam, dsu.weight_mask.keep_fraction, dsu.weight_mask.masked_layers) == (0.7, 0.2, 2)
  assert bound['dp2fedsam'] == METHODS['dp2fedsam']  # nothing of its own to override
  assert build(method='dp_fedavg_blur', blur_lambda=2.5).spec.regularizer.lam == 2.5


class _TwoLayerExtractor(nn.Module):
  """Two kernel layers, so DSU can mask the last one and leave the one below whole."""

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(32, name='low')(x.reshape(x.shape[0], -1)))
    return nn.relu(nn.Dense(32, name='high')(x))


def test_dsu_masks_only_the_last_layers_and_trains_through_the_mask():
  exp = build(method='dp_pfeddsu', **{'dsu.masked_layers': 1, 'dsu.keep_fraction': 0.05,
              'local.shared_epochs': 1, 'local.batch_size': 512}, num_clients=2)
  exp.model = SplitModel('two_layer', _TwoLayerExtractor(), nn.Dense(exp.data.num_classes),
                         exp.data.num_classes, exp.data.input_shape)
  model, data = exp.model, exp.data
  paths = pieces.kernel_layer_paths(model)
  assert paths == (('low',), ('high',))
  state = exp.init_state()
  shared = state.shared
  mask = pieces.dsu_mask(shared, paths, 1, 0.05)
  ext = mask['extractor']
  assert all(np.all(np.asarray(x) == 1) for x in jax.tree.leaves(ext['low']))
  kernel_mask = np.asarray(ext['high']['kernel'])
  assert kernel_mask.sum() == math.ceil(0.05 * kernel_mask.size)

  # The forward pass uses theta * M in `high`: a weight outside M does not change the output.
  x = data.normalize(data.client_train(0)[0][:8])
  outside = tuple(np.argwhere(kernel_mask == 0)[0])
  bumped = jax.tree.map(lambda a: a, shared)  # a copy we can edit
  # Shrinking a weight outside M keeps it outside M.
  bumped['extractor']['high']['kernel'] = shared['extractor']['high']['kernel'].at[outside].set(0.0)
  head = jax.tree.map(lambda h: h[0], state.personal['head'])

  def logits(s):
    forward = sparsify.apply_mask(s, pieces.dsu_mask(s, paths, 1, 0.05))
    return model.apply({**forward, 'head': head}, x)

  np.testing.assert_allclose(logits(shared), logits(bumped), atol=1e-6)
  dense = lambda s: model.apply({**s, 'head': head}, x)
  assert not np.allclose(dense(shared), dense(bumped), atol=1e-6)  # the weight does matter unmasked

  # One local step: `high` moves only inside its mask; the layer below moves everywhere.
  client = make_client_update(exp.spec, model, exp.local_config, data.normalize,
                              clip_norm=exp.mechanism.clip_norm)
  personal = jax.tree.map(lambda h: h[0], state.personal)
  result = jax.jit(client)(shared, personal, *data.client_train(0), jax.random.key(0), 0)
  high_moved = np.asarray(result.delta['extractor']['high']['kernel']) != 0
  assert high_moved.any() and not np.any(high_moved & (kernel_mask == 0))
  assert np.mean(np.asarray(result.delta['extractor']['low']['kernel']) != 0) > 0.5


def test_ft_methods_change_only_the_evaluation():
  base_state = {}
  for base, ft in (('dp_fedavg', 'dp_fedavg_ft'), ('dp_fedsam', 'dp_fedsam_ft'),
                   ('dp_fedavg', 'dp_fedavg_fb')):
    a, b = build(method=base), build(method=ft)
    assert dataclasses.replace(b.spec, name=base, paper='', evaluation=specs.TEST_GLOBAL) == \
        dataclasses.replace(a.spec, paper='')
    if base not in base_state:
      base_state[base] = one_round(a)[1]
    state_a = base_state[base]
    _, state_b = one_round(b)
    chex.assert_trees_all_equal(state_a, state_b)
    key = jax.random.key(0)
    acc_a = make_evaluate(a.spec, a.model, a.local_config)(state_a, a.data, key)
    acc_b = make_evaluate(b.spec, b.model, b.local_config)(state_b, b.data, key)
    assert float(acc_a['test_loss']) != float(acc_b['test_loss'])


def test_method_pairs_differ_only_in_their_one_piece():
  def same_but(a, b, **piece):
    return dataclasses.replace(METHODS[a], name='x', paper='', **piece) == \
        dataclasses.replace(METHODS[b], name='x', paper='')
  assert same_but('centaur', 'dp2fedsam', shared_optimizer=local.SAM())
  assert same_but('dp_fedavg', 'dp_fedsam', shared_optimizer=local.SAM())
  assert same_but('fedavg', 'dp_fedavg', private=True)
  assert same_but('dp2fedsam', 'p_fedsam', private=False)
  assert same_but('fed_smp_topk', 'fed_smp_topk_safe', noise_on_mask=False)
  assert same_but('dp_pfeddsu', 'dp_pfeddsu_safe', noise_on_mask=False)
  assert same_but('dp_fedavg_blur', 'dp_fedavg_blurs', upload_mask=specs.TOPK)


def test_ppsgd_personal_model_is_global_plus_own_offset():
  exp = build(method='ppsgd', sampling_rate=1.0)
  state = exp.init_state()
  assert set(state.personal) == {'head_offset'}
  assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(state.personal))
  _, new = one_round(exp)
  offsets = new.personal['head_offset']['kernel']
  assert not np.allclose(offsets[0], offsets[1])  # each client learns its own correction
  assert 'head' in new.shared  # the global head is shared and aggregated


def test_leaky_methods_say_so_in_metrics(tmp_path):
  config = tiny_config(method='dp_pfeddsu', num_rounds=1, num_clients=4)
  final = train.train_and_evaluate(config, str(tmp_path))
  assert 'does not cover' in final['epsilon_caveat']


@pytest.mark.parametrize('name', ['dp_pfeddsu', 'dp_pfeddsu_safe'])
def test_dsu_trains_and_tests_the_same_masked_network(name):
  """Every forward pass is through theta * M (dp-pfeddsu.txt eq. 7): the head phase and the test
  of a state see exactly what they would see on the explicitly masked state."""
  exp = build(method=name, **{'dsu.masked_layers': 2, 'dsu.keep_fraction': 0.1})
  state = exp.init_state()
  weight_mask = exp.spec.weight_mask.for_model(exp.spec.name, exp.model)
  masked = state.replace(shared=weight_mask.forward(state.shared))
  # Only kernels are masked; the biases of masked layers are kept whole.
  mask = weight_mask(state.shared)
  for path, m in jax.tree_util.tree_leaves_with_path(mask):
    if jax.tree_util.keystr(path).endswith("['bias']"):
      assert np.all(np.asarray(m) == 1), path
  assert min(float(np.mean(np.asarray(m))) for m in jax.tree.leaves(mask)) < 0.11

  evaluate = jax.jit(exp.make_evaluate())
  key = jax.random.key(0)
  chex.assert_trees_all_close(evaluate(state, exp.data, key), evaluate(masked, exp.data, key))
  # The dense network is a different one (so the check above is not vacuous).
  dense = make_evaluate(dataclasses.replace(exp.spec, weight_mask=specs.NO_WEIGHT_MASK,
                                            upload_mask=specs.NO_UPLOAD_MASK, noise_on_mask=False),
                        exp.model, exp.local_config)
  assert float(dense(state, exp.data, key)['test_loss']) != float(
      evaluate(state, exp.data, key)['test_loss'])

  # The head phase learns on the masked features: the new head is the same from theta * M.
  client = jax.jit(make_client_update(exp.spec, exp.model, exp.local_config, exp.data.normalize,
                                      clip_norm=exp.mechanism.clip_norm))
  personal = jax.tree.map(lambda h: h[0], state.personal)
  args = (*exp.data.client_train(0), jax.random.key(1), 0)
  chex.assert_trees_all_close(client(state.shared, personal, *args).personal,
                              client(masked.shared, personal, *args).personal, atol=1e-6)


def test_client_topk_releases_exact_zeros_that_reveal_the_target():
  """dp_fedsam_topk's caveat (docs/privacy.md section 4): with this code's clip, distributed shares
  and client top-k, a coordinate nobody kept is released as an exact 0, and how often depends on
  whether the target took part: d = 2000, |S| = 20, sigma = C = 1, 10 % kept. Without the target
  P(sum[0] = 0) is ~0.9^20 = 0.12; with a target that puts its update on coordinate 0 it is 0, so
  delta >= ~0.12 for every epsilon, which the accounted epsilon does not say."""
  from dp2fedsam_jax.privacy.mechanism import DPMechanism  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.privacy.noise_mechanisms import Independent  # pylint: disable=import-outside-toplevel
  d, others, trials = 2000, 20, 400
  assert 'does not cover' in train.get_method('dp_fedsam_topk').privacy_caveat()

  def released_zero(key, with_target):
    cohort = others + int(with_target)
    mech = DPMechanism(Independent(cohort, 1.0), clip_norm=1.0, noise_multiplier=1.0,
                       noise_placement='distributed')
    update_key, noise_key = jax.random.split(key)
    updates = jax.random.normal(update_key, (cohort, d))
    if with_target:
      updates = updates.at[-1].set(jnp.zeros(d).at[0].set(5.0))

    def one(update, k):
      upload, _ = mech.clip({'w': update})
      upload = mech.privatize_upload(k, upload, jnp.asarray(cohort))
      return sparsify.apply_mask(upload, sparsify.topk_mask(upload, 0.1))['w']
    total = jnp.sum(jax.vmap(one)(updates, jax.random.split(noise_key, cohort)), axis=0)
    return total[0] == 0

  trial_keys = jax.random.split(jax.random.key(0), trials)
  without = float(jnp.mean(jax.vmap(lambda k: released_zero(k, False))(trial_keys)))
  with_target = float(jnp.mean(jax.vmap(lambda k: released_zero(k, True))(trial_keys)))
  assert 0.07 < without < 0.18 and with_target == 0.0, (without, with_target)
