r"""The centralized bound: the run's model trained on the pooled training rows of all its clients.

  python3 -m experiments.centralized --config=experiments/configs/shakespeare.py \
      --config.model=char_lstm --epochs=5 --batch_size=10 --lr=1.0 --out=centralized.jsonl

The data are the federation the config would train on (the same clients, seed and train/test
split); every client's training rows are pooled and shuffled each epoch, minibatch SGD (or Adam)
trains the config's model, and after each epoch the model is tested on every client's test rows
pooled: `test_accuracy_pooled` counts targets as the federated evaluation does (images: examples;
tokens: non-pad targets less EOS/BOS), so it is the ceiling of a federated run's pooled accuracy
with this model. One JSON line per epoch (stdout, and --out). `--max_steps=K` stops after K steps
and estimates the seconds per epoch (a smoke check); `--dry_run` prints the pooled sizes and the
steps per epoch, and trains nothing.
"""

from __future__ import annotations

import json
import time

import numpy as np
from absl import app
from absl import flags
from ml_collections import config_flags

from dp2fedsam_jax import cli

FLAGS = flags.FLAGS
OPTIMIZERS = ('sgd', 'adam')
EVAL_BATCH = 500  # test rows per forward pass


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  config_flags.DEFINE_config_file('config', None, 'Experiment config file: its dataset, clients, '
                                  'seed and model.', lock_config=True, flag_values=flag_values)
  flags.DEFINE_integer('epochs', 1, 'Passes over the pooled training rows.', flag_values=flag_values)
  flags.DEFINE_integer('batch_size', 10, 'Rows per SGD step.', flag_values=flag_values)
  flags.DEFINE_float('lr', 1.0, 'Learning rate (constant).', flag_values=flag_values)
  flags.DEFINE_float('momentum', 0.0, 'SGD momentum.', flag_values=flag_values)
  flags.DEFINE_enum('optimizer', 'sgd', OPTIMIZERS, 'sgd | adam.', flag_values=flag_values)
  flags.DEFINE_integer('max_steps', None, 'Stop after this many steps (a smoke check; the '
                       'seconds per epoch are then estimated).', flag_values=flag_values)
  flags.DEFINE_integer('seed', 0, 'Initialisation and shuffling.', flag_values=flag_values)
  flags.DEFINE_string('out', None, 'Also append each epoch\'s JSON line to this file.',
                      flag_values=flag_values)
  flags.DEFINE_bool('dry_run', False, 'Print the pooled sizes and steps per epoch; no training.',
                    flag_values=flag_values)


