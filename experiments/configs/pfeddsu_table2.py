"""dp-pfeddsu.txt Table II: accuracy of the personalized DP methods across datasets and class splits.

Grid (`sweep_grid()`): DP-FedAvg-fb, PPSGD, PMTL-FT, CENTAUR, DP-pFedDSU x (dataset, s) in
{EMNIST s = 5, 10; CIFAR-10 s = 2, 5, 10; CIFAR-100 s = 3, 5, 10} x seeds {0, 1, 2}, eps = 1:
120 runs. Setup and the values the paper does not state: see `_pfeddsu.py`.

Arguments: `:method=dp_pfeddsu,dataset=cifar100,s=3,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _pfeddsu


def get_config(arg: str | None = None):
  return _pfeddsu.paper_config(_common.parse_args(arg, **_pfeddsu.DEFAULTS))


def sweep_grid() -> list[dict]:
  return [dict(dataset=d, s=s, method=m, eps=1.0, seed=seed)
          for d, s in _pfeddsu.TABLE2_SETTINGS for m in _pfeddsu.TABLE_METHODS
          for seed in _common.SEEDS]
