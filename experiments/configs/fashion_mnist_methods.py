"""Every method on one Fashion-MNIST split: same (N, S), same epsilon, same rounds, same seed.

A short, CPU-sized comparison (about 1-2 minutes a method on 2 cores), not a paper table: the default
experiment's (1000, 2) pathological split and hyperparameters, q = 0.01 (~10 clients a round),
30 rounds, sigma calibrated for eps, local lr 0.05 with momentum 0.5. Fine-tuning evaluations
(-ft, -fb, pmtl_ft) train every client, so they are evaluated only at the last round.

Grid (sweep_grid): every registered method at seed 0 (22 runs), plus DP-FedAvg, DP-FedSAM, CENTAUR
and DP²-FedSAM at seeds 1 and 2 (8 runs): 30 runs.

  python -m launch.sweep --config=experiments/configs/fashion_mnist_methods.py --root=runs/methods
  or one method:
  python -m experiments.train --config=experiments/configs/fashion_mnist_methods.py:method=dp_fedsam \
      --workdir=runs/methods/dp_fedsam
"""

from dp2fedsam_jax.algorithms import METHODS
from experiments.configs import _common, default

# The issue-5 comparison, repeated over seeds; every other method once.
SEEDED = ('dp_fedavg', 'dp_fedsam', 'centaur', 'dp2fedsam')

DEFAULTS = {**default.DEFAULTS, 'q': 0.01, 'rounds': 30}


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  c = default.default_config(args)
  c.sampling_rate = args['q']
  c.num_rounds = args['rounds']
  c.eval_every = 5
  c.dp.noise_placement = _common.noise_placement_for(c.method)
  if c.method.endswith(('_ft', '_fb')):
    c.eval_every = c.num_rounds
  return c


def sweep_grid() -> list[dict]:
  """Every registered federated method at seed 0, and DP-FedAvg, DP-FedSAM, CENTAUR, DP²-FedSAM
  at seeds 1, 2. Not local_only: its num_rounds visits of every client cost N/(qN) = 100x a run here."""
  others = [m for m in sorted(METHODS) if m not in SEEDED and METHODS[m].federated]
  return ([dict(method=m, seed=0) for m in SEEDED + tuple(others)]
          + [dict(method=m, seed=s) for m in SEEDED for s in (1, 2)])
