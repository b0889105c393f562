"""The evaluation's cost follows the real test rows: clients are tested in a few buffer sizes
(eval_blocks.test_buffer_sizes), never all padded to the largest client's, and every per-client
result is the one of the client tested on exactly its own rows."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import token_federation
from dp2fedsam_jax import eval_blocks, evaluation, local
from dp2fedsam_jax.algorithms import get_method
from dp2fedsam_jax.data import from_flat_arrays
from dp2fedsam_jax.models import get_model
from dp2fedsam_jax.models.registry import SplitModel
from dp2fedsam_jax.state import init_state, model_params

# Very unequal test sizes, one client without test data; 40 rows > 2 x the next: several buffers.
TEST_SIZES = (1, 3, 40, 0, 9, 17)
TRAIN_SIZES = (2, 5, 30, 4, 12, 7)
SHAPE = (3, 3, 1)
VOCAB, LENGTH, PAD, EOS = 7, 5, 0, 6
# One method per evaluation kind: global, personal, finetune, finetune_head.
METHODS = ('dp_fedavg', 'dp2fedsam', 'dp_fedavg_ft', 'dp_fedavg_fb')


def _images():
  rng = np.random.default_rng(0)
  train, test = sum(TRAIN_SIZES), sum(TEST_SIZES)
  return from_flat_arrays(
      train_x=rng.integers(0, 256, (train, *SHAPE), dtype=np.uint8), train_y=rng.integers(0, 3, train),
      train_offsets=np.r_[0, np.cumsum(TRAIN_SIZES)],
      test_x=rng.integers(0, 256, (test, *SHAPE), dtype=np.uint8), test_y=rng.integers(0, 3, test),
      test_offsets=np.r_[0, np.cumsum(TEST_SIZES)], num_classes=3, mean=(0.5,), std=(0.25,))


def _tokens():
  return token_federation(TRAIN_SIZES, TEST_SIZES, vocab=VOCAB, length=LENGTH, pad=PAD, eos=EOS,
                          seed=1)


class _TokenExtractor(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Dense(8)(nn.Embed(VOCAB, 4)(jnp.asarray(x, jnp.int32))))


def _setup(kind, method):
  if kind == 'image':
    data, model = _images(), get_model('mlp', 3, SHAPE, hidden=8)
  else:
    data = _tokens()
    model = SplitModel(name='tiny_tokens', extractor=_TokenExtractor(), head=nn.Dense(VOCAB),
                       num_classes=VOCAB, input_shape=(LENGTH,))
  spec = get_method(method)
  state = init_state(spec, model, jax.random.key(1), data.num_clients)
  # Every client's own personal part, so that a client's result shows whose model tested it.
  leaves, treedef = jax.tree.flatten(state.personal)
  noise = jax.random.split(jax.random.key(2), len(leaves))
  personal = jax.tree.unflatten(treedef, [p + 0.5 * jax.random.normal(k, p.shape)
                                          for p, k in zip(leaves, noise)])
  state = state.replace(personal=personal, round=jnp.asarray(3, jnp.int32),
                        times_sampled=jnp.array([1, 0, 2, 0, 1, 1], jnp.int32))
  local_config = local.LocalConfig(
      personal_epochs=1, shared_epochs=1, batch_size=4, lr_personal=0.1, lr_shared=0.1, momentum=0.0,
      lr_decay=0.9, sam_rho=0.05, finetune_epochs=2, max_examples=8)  # clients 3, 5 > budget
  return spec, model, data, state, local_config


def _per_client(spec, model, local_config, state, data, **kwargs):
  evaluate = evaluation.make_evaluate(spec, model, local_config, **kwargs)
  return jax.device_get(jax.jit(evaluate.per_client)(state, data, jax.random.key(7)))


def _assert_same(got, expected):
  np.testing.assert_array_equal(got['targets'], expected['targets'])
  np.testing.assert_array_equal(got['took_part'], expected['took_part'])
  for name in ('accuracy', 'loss'):  # up to float rounding: a different buffer sums the loss
    np.testing.assert_allclose(got[name], expected[name], rtol=2e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize('kind', ['image', 'tokens'])
@pytest.mark.parametrize('method', ['dp_fedavg', 'dp2fedsam'])
def test_forward_only_evaluation_is_each_client_on_exactly_its_own_rows(kind, method):
  """Global and personal evaluation against each client's model applied to its unpadded rows."""
  spec, model, data, state, local_config = _setup(kind, method)
  offsets = np.asarray(data.test_offsets)
  expected = {'accuracy': [], 'loss': [], 'targets': []}
  for i in range(data.num_clients):
    rows = np.arange(offsets[i], offsets[i + 1])
    if rows.size == 0:  # no test data: no target, accuracy 0 and loss 0 (masked_cross_entropy)
      expected['targets'].append(0), expected['accuracy'].append(0.0), expected['loss'].append(0.0)
      continue
    x, y = data.test_x[rows], jnp.asarray(data.test_y[rows], jnp.int32)
    params = model_params(spec, state.shared, jax.tree.map(lambda p, i=i: p[i], state.personal))
    logits = model.apply(params, data.normalize(x))
    real = jnp.ones(len(rows), bool)
    counted = data.accuracy_mask(y, real)
    targets = int(counted.sum())
    expected['targets'].append(targets)
    expected['accuracy'].append(float(jnp.sum((jnp.argmax(logits, -1) == y) & counted)) / max(targets, 1))
    expected['loss'].append(float(local.masked_cross_entropy(logits, y, data.loss_mask(y, real))))
  expected['took_part'] = np.asarray(state.times_sampled) > 0
  _assert_same(_per_client(spec, model, local_config, state, data, clients_per_batch=4), expected)


