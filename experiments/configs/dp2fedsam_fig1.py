"""dp2-fedsam.txt Fig. 1: private vs non-private, CIFAR-10 with (N, S) = (1000, 2).

Grid (`sweep_grid()`): DP-FedAvg and DP²-FedSAM at eps = 1 beside their non-private versions
FedAvg and P-FedSAM (eps = inf: no clipping or noise) x seeds {0, 1, 2}: 12 runs.
Setup: see `_dp2fedsam.py`.

Arguments: `:method=p_fedsam,eps=inf,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _dp2fedsam


def get_config(arg: str | None = None):
  return _dp2fedsam.paper_config(_common.parse_args(arg, **_dp2fedsam.DEFAULTS))


def sweep_grid() -> list[dict]:
  private = _common.grid(method=['dp_fedavg', 'dp2fedsam'], eps=[1.0], seed=_common.SEEDS)
  public = _common.grid(method=['fedavg', 'p_fedsam'], eps=[float('inf')], seed=_common.SEEDS)
  return private + public
