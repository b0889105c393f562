"""One client's work in a round (Algorithm 2, lines 5-17 of dp2-fedsam.txt), as a pure function.

    head phase:       h_i <- tau_h epochs of SGD on F_i(phi, h), phi fixed         (lines 6-9)
    extractor phase:  phi_i <- tau_phi epochs of SAM on F_i(phi, h_i), h_i fixed  (lines 10-15)
    upload:           Delta_i = phi_i - phi                                       (line 17)

Methods without a personal head (spec.shared == 'full') skip the head phase and train the whole model
in the second phase. Clipping and noise happen in the round step, on Delta_i.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dp2fedsam_jax import local
from dp2fedsam_jax.algorithms.specs import MethodSpec


class ClientResult(NamedTuple):
  delta: object      # shared params after local training minus the received ones
  personal: object   # the client's new personal params (empty dict for global methods)
  train_loss: jax.Array  # mean minibatch loss of the shared phase


def make_client_update(spec: MethodSpec, model, local_config, normalize):
  """Returns client_update(shared, personal, x, y, count, key, round) -> ClientResult.

  `x`, `y`: the client's padded training data; `count`: its number of real examples; `normalize`
  maps stored uint8 images to model inputs.
  """
  head_phase = local.Phase(local_config.head_epochs, local_config.batch_size, 'sgd',
                           local_config.momentum)
  body_phase = local.Phase(local_config.body_epochs, local_config.batch_size, spec.body_optimizer,
                           local_config.momentum, local_config.sam_rho)

  def head_loss(head, features, labels, mask):
    return local.masked_cross_entropy(model.logits_from_features(head, features), labels, mask)

  def client_update(shared, personal, x, y, count, key, round_index):
    decay = jnp.asarray(local_config.lr_decay, jnp.float32) ** round_index
    head_key, body_key = jax.random.split(key)
    inputs = normalize(x)

    if spec.head_phase:
      # phi is fixed in this phase, so the features are computed once and reused every epoch.
      features = model.features(shared['extractor'], inputs)
      head, _ = local.run_phase(head_phase, head_loss, personal['head'], features, y, count,
                                head_key, local_config.lr_head * decay)
      personal = {**personal, 'head': head}

    def body_loss(trainable, inputs, labels, mask):
      logits = model.apply({**trainable, **personal}, inputs)
      return local.masked_cross_entropy(logits, labels, mask)

    new_shared, loss = local.run_phase(body_phase, body_loss, shared, inputs, y, count, body_key,
                                       local_config.lr_body * decay)
    delta = jax.tree.map(jnp.subtract, new_shared, shared)
    return ClientResult(delta, personal, loss)

  return client_update
