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

`test_accuracy_pooled` is the field's other metric (TFF, fedjax, LEAF): correct predictions over all
test targets of the evaluated clients (images: examples; tokens: non-pad targets less
`accuracy_ignore_ids`), so a client counts by its number of targets; `_pooled_participated` pools
the clients sampled at least once, `test_accuracy_never_sampled` and `_pooled_never_sampled` the
others (NaN where there are none). `make_evaluate(adapt=...)` replaces each client's model by the
test-time protocol's (adaptation.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dp2fedsam_jax import local, sharding
from dp2fedsam_jax.algorithms.specs import MethodParams, MethodSpec
from dp2fedsam_jax.state import model_params


# Clients vmapped at once by the evaluation. Forward-only evaluations share one extractor, so a
# vmapped block of clients is one big batched forward pass.
CLIENTS_PER_BATCH = 64
# The stream of numpy's generator that draws config.eval_clients (beside config.seed).
EVAL_SAMPLE_STREAM = 33
# The smallest test buffer: a block of clients with fewer test examples is padded to it. Image
# federations of equal clients (a few test examples each) keep one buffer: one compiled forward.
SMALLEST_TEST_BUFFER = 8
# Forward-only evaluations test a block of clients in about this many buffer rows: clients_per_batch
# clients of the small buffers, fewer of the large ones (Shakespeare: 64 of 8 rows, 6 of 152).
TEST_ROWS_PER_BLOCK = 1024


def evaluation_batch_size(spec: MethodSpec, executor: str) -> int:
  """How many clients the evaluation vmaps at once under the round's (resolved) executor.

  Fine-tuning (-FT methods) gives every client its own weights: one at a time where the round loops
  over clients (sharding.loops_over_clients: sequential, or sharded on CPU). A Fashion-MNIST
  paper-regime evaluation of 1,000 clients: 70.8 s instead of 108.5 s on 2 cores; Shakespeare's
  DP-FedAvg-FT, 200 roles: 4.95 s instead of 24.1 s (benchmarks/README.md)."""
  if spec.evaluation.own_weights and sharding.loops_over_clients(executor):
    return 1
  return CLIENTS_PER_BATCH


def test_buffer_sizes(max_test: int) -> tuple[int, ...]:
  """The test buffers the evaluation compiles: powers of two from SMALLEST_TEST_BUFFER below
  max_test, then max_test (Shakespeare's 152: 8, 16, 32, 64, 128, 152). A block of clients whose
  largest holds n test examples is tested in the smallest buffer >= n: under 2n rows (or 8) a
  client, as fedjax's padded batch-size buckets."""
  sizes, size = [], SMALLEST_TEST_BUFFER
  while size < max_test:
    sizes.append(size)
    size *= 2
  return (*sizes, max_test)


def eval_client_ids(num_clients: int, eval_clients: int | None, seed: int):
  """The clients the evaluation tests: None (all of them), or `eval_clients` ids drawn once without
  replacement from np.random.default_rng([seed, EVAL_SAMPLE_STREAM]), sorted: the same fixed sample
  at every evaluation and on resume (config.eval_clients)."""
  if eval_clients is None or eval_clients >= num_clients:
    return None
  rng = np.random.default_rng([seed, EVAL_SAMPLE_STREAM])
  return np.sort(rng.choice(num_clients, size=eval_clients, replace=False)).astype(np.int32)


