"""One client's work in a round (Algorithm 2, lines 5-17 of dp2-fedsam.txt), as a pure function.

    personal phase:   h_i <- tau_h epochs of SGD on F_i(phi, h), phi fixed         (lines 6-9)
    shared phase:     phi_i <- tau_phi epochs of SAM on F_i(phi, h_i), h_i fixed  (lines 10-15)
    upload:           Delta_i = phi_i - phi                                       (line 17)

Other methods change the pieces, not the loop (see algorithms/specs.py): no head phase and the whole
model shared (FedAvg family), SGD or ASAM instead of SAM, a regularizer on the local update (BLUR,
DSU's adaptive norm, a proximal term), DSU's masked forward pass. Clipping and noise happen in the
round step, on Delta_i.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dp2fedsam_jax import keys, local
from dp2fedsam_jax.algorithms.specs import MethodSpec
from dp2fedsam_jax.privacy import sparsify
from dp2fedsam_jax.state import model_params


class LocalUpdate(NamedTuple):
  """What one client's local training produces (the round makes its ClientResult of it)."""
  delta: object      # shared params after local training minus the received ones
  personal: object   # the client's new personal params (empty dict for global methods)
  train_loss: jax.Array  # mean minibatch loss of the shared phase
  mask: object       # DSU's final mask M^tau over the shared params (None for other methods)


def personal_trainer(spec: MethodSpec, model, local_config: local.LocalConfig,
                     target_mask=local.every_example):
  """train_personal(shared, personal, features, y, count, key, lr) -> personal: SGD on the personal part
  with the extractor's features computed once (phi is fixed in this phase; [n, F] or, for token
  sequences, [n, T, F])."""
  phase = local.Phase(local_config.personal_epochs, local_config.batch_size, local.SGD(),
                      local_config.momentum)

  def train_personal(shared, personal, features, y, count, key, lr, epochs=None):
    run = phase if epochs is None else local.Phase(epochs, phase.batch_size, local.SGD(), phase.momentum)
    head = lambda p: model_params(spec, shared, p)['head']  # a personal head, or the global one + offset
    return local.train_head(model, run, personal, features, y, count, key, lr, target_mask, head)[0]

  return train_personal


def make_client_update(spec: MethodSpec, model, local_config: local.LocalConfig, normalize,
                       target_mask=local.every_example, clip_norm=None):
  """Builds one client's local training: the head phase (Algorithm 2, lines 6-9), then the shared
  phase (lines 10-15) and the update Delta_i (line 17).

  Args:
    spec: the method's pieces (shared-phase optimizer: SGD/SAM/ASAM, regularizer, masks, personal part).
    model: the SplitModel.
    local_config: epochs, batch size, learning rates, decay, momentum, SAM rho.
    normalize: maps the stored uint8 images to model inputs.
    target_mask: `(y, example_mask) -> mask` of the targets the loss counts (FederatedData.loss_mask:
      token sequences drop the pad id); default: every real example.
    clip_norm: the round's C (the DPMechanism's, traced under adaptive clipping), which BLUR and
      DSU's adaptive norm penalise against; other methods leave it None.

  Returns:
    `client_update(shared, personal, x, y, count, key, round_index) -> LocalUpdate` for one
    client: `x`, `y` its padded training data, `count` its number of real examples (padding is
    never trained on), `key` its TRAIN stream, `round_index` the 0-based round (learning-rate
    decay). The result holds the raw shared update `delta` (unclipped), the new personal
    parameters and the mean training loss.
  """
  local.check_local_config(local_config)
  train_personal = personal_trainer(spec, model, local_config, target_mask)
  shared_phase = local.Phase(local_config.shared_epochs, local_config.batch_size, spec.shared_optimizer,
                           local_config.momentum, local_config.sam_rho)
  regularizer = spec.regularizer.at_clip_norm(clip_norm)
  weight_mask = spec.weight_mask.for_model(spec.name, model)

  def client_update(shared, personal, x, y, count, key, round_index):
    decay = jnp.asarray(local_config.lr_decay, jnp.float32) ** round_index
    personal_key, shared_key = keys.personal_and_shared(key)
    inputs = normalize(x)

    if spec.personal_phase:  # DSU: the head learns on the features of theta * M, as it is tested
      features = model.features(weight_mask.forward(shared)['extractor'], inputs)
      personal = train_personal(shared, personal, features, y, count, personal_key,
                            local_config.lr_personal * decay)

    def shared_loss(trainable, inputs, labels, mask):
      # DSU: the forward pass sees theta * M, M recomputed from the current weights every step.
      wmask = weight_mask(trainable)
      forward = trainable if wmask is None else sparsify.apply_mask(trainable, wmask)
      logits = model.apply(model_params(spec, forward, personal), inputs)
      return (local.masked_cross_entropy(logits, labels, target_mask(labels, mask))
              + regularizer(trainable, shared, wmask))

    new_shared, loss = local.run_phase(shared_phase, shared_loss, shared, inputs, y, count, shared_key,
                                       local_config.lr_shared * decay)
    delta = jax.tree.map(jnp.subtract, new_shared, shared)
    return LocalUpdate(delta, personal, loss, weight_mask(new_shared))

  return client_update
