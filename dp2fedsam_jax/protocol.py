"""The test-time protocol: what each client does to the model its method gives it, before testing.

`Protocol` is config.eval; its fields and their defaults are written here once (config.py builds the
block from DEFAULTS, run_files gives them to runs older than the block, the report reads them):

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

One path: `Protocol.for_method` resolves it into the `Adaptation` a method's clients run
(adaptation.py trains it). At the defaults (0 epochs, head 'own') that is the method's own, its
evaluation piece's (algorithms/pieces.py): a global or personal model tested as it is, an -FT
method's whole model or a -fb method's head fine-tuned for local.finetune_epochs at its round's
local lr. Any other protocol replaces it, the same budget for every method. Nothing is selected: no
test data is looked at before testing. docs/evaluation.md. No JAX here: config.py reads this.
"""

from __future__ import annotations

import dataclasses

ADAPT_PARTS = ('auto', 'head', 'full')
HEAD_INITS = ('own', 'random', 'shared')
PARTS = ('none', 'head', 'full')  # what an Adaptation trains


@dataclasses.dataclass(frozen=True)
class Adaptation:
  """What each client of one method trains on its own training rows before it is tested (on a copy,
  inside the evaluation: the server state is never touched)."""
  part: str = 'none'              # one of PARTS
  epochs: int = 0
  lr: float | None = None
  # A method's own fine-tuning decays its lr with the round (lr * lr_decay ** round, as local
  # training does); None: the constant lr of a configured protocol.
  lr_decay: float | None = None
  head_init: str = 'own'          # one of HEAD_INITS
  # Every client tests its own trained weights: one client at a time where the round loops over
  # clients (executors.Executor.loops_over_clients). A -fb method's own head fine-tuning stays
  # vmapped, as it always ran.
  own_weights: bool = False

  @property
  def trains(self) -> bool:
    return self.part != 'none' and self.epochs > 0

  @property
  def forward_only(self) -> bool:
    """The client tests the method's model as it is: it is built inside the test's forward pass."""
    return not self.trains and self.head_init == 'own'


NO_ADAPTATION = Adaptation()


@dataclasses.dataclass(frozen=True)
class Protocol:
  """`config.eval` at the engine boundary (frozen). The field defaults are every config's."""
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

  def part(self, spec) -> str:
    """'head' | 'full' | 'none': what this protocol trains for `spec`'s clients."""
    return spec.evaluation.adapt_part if self.adapt_part == 'auto' else self.adapt_part

  def for_method(self, spec, local_config) -> Adaptation:
    """What `spec`'s clients train before testing: at the defaults the method's own evaluation
    (its evaluation piece's adaptation), else this protocol."""
    if self.is_default:
      return spec.evaluation.adaptation(local_config)
    return Adaptation(self.part(spec), self.adapt_epochs, self.adapt_lr, None, self.head_init,
                      own_weights=self.adapt_epochs > 0)

  def describe(self) -> dict:
    return dataclasses.asdict(self)


DEFAULT_PROTOCOL = Protocol()  # each method's own evaluation
# config.eval's fields and their defaults (today's evaluation; also what an older run had).
DEFAULTS = {field.name: field.default for field in dataclasses.fields(Protocol)}
