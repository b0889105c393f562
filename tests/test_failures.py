"""Failure behaviour: every config field validated (property-based), clipping and padding invariants,
NaN/Inf stops with the round and a resumable checkpoint, out-of-memory and missing-data hints."""

import json
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conftest import tiny_config
from dp2fedsam_jax import checkpoint, data, train
from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax.config import ConfigError, base_config, choices, validate_config
from dp2fedsam_jax.models.registry import model_names
from dp2fedsam_jax.privacy import accounting, clipping
from dp2fedsam_jax.federated_round import _masked_sum, make_round_step

QUICK = settings(max_examples=40, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------ config validation

NAN, INF = float('nan'), float('inf')


def _other_text(choices):
  return st.text(max_size=12).filter(lambda s: s not in choices and not s.startswith('tfds:'))


_floats = lambda **kw: st.floats(allow_nan=False, **kw)
_not_finite = st.sampled_from([NAN, INF, -INF])
NON_POSITIVE_INT = st.integers(max_value=0)
NEGATIVE_INT = st.integers(max_value=-1)
NON_POSITIVE = _floats(max_value=0.0) | _not_finite
NEGATIVE = _floats(max_value=-1e-300) | _not_finite
NOT_A_FRACTION = _floats(max_value=0.0) | _floats(min_value=1.0 + 1e-12) | st.just(NAN)

# Every field of base_config() and values of its type that must be refused (ConfigDict itself
# refuses values of another type, e.g. 1.5 for an int field).
CHOICES = choices()  # from the modules that implement each choice
INVALID = {
    'method': _other_text(set(METHODS)),
    'dataset': _other_text(set(data.dataset_names())),
    'model': _other_text(set(model_names())),
    'conv_impl': _other_text(CHOICES['conv_impl']),
    'partition': _other_text(CHOICES['partition']),
    'executor': _other_text(CHOICES['executor']),
    'server_optimizer': _other_text(CHOICES['server_optimizer']),
    'dp.sampling': _other_text(CHOICES['dp.sampling']),
    'dp.poisson_draw': _other_text(CHOICES['dp.poisson_draw']),
    'dp.noise_placement': _other_text(CHOICES['dp.noise_placement']),
    'dp.accountant': _other_text(CHOICES['dp.accountant']),
    'dp.noise_mechanism': _other_text(CHOICES['dp.noise_mechanism']),
    'dp.clipping': _other_text(CHOICES['dp.clipping']),
    'num_clients': NON_POSITIVE_INT,
    'classes_per_client': NON_POSITIVE_INT,
    'eval_every': NON_POSITIVE_INT,
    'eval_from': NEGATIVE_INT,
    'checkpoint_every': NON_POSITIVE_INT,
    'local.batch_size': NON_POSITIVE_INT,
    'chunk_size': NON_POSITIVE_INT,
    'cohort_capacity': NON_POSITIVE_INT,
    'eval_clients': NON_POSITIVE_INT,
    'local.max_examples': NON_POSITIVE_INT,
    'local.subset_draw': _other_text(CHOICES['local.subset_draw']),
    'dp.num_bands': NON_POSITIVE_INT,
    'num_rounds': NEGATIVE_INT,
    'seed': NEGATIVE_INT,
    'training_seed': st.one_of(NEGATIVE_INT, st.integers(min_value=2**64)),
    'dsu.masked_layers': NEGATIVE_INT,
    'local.personal_epochs': NEGATIVE_INT,
    'local.shared_epochs': NEGATIVE_INT,
    'local.finetune_epochs': NEGATIVE_INT,
    'dirichlet_alpha': NON_POSITIVE,
    'server_lr': NON_POSITIVE,
    'server_eps': NON_POSITIVE,
    'local.lr_decay': NON_POSITIVE,
    'dp.clip_norm': NON_POSITIVE,
    'dp.target_epsilon': NON_POSITIVE,
    'blur_lambda': NEGATIVE,
    'pmtl_lambda': NEGATIVE,
    'dsu.lam': NEGATIVE,
    'local.lr_personal': NEGATIVE,
    'local.lr_shared': NEGATIVE,
    'local.sam_rho': NEGATIVE,
    'dp.noise_multiplier': NEGATIVE,
    'dp.clip_lr': NEGATIVE,
    'dp.count_noise_multiplier': NEGATIVE,
    'dp.initial_clip_norm': NON_POSITIVE,
    'dp.target_quantile': NOT_A_FRACTION,
    'sampling_rate': NOT_A_FRACTION,
    'keep_fraction': NOT_A_FRACTION,
    'dsu.keep_fraction': NOT_A_FRACTION,
    'validation_fraction': _floats(max_value=-1e-300) | _floats(min_value=1.0) | st.just(NAN),
    'local.momentum': _floats(max_value=-1e-300) | _floats(min_value=1.0) | st.just(NAN),
    **{f'server_{decay}': _floats(max_value=-1e-300) | _floats(min_value=1.0) | st.just(NAN)
       for decay in ('momentum', 'beta1', 'beta2')},
    'dp.delta': _floats(max_value=0.0) | _floats(min_value=1.0) | st.just(NAN),
    'init_checkpoint': st.text(min_size=1, max_size=12).map(lambda s: '/nonexistent/' + s),
    'eval.adapt_epochs': NEGATIVE_INT,
    'eval.adapt_lr': NON_POSITIVE,
    'eval.adapt_part': _other_text(CHOICES['eval.adapt_part']),
    'eval.head_init': _other_text(CHOICES['eval.head_init']),
}
# Any string is a valid directory name here; a missing one fails at load with the dataset's hint.
# private_metrics_only is a bool (ConfigDict refuses other types); True is refused only with a
# non-private method (tests/test_train.py::test_private_metrics_only_is_refused_for_a_non_private_method).
NO_INVALID_VALUE = {'data_dir', 'private_metrics_only'}


def _leaf_fields(c, prefix=''):
  for k, v in c.items():
    if hasattr(v, 'items'):
      yield from _leaf_fields(v, f'{prefix}{k}.')
    else:
      yield f'{prefix}{k}'


def test_every_config_field_has_invalid_values_under_test():
  assert set(_leaf_fields(base_config())) == set(INVALID) | NO_INVALID_VALUE


def _set(config, field, value):
  node = config
  *parents, leaf = field.split('.')
  for p in parents:
    node = node[p]
  node[leaf] = value


@QUICK
@given(st.data())
def test_any_invalid_field_is_refused_naming_that_field(draw):
  field = draw.draw(st.sampled_from(sorted(INVALID)), label='field')
  value = draw.draw(INVALID[field], label='value')
  config = tiny_config()
  _set(config, field, value)
  with pytest.raises(ConfigError, match='^config.' + field.replace('.', r'\.') + '='):
    validate_config(config, set(METHODS))


@QUICK
@given(q=_floats(min_value=1e-9, max_value=1.0), clip=_floats(min_value=1e-9, max_value=1e9),
       sigma=_floats(min_value=0.0, max_value=1e6), delta=_floats(min_value=1e-12, max_value=0.999),
       momentum=_floats(min_value=0.0, max_value=0.999), rounds=st.integers(0, 10**6),
       method=st.sampled_from(sorted(METHODS)), sampling=st.sampled_from(['poisson', 'fixed']))
def test_valid_values_pass(q, clip, sigma, delta, momentum, rounds, method, sampling):
  config = tiny_config(**{'sampling_rate': q, 'dp.clip_norm': clip, 'dp.noise_multiplier': sigma,
                          'dp.delta': delta, 'local.momentum': momentum, 'num_rounds': rounds,
                          'method': method, 'dp.sampling': sampling,
                          'dp.accountant': 'rdp' if sampling == 'fixed' else 'pld'})
  validate_config(config, set(METHODS))


@QUICK
@given(st.data())
def test_accounting_refuses_invalid_arguments_naming_them(draw):
  field, value = draw.draw(st.sampled_from(['noise_multiplier', 'sampling_rate', 'delta']).flatmap(
      lambda f: st.tuples(st.just(f), {'noise_multiplier': NEGATIVE, 'sampling_rate': NOT_A_FRACTION,
                                       'delta': INVALID['dp.delta']}[f])))
  kwargs = dict(noise_multiplier=1.0, sampling_rate=0.1, delta=1e-5)
  kwargs[field] = value
  with pytest.raises(ValueError, match=field):
    accounting.compute_epsilon(kwargs['noise_multiplier'], kwargs['sampling_rate'], 3,
                               kwargs['delta'])


# ------------------------------------------------------------------ clipping and padding invariants

_shapes = st.sampled_from([(3,), (2, 5), (4, 1, 2)])
_BIG = float(np.float32(1e30))
_values = _floats(min_value=-_BIG, max_value=_BIG, width=32)


@st.composite
def _trees(draw):
  leaves = draw(st.lists(_shapes, min_size=1, max_size=3))
  return {f'l{i}': draw(hnp.arrays(np.float32, s, elements=_values)) for i, s in enumerate(leaves)}


@settings(max_examples=60, deadline=None)
@given(tree=_trees(), clip=_floats(min_value=1e-3, max_value=1e3))
def test_clipped_global_norm_is_at_most_c_and_the_direction_is_kept(tree, clip):
  """Against a float64 NumPy norm of all arrays concatenated, not the library's own global_norm."""
  clipped, norm = clipping.clip_by_global_norm(jax.tree.map(jnp.asarray, tree), clip)
  norm64 = lambda t: np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in t.values()))
  expected = norm64(tree)
  # atol: a float32 norm of subnormal entries is exact only to ~1e-45.
  np.testing.assert_allclose(float(norm), expected, rtol=1e-5, atol=1e-30)
  assert norm64(clipped) <= clip * (1 + 1e-5)
  scale = min(1.0, clip / expected) if expected > 0 else 1.0
  for key in tree:  # one scale for the whole update: clipping is global, never per tensor
    np.testing.assert_allclose(np.asarray(clipped[key], np.float64),
                               tree[key].astype(np.float64) * scale, rtol=1e-5,
                               atol=1e-6 * clip)


