"""The fair benchmark's second design: its pilot (docs/benchmark.md, "Second design").

A pilot, declared as such: its runs choose the regime and the clip-norm rule of the one block that
follows; they release nothing that a verdict uses, and no epsilon covers their numbers.

Question 1, the regime with room: at which Fashion-MNIST split does a non-private ceiling stand at
least 2 points above a private run? Block (a) of the first design, at the pathological (1000, 2)
split and eps 0.25, missed its 2 points by 0.02: with two classes a client, the personal head
alone nearly solves each client's task. The pilot tries more classes a client, S = 5 and S = 10
(DP-pFedDSU's Table II columns), at eps 0.25 and 1.

Question 2, the clip norm by rule: the clip bound 99-100 % of the first design's updates, so C and
the server lr acted as one knob. The pilot records each family's pre-clip update norms
(train_metrics.jsonl: mean_update_norm, every round); the block fixes C at the median over rounds
of that family's pilot, and searches the step eta_eff = server lr x C with the client lr.

Every run starts from block (a)'s selected values of its method (experiments/results/
fair_a_dp2fedsam: DP2-FedSAM for the SAM family, DP-FedAvg for the global-model family, P-FedSAM
for the ceiling), seed 0 (the data split and keys; the block's final seeds are 0-4, its trials'
seeds are secret), T = 200 as the block.

Grid: 7 runs at seed 0 (sweep_grid, in priority order).

  python3 -m launch.sweep --config=experiments/configs/fair2_pilot.py --root=$HOME/fair2 --plan

Arguments: `:method=dp2fedsam,eps=0.25,S=5,seed=0`.
"""

from __future__ import annotations

import math

from experiments.configs import _common
from experiments.configs import fmnist_paper_regime as regime

DEFAULTS = dict(method='dp2fedsam', eps=0.25, S=5, seed=0)
# Block (a)'s selections (its runs/<row>/tuning.json), rounded as the tuner wrote them.
START_VALUES = {
    'dp2fedsam': {'dp.clip_norm': 0.0244, 'local.lr_personal': 0.02221, 'local.lr_shared': 0.005766,
                  'local.personal_epochs': 1, 'local.sam_rho': 0.01001, 'server_lr': 1.141},
    'dp_fedavg': {'dp.clip_norm': 0.09585, 'local.lr_shared': 0.02917, 'server_lr': 0.532},
    'p_fedsam': {'local.lr_personal': 0.001132, 'local.lr_shared': 0.02184,
                 'local.personal_epochs': 2, 'local.sam_rho': 0.2244, 'server_lr': 0.6583},
}


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  if args['method'] not in START_VALUES:
    raise ValueError(f"method={args['method']!r}: the pilot runs {sorted(START_VALUES)}")
  c = regime.get_config(f"method={args['method']},eps={args['eps']},seed={args['seed']},"
                        f"S={args['S']}")
  values = dict(START_VALUES[args['method']])
  c.server_lr = values.pop('server_lr')
  _common.set_fields(c, values)
  c.eval_every = 20
  return c


def sweep_grid() -> list[dict]:
  """Priority order: the two questions at S = 5, then at S = 10, then eps 1."""
  grid = []
  for s in (5, 10):
    grid += [dict(method='p_fedsam', eps=math.inf, S=s), dict(method='dp2fedsam', eps=0.25, S=s)]
  grid += [dict(method='dp_fedavg', eps=0.25, S=5)]
  grid += [dict(method='dp2fedsam', eps=1.0, S=s) for s in (5, 10)]
  return [dict(g, seed=0) for g in grid]
