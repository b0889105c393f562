"""dp2-fedsam.txt Table 3: accuracy under privacy budgets eps in {1, 2}.

Grid (`sweep_grid()`): the six Table 2 methods x {FEMNIST (natural, 500 writers), CIFAR-10
(N, S) = (1000, 2)} x eps in {1, 2} x seeds {0, 1, 2}: 72 runs (the eps = 1 half repeats Table 2's
runs under another config name, so a sweep runs them again). Setup: see `_dp2fedsam.py`.

Arguments: `:method=centaur,dataset=femnist,eps=2,seed=1`.
"""

from __future__ import annotations

from experiments.configs import _common, _dp2fedsam


def get_config(arg: str | None = None):
  return _dp2fedsam.paper_config(_common.parse_args(arg, **_dp2fedsam.DEFAULTS))


def sweep_grid() -> list[dict]:
  femnist = _common.grid(dataset=['femnist'], method=_dp2fedsam.TABLE_METHODS, eps=[1.0, 2.0],
                         seed=_common.SEEDS)
  cifar = _common.grid(dataset=['cifar10'], N=[1000], S=[2], method=_dp2fedsam.TABLE_METHODS,
                       eps=[1.0, 2.0], seed=_common.SEEDS)
  return femnist + cifar