@settings(max_examples=60, deadline=None)
@given(rows=hnp.arrays(np.float32, (5, 3), elements=_floats(min_value=-1e6, max_value=1e6,
                                                             width=32)),
       valid=hnp.arrays(np.bool_, (5,)),
       garbage=st.sampled_from([NAN, INF, -INF, 1e30]))
def test_padded_slots_never_change_the_sum(rows, valid, garbage):
  padded = np.where(valid[:, None], rows, np.float32(garbage))
  total = _masked_sum({'a': jnp.asarray(padded)}, jnp.asarray(valid))['a']
  np.testing.assert_allclose(np.asarray(total), rows[valid].sum(axis=0), rtol=1e-5, atol=1e-2)


@pytest.fixture(scope='module')
def client_update():
  exp = train.build_experiment(tiny_config())
  update = jax.jit(make_client_update(exp.spec, exp.model, exp.local_config, exp.data.normalize))
  state = exp.init_state()
  personal = jax.tree.map(lambda p: p[0], state.personal)
  return exp, lambda x, y, n: update(state.shared, personal, x, y, n, jax.random.key(3), 0)


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pad_x=hnp.arrays(np.uint8, (24, 8, 8, 1)), pad_y=hnp.arrays(np.int32, (24,),
                                                                    elements=st.integers(0, 3)))
