"""Evaluation: each client tests its own model on its own test split; the metric is the mean over
clients of these per-client accuracies (the papers' "average test accuracy of the local models").

A client's model is the one its test-time protocol gives it (protocol.py, adaptation.py): by
default the method's `evaluation` piece, which is its own protocol --
  global          the global model
  personal        the global shared part with the client's own personal part (head or head offset)
  finetune        a copy of the global model fine-tuned on the client's training data (-FT methods)
  finetune_head   the global model with its head fine-tuned on the client's data (DP-FedAvg-fb)
-- and a configured config.eval protocol in its place. Fine-tuning happens on copies inside the
evaluation: it never touches the server state. Methods with a forward-pass mask (DSU) are tested
through theta * M, the network they train. How the clients are walked (blocks by test size, one at
a time, spread over devices) is eval_blocks.py's.

Besides the mean over all clients with test data, the evaluation reports `participation` (the
fraction of clients sampled at least once) and `test_accuracy_participated` (the mean over the
clients that trained at least once; NaN before anyone has): in short runs most personal heads are
still at their initialisation, which dominates the plain mean.

`test_accuracy_pooled` is the field's other metric (TFF, fedjax, LEAF): correct predictions over all
test targets of the evaluated clients (images: examples; tokens: non-pad targets less
`accuracy_ignore_ids`), so a client counts by its number of targets; `_pooled_participated` pools
the clients sampled at least once, `test_accuracy_never_sampled` and `_pooled_never_sampled` the
others (NaN where there are none).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dp2fedsam_jax import adaptation, eval_blocks, local
from dp2fedsam_jax.algorithms.specs import MethodSpec
from dp2fedsam_jax.protocol import DEFAULT_PROTOCOL, Protocol

# The stream of numpy's generator that draws config.eval_clients (beside config.seed).
EVAL_SAMPLE_STREAM = 33


def eval_client_ids(num_clients: int, eval_clients: int | None, seed: int):
  """The clients the evaluation tests: None (all of them), or `eval_clients` ids drawn once without
  replacement from np.random.default_rng([seed, EVAL_SAMPLE_STREAM]), sorted: the same fixed sample
  at every evaluation and on resume (config.eval_clients)."""
  if eval_clients is None or eval_clients >= num_clients:
    return None
  rng = np.random.default_rng([seed, EVAL_SAMPLE_STREAM])
  return np.sort(rng.choice(num_clients, size=eval_clients, replace=False)).astype(np.int32)


def make_evaluate(spec: MethodSpec, model, local_config: local.LocalConfig,
                  clients_per_batch: int = eval_blocks.CLIENTS_PER_BATCH, client_ids=None,
                  protocol: Protocol = DEFAULT_PROTOCOL, initial_head=None, mesh=None):
  """Returns evaluate(state, data, key): each client tests the model its test-time `protocol` gives
  it (protocol.py; the default: the method's own evaluation) on its own test split. `key` seeds the
  adaptations' minibatch order. `initial_head`: the run's initial head (head_init='random')."""
  plan = protocol.for_method(spec, local_config)
  client_model = adaptation.make_client_model(spec, model, local_config, plan, initial_head)
  return make_evaluate_models(model, client_model, plan.forward_only, clients_per_batch, client_ids,
                              mesh)


def make_evaluate_models(model, client_model, forward_only: bool,
                         clients_per_batch: int = eval_blocks.CLIENTS_PER_BATCH, client_ids=None,
                         mesh=None):
  """evaluate(state, data, key) -> {'test_accuracy', 'test_loss', 'test_nonfinite_clients',
  'participation', 'test_accuracy_participated', the spread and the pooled metrics} over the
  evaluated clients with test data, each client testing
  `client_model(state, personal, data, client_id, key)` (key: fold_in(key, client_id));
  `evaluate.per_client(state, data, key)`: the per-client arrays.
  `client_ids`: the clients tested (eval_client_ids; None: all). `forward_only`, `clients_per_batch`
  and `mesh` say how the clients are walked (eval_blocks.test_clients)."""

  def model_of(env, client_id):
    state, data, key = env
    personal = jax.tree.map(lambda p: p[client_id], state.personal)
    return client_model(state, personal, data, client_id, jax.random.fold_in(key, client_id))

  def test(env, client_id, params, buffer: int):
    """(accuracy, loss, targets, correct) of one client's model on its test rows in a [buffer]."""
    _, data, _ = env
    x, y, count = data.test_examples(client_id, buffer)
    logits = model.apply(params, data.normalize(x))
    example_mask = jnp.arange(buffer) < count
    counted = data.accuracy_mask(y, example_mask)
    targets = jnp.sum(counted)
    correct = jnp.sum((jnp.argmax(logits, -1) == y) & counted)
    loss = local.masked_cross_entropy(logits, y, data.loss_mask(y, example_mask))
    return correct / jnp.maximum(targets, 1), loss, targets, correct

  def per_client(state, data, key):
    """{'accuracy', 'loss', 'targets', 'correct', 'took_part'}, one entry per evaluated client
    (client_ids order): accuracy = correct / targets (images: examples; tokens: non-pad tokens less
    accuracy_ignore_ids), targets = 0 for a client without test data."""
    ids = (jnp.arange(data.num_clients, dtype=jnp.int32) if client_ids is None
           else jnp.asarray(client_ids, jnp.int32))
    dtypes = (jnp.float32, jnp.float32, data.test_count.dtype, data.test_count.dtype)
    accuracy, loss, targets, correct = eval_blocks.test_clients(
        model_of, test, (state, data, key), ids, data.test_count, data.max_test, clients_per_batch,
        forward_only, mesh, dtypes)
    return {'accuracy': accuracy, 'loss': loss, 'targets': targets, 'correct': correct,
            'took_part': state.times_sampled[ids] > 0}

  def evaluate(state, data, key):
    clients = per_client(state, data, key)
    has_test = (clients['targets'] > 0).astype(jnp.float32)
    tested = jnp.maximum(has_test.sum(), 1.0)
    tested_part = has_test * clients['took_part'].astype(jnp.float32)
    accuracy = clients['accuracy']
    return {'test_accuracy': jnp.sum(accuracy * has_test) / tested,
            'test_loss': jnp.sum(clients['loss'] * has_test) / tested,
            # A tested model gone non-finite (a fine-tune at too high an lr) makes test_loss NaN
            # and its client's accuracy that of NaN logits: counted here so that it shows.
            'test_nonfinite_clients': jnp.sum((clients['targets'] > 0)
                                              & ~jnp.isfinite(clients['loss'])),
            'participation': jnp.mean((state.times_sampled > 0).astype(jnp.float32)),
            'test_accuracy_participated': jnp.where(
                tested_part.sum() > 0, jnp.sum(accuracy * tested_part) / tested_part.sum(), jnp.nan),
            **accuracy_spread(accuracy, has_test > 0),
            **pooled_accuracy(clients)}

  evaluate.per_client = per_client
  return evaluate


def make_validation_evaluate(evaluate):
  """evaluate_validation(state, validation_data, key) for an evaluate of make_evaluate, on the
  validation data of data.split_validation: 'validation_accuracy' and 'validation_loss' (means over
  the evaluated clients with validation targets), 'validation_clients' (their count) and
  'validation_accuracy_sum' (the sum of their accuracies, each in [0, 1]: one client moves it by at
  most 1, what a private selection score noises)."""

  def evaluate_validation(state, validation_data, key):
    clients = evaluate.per_client(state, validation_data, key)
    has = (clients['targets'] > 0).astype(jnp.float32)
    n = has.sum()
    total = jnp.sum(clients['accuracy'] * has)
    return {'validation_accuracy': total / jnp.maximum(n, 1.0),
            'validation_loss': jnp.sum(clients['loss'] * has) / jnp.maximum(n, 1.0),
            'validation_clients': n, 'validation_accuracy_sum': total}

  return evaluate_validation


def pooled_accuracy(clients: dict) -> dict:
  """From per_client's arrays: `test_accuracy_pooled` (sum of correct / sum of targets over the
  evaluated clients), the same over the clients sampled at least once (`_pooled_participated`) and
  over the others (`_pooled_never_sampled`), and the per-client mean over the never-sampled clients
  with test data (`test_accuracy_never_sampled`); NaN where a group has no target."""
  took = clients['took_part']
  correct, targets = clients['correct'], clients['targets']

  def pooled(where):
    total = jnp.sum(jnp.where(where, targets, 0))
    return jnp.where(total > 0, jnp.sum(jnp.where(where, correct, 0)) / jnp.maximum(total, 1),
                     jnp.nan)

  never = (~took) & (targets > 0)
  return {'test_accuracy_pooled': pooled(jnp.ones_like(took)),
          'test_accuracy_pooled_participated': pooled(took),
          'test_accuracy_pooled_never_sampled': pooled(~took),
          'test_accuracy_never_sampled': jnp.where(
              never.any(), jnp.sum(jnp.where(never, clients['accuracy'], 0.0))
              / jnp.maximum(never.sum(), 1), jnp.nan)}


WORST_FRACTION = 0.1  # test_accuracy_worst10: the mean over this fraction of the clients, the worst


def _percentile(ascending, n, q: float):
  """numpy.percentile(x, q) ('linear') of the n values that `ascending` starts with."""
  position = q / 100 * (n - 1).astype(jnp.float32)
  low = jnp.floor(position).astype(jnp.int32)
  high = jnp.minimum(low + 1, n - 1)
  return ascending[low] + (position - low) * (ascending[high] - ascending[low])


def accuracy_spread(accuracy, has_test) -> dict:
  """The spread of the per-client accuracies over the clients where has_test (NaN if none):
  `test_accuracy_std` (over clients), the percentiles `test_accuracy_p10`, `_p50`, `_p90` (numpy's
  linear interpolation) and `test_accuracy_worst10`, the mean over the worst ceil(10 %) of them
  (at least one client)."""
  n = jnp.sum(has_test, dtype=jnp.int32)
  ascending = jnp.sort(jnp.where(has_test, accuracy, jnp.inf))  # clients without test data last
  nf = jnp.maximum(n, 1).astype(jnp.float32)
  mean = jnp.sum(jnp.where(has_test, accuracy, 0.0)) / nf
  worst = jnp.maximum(jnp.ceil(WORST_FRACTION * nf), 1.0)
  spread = {
      'test_accuracy_std': jnp.sqrt(jnp.sum(jnp.where(has_test, (accuracy - mean) ** 2, 0.0)) / nf),
      'test_accuracy_p10': _percentile(ascending, n, 10),
      'test_accuracy_p50': _percentile(ascending, n, 50),
      'test_accuracy_p90': _percentile(ascending, n, 90),
      'test_accuracy_worst10': jnp.sum(jnp.where(jnp.arange(accuracy.shape[0]) < worst, ascending,
                                                 0.0)) / worst,
  }
  return jax.tree.map(lambda v: jnp.where(n > 0, v, jnp.nan), spread)
