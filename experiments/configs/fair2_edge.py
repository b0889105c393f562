"""The fair benchmark's second design, its pilot's second stage: the divergence edge of the two
searched steps, per family (docs/benchmark.md, "Second design"; the rule that reads these runs:
experiments/studies/fair2_pilot.py).

The block searches a row's client lr and its noisy step eta_eff = server lr x C (C fixed by the
pilot's rule), each log-uniform over 1.5 decades below the divergence edge. This ladder finds each
family's edge: one run per value of a half-decade ladder, the other step held at the family's pilot
run (block (a)'s selection), T_EDGE rounds at the noise of the block's T = 200 rounds (sigma
calibrated for eps over 200 rounds, so a short run sees a long run's noise per round: its eps is
smaller, and no verdict uses it).

  family          method      C                  eta_eff ladder          client lr ladder
  personal-head   dp2fedsam   C by rule (0.101)  0.01 - 1                0.01 - 1
  global-model    dp_fedavg   C by rule (0.875)  0.01 - 1                0.01 - 1
  ceiling         p_fedsam    none (eps = inf)   0.1 - 10 (the server    0.01 - 1
                                                 lr itself)
(half-decade steps; the ladders are declared in experiments/studies/fair2_pilot.py)

"The client lr" is one knob: it sets every client lr a method has (a head phase's too:
local.lr_personal = local.lr_shared), as the block searches it. The head epochs are 1 (the
block's pin), the rest is the pilot run's. A family's ten runs differ only in searched scalars, so
they run as one compiled program. Grid: 30 runs at seed 0 (3 families x 2 ladders x 5 values):

  python3 -m launch.sweep --config=experiments/configs/fair2_edge.py --root=$HOME/fair2 \\
      --one_program=auto

Arguments: `:method=dp2fedsam,knob=client_lr,value=0.1`.
"""

from __future__ import annotations

import math
import os

from experiments.configs import _common
from experiments.configs import fair2_pilot as pilot
from experiments.configs import fmnist_paper_regime as regime
from experiments.studies import fair2_pilot as rules

EPS, CLASSES = 0.25, 5     # the regime the pilot chose (experiments/studies/fair2_pilot.py)
HEAD_EPOCHS = 1
DEFAULTS = dict(method='dp2fedsam', knob='client_lr', value=0.1, seed=0)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def clip_norm(method: str) -> float | None:
  """C by the pilot's rule for the method's family (None: the non-private ceiling)."""
  family = rules.FAMILIES[method]
  if family == 'ceiling':
    return None
  value = rules.chosen(REPO).clip_norms[family]
  if value is None:
    raise ValueError(f'C by rule for the {family} family is pending: its pilot run has not finished.')
  return round(value, 3)


def pilot_step(method: str) -> float:
  """The family's pilot run's eta_eff (server lr x the C it ran with; the server lr alone for the
  non-private ceiling)."""
  values = pilot.START_VALUES[method]
  return values['server_lr'] * values.get('dp.clip_norm', 1.0)


def set_client_lr(config, lr: float) -> None:
  """The one client lr: every client lr the method has."""
  config.local.lr_shared = config.local.lr_personal = lr


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  method, knob, value = args['method'], args['knob'], float(args['value'])
  if method not in rules.FAMILIES or knob not in rules.KNOBS:
    raise ValueError(f'method={method!r}, knob={knob!r}: the ladder runs methods '
                     f'{sorted(rules.FAMILIES)} and knobs {rules.KNOBS}')
  private = rules.FAMILIES[method] != 'ceiling'
  c = pilot.get_config(f"method={method},eps={EPS if private else math.inf},S={CLASSES},"
                       f"seed={args['seed']}")
  c.local.personal_epochs = HEAD_EPOCHS
  step, lr = pilot_step(method), pilot.START_VALUES[method]['local.lr_shared']
  if knob == 'client_lr':
    lr = value
  else:
    step = value
  set_client_lr(c, lr)
  clip = clip_norm(method)
  c.server_lr = step / clip if private else step
  if private:  # the block's noise per round: sigma for eps over 200 rounds, stopped at T_EDGE
    c.dp.clip_norm = clip
    c.dp.target_epsilon, c.dp.noise_multiplier = None, regime.FIXED_CLIP_SIGMA[EPS]
  c.num_rounds, c.eval_every = rules.T_EDGE, rules.T_EDGE // 2
  return c


def sweep_grid() -> list[dict]:
  """Each family's two ladders (one program each family), the personal-head family first."""
  return [dict(method=m, knob=k, value=v, seed=0)
          for m in rules.FAMILIES for k in rules.KNOBS for v in rules.ladder(m, k)]