def test_padding_examples_never_change_a_client_update(client_update, pad_x, pad_y):
  exp, update = client_update
  x, y, n = exp.data.client_train(0)
  n = int(n)
  x, y = x[:n], y[:n]
  clean = update(jnp.concatenate([x, jnp.zeros_like(pad_x)]),
                 jnp.concatenate([y, jnp.zeros_like(pad_y)]), n)
  dirty = update(jnp.concatenate([x, pad_x]), jnp.concatenate([y, pad_y]), n)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               clean, dirty)


# ------------------------------------------------------------------ NaN / Inf, OOM, missing data


def test_a_diverged_client_uploads_zero_keeps_its_head_and_the_run_goes_on():
  """One client's training diverges (NaN data): it counts in nonfinite_clients, contributes exactly
  a zero update (the same release as a client whose update is zero), and its head is not written."""
  exp = train.build_experiment(tiny_config(sampling_rate=1.0, **{'dp.delta': 0.1}))
  state = exp.init_state()
  float_data = exp.data.replace(train_x=exp.data.train_x.astype(jnp.float32))
  rows = slice(*np.asarray(exp.data.train_offsets[2:4]))  # client 2's examples
  poisoned_data = float_data.replace(train_x=float_data.train_x.at[rows].set(jnp.nan))
  step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, exp.round_config))
  zero_hook = lambda cid, d: jax.tree.map(lambda x: jnp.where(cid == 2, 0.0, x), d)
  zero_step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, exp.round_config,
                                      update_hook=zero_hook))

  nan_state, nan_metrics = step(state, poisoned_data, exp.root_key)
  zero_state, zero_metrics = zero_step(state, float_data, exp.root_key)
  assert int(nan_metrics['nonfinite_clients']) == 1 and int(zero_metrics['nonfinite_clients']) == 0
  assert bool(nan_metrics['finite'])
  chex.assert_trees_all_equal(nan_state.shared, zero_state.shared)
  head = lambda s, i: jax.tree.map(lambda h: np.asarray(h[i]), s.personal)
  chex.assert_trees_all_equal(head(nan_state, 2), head(state, 2))        # not written
  assert not np.array_equal(head(zero_state, 2)['head']['kernel'], head(state, 2)['head']['kernel'])
  chex.assert_trees_all_equal(head(nan_state, 1), head(zero_state, 1))   # the others are
  assert np.isfinite(float(nan_metrics['train_loss']))


