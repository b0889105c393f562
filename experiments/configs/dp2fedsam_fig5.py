"""dp2-fedsam.txt Fig. 5: mean norm of the local updates vs round, CIFAR-10 (N, S) = (1000, 2).

Grid (`sweep_grid()`): FedAvg and P-FedSAM (non-private, eps = inf) x seeds {0, 1, 2}: 6 runs.
`experiments/report/` plots `mean_update_norm` (pre-clip, averaged over the cohort) per round.
The paper's band is the std over clients within a round; ours is the std over seeds of the cohort
mean (metrics.jsonl records the cohort mean only). Setup: see `_dp2fedsam.py`.

Arguments: `:method=fedavg,eps=inf,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _dp2fedsam


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **{**_dp2fedsam.DEFAULTS, 'method': 'p_fedsam', 'eps': float('inf')})
  return _dp2fedsam.paper_config(args)


def sweep_grid() -> list[dict]:
  return _common.grid(method=['fedavg', 'p_fedsam'], eps=[float('inf')], seed=_common.SEEDS)
