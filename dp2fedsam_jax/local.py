"""Local training of one client: minibatch epochs over padded data, with SGD, SAM or ASAM steps.

Every function here is pure and sees one client; the round step maps it over the cohort (vmap or a
sequential loop). Padding never matters: an epoch visits the client's own `count` examples in a random
order, batches beyond `count` are inactive (parameters and optimizer state left unchanged), and a
partial last batch averages over its real examples only.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from dp2fedsam_jax.trees import global_norm

LossFn = Callable  # (params, inputs, labels, mask) -> scalar mean loss over mask


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy over the targets where mask is True (0 if there are none).

  `labels` [b] or token sequences [b, T]; `mask` per example ([b]) or per target (labels' shape).
  """
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  mask = mask.reshape(mask.shape + (1,) * (losses.ndim - mask.ndim)).astype(losses.dtype)
  return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def epoch_order(key: jax.Array, count: jax.Array, max_n: int, batch_size: int):
  """A random order of the first `count` of `max_n` slots, as [steps, batch_size] indices + mask.

  Each slot's sort key comes from fold_in(key, slot), so the order of the real examples does not
  depend on how much padding follows them.
  """
  slots = jnp.arange(max_n)
  u = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(key, i)))(slots)
  order = jnp.argsort(jnp.where(slots < count, u, 2.0))
  steps = -(-max_n // batch_size)
  order = jnp.pad(order, (0, steps * batch_size - max_n))
  positions = jnp.arange(steps * batch_size)
  return order.reshape(steps, batch_size), (positions < count).reshape(steps, batch_size)


# ------------------------------------------------------------------ local optimizers (a row names one)
# `gradient(loss_fn, params, batch, rho)`: the gradient a step takes and the loss at `params` (before any
# perturbation); run_phase feeds it to SGD (with momentum, if set). rho is config.local.sam_rho.


@dataclasses.dataclass(frozen=True)
class SGD:
  """The minibatch gradient, as it is."""
  name = 'sgd'

  def gradient(self, loss_fn: LossFn, params, batch, rho):
    del rho
    return jax.value_and_grad(loss_fn)(params, *batch)


@dataclasses.dataclass(frozen=True)
class SAM(SGD):
  """SAM is Algorithm 2's extractor loop (lines 11-15 of dp2-fedsam.txt): the minibatch gradient
  (line 12), the perturbation p (line 13, Eq. 11), the gradient at phi + p that the step takes
  (line 14, Eq. 12); run_phase loops it over the tau_phi epochs (lines 11 and 15)."""
  name = 'sam'

  def perturbation(self, grads, params, rho):
    """rho g/||g|| (line 13, Eq. 11: p(phi) from the minibatch gradient of line 12)."""
    del params
    scale = rho / jnp.maximum(global_norm(grads), 1e-12)
    return jax.tree.map(lambda g: g * scale, grads)

  def gradient(self, loss_fn: LossFn, params, batch, rho):
    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)             # line 12
    eps = self.perturbation(grads, params, rho)                           # line 13, Eq. 11
    perturbed = jax.tree.map(jnp.add, params, eps)
    return loss, jax.grad(loss_fn)(perturbed, *batch)                      # line 14, Eq. 12


@dataclasses.dataclass(frozen=True)
class ASAM(SAM):
  """SAM with scale-invariant sharpness (Kwon et al., 2021; the reference code's --adaptive flag)."""
  eta: float = 0.01  # the scale offset of T = |w| + eta
  name = 'asam'

  def perturbation(self, grads, params, rho):
    """rho T^2 g/||T g|| with T = |w| + eta."""
    t = jax.tree.map(lambda w: jnp.abs(w) + self.eta, params)
    tg = jax.tree.map(jnp.multiply, t, grads)
    scale = rho / jnp.maximum(global_norm(tg), 1e-12)
    return jax.tree.map(lambda ti, tgi: ti * tgi * scale, t, tg)


