"""dp-pfeddsu.txt Table VI: DP-pFedDSU under the number of reparameterised layers, 1 to 8.

CIFAR-10 with s = 10, sparsity S = 0.05, eps = 1, no DAN (lam = 0; see pfeddsu_table5.py for
why). Grid (`sweep_grid()`): layers x seeds {0, 1, 2}: 24 runs. Setup: see `_pfeddsu.py`.

Arguments: `:layers=4,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _pfeddsu


def get_config(arg: str | None = None):
  defaults = {**_pfeddsu.DEFAULTS, 's': 10, 'lam': 0.0}
  return _pfeddsu.paper_config(_common.parse_args(arg, **defaults))


def sweep_grid() -> list[dict]:
  return _common.grid(method=['dp_pfeddsu'], layers=list(range(1, 9)), seed=_common.SEEDS)
