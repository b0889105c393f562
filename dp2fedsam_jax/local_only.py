"""The local-only baseline (method local_only): each client trains its own model alone, nothing is
released.

Every client starts from the run's initial model and makes `num_rounds` visits' worth of local
training on its own data, as if it were sampled every round and never received anything: per
visit `local.shared_epochs` epochs of SGD on the whole model (local.batch_size, local.momentum) over
at most local.max_examples of its rows (a fresh random subset each visit, as a round draws it), at
local.lr_shared * local.lr_decay ** visit. Then each client tests its own model (evaluation.py's
metrics, pooled and per client). No round runs: the work is N clients' local training and one
evaluation, written as one record at round num_rounds with epsilon 0 (nothing leaves a client).
No state is kept (N models); a rerun of the same config retrains. The record's `seconds` is the
whole run's wall time (compilation included) over num_rounds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dp2fedsam_jax import evaluation, local
from dp2fedsam_jax.algorithms.specs import MethodSpec
from dp2fedsam_jax.state import ServerState

# What metrics.jsonl says was released (the record's epsilon is 0).
RELEASED = 'nothing: each client trains and tests alone'


def make_train_alone(model, local_config: local.LocalConfig, num_visits: int, initial_params):
  """`train_alone(state, personal, data, client_id, key) -> params`, the model the client tests
  (evaluation.make_evaluate_models): its model after `num_visits` visits of local training from
  `initial_params` (the state and the personal part are ignored)."""
  local.check_local_config(local_config)
  phase = local.Phase(local_config.shared_epochs, local_config.batch_size, local.SGD(),
                      local_config.momentum)

  def train_alone(state, personal, data, client_id, key):
    del state, personal
    budget = local_config.budget(data.max_train)

    def visit(p, r):
      visit_key = jax.random.fold_in(key, r)
      train_key, examples_key = jax.random.split(visit_key)
      x, y, count = data.train_examples(client_id, budget,
                                        examples_key if budget < data.max_train else None,
                                        local_config.subset_draw)
      lr = local_config.lr_shared * jnp.asarray(local_config.lr_decay, jnp.float32) ** r
      return local.train_model(model, phase, p, data.normalize(x), y, count, train_key, lr,
                               data.loss_mask)[0], None

    return jax.lax.scan(visit, initial_params, jnp.arange(num_visits))[0]

  return train_alone


def make_evaluate(spec: MethodSpec, model, local_config: local.LocalConfig, num_visits: int,
                  initial_params, clients_per_batch: int, client_ids=None, mesh=None):
  """evaluate(data, key) -> evaluation.make_evaluate's metrics of the clients' own models;
  evaluate.per_client(data, key) -> its per-client arrays. `mesh`: as make_evaluate's (the
  sharded executor's CPU devices share the clients)."""
  del spec  # each client tests the model it trained alone, not one the method assembles
  train_alone = make_train_alone(model, local_config, num_visits, initial_params)
  evaluate = evaluation.make_evaluate_models(model, train_alone, False, clients_per_batch,
                                             client_ids, mesh)

  def state(data):
    # Every client trained: each counts as taking part (its model is its own, not an initial one).
    return ServerState(round=jnp.asarray(num_visits, jnp.int32), shared=initial_params,
                       personal={}, times_sampled=jnp.ones(data.num_clients, jnp.int32))

  run = lambda data, key: evaluate(state(data), data, key)
  run.per_client = lambda data, key: evaluate.per_client(state(data), data, key)
  return run
