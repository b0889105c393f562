r"""Your own method, from your own file: DP²-FedSAM whose server steps along a moving average.

    python3 -m experiments.train --config=experiments/extending/own_method.py --workdir=/tmp/own_method
    ... --config.ema_beta=0.9      (the method's own knob, validated: in [0, 1))

The method is a MethodSpec of the package's pieces (a personal head, SAM, each client tests its
own head) and one new piece: `SmoothedMeanStep`, a server step (the slot from the released mean to
the new global model) with state of its own. Its `beta` is a knob: registering the method adds
`config.ema_beta` (default 0.5, the field's) to base_config(), and validate_config refuses a value
outside [0, 1) naming the field. Only public names of `dp2fedsam_jax` are used (docs/extending.md).
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from dp2fedsam_jax import (SAM, Knob, MethodSpec, OwnHead, ServerStep, TestPersonal, base_config,
                           register_method)


@dataclasses.dataclass(frozen=True)
class SmoothedMeanStep(ServerStep):
  """v <- beta v + (1 - beta) sum / m;  phi <- phi + lr v.

  A moving average of the released mean updates: a function of the released sums only, so
  post-processing (the accounted epsilon is unchanged). Its state v, shaped like the shared
  params, is carried and checkpointed with the server state.
  """
  beta: float = 0.5
  name: ClassVar[str] = 'smoothed_mean'
  config_fields = (Knob('beta', 'ema_beta', low=0.0, high=1.0, high_open=True,
                        help='beta of the moving average of released means (own_method.py)'),)

  def init(self, shared):
    return jax.tree.map(jnp.zeros_like, shared)

  def apply(self, shared, total, denominator, learning_rate, state):
    state = jax.tree.map(lambda v, s: self.beta * v + (1.0 - self.beta) * (s / denominator),
                         state, total)
    return jax.tree.map(lambda p, v: p + learning_rate * v, shared, state), state


register_method(MethodSpec(
    'dp2fedsam_ema', personal=OwnHead(), personal_phase=True, shared_optimizer=SAM(),
    evaluation=TestPersonal(), server_step=SmoothedMeanStep(),
    paper='DP²-FedSAM whose server steps along a moving average of the released means '
          '(experiments/extending)'))


def get_config():
  """Three rounds of the new method on 8 synthetic clients with an MLP (seconds on a CPU)."""
  c = base_config()  # after register_method: it holds config.ema_beta
  c.method, c.model = 'dp2fedsam_ema', 'mlp'
  c.dataset, c.partition, c.num_clients = 'synthetic', 'iid', 8
  c.sampling_rate, c.num_rounds, c.eval_every = 0.5, 3, 3
  c.local.update(personal_epochs=1, shared_epochs=1, batch_size=16, lr_personal=0.05, lr_shared=0.05)
  c.dp.clip_norm, c.dp.noise_multiplier = 1.0, 1.0
  return c