def test_a_round_where_every_client_diverged_reports_no_mean_loss():
  """No client trained (NaN data everywhere): the round's means are NaN (null in
  train_metrics.jsonl), never the 0 of an empty sum that reads as a perfect loss."""
  exp = train.build_experiment(tiny_config(sampling_rate=1.0, **{'dp.delta': 0.1}))
  poisoned = exp.data.replace(train_x=jnp.full(exp.data.train_x.shape, jnp.nan, jnp.float32))
  step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, exp.round_config))
  _, metrics = step(exp.init_state(), poisoned, exp.root_key)
  assert int(metrics['nonfinite_clients']) == int(metrics['cohort_size']) > 0
  for key in ('train_loss', 'mean_update_norm', 'clipped_fraction'):
    assert np.isnan(float(metrics[key])), key
  assert train.window_means([metrics, {**metrics, 'train_loss': 2.0}])['train_loss'] == 2.0


def test_diverging_clients_do_not_end_a_run(tmp_path):
  """Local training at lr 1e30 blows up (a client goes non-finite and uploads zero; the others
  saturate to a zero update): the run finishes and says so."""
  config = tiny_config(num_rounds=2, **{'local.lr_shared': 1e30, 'local.lr_personal': 1e30})
  final = train.train_and_evaluate(config, str(tmp_path))
  assert final['round'] == 2 and final['nonfinite_clients'] >= 1
  assert math.isfinite(final['test_loss'])


def _poisoned_round_step(from_round: int):
  """The real round step, on shared parameters that are +inf from round `from_round` + 1 on."""
  def round_step(self):
    real = make_round_step(self.spec, self.model, self.local_config, self.round_config)
    def step(state, data, key):
      poisoned = jax.tree.map(lambda x: jnp.where(state.round >= from_round, x + jnp.inf, x),
                              state.shared)
      return real(state.replace(shared=poisoned), data, key)
    return step
  return round_step


def test_nonfinite_release_before_any_checkpoint_does_not_claim_one(tmp_path, monkeypatch):
  monkeypatch.setattr(train.Experiment, 'make_round_step', _poisoned_round_step(0))
  with pytest.raises(FloatingPointError) as info:
    train.train_and_evaluate(tiny_config(num_rounds=1), str(tmp_path))
  message = str(info.value)
  assert message.startswith('round 1: ') and 'is intact' not in message
  assert f'no checkpoint was written yet in {tmp_path}' in message


