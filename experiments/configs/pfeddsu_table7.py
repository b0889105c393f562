"""dp-pfeddsu.txt Table VII: DP-pFedDSU under the DAN weight lambda in {0.1, ..., 0.7}.

CIFAR-10 with s = 10, sparsity S = 0.05 on 4 layers, eps = 1. Grid (`sweep_grid()`): lambda x seeds
{0, 1, 2}: 21 runs. Setup: see `_pfeddsu.py`.

Arguments: `:lam=0.4,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _pfeddsu


def get_config(arg: str | None = None):
  return _pfeddsu.paper_config(_common.parse_args(arg, **{**_pfeddsu.DEFAULTS, 's': 10}))


def sweep_grid() -> list[dict]:
  return _common.grid(method=['dp_pfeddsu'], lam=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],
                      seed=_common.SEEDS)
