"""Evaluation: each client tests its own model on its own test split; the metric is the mean over
clients of these per-client accuracies (the papers' "average test accuracy of the local models").

A client's model depends on the method's `evaluation` piece:
  global          the global model
  personal        the global shared part with the client's own personal part (head or head offset)
  finetune        a copy of the global model fine-tuned on the client's training data (-FT methods)
  finetune_head   the global model with its head fine-tuned on the client's data (DP-FedAvg-fb)
Fine-tuning happens on copies inside the evaluation: it never touches the server state. Methods
with a forward-pass mask (DSU) are tested through theta * M, the network they train.

Besides the mean over all clients with test data, the evaluation reports `participation` (the
fraction of clients sampled at least once) and `test_accuracy_participated` (the mean over the
clients that trained at least once; NaN before anyone has): in short runs most personal heads are
still at their initialisation, which dominates the plain mean.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dp2fedsam_jax import local
from dp2fedsam_jax.algorithms import pieces
from dp2fedsam_jax.algorithms.specs import MethodParams, MethodSpec
from dp2fedsam_jax.state import model_params


# Clients vmapped at once by the evaluation. Forward-only evaluations share one extractor, so a
# vmapped block of clients is one big batched forward pass.
CLIENTS_PER_BATCH = 64


def evaluation_batch_size(spec: MethodSpec, executor: str) -> int:
  """How many clients the evaluation vmaps at once under the round's (resolved) executor.

  Fine-tuning (-FT methods) gives every client its own weights, the case where the sequential
  executor loops over clients on CPU: one at a time there as well (a Fashion-MNIST paper-regime
  evaluation of 1,000 clients: 70.8 s instead of 108.5 s on 2 cores, benchmarks/README.md)."""
  if spec.evaluation == 'finetune' and executor == 'sequential':
    return 1
  return CLIENTS_PER_BATCH


def make_evaluate(spec: MethodSpec, model, local_config: local.LocalConfig,
                  params: MethodParams = MethodParams(), clients_per_batch: int = CLIENTS_PER_BATCH):
  """Returns evaluate(state, data, key) -> {'test_accuracy', 'test_loss', 'participation',
  'test_accuracy_participated'}, averaged over clients with test data, and the spread over them
  (`accuracy_spread`). `key` seeds the fine-tuning
  minibatch order (unused by other evaluations)."""
  local.check_local_config(local_config)
  weight_mask = pieces.WeightMask.for_method(spec, model, params)
  finetune = local.Phase(local_config.finetune_epochs, local_config.batch_size, 'sgd',
                         local_config.momentum)

  def ce_loss(params, x, y, mask):
    return local.masked_cross_entropy(model.apply(params, x), y, mask)

  def client_model(state, personal, x, y, count, key):
    params = model_params(spec, weight_mask.forward(state.shared), personal)
    decay = jnp.asarray(local_config.lr_decay, jnp.float32) ** state.round
    if spec.evaluation == 'finetune':
      params, _ = local.run_phase(finetune, ce_loss, params, x, y, count, key,
                                  local_config.lr_body * decay)
    elif spec.evaluation == 'finetune_head':
      features = model.features(params['extractor'], x)
      head_loss = lambda h, f, labels, mask: local.masked_cross_entropy(
          model.logits_from_features(h, f), labels, mask)
      head, _ = local.run_phase(finetune, head_loss, params['head'], features, y, count, key,
                                local_config.lr_head * decay)
      params = {**params, 'head': head}
    return params

  def evaluate(state, data, key):
    max_test = data.test_y.shape[1]

    def one_client(args):
      personal, train_x, train_y, train_count, x, y, count, client_key = args
      params = client_model(state, personal, data.normalize(train_x), train_y, train_count,
                            client_key)
      logits = model.apply(params, data.normalize(x))
      mask = jnp.arange(max_test) < count
      correct = jnp.sum((jnp.argmax(logits, -1) == y) & mask)
      return (correct / jnp.maximum(count, 1), local.masked_cross_entropy(logits, y, mask))

    num_clients = data.test_y.shape[0]
    keys = jax.random.split(key, num_clients)
    accuracy, loss = jax.lax.map(
        one_client, (state.personal, data.train_x, data.train_y, data.train_count,
                     data.test_x, data.test_y, data.test_count, keys),
        batch_size=None if clients_per_batch == 1 else min(clients_per_batch, num_clients))
    has_test = (data.test_count > 0).astype(jnp.float32)
    clients = jnp.maximum(has_test.sum(), 1.0)
    took_part = (state.times_sampled > 0).astype(jnp.float32)
    tested_part = has_test * took_part
    return {'test_accuracy': jnp.sum(accuracy * has_test) / clients,
            'test_loss': jnp.sum(loss * has_test) / clients,
            'participation': jnp.mean(took_part),
            'test_accuracy_participated': jnp.where(
                tested_part.sum() > 0, jnp.sum(accuracy * tested_part) / tested_part.sum(), jnp.nan),
            **accuracy_spread(accuracy, has_test > 0)}

  return evaluate


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
