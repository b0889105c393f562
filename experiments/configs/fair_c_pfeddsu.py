"""Benchmark block (c): DP-pFedDSU's Table II methods, each tuned under one law (docs/benchmark.md).

Rows (dp-pfeddsu.txt Table II): DP-pFedDSU as written (noise only on its private mask: eps does not
cover the mask, marked) and `_safe` (noise on every coordinate), CENTAUR, PPSGD, PMTL-FT,
DP-FedAvg-fb. DSU's schedule is searched: the fraction of weights kept (S), the masked layers (of
emnist_cnn's three kernel layers) and the adaptive norm's lambda (the paper's 0.05, 4 and 0.2 are
candidates, its Tables V-VII tuned them).

Regime: the shard split s = 2 of block (a) (FedRep's shards, (N, S) = (1000, 2), fmnist_paper_regime's
settings: the paper's 20 clients leave client-level DP no room), eps = 0.25 per trial and per final
run, for the reason block (a) gives. Trial law: block (a)'s (K geometric with E[K] = 3); score
noise 10 on the sum over the 1,000 clients. Ceiling: block (a)'s (non-private P-FedSAM on the same
split, same law): the regime is (a)'s, so it is searched once, in (a).

Regime rule (declared before any run): the block tests the paper's order only if (a)'s ceiling is at
least 2 points above the best private row's 3-seed mean here. If not: "at the ceiling: no verdict on
the paper's order", and s = 5 at the same eps and law is the next block to run.

  python3 -m launch.fair_benchmark --blocks=c --root=$HOME/fair --plan

Arguments: `:method=dp_pfeddsu,eps=0.25,seed=0,S=2`.
"""

from __future__ import annotations

from experiments.configs import _common, _fair
from experiments.configs import fair_a_dp2fedsam as block_a

DEFAULTS = dict(method='dp_pfeddsu', eps=0.25, seed=0, S=2)
EPS = block_a.EPS
TRIALS = block_a.TRIALS
RANGES = {
    **{k: v for k, v in block_a.RANGES.items() if k != 'local.sam_rho'},
    'pmtl_lambda': ('log_uniform', 0.01, 1.0),
    'dsu.keep_fraction': ('log_uniform', 0.02, 0.5),
    'dsu.masked_layers': ('choice', [1, 2, 3]),
    'dsu.lam': ('uniform', 0.05, 0.7),
}
MASK_LEAKS = 'paper form: noise only on the private mask; eps does not cover the mask'
ROWS = (
    _fair.Row('dp_pfeddsu', 'dp_pfeddsu', seed=301, mark=MASK_LEAKS, paper_row='DP-pFedDSU'),
    _fair.Row('dp_pfeddsu_safe', 'dp_pfeddsu_safe', seed=302,
              mark='covered form: noise on every coordinate', paper_row='DP-pFedDSU'),
    _fair.Row('centaur', 'centaur', seed=303, paper_row='CENTAUR'),
    _fair.Row('ppsgd', 'ppsgd', seed=304, paper_row='PPSGD'),
    _fair.Row('pmtl_ft', 'pmtl_ft', seed=305, paper_row='PMTL-FT'),
    _fair.Row('dp_fedavg_fb', 'dp_fedavg_fb', seed=306, paper_row='DP-FedAvg-fb'),
)
# The orders dp-pfeddsu.txt claims (Table II, CIFAR-10 s = 2: 86.29 > 85.11 > 84.35 > 83.70 > 83.34;
# CENTAUR and PPSGD swap between columns, as DP-FedAvg-fb and PMTL-FT do: no claim between them).
CLAIMS = (
    _fair.claims('DP-pFedDSU', ('CENTAUR', 'PPSGD', 'DP-FedAvg-fb', 'PMTL-FT'),
                 'Table II: DP-pFedDSU above every baseline')
    + _fair.claims('CENTAUR', ('DP-FedAvg-fb', 'PMTL-FT'), 'Table II, every column')
    + _fair.claims('PPSGD', ('DP-FedAvg-fb', 'PMTL-FT'), 'Table II, every column but EMNIST')
)
BLOCK = _fair.Block(
    name='c', paper='dp-pfeddsu.txt Table II', rows=ROWS, trials=TRIALS, eps=EPS, score_noise=10.0,
    ranges=RANGES, ceiling=None,
    ceiling_reference="block (a)'s ceiling_p_fedsam (the same split, law and settings)",
    ceiling_of_block='a',
    if_rule_fails='s = 5 at the same eps and law',
    trial_fixed=block_a.BLOCK.trial_fixed, final_fixed=block_a.BLOCK.final_fixed, claims=CLAIMS)


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  return block_a.get_config(f"method={args['method']},eps={args['eps']},seed={args['seed']},"
                            f"S={args['S']}")


def tuning_space() -> dict:
  return BLOCK.tuning_space()
