"""dp2-fedsam.txt Fig. 6: DP²-FedSAM's accuracy vs round for SAM radii rho in {0.05, 0.1, 0.5, 1.0}.

CIFAR-10 (N, S) = (1000, 2), eps = 1 (the paper's default budget). Grid (`sweep_grid()`): rho x
seeds {0, 1, 2}: 12 runs. Setup: see `_dp2fedsam.py`.

Arguments: `:rho=0.5,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _dp2fedsam


def get_config(arg: str | None = None):
  return _dp2fedsam.paper_config(_common.parse_args(arg, **{**_dp2fedsam.DEFAULTS, 'rho': 0.1}))


def sweep_grid() -> list[dict]:
  return _common.grid(method=['dp2fedsam'], rho=[0.05, 0.1, 0.5, 1.0], eps=[1.0],
                      seed=_common.SEEDS)
