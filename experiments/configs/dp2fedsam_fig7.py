"""dp2-fedsam.txt Fig. 7: DP²-FedSAM's accuracy vs round for local extractor epochs tau_phi.

CIFAR-10 (N, S) = (1000, 2), tau_h = 2, eps = 1. The text does not list the tau_phi values of the
figure; we sweep tau_phi in {1, 2, 3, 4, 5} (2 is the paper's default). Grid (`sweep_grid()`):
tau x seeds {0, 1, 2}: 15 runs. Setup: see `_dp2fedsam.py`.

Arguments: `:tau=4,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _dp2fedsam


def get_config(arg: str | None = None):
  return _dp2fedsam.paper_config(_common.parse_args(arg, **_dp2fedsam.DEFAULTS))


def sweep_grid() -> list[dict]:
  return _common.grid(method=['dp2fedsam'], tau=[1, 2, 3, 4, 5], eps=[1.0], seed=_common.SEEDS)
