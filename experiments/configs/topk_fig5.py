"""dp-fedsam-topk.txt Fig. 5: DP-FedSAM's hyperparameters on EMNIST, Dirichlet 0.6.

Three one-at-a-time sweeps around the defaults (rho = 0.5, 30 local epochs, M = 500):
(a) SAM radius rho in {0.01, 0.1, 0.3, 0.5, 0.7, 1.0}; (b) local epochs in {10, 20, 30, 40} (the
text names 30 and 40; 10 and 20 are our choice); (c) number of clients M in {100, 200, 300, 500, 700}.
Grid (`sweep_grid()`): 6 + 4 + 5 settings x seeds {0, 1, 2}: 45 runs (the default setting once per
sweep, so it runs three times under different names). Setup: see `_topk.py`.

Arguments: `:rho=0.1,seed=0`, `:epochs=40`, `:M=100`.
"""

from __future__ import annotations

from experiments.configs import _common, _topk


def get_config(arg: str | None = None):
  return _topk.paper_config(_common.parse_args(arg, **{**_topk.DEFAULTS, 'dataset': 'emnist'}))


def sweep_grid() -> list[dict]:
  base = dict(method='dp_fedsam', dataset='emnist', alpha=0.6)
  out = []
  for axis, values in (('rho', [0.01, 0.1, 0.3, 0.5, 0.7, 1.0]), ('epochs', [10, 20, 30, 40]),
                       ('M', [100, 200, 300, 500, 700])):
    out += [{**base, axis: v, 'seed': s} for v in values for s in _common.SEEDS]
  return out
