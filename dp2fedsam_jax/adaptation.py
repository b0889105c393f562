"""The test-time protocol (config.eval): one adaptation budget given equally to every method.

Before testing, each client adapts the model the method gives it, on its own training data:

  adapt_part   'auto': what the method adapts -- personal-head methods (own head or head offset)
               and -fb methods re-fit the head on the final shared model, -FT methods fine-tune
               the whole model, global-model methods (FedAvg, DP-FedAvg) adapt nothing;
               'head': the head on the frozen extractor, for any method; 'full': the whole model.
  head_init    the head adaptation starts from (and tests with when nothing is trained):
               'own' -- the head the method tests with today (the client's personal head, the
               global head plus the client's offset, or the global head of a global model);
               'random' -- the run's initial head (what every personal head starts from; a linear
               probe of the final extractor); 'shared' -- the global head, for methods that have one.
  adapt_epochs epochs of SGD (local.batch_size, local.momentum) at adapt_lr, constant (no round
               decay), on at most local.max_examples of the client's training rows (a random
               subset drawn as a round draws it).

adapt_epochs = 0 with head_init = 'own' is today's evaluation, unchanged (`make_adapt` returns None
and evaluation.py runs its own code); otherwise the protocol replaces the method's own fine-tuning
(local.finetune_epochs). Nothing is selected: the budget is fixed, no test data is looked at
before testing. docs/evaluation.md.
"""

from __future__ import annotations

import dataclasses

import jax

from dp2fedsam_jax import local, sharding
from dp2fedsam_jax.algorithms.specs import MethodSpec
from dp2fedsam_jax.errors import ConfigError

ADAPT_PARTS = ('auto', 'head', 'full')
HEAD_INITS = ('own', 'random', 'shared')
# The config.eval fields and their defaults (today's evaluation); also what an older run had.
DEFAULTS = {'adapt_epochs': 0, 'adapt_lr': None, 'adapt_part': 'auto', 'head_init': 'own'}


@dataclasses.dataclass(frozen=True)
class Protocol:
  """`config.eval` at the engine boundary (frozen)."""
  adapt_epochs: int = 0
  adapt_lr: float | None = None
  adapt_part: str = 'auto'
  head_init: str = 'own'

  @classmethod
  def from_config(cls, config) -> 'Protocol':
    """From config.eval; a config without the block (a run older than it) has the defaults."""
    block = dict(config.get('eval') or {})
    return cls(**{k: block.get(k, v) for k, v in DEFAULTS.items()})

  @property
  def is_default(self) -> bool:
    return self.adapt_epochs == 0 and self.head_init == 'own'

  def part(self, spec: MethodSpec) -> str:
    """'head' | 'full' | 'none': what this protocol trains for `spec`'s clients."""
    if self.adapt_part != 'auto':
      return self.adapt_part
    return spec.evaluation.adapt_part

  def describe(self) -> dict:
    return dataclasses.asdict(self)


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


def make_adapt(spec: MethodSpec, model, local_config: local.LocalConfig, protocol: Protocol,
               initial_head=None):
  """None for the default protocol, else `adapt(state, params, data, client_id, key) -> params`
  for evaluation.make_evaluate: `params` is the client's model as the method builds it.
  `initial_head`: the run's initial head params (needed by head_init='random')."""
  local.check_local_config(local_config)
  if protocol.is_default:
    return None
  if protocol.head_init == 'random' and initial_head is None:
    raise ValueError("head_init='random' needs the run's initial head")
  part = protocol.part(spec)
  phase = local.Phase(protocol.adapt_epochs, local_config.batch_size, 'sgd', local_config.momentum)

  def adapt(state, params, data, client_id, key):
    head = {'own': lambda: params['head'], 'random': lambda: initial_head,
            'shared': lambda: state.shared['head']}[protocol.head_init]()
    params = {**params, 'head': head}
    if part == 'none' or protocol.adapt_epochs == 0:
      return params
    budget = local_config.budget(data.max_train)
    ft_key, examples_key = jax.random.split(key) if budget < data.max_train else (key, None)
    train_x, y, count = data.train_examples(client_id, budget, examples_key, local_config.subset_draw)
    x = data.normalize(train_x)
    if part == 'full':
      loss = lambda p, x, y, mask: local.masked_cross_entropy(model.apply(p, x), y,
                                                              data.loss_mask(y, mask))
      return local.run_phase(phase, loss, params, x, y, count, ft_key, protocol.adapt_lr)[0]
    features = model.features(params['extractor'], x)  # the extractor is fixed: computed once
    head_loss = lambda h, f, labels, mask: local.masked_cross_entropy(
        model.logits_from_features(h, f), labels, data.loss_mask(labels, mask))
    head, _ = local.run_phase(phase, head_loss, params['head'], features, y, count, ft_key,
                              protocol.adapt_lr)
    return {**params, 'head': head}

  return adapt


def evaluation_batch_size(protocol: Protocol, executor: str, default: int) -> int:
  """Clients the evaluation vmaps at once: adaptation gives each client its own weights, one at a
  time where the round loops over clients (as the -FT evaluation); `default` otherwise."""
  if protocol.adapt_epochs > 0 and sharding.loops_over_clients(executor):
    return 1
  return default
