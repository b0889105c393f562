"""dp-fedsam-topk.txt Table 2: accuracy under privacy budgets eps in {4, 6, 8, 10}.

CIFAR-10 and CIFAR-100, Dirichlet 0.6, ResNet-18; sigma calibrated to each eps (RDP, delta = 1/M).
Grid (`sweep_grid()`): the seven Table 1 methods x {cifar10, cifar100} x eps x seeds {0, 1, 2}:
168 runs. Setup: see `_topk.py`.

Arguments: `:method=fed_smp_topk,dataset=cifar100,eps=8,seed=2`.
"""

from __future__ import annotations

from experiments.configs import _common, _topk


def get_config(arg: str | None = None):
  return _topk.paper_config(_common.parse_args(arg, **{**_topk.DEFAULTS, 'eps': 4.0}))


def sweep_grid() -> list[dict]:
  return _common.grid(dataset=['cifar10', 'cifar100'], alpha=[0.6], method=_topk.TABLE_METHODS,
                      eps=[4.0, 6.0, 8.0, 10.0], seed=_common.SEEDS)
