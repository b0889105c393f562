"""Benchmark block (c): DP-pFedDSU's Table II methods, each tuned under one law (docs/benchmark.md).

Rows (dp-pfeddsu.txt Table II): DP-pFedDSU as written (noise only on its private mask: eps does not
cover the mask, marked) and `_safe` (noise on every coordinate), CENTAUR, PPSGD, PMTL-FT,
DP-FedAvg-fb. DSU's schedule is searched: the fraction of weights kept (S), the masked layers (of
emnist_cnn's three kernel layers) and the adaptive norm's lambda (the paper's 0.05, 4 and 0.2 are
candidates, its Tables V-VII tuned them).

Regime: the shard split s = 5 of block (a5) (FedRep's shards, (N, S) = (1000, 5), fmnist_paper_regime's
settings: the paper's 20 clients leave client-level DP no room), eps = 0.25 per trial and per final
run, for the reason block (a) gives. Trial law: block (a)'s (K geometric with E[K] = 3); score
noise 10 on the sum over the 1,000 clients. Ceiling: non-private P-FedSAM at block (a)'s ceiling's
selected values on (1000, 5), seed 0, 87.25 % at T = 200 (committed: CEILING_RUN; still rising, so
a lower bound of the room, which makes the rule harder to pass, not easier).

Why s = 5 and not s = 2 (re-declared on 2026-11-30, before any run of this block): s = 2 was first
declared, with (a)'s ceiling. (a) then measured that very regime (same split, eps, law, ranges and
settings) at its ceiling, with CENTAUR, a row of this block, 1.98 points under it (94.32 against
96.30 %): this block at s = 2 could pass its rule only if a second CENTAUR search landed lower than
(a)'s and no DSU row came within 2 points, and its verdicts would then sit on ~2 points of room.
At s = 5 block (a5)'s personal-head and fine-tuned rows ended at 68.57-81.84 % (CENTAUR highest),
5.41 points under the ceiling above; (a5)'s own ceiling search diverged, so that committed run is
the ceiling here.

Regime rule (declared before any run): the block tests the paper's order only if the ceiling is at
least 2 points above the best private row's 3-seed mean here. If not: "at the ceiling: no verdict on
the paper's order", and no further step (s = 2, the paper's other split, is the regime (a) measured
at its ceiling).

  python3 -m launch.fair_benchmark --blocks=c --root=$HOME/fair --plan

Arguments: `:method=dp_pfeddsu,eps=0.25,seed=0,S=5`.
"""

from __future__ import annotations

from experiments.configs import _common
from experiments.configs import fair_a_dp2fedsam as block_a
from experiments.studies import fair

DEFAULTS = dict(method='dp_pfeddsu', eps=0.25, seed=0, S=5)
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
    fair.Row('dp_pfeddsu', 'dp_pfeddsu', seed=301, mark=MASK_LEAKS, paper_row='DP-pFedDSU'),
    fair.Row('dp_pfeddsu_safe', 'dp_pfeddsu_safe', seed=302,
              mark='covered form: noise on every coordinate', paper_row='DP-pFedDSU'),
    fair.Row('centaur', 'centaur', seed=303, paper_row='CENTAUR'),
    fair.Row('ppsgd', 'ppsgd', seed=304, paper_row='PPSGD'),
    fair.Row('pmtl_ft', 'pmtl_ft', seed=305, paper_row='PMTL-FT'),
    fair.Row('dp_fedavg_fb', 'dp_fedavg_fb', seed=306, paper_row='DP-FedAvg-fb'),
)
# The orders dp-pfeddsu.txt claims (Table II, CIFAR-10 s = 2: 86.29 > 85.11 > 84.35 > 83.70 > 83.34;
# CENTAUR and PPSGD swap between columns, as DP-FedAvg-fb and PMTL-FT do: no claim between them).
CLAIMS = (
    fair.claims('DP-pFedDSU', ('CENTAUR', 'PPSGD', 'DP-FedAvg-fb', 'PMTL-FT'),
                 'Table II: DP-pFedDSU above every baseline')
    + fair.claims('CENTAUR', ('DP-FedAvg-fb', 'PMTL-FT'), 'Table II, every column')
    + fair.claims('PPSGD', ('DP-FedAvg-fb', 'PMTL-FT'), 'Table II, every column but EMNIST')
)
CEILING_RUN = 'experiments/results/fair_a5_dp2fedsam/diagnostics/ceiling_p_fedsam_at_block_a_values_seed0'
BLOCK = fair.Block(
    name='c', paper='dp-pfeddsu.txt Table II', rows=ROWS, trials=TRIALS, eps=EPS, score_noise=10.0,
    ranges=RANGES, ceiling=None,
    ceiling_reference=("non-private P-FedSAM at block (a)'s ceiling's selected values on (1000, 5), "
                       f'seed 0, 87.25 % at T = 200 ({CEILING_RUN})'),
    ceiling_accuracy=87.25,
    if_rule_fails="no further step (s = 2 is the regime block (a) measured at its ceiling)",
    trial_fixed=block_a.BLOCK.trial_fixed, final_fixed=block_a.BLOCK.final_fixed, claims=CLAIMS)


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  return block_a.get_config(f"method={args['method']},eps={args['eps']},seed={args['seed']},"
                            f"S={args['S']}")


def tuning_space() -> dict:
  return BLOCK.tuning_space()
