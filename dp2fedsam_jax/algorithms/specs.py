"""Every method as a composition of the engine's shared pieces, side by side in one table.

A method is data, not a loop: which parameters are shared with the server, whether a personal head is
trained first, which local optimizer trains the shared part, whether the upload is clipped and noised,
and how the result is evaluated. `dp2fedsam_jax.round.make_round_step` turns any spec into one jitted
round.
"""

from __future__ import annotations

import dataclasses

from dp2fedsam_jax.local import OPTIMIZERS

SHARED = ('extractor', 'full')
EVALUATIONS = ('personal', 'global')


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  name: str
  shared: str            # 'extractor': personal head kept by each client; 'full': one global model
  head_phase: bool       # train the personal head (SGD, extractor fixed) before the shared phase
  body_optimizer: str    # local optimizer of the shared phase: 'sgd' | 'sam' | 'asam'
  private: bool          # clip the shared update and add Gaussian noise (client-level DP)
  evaluation: str        # 'personal': own head + global extractor; 'global': the global model
  paper: str = ''

  def __post_init__(self):
    assert self.shared in SHARED and self.evaluation in EVALUATIONS, self
    assert self.body_optimizer in OPTIMIZERS, self
    assert not (self.head_phase and self.shared == 'full'), 'a head phase needs a personal head'

  @property
  def shared_keys(self) -> tuple[str, ...]:
    return ('extractor', 'head') if self.shared == 'full' else ('extractor',)

  @property
  def personal_keys(self) -> tuple[str, ...]:
    return () if self.shared == 'full' else ('head',)


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
  if spec.name in METHODS:
    raise ValueError(f'method {spec.name!r} is registered twice')
  METHODS[spec.name] = spec
  return spec


def get_method(name: str) -> MethodSpec:
  if name not in METHODS:
    raise ValueError(f'config.method={name!r}: unknown method; choose one of {sorted(METHODS)}.')
  return METHODS[name]


# name, shared, head phase, body optimizer, private, evaluation
register(MethodSpec('dp2fedsam', 'extractor', True, 'sam', True, 'personal',
                    'DP²-FedSAM, dp2-fedsam.txt Algorithm 2'))
register(MethodSpec('centaur', 'extractor', True, 'sgd', True, 'personal',
                    'CENTAUR at client level: DP²-FedSAM with SGD instead of SAM (dp2-fedsam.txt §5)'))
register(MethodSpec('p_fedsam', 'extractor', True, 'sam', False, 'personal',
                    'DP²-FedSAM without clipping or noise (epsilon = inf)'))
