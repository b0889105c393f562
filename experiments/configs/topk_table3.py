"""dp-fedsam-topk.txt Table 3: DP-FedSAM-topk under sparsity ratios p in {0.1, 0.2, 0.4, 0.6, 0.8}.

p = 1.0 is DP-FedSAM (no sparsification). CIFAR-10 and CIFAR-100, Dirichlet 0.6, sigma = 0.95.
Grid (`sweep_grid()`): (dp_fedsam, p = 1) and dp_fedsam_topk x p, x {cifar10, cifar100} x seeds
{0, 1, 2}: 36 runs. Setup: see `_topk.py`.

Arguments: `:method=dp_fedsam_topk,dataset=cifar10,p=0.2,seed=0`.

Privacy: the paper's client top-k of the noised share releases exact zeros whose frequency depends
on who took part, so the reported epsilon of these dp_fedsam_topk runs covers neither the uploads
nor the sum (docs/privacy.md section 4); they reproduce the paper's accuracy, not a DP guarantee.
"""

from __future__ import annotations

from experiments.configs import _common, _topk


def get_config(arg: str | None = None):
  return _topk.paper_config(_common.parse_args(arg, **{**_topk.DEFAULTS, 'method': 'dp_fedsam_topk'}))


def sweep_grid() -> list[dict]:
  dense = _common.grid(dataset=['cifar10', 'cifar100'], alpha=[0.6], method=['dp_fedsam'], p=[1.0],
                       seed=_common.SEEDS)
  sparse = _common.grid(dataset=['cifar10', 'cifar100'], alpha=[0.6], method=['dp_fedsam_topk'],
                        p=[0.1, 0.2, 0.4, 0.6, 0.8], seed=_common.SEEDS)
  return dense + sparse
