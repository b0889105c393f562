"""Clients of any size as one data model: ragged storage, the per-round budget, token
sequences (per-token masks, [n, T, F] head features), and evaluation of a fixed sample of clients."""

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config, token_federation
from dp2fedsam_jax import evaluation, keys, local
from dp2fedsam_jax.algorithms import get_method
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax.config import ConfigError, validate_config
from dp2fedsam_jax.data import from_flat_arrays, padded_bytes
from dp2fedsam_jax.models import get_model
from dp2fedsam_jax.models.registry import SplitModel
from dp2fedsam_jax.privacy.mechanism import DPMechanism
from dp2fedsam_jax.executors import Sequential
from dp2fedsam_jax.federated_round import RoundConfig, chunk_ids, make_round_step, sampled_id_blocks
from dp2fedsam_jax.state import init_state

TRAIN_SIZES = (1, 3, 500)
SHAPE = (4, 4, 1)


def _local(**overrides):
  base = dict(personal_epochs=1, shared_epochs=1, batch_size=8, lr_personal=0.05, lr_shared=0.05,
              momentum=0.5, lr_decay=1.0, sam_rho=0.05, finetune_epochs=1, max_examples=None)
  return local.LocalConfig(**(base | overrides))


def _unequal_images(seed=0):
  rng = np.random.default_rng(seed)
  total = sum(TRAIN_SIZES)
  return from_flat_arrays(
      train_x=rng.integers(0, 256, (total, *SHAPE), dtype=np.uint8),
      train_y=rng.integers(0, 3, total), train_offsets=np.r_[0, np.cumsum(TRAIN_SIZES)],
      test_x=rng.integers(0, 256, (4, *SHAPE), dtype=np.uint8), test_y=rng.integers(0, 3, 4),
      test_offsets=[0, 1, 2, 4], num_classes=3, mean=(0.5,), std=(0.25,))


def _round(method, model, data, local_config, **config):
  spec = get_method(method)
  c = tiny_config(method=method, num_clients=data.num_clients, sampling_rate=1.0, **config)
  c.dp.noise_multiplier, c.dp.target_epsilon = 0.0, None
  mechanism = DPMechanism.from_config(c, data.num_clients, spec)
  step = make_round_step(spec, model, local_config, RoundConfig(mechanism, server_lr=1.0,
                                                                executor=Sequential()))
  return spec, jax.jit(step)


def _alone(spec, model, data, local_config, state, client_id, x, y, root):
  """Client `client_id` trained by itself on exactly x, y (no padded slot), with its round keys."""
  update = jax.jit(make_client_update(spec, model, local_config, data.normalize))
  client_key = keys.client_key(keys.round_keys(root, 0).clients, client_id)
  train_key, _ = keys.train_and_upload(client_key)
  personal = jax.tree.map(lambda p: p[client_id], state.personal)
  return update(state.shared, personal, x, y, len(y), train_key, 0)


@pytest.mark.parametrize('max_examples,subset_draw', [(None, 'argsort'), (8, 'argsort'), (8, 'floyd')])
def test_unequal_clients_train_as_if_alone(max_examples, subset_draw):
  """Sizes 1, 3, 500 in one round (q = 1, no noise, no clipping bite): each client's new head and
  the summed update equal those of the clients trained alone on their own examples, unpadded; with
  a budget of 8 the large client trains on the 8 examples its own key chooses (by either draw)."""
  data = _unequal_images()
  model = get_model('mlp', 3, SHAPE, hidden=8)
  local_config = _local(max_examples=max_examples, subset_draw=subset_draw)
  spec, step = _round('fedrep', model, data, local_config)
  root = jax.random.key(5)
  state = init_state(spec, model, jax.random.key(1), data.num_clients)
  new, metrics = step(state, data, root)
  assert int(metrics['cohort_size']) == 3

  budget = local_config.budget(data.max_train)
  assert budget == (500 if max_examples is None else 8)
  total = None
  for i, n in enumerate(TRAIN_SIZES):
    start = int(data.train_offsets[i])
    rows = np.arange(start, start + n)
    if n > budget:  # (c) truncation: the subset the client's examples key picks, fresh per round
      client_key = keys.client_key(keys.round_keys(root, 0).clients, i)
      gather = jax.jit(lambda d, k, i=i: d.train_examples(i, budget, keys.examples_key(k),
                                                          subset_draw))
      x, _, count = gather(data, client_key)
      assert int(count) == budget
      chosen = [int(np.flatnonzero((np.asarray(data.train_x[rows]) == np.asarray(xj)).all((1, 2, 3)))[0])
                for xj in x]
      assert len(set(chosen)) == budget
      other_key = keys.client_key(keys.round_keys(root, 1).clients, i)
      assert not np.array_equal(x, gather(data, other_key)[0])
      rows = rows[chosen]
    result = _alone(spec, model, data, local_config, state, i, data.train_x[rows],
                    data.train_y[rows], root)
    chex.assert_trees_all_close(jax.tree.map(lambda p, i=i: p[i], new.personal), result.personal,
                                rtol=1e-5, atol=1e-6)
    total = result.delta if total is None else jax.tree.map(jnp.add, total, result.delta)
  released = jax.tree.map(jnp.subtract, new.shared, state.shared)
  chex.assert_trees_all_close(released, jax.tree.map(lambda t: t / 3, total), rtol=1e-4, atol=1e-6)