@dataclasses.dataclass(frozen=True)
class LocalConfig:
  """`config.local` at the engine boundary: frozen, so a built round step cannot change under it.

  `make_client_update`, `make_evaluate` and `make_round_step` take this, never the ConfigDict (whose
  later edits would reach a step traced after them). Build it with `LocalConfig.from_config(config)`;
  the defaults live in `config.base_config()` only.
  """
  personal_epochs: int      # tau_h: SGD epochs on the personal part per round
  shared_epochs: int      # tau_phi: epochs of the shared phase per round
  batch_size: int
  lr_personal: float
  lr_shared: float
  momentum: float
  lr_decay: float       # both learning rates are multiplied by lr_decay ** round
  sam_rho: float        # SAM / ASAM radius
  finetune_epochs: int  # -FT / -fb evaluation: local epochs on a copy before testing
  # Examples a client trains on per round (None: all); a larger client uses a fresh random subset
  # of this many each round (data.FederatedData.train_examples). A constant: sensitivity unchanged.
  max_examples: int | None = None
  # How that subset is drawn (data.federated.SUBSET_DRAWS): 'argsort' O(max_train), 'floyd' O(budget).
  subset_draw: str = 'argsort'

  def budget(self, max_train: int) -> int:
    """The [budget] buffer a client's training examples are gathered into: never above max_train."""
    return max_train if self.max_examples is None else min(self.max_examples, max_train)

  def with_hyperparameters(self, hp) -> 'LocalConfig':
    """This config at a search's traced scalars (federated_round.Hyperparameters)."""
    return dataclasses.replace(self, lr_shared=hp.lr_shared, lr_personal=hp.lr_personal,
                               sam_rho=hp.sam_rho)

  @classmethod
  def from_config(cls, config) -> 'LocalConfig':
    """From the experiment config's `local` block, which must have exactly these fields."""
    block = dict(config.local)
    names = [f.name for f in dataclasses.fields(cls)]
    if set(block) != set(names):
      raise ValueError(f'config.local has fields {sorted(block)}; LocalConfig needs {sorted(names)}.')
    def value(field):
      v = block[field.name]
      if v is None or field.type == 'str':
        return v
      return operator.index(v) if field.type.startswith('int') else float(v)
    return cls(**{f.name: value(f) for f in dataclasses.fields(cls)})


def check_local_config(local_config) -> None:
  if not isinstance(local_config, LocalConfig):
    raise TypeError(f'expected a local.LocalConfig, got {type(local_config).__name__}: pass '
                    'LocalConfig.from_config(config), not config.local.')


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase of local training: `epochs` passes of `optimizer` steps over the client's data."""
  epochs: int
  batch_size: int
  optimizer: SGD = SGD()  # SGD() | SAM() | ASAM(): the gradient each step takes
  momentum: float = 0.0
  rho: float = 0.0


def run_phase(phase: Phase, loss_fn: LossFn, params, inputs, labels, count, key, lr):
  """Trains `params` for `phase.epochs` epochs; returns (params, mean minibatch loss).

  `inputs`/`labels` are the client's padded arrays (leading dim max_n); only the first `count` are
  real. The optimizer state starts fresh each round, as in the papers' reference implementations.
  """
  if phase.epochs == 0:
    return params, jnp.zeros((), jnp.float32)
  tx = optax.sgd(learning_rate=lr, momentum=phase.momentum or None)
  max_n = labels.shape[0]

  def step(carry, batch_idx_mask):
    idx, mask = batch_idx_mask

    def train(carry):
      params, opt_state, loss_sum, active_steps = carry
      loss, grads = phase.optimizer.gradient(loss_fn, params, (inputs[idx], labels[idx], mask), phase.rho)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss_sum + loss, active_steps + 1

    # A batch is real iff its first slot is. Padded steps leave everything unchanged; as a cond they
    # are skipped outright in a client loop (the sequential executor: a client with 5 of max_n = 400
    # examples costs 1 step, not 40), and under vmap the cond becomes a select, as before.
    return jax.lax.cond(mask[0], train, lambda carry: carry, carry), None

  def epoch(carry, epoch_key):
    order, mask = epoch_order(epoch_key, count, max_n, phase.batch_size)
    return jax.lax.scan(step, carry, (order, mask))[0], None

  carry = (params, tx.init(params), jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
  (params, _, loss_sum, active_steps), _ = jax.lax.scan(
      epoch, carry, jax.random.split(key, phase.epochs))
  return params, loss_sum / jnp.maximum(active_steps, 1)


def every_example(labels, mask):
  """The target mask that counts every real example (image labels)."""
  del labels
  return mask


def train_head(model, phase: Phase, trainable, features, labels, count, key, lr,
               target_mask=every_example, head=lambda trainable: trainable):
  """`phase` on the model's head alone over fixed features (the extractor is frozen, so its features
  are computed once): a round's head phase, a -fb method's fine-tuned head and a test-time head
  re-fit all train here. `head(trainable)` is the head the trained parameters give (a head is
  itself; PPSGD's offset gives the global head plus it); `target_mask(labels, example_mask)` the
  targets the loss counts. Returns (trainable, mean minibatch loss)."""
  def loss(params, feats, y, mask):
    return masked_cross_entropy(model.logits_from_features(head(params), feats), y, target_mask(y, mask))
  return run_phase(phase, loss, trainable, features, labels, count, key, lr)


def train_model(model, phase: Phase, params, inputs, labels, count, key, lr,
                target_mask=every_example):
  """`phase` on the whole model (an -FT method's fine-tuning, a test-time full re-fit, local_only's
  visits). Returns (params, mean minibatch loss)."""
  loss = lambda p, x, y, mask: masked_cross_entropy(model.apply(p, x), y, target_mask(y, mask))
  return run_phase(phase, loss, params, inputs, labels, count, key, lr)