def test_nonfinite_release_stops_with_the_round_and_the_checkpoint_resumes(tmp_path, monkeypatch):
  workdir = str(tmp_path)
  monkeypatch.setattr(train.Experiment, 'make_round_step', _poisoned_round_step(1))
  with pytest.raises(FloatingPointError,
                     match=r'^round 2: .*NaN/Inf.*the checkpoint of round 1 in .* is intact'):
    train.train_and_evaluate(tiny_config(num_rounds=3), workdir)
  monkeypatch.undo()
  assert [json.loads(l)['round'] for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()] == [1]
  # The failed round's training scalars are kept for diagnosis (cut back when the run resumes).
  trained = [json.loads(l) for l in (tmp_path / 'train_metrics.jsonl').read_text().splitlines()]
  assert [t['round'] for t in trained] == [1, 2]
  state, _ = checkpoint.restore(workdir, train.build_experiment(tiny_config()).init_state())
  assert int(state.round) == 1
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(state.shared))
  # The same command without the fault resumes from round 1.
  final = train.train_and_evaluate(tiny_config(num_rounds=3), workdir)
  lines = [json.loads(l) for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [l['round'] for l in lines] == [1, 2, 3] and math.isfinite(final['train_loss'])
  trained = [json.loads(l) for l in (tmp_path / 'train_metrics.jsonl').read_text().splitlines()]
  assert [t['round'] for t in trained] == [1, 2, 3]


_OOM = 'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 12.00GiB.'


def test_out_of_memory_says_to_set_chunk_size(tmp_path, monkeypatch):
  def exhausted(self):
    def step(state, data, key):
      raise jax.errors.JaxRuntimeError(_OOM)
    return step

  monkeypatch.setattr(train.Experiment, 'make_round_step', exhausted)
  with pytest.raises(train.OutOfMemoryError, match='compiling the round step.*config.chunk_size') as e:
    train.train_and_evaluate(tiny_config(), str(tmp_path))
  assert isinstance(e.value.__cause__, jax.errors.JaxRuntimeError)
  # The same hint wraps every round; other runtime errors pass through untouched.
  with pytest.raises(train.OutOfMemoryError, match=r'^round 7: .*--config\.chunk_size=K'):
    with train._hint_on_oom(tiny_config(), 'round 7', str(tmp_path)):
      raise jax.errors.JaxRuntimeError(_OOM)
  with pytest.raises(jax.errors.JaxRuntimeError, match='INTERNAL'):
    with train._hint_on_oom(tiny_config(), 'round 7', str(tmp_path)):
      raise jax.errors.JaxRuntimeError('INTERNAL: something else')


def test_missing_dataset_says_how_to_get_it(tmp_path):
  config = tiny_config(dataset='fashion_mnist', data_dir=str(tmp_path / 'nowhere'))
  with pytest.raises(data.DatasetNotFoundError,
                     match=r'apt-get install dataset-fashion-mnist.*--config\.data_dir'):
    train.build_experiment(config)


@pytest.mark.parametrize('dataset, partition, model, fitting', [
    ('shakespeare', 'natural', 'cifar_cnn', 'char_lstm, char_lstm_small'),
    ('synthetic', 'iid', 'char_lstm', 'cifar_cnn, emnist_cnn'),
])
def test_a_model_that_does_not_fit_the_dataset_fails_before_any_data_is_loaded(
    dataset, partition, model, fitting, monkeypatch):
  """A new user's --config.dataset=shakespeare --config.partition=natural --config.model=cifar_cnn:
  one line naming config.model and the models that fit, from the binary's first check, with every
  data loader replaced by one that fails the test if it is reached."""
  def no_loading(*args, **kwargs):
    raise AssertionError('data was loaded before the config was checked')
  for name in ('make_federated_data', 'load_token_clients'):
    monkeypatch.setattr(train, name, no_loading)
  monkeypatch.setattr(data.sources, 'load_dataset', no_loading)
  config = tiny_config(dataset=dataset, partition=partition, model=model)
  for check in (validate_config, train.build_experiment, train.describe):
    with pytest.raises(ConfigError) as error:
      check(config)
    message = str(error.value)
    assert message.startswith(f'config.model={model!r}: config.dataset={dataset!r} is ')
    assert fitting in message and '\n' not in message
