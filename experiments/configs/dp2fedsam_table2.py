"""dp2-fedsam.txt Table 2 (and Fig. 4): accuracy under different data distributions at eps = 1.

Grid (`sweep_grid()`): methods DP-FedAvg, DP-FedAvg-FT, DP-FedSAM, DP-FedSAM-FT, CENTAUR,
DP²-FedSAM x settings FEMNIST (500 writers, natural split) and CIFAR-10 (N, S) in {(500, 5),
(1000, 2), (1000, 5)} x seeds {0, 1, 2}, eps = 1, delta = 1/N. 6 x 4 x 3 = 72 runs of 200 rounds.
Fig. 4 is the accuracy-vs-round curve of the same runs (`experiments/report/` draws it).
Setup: see `_dp2fedsam.py`.

Arguments: `:method=dp2fedsam,dataset=cifar10,N=1000,S=2,eps=1,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _dp2fedsam


def get_config(arg: str | None = None):
  return _dp2fedsam.paper_config(_common.parse_args(arg, **_dp2fedsam.DEFAULTS))


def sweep_grid() -> list[dict]:
  femnist = _common.grid(dataset=['femnist'], method=_dp2fedsam.TABLE_METHODS, eps=[1.0],
                         seed=_common.SEEDS)
  cifar = [dict(dataset='cifar10', N=n, S=s, method=m, eps=1.0, seed=seed)
           for n, s in _dp2fedsam.CIFAR10_SETTINGS for m in _dp2fedsam.TABLE_METHODS
           for seed in _common.SEEDS]
  return femnist + cifar
