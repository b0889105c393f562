"""Benchmark block (d): the Shakespeare privacy block, each row tuned under one law (docs/benchmark.md).

Rows: DP2-FedSAM, CENTAUR, DP-FedAvg, and DP2-FedSAM with the whole-model fine-tune pinned (so that
the adaptation is symmetric with DP-FedAvg's whole-model fine-tune whatever the search picks; marked
as a variant). Every row searches the law DP-FedAvg's committed search used (K ~ Poisson(6),
shakespeare_field's study dp_fedavg_eps2), over client lr, server lr, C, and its own knobs (head lr
and head epochs for the personal heads, SAM rho for DP2-FedSAM) and the test-time adaptation's part
(the head re-fit or the whole model) and lr, 10 epochs of it for every row (shakespeare_field's ADAPT).
The committed runs searched only DP-FedAvg's two lrs, at C = 0.5, and gave them to every row.
The variant is searched only where DP2-FedSAM's own search picks the head re-fit: where it picks the
whole model its row already is the symmetric one, and the variant runs nothing (experiments/studies/fair.py's
Block.is_subsumed; declared on 2026-11-30 after DP2-FedSAM's search had selected 'full', before any
variant trial: the only thing read was that value).

Regime: shakespeare_field's privacy block (1,063 roles, char_lstm_small, T = 1,000, Poisson cohort of
20, delta = 1/N, PLD), eps = 2 per trial and per final run (eps = 8 if the budget allows), evaluated
once at T with the adaptation (a full fine-tune of every role costs ~6 min on the CPU); every number
compared is `test_accuracy_pooled`. Score noise 10 on the sum over the 1,063 roles.

Ceiling: the committed non-private FedAvg at the operating point (its own search, study fedavg, 9
trials) with the head fine-tune, 51.99 +- 0.03 % pooled over 3 seeds (experiments/results/
shakespeare_field): no new run.

Regime rule (declared before any run): the block tests the papers' order only if that ceiling is at
least 2 points above the best private row's 3-seed mean (the committed private rows sat at 38-41 %).
If not: "at the ceiling: no verdict on the papers' order". The Shakespeare verdicts of the README
are rewritten from this block when it is complete.

  python3 -m launch.fair_benchmark --blocks=d --root=$HOME/fair --plan

Arguments: `:method=dp2fedsam,eps=2,seed=0`.
"""

from __future__ import annotations

from experiments.configs import _common
from experiments.configs import shakespeare_field as field
from experiments.studies import fair

DEFAULTS = dict(method='dp2fedsam', eps=2.0, seed=0)
EPS = 2.0
TRIALS = {'name': 'poisson', 'mu': field.PRIVATE_TRIALS_MEAN}
# The committed values (client lr 2.327, server lr 0.2654, C 0.5, head lr 0.5, 10 head epochs,
# rho 0.05, adapt lr 0.5) are candidates inside these ranges.
RANGES = {
    'local.lr_shared': field.PRIVATE_TUNING_SPACE['local.lr_shared'],
    'server_lr': field.PRIVATE_TUNING_SPACE['server_lr'],
    'dp.clip_norm': ('log_uniform', 0.1, 2.0),
    'local.sam_rho': ('log_uniform', 0.01, 0.3),
    'local.lr_personal': ('log_uniform', 0.05, 2.0),
    'local.personal_epochs': ('choice', [1, 5, 10]),
    'eval.adapt_part': ('choice', ['head', 'full']),
    'eval.adapt_lr': ('log_uniform', 0.05, 2.0),
}
ROWS = (
    fair.Row('dp2fedsam', 'dp2fedsam', seed=401, paper_row='DP2-FedSAM'),
    fair.Row('centaur', 'centaur', seed=402, paper_row='CENTAUR'),
    fair.Row('dp_fedavg', 'dp_fedavg', seed=403, paper_row='DP-FedAvg'),
    fair.Row('dp2fedsam_full_ft', 'dp2fedsam', seed=404, paper_row='DP2-FedSAM',
              mark='variant: the whole-model fine-tune pinned', pinned=(('eval.adapt_part', 'full'),),
              why_pinned='the adaptation made symmetric with DP-FedAvg-FT, whatever the search picks'),
)
# dp2-fedsam.txt's orders among these rows (Table 2 and section 5.2.1), the ones the README's
# Shakespeare verdicts judged; the variant row meets both baselines too.
CLAIMS = (
    fair.claims('DP2-FedSAM', ('CENTAUR', 'DP-FedAvg'), 'Table 2: "DP2-FedSAM outperforms other baselines"')
    + (fair.Claim('CENTAUR', 'DP-FedAvg', '5.2.1: "personalized methods outperform traditional FL '
                   'methods"'),)
)
BLOCK = fair.Block(
    name='d', paper='dp2-fedsam.txt Table 2 methods on Shakespeare', rows=ROWS, trials=TRIALS,
    eps=EPS, score_noise=field.PRIVATE_SCORE_NOISE, ranges=RANGES, ceiling=None,
    ceiling_reference='committed FedAvg + head fine-tune at the operating point (study fedavg), '
                      '51.99 +- 0.03 % pooled, experiments/results/shakespeare_field',
    if_rule_fails="the README's Shakespeare verdicts withdrawn, not rewritten from this block",
    metric='test_accuracy_pooled', ceiling_accuracy=51.99,
    block_fixed=(('eval.adapt_epochs', field.ADAPT['eval.adapt_epochs']),
                 ('eval_every', field.OPERATING_POINT['num_rounds'])), claims=CLAIMS)


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  return field.get_config(f"method={args['method']},eps={args['eps']},seed={args['seed']},tuning=true")


def tuning_space() -> dict:
  return BLOCK.tuning_space()
