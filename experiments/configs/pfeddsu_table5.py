"""dp-pfeddsu.txt Table V: DP-pFedDSU under sparsity rates S in {0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9}.

CIFAR-10 with s = 10 (the tables' accuracies match Table II's s = 10 column), eps = 1. Our reading
of the tuning order in §VI-B4: Table V runs before the layer count and lambda were tuned — its
S = 0.05 value (42.23) equals Table VI's 1-layer value, and Table VI's 4-layer value (43.4) equals
Table IV's RT-only row — so this runs 1 reparameterised layer and no DAN (lam = 0).
Grid (`sweep_grid()`): S x seeds {0, 1, 2}: 21 runs. Setup: see `_pfeddsu.py`.

Arguments: `:sparsity=0.3,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _pfeddsu


def get_config(arg: str | None = None):
  defaults = {**_pfeddsu.DEFAULTS, 's': 10, 'layers': 1, 'lam': 0.0}
  return _pfeddsu.paper_config(_common.parse_args(arg, **defaults))


def sweep_grid() -> list[dict]:
  return _common.grid(method=['dp_pfeddsu'], sparsity=[0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9],
                      seed=_common.SEEDS)
