"""The test-time protocol run (protocol.py): each client's model, as the method gives it, after the
`Adaptation` its protocol resolves to, trained on the client's own training rows. One path for every
method: its own evaluation (the defaults: a model tested as it is, an -FT method's fine-tuned
copy, a -fb method's fine-tuned head) and a configured config.eval protocol alike. docs/evaluation.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dp2fedsam_jax import local
from dp2fedsam_jax.algorithms.specs import MethodSpec
from dp2fedsam_jax.errors import ConfigError
from dp2fedsam_jax.protocol import ADAPT_PARTS, HEAD_INITS, Adaptation, Protocol
from dp2fedsam_jax.state import model_params


def check_config(config, spec: MethodSpec | None = None) -> None:
  """Raises ConfigError naming the first bad config.eval field (or its clash with the method)."""
  p = Protocol.from_config(config)
  epochs = p.adapt_epochs
  if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 0:
    raise ConfigError(f'config.eval.adapt_epochs={epochs!r}: must be an integer >= 0 (0: each '
                      "method's own evaluation).")
  for field, choices in (('adapt_part', ADAPT_PARTS), ('head_init', HEAD_INITS)):
    if getattr(p, field) not in choices:
      raise ConfigError(f'config.eval.{field}={getattr(p, field)!r}: unknown; choose one of '
                        f'{list(choices)}.')
  lr = p.adapt_lr
  if lr is not None and (not isinstance(lr, (int, float)) or isinstance(lr, bool)
                         or not lr > 0 or lr == float('inf')):
    raise ConfigError(f'config.eval.adapt_lr={lr!r}: must be a number > 0.')
  if epochs > 0 and lr is None:
    raise ConfigError(f'config.eval.adapt_lr=None: adapt_epochs={epochs} needs a learning rate, '
                      'the same for every method compared: set --config.eval.adapt_lr.')
  if spec is not None and not spec.federated and not p.is_default:
    raise ConfigError(f'config.eval.adapt_epochs={epochs!r}, head_init={p.head_init!r}: '
                      f'{spec.name} trains each client\'s whole model on its own data; a test-time '
                      'protocol does not apply. Leave config.eval at its defaults.')
  if spec is not None and p.head_init == 'shared' and 'head' not in spec.personal.shared_keys:
    raise ConfigError(f"config.eval.head_init='shared': {spec.name} has no global head (its heads "
                      "are personal); use 'own' or 'random'.")


def make_client_model(spec: MethodSpec, model, local_config: local.LocalConfig,
                      adaptation: Adaptation, initial_head=None):
  """`client_model(state, personal, data, client_id, key) -> params`, the model a client tests: the
  method's (the shared part through its weight mask, with the client's personal part), its head
  swapped for `adaptation.head_init`'s, then `adaptation` trained on the client's training rows
  (`key` orders the minibatches). `initial_head`: the run's initial head (head_init='random')."""
  local.check_local_config(local_config)
  if adaptation.head_init == 'random' and initial_head is None:
    raise ValueError("head_init='random' needs the run's initial head")
  weight_mask = spec.weight_mask.for_model(spec.name, model)
  phase = local.Phase(adaptation.epochs, local_config.batch_size, local.SGD(), local_config.momentum)

  def client_model(state, personal, data, client_id, key):
    params = model_params(spec, weight_mask.forward(state.shared), personal)
    if adaptation.head_init != 'own':
      params = {**params, 'head': initial_head if adaptation.head_init == 'random'
                else state.shared['head']}
    if not adaptation.trains:
      return params
    lr = adaptation.lr
    if adaptation.lr_decay is not None:  # a method's own fine-tuning, at its round's local lr
      lr = lr * jnp.asarray(adaptation.lr_decay, jnp.float32) ** state.round
    # On at most local.max_examples of the client's examples, as local training (a random subset
    # needs a second key; without one, the key is the one runs used before).
    budget = local_config.budget(data.max_train)
    train_key, examples_key = jax.random.split(key) if budget < data.max_train else (key, None)
    x, y, count = data.train_examples(client_id, budget, examples_key, local_config.subset_draw)
    x = data.normalize(x)
    if adaptation.part == 'full':
      return local.train_model(model, phase, params, x, y, count, train_key, lr, data.loss_mask)[0]
    features = model.features(params['extractor'], x)  # the extractor is fixed: computed once
    head, _ = local.train_head(model, phase, params['head'], features, y, count, train_key, lr,
                               data.loss_mask)
    return {**params, 'head': head}

  return client_model
