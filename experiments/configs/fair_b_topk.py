"""Benchmark block (b): DP-FedSAM-topk's Table 1 methods, each tuned under one law (docs/benchmark.md).

Rows (dp-fedsam-topk.txt Table 1, Dirichlet 0.3 column): DP-FedSAM-topk in the paper's form (each
client top-k's its own noised upload: eps does not cover the sum, marked) and in the covered
`_server` form (top-k of the noised sum, marked), DP-FedSAM, DP-FedAvg, Fed-SMP-topk as written (the
mask leaks, marked) and `_safe` (noise on every coordinate), Fed-SMP-randk, DP-FedAvg-blur,
DP-FedAvg-blurs. Global-model accuracy (each client tests the global model: every row's own
evaluation).

Regime: Fashion-MNIST on a Dirichlet(0.3) split over M = 500 clients as the paper (108 train /
12 test rows a client), emnist_cnn, T = 200 rounds, Poisson q = 0.1 (~50 a round, as the paper's
ratio), 1 local epoch (the paper's 30 do not fit the budget: 108 rows x 1 epoch is (a)'s 54 x 2
work a client), batch 10, momentum 0.5, no lr decay, delta = 1/M, PLD, eps = 1 per trial and per
final run (the paper fixes sigma = 0.95 and reports no eps). Noise placement: distributed for the
paper's DP-FedSAM-topk (its Option II needs it), central for every other row.

Trial law: block (a)'s, K geometric (eta = 1) with E[K] = 3; score noise 5 on the sum over the
500 clients (std 1 point on the mean). Ceiling: non-private FedAvg, searched with K ~ Poisson(8)
(the law of the Shakespeare study's non-private FedAvg search), 1 seed.

The ceiling's law re-declared on 2026-11-30, before any run of this block (first declared: the
rows' law). A non-private search releases unprotected models, so its K costs no eps, and the rule
reads the ceiling as the regime's room: an under-tuned ceiling withholds the verdict (or, under the
best private row, ends the block with no further step). Under the rows' law P[K = 1] = 1/3, and
block (a5)'s ceiling search under it selected a trial whose validation score was 6.3 %: every
trial it ran scored under chance (10 %). If half of the space trains, every draw misses it with
probability 0.25 under the rows' law and 0.018 under Poisson(8) (`fair.every_draw_misses`); ~5
more FedAvg trials, ~0.8 CPU hours.

Regime rule (declared before any run): the block tests the paper's order only if the ceiling's
accuracy is at least 2 points above the best private row's 3-seed mean. If not: "at the ceiling: no
verdict on the paper's order", and the block is rerun at eps = 0.25 with new tuner seeds and C's
range times sigma(eps 1) / sigma(eps 0.25) = 0.333 (declared 2026-11-30 with the ranges below: the
same noise on each weight a round as here; with these C's, 33 % of its draws would be at most at
0.0060).

Ranges re-declared on 2026-11-30, before any run of this block (first declared: client lr 0.01-0.3,
C 0.05-1.0), for two facts the first ranges ignored (docs/benchmark.md section 2):
- The server's noise. At sigma = 3.49 (eps 1, q 0.1, T 200, delta 1/500) a round puts noise of std
  server lr x C x sigma / (qN) = 0.070 x server lr x C on each weight of the global model. Block (a)'s
  global-model rows trained at 0.0031 and 0.0060, block (a5)'s failed at 0.0242 and 0.0309. The
  first ranges put 22 % of the draws at most at 0.0060, so a row's search would miss them all
  with probability 0.54 under this law; these put 65 % there (0.15).
- Local divergence. Non-private FedAvg on this split diverges in round 1 at client lr 0.15 and 0.3
  (train loss 3.7e28, 4.0e29) and trains at 0.1 (10.89, then 2.14): three rounds each, on the
  clients' rows, covered by no eps (experiments/results/fair_b_topk/diagnostics). The paper's 0.1
  is now the top.

  python3 -m launch.fair_benchmark --blocks=b --root=$HOME/fair --plan

Arguments: `:method=dp_fedsam,eps=1,seed=0,alpha=0.3`.
"""

from __future__ import annotations

import math

from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.config import base_config
from experiments.configs import _common
from experiments.studies import fair

DEFAULTS = dict(method='dp_fedsam', eps=1.0, seed=0, alpha=0.3)
EPS = 1.0
NUM_CLIENTS = 500
TRIALS = {'name': 'truncated_negative_binomial', 'eta': 1.0, 'mean': 3.0}
CEILING_TRIALS = {'name': 'poisson', 'mu': 8.0}  # non-private: K costs no eps (docstring)
# The paper's values (section 6.1: lr 0.1, C 0.2, rho 0.5, p 0.4; BLUR's lambda the method's
# default 1) are candidates inside these ranges (lr and C re-declared: the docstring says why).
FIRST_DECLARED = {'local.lr_shared': ('log_uniform', 0.01, 0.3),
                  'dp.clip_norm': ('log_uniform', 0.05, 1.0)}