def test_a_client_within_the_budget_trains_on_all_its_examples_in_order():
  data = _unequal_images()
  key = jax.random.key(0)
  for i, n in enumerate(TRAIN_SIZES[:2]):
    full_x, full_y, full_n = data.client_train(i)
    x, y, count = data.train_examples(i, 8, key)
    assert int(count) == int(full_n) == n
    np.testing.assert_array_equal(x, full_x[:8])
    np.testing.assert_array_equal(y, full_y[:8])
    assert not np.asarray(x[n:]).any()


def test_storage_follows_the_total_number_of_examples():
  """(b) memory: the flat arrays hold the 504 training examples, not 3 x 500 padded slots."""
  data = _unequal_images()
  example = int(np.prod(SHAPE))
  assert data.train_x.shape == (sum(TRAIN_SIZES), *SHAPE) and data.train_y.shape == (504,)
  assert data.max_train == 500 and data.max_test == 2
  padded, ragged = padded_bytes(data.train_offsets, example)
  assert padded == 3 * 500 * example and ragged == 504 * example + 4 * 4
  assert data.nbytes == sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(data)) < padded
  # The round's buffer of one client is [budget], never [N, max]: a 10x larger population of the
  # same clients costs 10x the data and the same buffer.
  x, _, _ = jax.eval_shape(lambda d: d.train_examples(0, 8, jax.random.key(0)), data)
  assert x.shape == (8, *SHAPE)


# ---------------------------------------------------------------- token sequences

VOCAB, LENGTH, PAD, EOS = 7, 6, 0, 6


class _TokenExtractor(nn.Module):
  """Embedding + Dense: [n, T] ids -> [n, T, 8] features."""

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Dense(8)(nn.Embed(VOCAB, 4)(jnp.asarray(x, jnp.int32))))


def _token_model():
  return SplitModel(name='tiny_tokens', extractor=_TokenExtractor(), head=nn.Dense(VOCAB),
                    num_classes=VOCAB, input_shape=(LENGTH,))


def _token_data(train_sizes=(2, 5, 1, 9), test_sizes=(1, 2, 0, 3)):
  return token_federation(train_sizes, test_sizes, vocab=VOCAB, length=LENGTH, pad=PAD, eos=EOS,
                          seed=3)


def test_token_targets_pad_out_of_loss_and_eos_out_of_accuracy():
  data = _token_data()
  assert data.input_kind == 'tokens' and data.train_y.dtype == jnp.uint8
  assert data.normalize(data.train_x).dtype == jnp.int32
  y = jnp.array([[3, EOS, PAD], [2, 4, PAD]])
  examples = jnp.array([True, False])
  np.testing.assert_array_equal(data.loss_mask(y, examples), [[1, 1, 0], [0, 0, 0]])
  np.testing.assert_array_equal(data.accuracy_mask(y, examples), [[1, 0, 0], [0, 0, 0]])
  logits = jax.random.normal(jax.random.key(0), (2, 3, VOCAB))
  loss = local.masked_cross_entropy(logits, y, data.loss_mask(y, examples))
  by_hand = -np.mean([jax.nn.log_softmax(logits[0, t])[int(y[0, t])] for t in (0, 1)])
  np.testing.assert_allclose(loss, by_hand, rtol=1e-6)


def test_token_sequences_train_with_a_head_phase_and_evaluate_per_token():
  """DP2-FedSAM on tokens: head phase on cached [n, T, F] features, SAM phase, evaluation =
  correct non-pad non-EOS tokens / such tokens of each client (the mean over clients with any)."""
  data, model = _token_data(), _token_model()
  local_config = _local(max_examples=4)
  spec, step = _round('dp2fedsam', model, data, local_config, **{'dp.noise_multiplier': 0.0})
  state = init_state(spec, model, jax.random.key(1), data.num_clients)
  new, metrics = step(state, data, jax.random.key(2))
  assert int(metrics['cohort_size']) == 4 and np.isfinite(float(metrics['train_loss']))
  assert float(metrics['mean_update_norm']) > 0
  moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), new.personal, state.personal)
  assert all(jax.tree.leaves(moved))  # the heads learnt on [n, T, F] features

  evaluate = evaluation.make_evaluate(spec, model, local_config)
  clients = jax.jit(evaluate.per_client)(new, data, jax.random.key(0))
  expected, targets = [], []
  for i in range(data.num_clients):
    x, y, n = data.test_examples(i)
    params = {**new.shared, **jax.tree.map(lambda p, i=i: p[i], new.personal)}
    predicted = np.argmax(np.asarray(model.apply(params, data.normalize(x))), -1)[:int(n)]
    y = np.asarray(y)[:int(n)]
    counted = (y != PAD) & (y != EOS)
    targets.append(counted.sum())
    expected.append((predicted == y)[counted].sum() / max(counted.sum(), 1))
  np.testing.assert_array_equal(clients['targets'], targets)
  np.testing.assert_allclose(clients['accuracy'], expected, rtol=1e-6)
  result = jax.jit(evaluate)(new, data, jax.random.key(0))
  tested = np.array(targets) > 0
  np.testing.assert_allclose(result['test_accuracy'], np.mean(np.array(expected)[tested]), rtol=1e-6)


