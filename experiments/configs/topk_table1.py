"""dp-fedsam-topk.txt Table 1 (and Figs. 2 and 4): accuracy on EMNIST, CIFAR-10 and CIFAR-100
under Dirichlet 0.3, Dirichlet 0.6 and IID splits, sigma = 0.95.

Grid (`sweep_grid()`): DP-FedAvg, Fed-SMP-randk, Fed-SMP-topk, DP-FedAvg-blur, DP-FedAvg-blurs,
DP-FedSAM, DP-FedSAM-topk x datasets {emnist, cifar10, cifar100} x alpha in {0.3, 0.6, inf (IID)}
x seeds {0, 1, 2}: 189 runs. Fig. 2 is these runs' accuracy per round; Fig. 4 (update norms of
DP-FedAvg vs DP-FedSAM, CIFAR-10 Dirichlet 0.6) is their `mean_update_norm` per round.
Setup: see `_topk.py`.

Arguments: `:method=dp_fedsam_topk,dataset=emnist,alpha=0.3,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _topk


def get_config(arg: str | None = None):
  return _topk.paper_config(_common.parse_args(arg, **_topk.DEFAULTS))


def sweep_grid() -> list[dict]:
  return _common.grid(dataset=['emnist', 'cifar10', 'cifar100'], alpha=_topk.ALPHAS,
                      method=_topk.TABLE_METHODS, seed=_common.SEEDS)