def make_evaluate(spec: MethodSpec, model, local_config: local.LocalConfig,
                  params: MethodParams = MethodParams(), clients_per_batch: int = CLIENTS_PER_BATCH,
                  client_ids=None, adapt=None, mesh=None):
  """Returns evaluate(state, data, key) -> {'test_accuracy', 'test_loss', 'participation',
  'test_accuracy_participated'}, averaged over the evaluated clients with test data, and the spread
  over them (`accuracy_spread`). `key` seeds the fine-tuning minibatch order (unused by other
  evaluations). `client_ids`: the clients tested (eval_client_ids; None: all).
  `evaluate.per_client(state, data, key)` gives the per-client arrays the means come from.
  `adapt`: None (the method's own evaluation), or `adapt(state, params, data, client_id, key) ->
  params`, the test-time protocol applied to each client's model (adaptation.make_adapt).
  `mesh`: where clients get their own weights one at a time (clients_per_batch 1), a mesh of CPU
  devices that each loop over their share of the clients (the sharded executor's
  sharding.map_slots_on_each_device); None: one device loops over all."""
  local.check_local_config(local_config)
  weight_mask = spec.weight_mask.for_model(spec.name, model, params)
  finetune = local.Phase(local_config.finetune_epochs, local_config.batch_size, 'sgd',
                         local_config.momentum)

  def client_model(state, personal, data, client_id, key):
    params = model_params(spec, weight_mask.forward(state.shared), personal)
    if adapt is not None:
      return adapt(state, params, data, client_id, key)
    if not spec.evaluation.finetunes:
      return params
    decay = jnp.asarray(local_config.lr_decay, jnp.float32) ** state.round
    # Fine-tuning is local training: on at most local.max_examples of the client's examples (a
    # random subset needs a second key; without one, the key is the one runs used before).
    budget = local_config.budget(data.max_train)
    ft_key, examples_key = jax.random.split(key) if budget < data.max_train else (key, None)
    train_x, y, count = data.train_examples(client_id, budget, examples_key, local_config.subset_draw)
    x = data.normalize(train_x)
    return spec.evaluation.finetune(model, finetune, params, x, y, count, ft_key, local_config,
                                    decay, data.loss_mask)

  def test_one(state, data, key, client_id, params, buffer: int):
    """(accuracy, loss, targets, correct) of one client's model on its test rows in a [buffer]
    buffer."""
    if params is None:  # forward-only evaluations: the model is the state's (no fine-tuning)
      # The same key as split(key, N)[client_id] (keys.py), without an O(N) split.
      params = client_model(state, jax.tree.map(lambda p: p[client_id], state.personal), data,
                            client_id, jax.random.fold_in(key, client_id))
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
    accuracy_ignore_ids), targets = 0 for a client without test data.

    The clients are tested in blocks, largest test sets first, each block in the smallest of
    `test_buffer_sizes` that holds its first (largest) client: the cost follows the real test rows,
    not N x max_test. A forward-only block of buffer b holds TEST_ROWS_PER_BLOCK // b clients (at
    most clients_per_batch, at least one), so the large buffers do not pad many smaller clients to
    them; a fine-tuning block holds clients_per_batch (their cost is the fine-tuning). Padding
    changes no result beyond float rounding (tests/test_evaluation_buckets.py; against the
    [max_test] buffer every client had before: targets and accuracy bit-identical, the loss within
    2 ulp)."""
    ids = (jnp.arange(data.num_clients, dtype=jnp.int32) if client_ids is None
           else jnp.asarray(client_ids, jnp.int32))
    num = ids.shape[0]
    sizes = test_buffer_sizes(data.max_test)
    finetunes = adapt is not None or spec.evaluation.finetunes  # once a block, whichever buffer
    cap = max(1, min(clients_per_batch, num))
    per_block = [cap if finetunes else max(1, min(cap, TEST_ROWS_PER_BLOCK // b)) for b in sizes]
    order = jnp.argsort(-data.test_count[ids], stable=True)
    spread = finetunes and cap == 1 and mesh is not None and sharding.num_shards(mesh) > 1
    # The sorted ids, then repeats of the smallest client filling the last block, or the last
    # device's share (dropped).
    slots = sharding.round_up(num, sharding.num_shards(mesh)) if spread else num + max(per_block)
    sorted_ids = ids[jnp.concatenate([order, jnp.full(slots - num, order[-1])])]
    sorted_count = data.test_count[sorted_ids]
    # One client at a time is a plain loop (what evaluation_batch_size asks for), not a vmap.
    over_block = lambda k: jax.vmap if k > 1 else (
        lambda f: lambda *a: jax.tree.map(lambda v: v[None], f(*jax.tree.map(lambda v: v[0], a))))

    def finetuned(k, block_ids):
      if not finetunes:
        return None
      return over_block(k)(lambda i: client_model(
          state, jax.tree.map(lambda p: p[i], state.personal), data, i,
          jax.random.fold_in(key, i)))(block_ids)

    def branch(buffer, k):
      def run(start, results):
        block_ids = jax.lax.dynamic_slice_in_dim(sorted_ids, start, k)
        out = over_block(k)(lambda i, p: test_one(state, data, key, i, p, buffer))(
            block_ids, finetuned(k, block_ids))
        return start + k, tuple(jax.lax.dynamic_update_slice_in_dim(r, o.astype(r.dtype), start, 0)
                                for r, o in zip(results, out))
      return run

    branches = [branch(b, k) for b, k in zip(sizes, per_block)]

    def test_block(carry):
      start, results = carry
      # The smallest buffer that holds the block's largest (first) test set.
      size_index = jnp.searchsorted(jnp.asarray(sizes), sorted_count[start])
      return jax.lax.switch(size_index, branches, start, results)

    dtypes = (jnp.float32, jnp.float32, data.test_count.dtype, data.test_count.dtype)
    if spread:
      results = spread_over_devices(state, data, key, sorted_ids, sizes)
    else:
      # Streams the blocks: a block's test data is gathered inside, never all clients' at once.
      empty = tuple(jnp.zeros(slots, dtype) for dtype in dtypes)
      _, results = jax.lax.while_loop(lambda carry: carry[0] < num, test_block,
                                      (jnp.zeros((), jnp.int32), empty))
    accuracy, loss, targets, correct = (jnp.zeros(num, dtype).at[order].set(r[:num].astype(dtype))
                                        for r, dtype in zip(results, dtypes))
    return {'accuracy': accuracy, 'loss': loss, 'targets': targets, 'correct': correct,
            'took_part': state.times_sampled[ids] > 0}

  def spread_over_devices(state, data, key, sorted_ids, sizes):
    """The loop's results for blocks of one client, the clients spread over the mesh's devices:
    slot s on device s mod n, so each device gets a like share of the clients sorted by test rows
    (sorted_ids: a multiple of n slots); each client in the smallest buffer that holds its test
    rows, as its block of one is."""

    def test_client(env, client_id):
      state, data, key = env
      params = client_model(state, jax.tree.map(lambda p: p[client_id], state.personal), data,
                            client_id, jax.random.fold_in(key, client_id))
      size_index = jnp.searchsorted(jnp.asarray(sizes), data.test_count[client_id])
      return jax.lax.switch(size_index, [
          lambda b=b: test_one(state, data, key, client_id, params, b) for b in sizes])

    return sharding.map_slots_on_each_device(test_client, (state, data, key), (sorted_ids,), mesh)

  def evaluate(state, data, key):
    clients = per_client(state, data, key)
    has_test = (clients['targets'] > 0).astype(jnp.float32)
    tested = jnp.maximum(has_test.sum(), 1.0)
    tested_part = has_test * clients['took_part'].astype(jnp.float32)
    accuracy = clients['accuracy']
    return {'test_accuracy': jnp.sum(accuracy * has_test) / tested,
            'test_loss': jnp.sum(clients['loss'] * has_test) / tested,
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