def _slow_beyond(pairs, fast):
  """pytest params of (a, b) pairs, those not in `fast` marked slow: CI runs every method and every
  kind at least once (the fine-tuning ones on tokens are the suite's slowest compiles)."""
  return [pytest.param(*pair, marks=() if pair in fast else pytest.mark.slow) for pair in pairs]


@pytest.mark.parametrize('method,kind', _slow_beyond(
    [(m, k) for m in METHODS for k in ('image', 'tokens')],
    fast={(m, k) for m in METHODS for k in ('image', 'tokens')
          if k == 'image' or m in ('dp_fedavg', 'dp2fedsam')}))
def test_no_buffer_size_block_size_or_sample_changes_a_client_result(kind, method):
  """Every evaluation kind: the same per-client results however the clients are blocked (one at a
  time, in blocks of 2, all at once with a much larger max_test: other buffers, more padding),
  and for a sample of clients (eval_clients) the full evaluation's entries of them."""
  spec, model, data, state, local_config = _setup(kind, method)
  reference = _per_client(spec, model, local_config, state, data, clients_per_batch=1)
  assert list(reference['targets'] > 0) == [n > 0 for n in TEST_SIZES]
  padded = data.replace(max_test=4 * data.max_test + 3)
  for clients_per_batch, d in ((2, data), (64, padded)):
    _assert_same(_per_client(spec, model, local_config, state, d,
                             clients_per_batch=clients_per_batch), reference)
  sample = np.array([5, 0, 2], np.int32)  # any order: results come back in client_ids order
  _assert_same(_per_client(spec, model, local_config, state, data, client_ids=sample,
                           clients_per_batch=2), jax.tree.map(lambda a: a[sample], reference))


@pytest.mark.parametrize('kind', ['image', 'tokens'])
@pytest.mark.parametrize('method', ['dp_fedavg', 'dp2fedsam'])
@pytest.mark.parametrize('rows', [1, 16, 10**6])
def test_rows_per_block_changes_no_client_result(kind, method, rows, monkeypatch):
  """Forward-only blocks hold TEST_ROWS_PER_BLOCK // buffer clients: one per block, 2 of 8 rows
  and 1 of the larger buffers, or every client at once; each client's result is the one it gets
  tested alone."""
  spec, model, data, state, local_config = _setup(kind, method)
  reference = _per_client(spec, model, local_config, state, data, clients_per_batch=1)
  monkeypatch.setattr(eval_blocks, 'TEST_ROWS_PER_BLOCK', rows)
  _assert_same(_per_client(spec, model, local_config, state, data, clients_per_batch=64), reference)


@pytest.mark.parametrize('method,devices,kind', _slow_beyond(
    [(m, d, k) for m, d in (('dp_fedavg_ft', 2), ('dp_fedavg_fb', 4), ('dp2fedsam', 8))
     for k in ('image', 'tokens')],
    fast={('dp_fedavg_ft', 2, 'tokens'), ('dp_fedavg_fb', 4, 'image'), ('dp2fedsam', 8, 'tokens')}))
def test_clients_spread_over_devices_get_their_one_device_results(kind, method, devices):
  """Own-weights evaluations (fine-tuning, or dp2fedsam's heads re-fit by a test-time protocol)
  under the sharded executor on CPU: each device loops over its share of the clients (6 clients on
  4 or 8 devices: empty slots); each client's result is the one the one-device loop gives it."""
  from dp2fedsam_jax import sharding  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.protocol import DEFAULT_PROTOCOL, Protocol  # pylint: disable=import-outside-toplevel
  spec, model, data, state, local_config = _setup(kind, method)
  own = DEFAULT_PROTOCOL.for_method(spec, local_config)
  protocol = DEFAULT_PROTOCOL if own.trains else Protocol(adapt_epochs=2, adapt_lr=0.1)
  reference = _per_client(spec, model, local_config, state, data, clients_per_batch=1,
                          protocol=protocol)
  mesh = sharding.client_mesh(jax.devices()[:devices])
  _assert_same(_per_client(spec, model, local_config, state, data, clients_per_batch=1,
                           protocol=protocol, mesh=mesh), reference)
  sample = np.array([5, 0, 2], np.int32)
  _assert_same(_per_client(spec, model, local_config, state, data, client_ids=sample,
                           clients_per_batch=1, protocol=protocol, mesh=mesh),
               jax.tree.map(lambda a: a[sample], reference))


@pytest.mark.parametrize('kind', ['image', 'tokens'])
def test_a_client_whose_model_is_not_finite_is_counted_and_one_without_test_rows_is_not(kind):
  """A personal head of NaNs (what a diverged fine-tune leaves) on client 1 (test rows) and client 3
  (none): test_nonfinite_clients is 1 and test_loss NaN; finite heads give 0."""
  spec, model, data, state, local_config = _setup(kind, 'dp2fedsam')
  evaluate = jax.jit(evaluation.make_evaluate(spec, model, local_config))
  finite = jax.device_get(evaluate(state, data, jax.random.key(7)))
  assert finite['test_nonfinite_clients'] == 0 and np.isfinite(finite['test_loss'])
  broken = jax.tree.map(lambda p: p.at[jnp.array([1, 3])].set(jnp.nan), state.personal)
  got = jax.device_get(evaluate(state.replace(personal=broken), data, jax.random.key(7)))
  assert got['test_nonfinite_clients'] == 1 and np.isnan(got['test_loss'])
