"""One-run privacy audit of the default experiment (experiments/configs/default.py), as it trains.

`python -m experiments.audit --config=experiments/configs/audit_default.py` adds 1,000 canary
clients to the default Fashion-MNIST federation (N = 1000 + 1000, Poisson q = 0.02, 40 rounds, sigma
calibrated for eps = 2 at delta = 1e-3 over the 1,000 real clients) and runs the real round step
once: one trial, each canary in with probability 1/2, estimates after every 10 rounds
(docs/privacy.md, section 5). The canary directions take 2.3 GB (1,000 x 577k shared parameters).
Arguments: `:method=centaur,eps=1,canaries=500,every=5`.
"""

from experiments.configs import _common
from experiments.configs import default

DEFAULTS = dict(default.DEFAULTS, canaries=1000, every=10)


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  c = default.default_config(args)
  c.audit = dict(num_trials=1, num_canaries=args['canaries'], canary_norm=10.0, alpha=0.05,
                 select_fraction=0.2, batch_trials=1, seed=c.seed, estimate_every=args['every'])
  return c