RANGES = {
    'local.lr_shared': ('log_uniform', 0.005, 0.1),
    'server_lr': ('log_uniform', 0.3, 3.0),
    'dp.clip_norm': ('log_uniform', 0.01, 0.3),
    'local.sam_rho': ('log_uniform', 0.02, 1.0),
    'keep_fraction': ('uniform', 0.1, 0.8),
    'blur_lambda': ('log_uniform', 0.1, 10.0),
}
LEAKS = 'paper form: eps does not cover the release (docs/privacy.md section 4)'
ROWS = (
    fair.Row('dp_fedsam_topk', 'dp_fedsam_topk', seed=201, mark=LEAKS, paper_row='DP-FedSAM-topk'),
    fair.Row('dp_fedsam_topk_server', 'dp_fedsam_topk_server', seed=202,
              mark='covered form: top-k of the noised sum', paper_row='DP-FedSAM-topk'),
    fair.Row('dp_fedsam', 'dp_fedsam', seed=203, paper_row='DP-FedSAM'),
    fair.Row('dp_fedavg', 'dp_fedavg', seed=204, paper_row='DP-FedAvg'),
    fair.Row('fed_smp_topk', 'fed_smp_topk', seed=205, mark=LEAKS, paper_row='Fed-SMP-topk'),
    fair.Row('fed_smp_topk_safe', 'fed_smp_topk_safe', seed=206,
              mark='covered form: noise on every coordinate', paper_row='Fed-SMP-topk'),
    fair.Row('fed_smp_randk', 'fed_smp_randk', seed=207, paper_row='Fed-SMP-randk'),
    fair.Row('dp_fedavg_blur', 'dp_fedavg_blur', seed=208, paper_row='DP-FedAvg-blur'),
    fair.Row('dp_fedavg_blurs', 'dp_fedavg_blurs', seed=209, paper_row='DP-FedAvg-blurs'),
)
# The orders dp-fedsam-topk.txt claims (section 6.2: "our proposed algorithms consistently outperform
# other baselines"; Table 1's Dirichlet 0.3 columns, EMNIST and CIFAR-10, for the baselines' order).
BASELINES = ('DP-FedAvg-blurs', 'Fed-SMP-topk', 'Fed-SMP-randk', 'DP-FedAvg-blur', 'DP-FedAvg')
PROPOSED = '6.2: "our proposed algorithms consistently outperform other baselines"'
TABLE_ORDER = 'Table 1, Dirichlet 0.3, both datasets'
CLAIMS = (
    (fair.Claim('DP-FedSAM-topk', 'DP-FedSAM', f'{TABLE_ORDER} (77.27 > 76.81, 54.85 > 53.92)'),)
    + fair.claims('DP-FedSAM-topk', BASELINES, PROPOSED)
    + fair.claims('DP-FedSAM', BASELINES, PROPOSED)
    + fair.claims('Fed-SMP-topk', BASELINES[2:], TABLE_ORDER)
    + fair.claims('DP-FedAvg-blurs', BASELINES[2:], TABLE_ORDER)
)
BLOCK = fair.Block(
    name='b', paper='dp-fedsam-topk.txt Table 1', rows=ROWS, trials=TRIALS, eps=EPS, score_noise=5.0,
    ranges=RANGES, ceiling=fair.Row('ceiling_fedavg', 'fedavg', seed=200),
    ceiling_reference='non-private FedAvg, searched with K ~ Poisson(8), 1 seed',
    ceiling_trials=CEILING_TRIALS,
    if_rule_fails="the block again at eps = 0.25 with new tuner seeds and C's range x 0.333",
    trial_fixed=(('eval_every', 200),), final_fixed=(('eval_every', 50),), claims=CLAIMS)


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  c = base_config()
  c.method, c.seed = args['method'], args['seed']
  c.dataset, c.model, c.partition = 'fashion_mnist', 'emnist_cnn', 'dirichlet'
  c.num_clients, c.dirichlet_alpha = NUM_CLIENTS, args['alpha']
  c.num_rounds, c.eval_every, c.sampling_rate, c.server_lr = 200, 50, 0.1, 1.0
  c.executor = 'auto'
  _common.set_fields(c, {
      'local.personal_epochs': 0, 'local.shared_epochs': 1, 'local.batch_size': 10,
      'local.lr_shared': 0.1, 'local.lr_personal': 0.1, 'local.lr_decay': 1.0, 'local.momentum': 0.5,
      'local.sam_rho': 0.5, 'keep_fraction': 0.4, 'dp.clip_norm': 0.2, 'dp.sampling': 'poisson',
      'dp.accountant': 'pld',
  })
  c.dp.delta = None  # 1 / M
  if math.isinf(args['eps']):
    c.dp.target_epsilon = None
    if METHODS[c.method].private:
      c.dp.noise_multiplier = 0.0
  else:
    c.dp.target_epsilon = args['eps']
  c.dp.noise_placement = _common.noise_placement_for(c.method)
  return c


def tuning_space() -> dict:
  return BLOCK.tuning_space()
