"""dp-pfeddsu.txt Table III: accuracy under privacy budgets eps in {0.5, 1, 2}.

The text says EMNIST and CIFAR-10 but the table has one column per eps; its eps = 1 column equals
Table II's CIFAR-10 s = 5 column, so this config runs CIFAR-10 with s = 5. Grid (`sweep_grid()`):
the five Table II methods x eps x seeds {0, 1, 2}: 45 runs. Setup: see `_pfeddsu.py`.

Arguments: `:method=ppsgd,eps=0.5,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _pfeddsu


def get_config(arg: str | None = None):
  return _pfeddsu.paper_config(_common.parse_args(arg, **_pfeddsu.DEFAULTS))


def sweep_grid() -> list[dict]:
  return _common.grid(dataset=['cifar10'], s=[5], method=_pfeddsu.TABLE_METHODS,
                      eps=[0.5, 1.0, 2.0], seed=_common.SEEDS)