# ---------------------------------------------------------------- evaluation of a sample

def test_eval_clients_is_a_fixed_sample_and_the_mean_over_it():
  ids = evaluation.eval_client_ids(1000, 10, seed=4)
  np.testing.assert_array_equal(ids, evaluation.eval_client_ids(1000, 10, seed=4))
  assert len(set(ids.tolist())) == 10 and np.all(np.diff(ids) > 0)
  assert not np.array_equal(ids, evaluation.eval_client_ids(1000, 10, seed=5))
  assert evaluation.eval_client_ids(1000, None, 0) is None
  assert evaluation.eval_client_ids(10, 10, 0) is None

  data, model = _token_data(), _token_model()
  spec = get_method('dp2fedsam')
  state = init_state(spec, model, jax.random.key(1), data.num_clients)
  state = state.replace(times_sampled=jnp.array([1, 0, 0, 2], jnp.int32))
  sample = np.array([1, 2, 3], np.int32)
  every = evaluation.make_evaluate(spec, model, _local()).per_client(state, data, jax.random.key(0))
  some = evaluation.make_evaluate(spec, model, _local(), client_ids=sample)
  chex.assert_trees_all_close(some.per_client(state, data, jax.random.key(0)),
                              jax.tree.map(lambda a: a[sample], every))
  result = some(state, data, jax.random.key(0))
  tested = np.asarray(every['targets'])[sample] > 0  # client 2 has no test data
  np.testing.assert_allclose(result['test_accuracy'],
                             np.asarray(every['accuracy'])[sample][tested].mean(), rtol=1e-6)
  np.testing.assert_allclose(result['participation'], 0.5)  # over all clients, not the sample


@pytest.mark.parametrize('field,value', [('eval_clients', 0), ('eval_clients', -1),
                                         ('local.max_examples', 0), ('local.max_examples', -3)])
def test_new_fields_are_validated(field, value):
  config = tiny_config(**{field: value})
  with pytest.raises(ConfigError, match=f'config.{field}='):
    validate_config(config)


def test_offsets_must_describe_the_rows():
  good = dict(train_x=np.zeros((3, 2), np.uint8), train_y=np.zeros((3, 2), np.uint8),
              train_offsets=[0, 1, 3], test_x=np.zeros((1, 2), np.uint8),
              test_y=np.zeros((1, 2), np.uint8), test_offsets=[0, 0, 1], num_classes=4,
              input_kind='tokens', pad_id=0)
  assert from_flat_arrays(**good).num_clients == 2
  for bad, match in ((dict(train_offsets=[0, 2, 1]), 'never decrease'),
                     (dict(train_offsets=[0, 1, 2]), 'must all agree'),
                     (dict(test_offsets=[0, 1]), 'one offsets entry per client'),
                     (dict(train_offsets=[0, 0, 3]), 'client 0 has no training examples'),
                     (dict(input_kind='audio'), 'input_kind')):
    with pytest.raises(ValueError, match=match):
      from_flat_arrays(**(good | bad))


def test_local_config_reads_max_examples():
  config = tiny_config(**{'local.max_examples': 5})
  lc = local.LocalConfig.from_config(config)
  assert lc.max_examples == 5 and lc.budget(3) == 3 and lc.budget(9) == 5
  assert dataclasses.replace(lc, max_examples=None).budget(9) == 9


@pytest.mark.parametrize('num_clients,rate,capacity', [(5, 0.5, 2), (3000, 0.9, 300), (2049, 0.01, 7),
                                                       (4096, 1.0, 4096)])
def test_chunk_ids_are_the_sampled_ids_in_order(num_clients, rate, capacity):
  """The round's blocked id search equals nonzero over all N (what an argsort over N gave before)."""
  sampled = np.random.default_rng(num_clients).random(num_clients) < rate
  ids = jax.jit(lambda s, k: chunk_ids(sampled_id_blocks(s), k * capacity, capacity, num_clients))
  chunks = -(-num_clients // capacity)
  got = np.concatenate([ids(jnp.asarray(sampled), k) for k in range(chunks)])
  want = np.full(chunks * capacity, num_clients)
  want[:sampled.sum()] = np.flatnonzero(sampled)
  np.testing.assert_array_equal(got, want)
