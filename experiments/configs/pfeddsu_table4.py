"""dp-pfeddsu.txt Table IV: ablation of reparameterised training (RT) and the dynamic adaptive
norm (DAN) on CIFAR-10 (s = 10), CIFAR-10 (s = 5) and EMNIST (s = 10), eps = 1.

Rows: neither (its numbers equal CENTAUR's in Table II, so it is `centaur`), RT only
(`dp_pfeddsu` with lam = 0: ASSUMES lam = 0 switches DAN off — check against the method), RT + DAN
(`dp_pfeddsu`, lam = 0.2). Grid (`sweep_grid()`): 3 rows x 3 settings x seeds {0, 1, 2}: 27 runs.
Setup: see `_pfeddsu.py`.

Arguments: `:method=dp_pfeddsu,lam=0,dataset=emnist,s=10,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common, _pfeddsu


def get_config(arg: str | None = None):
  return _pfeddsu.paper_config(_common.parse_args(arg, **_pfeddsu.DEFAULTS))


def sweep_grid() -> list[dict]:
  rows = [dict(method='centaur'), dict(method='dp_pfeddsu', lam=0.0),
          dict(method='dp_pfeddsu', lam=0.2)]
  settings = [dict(dataset='cifar10', s=10), dict(dataset='cifar10', s=5),
              dict(dataset='emnist', s=10)]
  return [{**setting, **row, 'eps': 1.0, 'seed': seed}
          for setting in settings for row in rows for seed in _common.SEEDS]
