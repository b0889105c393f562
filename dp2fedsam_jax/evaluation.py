"""Evaluation: each client tests its own model on its own test split; the metric is the mean over
clients of these per-client accuracies (the papers' "average test accuracy of the local models").

For personalized methods a client's model is the global extractor with its own head; for global
methods it is the global model, so one function serves both.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dp2fedsam_jax import local


def make_evaluate(model, clients_per_batch: int = 64):
  """Returns evaluate(state, data) -> {'test_accuracy', 'test_loss'}, averaged over clients with test data."""

  def evaluate(state, data):
    max_test = data.test_y.shape[1]

    def one_client(args):
      personal, x, y, count = args
      logits = model.apply({**state.shared, **personal}, data.normalize(x))
      mask = jnp.arange(max_test) < count
      correct = jnp.sum((jnp.argmax(logits, -1) == y) & mask)
      return (correct / jnp.maximum(count, 1), local.masked_cross_entropy(logits, y, mask))

    accuracy, loss = jax.lax.map(
        one_client, (state.personal, data.test_x, data.test_y, data.test_count),
        batch_size=min(clients_per_batch, data.test_y.shape[0]))
    has_test = (data.test_count > 0).astype(jnp.float32)
    clients = jnp.maximum(has_test.sum(), 1.0)
    return {'test_accuracy': jnp.sum(accuracy * has_test) / clients,
            'test_loss': jnp.sum(loss * has_test) / clients}

  return evaluate