def _epoch_batches(rng: np.random.Generator, rows: int, steps: int, steps_per_call: int,
                   batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """One epoch's shuffled row indices and real-row mask, [padded steps, batch_size] each: the
  steps padded to whole calls of `steps_per_call` (padding rows point at row 0, marked not real)."""
  padded = -(-steps // steps_per_call) * steps_per_call
  order = rng.permutation(rows)
  order = np.concatenate([order, np.zeros(max(0, padded * batch_size - rows), np.int64)])[
      :padded * batch_size].reshape(padded, batch_size)
  real = (np.arange(padded * batch_size) < min(rows, steps * batch_size)).reshape(
      padded, batch_size)
  return order, real


def _pooled_test(data, model):
  """test(params) -> accuracy and loss over every client's test rows pooled, EVAL_BATCH at a time,
  targets counted as the federated evaluation counts them."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel

  test_rows = int(data.test_x.shape[0])

  @jax.jit
  def test_batch(params, idx, real):
    x, y = data.normalize(data.test_x[idx]), data.test_y[idx].astype(jnp.int32)
    logits = model.apply(params, x)
    counted = data.accuracy_mask(y, real)
    mask = data.loss_mask(y, real)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    losses = losses * mask.reshape(mask.shape + (1,) * (losses.ndim - mask.ndim))
    return (jnp.sum((jnp.argmax(logits, -1) == y) & counted), jnp.sum(counted), jnp.sum(losses),
            jnp.sum(mask))

  def test(params):
    totals = np.zeros(4)
    for start in range(0, test_rows, EVAL_BATCH):
      idx = np.arange(start, start + EVAL_BATCH)
      real = idx < test_rows
      totals += np.array([float(v) for v in test_batch(params, np.where(real, idx, 0), real)])
    correct, targets, loss_sum, loss_targets = totals
    return {'test_accuracy_pooled': correct / max(targets, 1), 'test_loss': loss_sum / max(loss_targets, 1),
            'test_targets': int(targets)}

  return test


def train_centralized(data, model, *, epochs: int, batch_size: int, lr: float,
                      momentum: float = 0.0, optimizer: str = 'sgd', seed: int = 0,
                      max_steps: int | None = None, steps_per_call: int = 50, on_epoch=None):
  """Trains `model` from its init on all of `data`'s training rows; returns (params, records), one
  record per epoch (or one for the steps `max_steps` allows). `on_epoch(record)` is called as each
  ends."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax import local  # pylint: disable=import-outside-toplevel

  if optimizer not in OPTIMIZERS:
    raise ValueError(f'--optimizer={optimizer!r}: choose one of {OPTIMIZERS}.')
  tx = (optax.sgd(lr, momentum=momentum or None) if optimizer == 'sgd' else optax.adam(lr))
  rows = int(data.train_x.shape[0])
  steps_per_epoch = -(-rows // batch_size)
  key = jax.random.key(seed)
  params = model.init(jax.random.fold_in(key, 0))
  opt_state = tx.init(params)

  def loss_fn(p, idx, real):
    x, y = data.normalize(data.train_x[idx]), data.train_y[idx].astype(jnp.int32)
    return local.masked_cross_entropy(model.apply(p, x), y, data.loss_mask(y, real))

  @jax.jit
  def train_steps(params, opt_state, idx, real):  # idx, real [k, batch_size]
    def step(carry, batch):
      def train(carry):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss
      # Padding steps (a chunk's tail) change nothing: one compiled chunk length.
      return jax.lax.cond(batch[1][0], train, lambda c: (c, jnp.zeros((), jnp.float32)), carry)
    (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), (idx, real))
    return params, opt_state, losses

  test = _pooled_test(data, model)
  test_rows = int(data.test_x.shape[0])

  rng = np.random.default_rng(seed)
  records, done = [], 0
  for epoch in range(1, epochs + 1):
    steps = steps_per_epoch if max_steps is None else min(steps_per_epoch, max_steps - done)
    order, real = _epoch_batches(rng, rows, steps, steps_per_call, batch_size)
    losses, train_seconds, compile_seconds = [], 0.0, 0.0
    for start in range(0, steps, steps_per_call):
      stop = start + steps_per_call
      t = time.perf_counter()
      params, opt_state, chunk = train_steps(params, opt_state, order[start:stop], real[start:stop])
      chunk = np.asarray(chunk)[real[start:stop, 0]]  # waits for the steps
      elapsed = time.perf_counter() - t
      if start == 0 and epoch == 1:
        compile_seconds = elapsed  # the first call compiles (a shorter last chunk compiles too)
      else:
        train_seconds += elapsed
      losses.append(chunk)
    done += steps
    timed_steps = steps - min(steps_per_call, steps) if epoch == 1 else steps
    t = time.perf_counter()
    record = {'epoch': epoch if steps == steps_per_epoch else epoch - 1 + steps / steps_per_epoch,
              'steps': done, 'train_loss': float(np.mean(np.concatenate(losses))), **test(params)}
    record.update(
        eval_seconds=time.perf_counter() - t, compile_seconds=compile_seconds,
        seconds_per_step=train_seconds / timed_steps if timed_steps else None,
        estimated_seconds_per_epoch=(train_seconds / timed_steps * steps_per_epoch
                                     if timed_steps else None),
        steps_per_epoch=steps_per_epoch, train_rows=rows, test_rows=test_rows)
    records.append(record)
    if on_epoch is not None:
      on_epoch(record)
    if max_steps is not None and done >= max_steps:
      break
  return params, records


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  # pylint: disable=import-outside-toplevel  (JAX: after the flags)
  import jax
  from dp2fedsam_jax import train
  from dp2fedsam_jax.models import count_params
  config = FLAGS.config
  train.validate_config(config, train.METHODS)
  data = train.make_federated_data(
      dataset=config.dataset, num_clients=config.num_clients, partition=config.partition,
      classes_per_client=config.classes_per_client, dirichlet_alpha=config.dirichlet_alpha,
      seed=config.seed, data_dir=config.data_dir)
  model = train.get_model(config.model, data.num_classes, data.input_shape, config.conv_impl)
  rows = int(data.train_x.shape[0])
  header = {'dataset': config.dataset, 'model': config.model, 'clients': data.num_clients,
            'train_rows': rows, 'test_rows': int(data.test_x.shape[0]),
            'steps_per_epoch': -(-rows // FLAGS.batch_size),
            'num_params': count_params(model.init(jax.random.key(0)))}
  print(json.dumps(header))
  if FLAGS.dry_run:
    return

  def write(record):
    line = json.dumps({'model': config.model, 'batch_size': FLAGS.batch_size, 'lr': FLAGS.lr,
                       'optimizer': FLAGS.optimizer, **record})
    print(line, flush=True)
    if FLAGS.out:
      with open(FLAGS.out, 'a') as f:
        f.write(line + '\n')

  train_centralized(data, model, epochs=FLAGS.epochs, batch_size=FLAGS.batch_size, lr=FLAGS.lr,
                    momentum=FLAGS.momentum, optimizer=FLAGS.optimizer, seed=FLAGS.seed,
                    max_steps=FLAGS.max_steps, on_epoch=write)


if __name__ == '__main__':
  define_flags()
  flags.mark_flag_as_required('config')
  cli.run(main)
