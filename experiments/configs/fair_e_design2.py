"""Benchmark block (e): the second design's one block (docs/benchmark.md section 5), declared on
2026-12-07 before any of its trials.

Regime (the pilot's rule, experiments/studies/fair2_pilot.py): Fashion-MNIST, pathological
(1000, 5), emnist_cnn, Poisson q = 0.05, delta = 1/N, PLD, eps 0.25. Every run of the block adds the
noise of T = 200 rounds at eps 0.25 (sigma 5.924): a final run spends eps 0.25, a trial of T_trial
rounds is the first T_trial rounds of such a run (its eps is smaller).

Rows: dp2-fedsam.txt Table 2 (DP2-FedSAM, CENTAUR, DP-FedSAM-FT, DP-FedAvg-FT, DP-FedSAM, DP-FedAvg)
and dp-pfeddsu.txt Table II (DP-pFedDSU as written and covered, PPSGD, DP-FedAvg-fb, PMTL-FT),
CENTAUR shared; the claims are blocks (a) and (c)'s. The ceiling: non-private P-FedSAM.

What a row searches (every range from the pilot, each family its own):
  the client lr            log-uniform, 1.5 decades under its family's edge; every client lr a
                           method has (a head's, a fine-tune's: tied to local.lr_shared)
  the step eta_eff         server lr x C, log-uniform, 1.5 decades under the family's edge: the
                           server lr is searched over eta_eff / C, C fixed by the pilot's rule
  at most one own knob     on a grid with its null value: SAM's rho in RHO_GRID, DSU's and PMTL's
                           lambda in LAMBDA_GRID
Pinned: C by rule (personal-head rows: the DP2-FedSAM pilot's median pre-clip norm; global-model
rows: DP-FedAvg's); head epochs 1, fine-tune epochs 2, DSU's mask at the paper's S = 0.05 and layers
(dsu.masked_layers 4: every kernel layer of emnist_cnn).

Law: K truncated negative binomial, eta = 0 (the logarithmic law), E[K] = 16; score noise 10 on the
sum over the 1,000 clients; each trial its own secret training seed. Pool floor 8: a row runs
max(K, 8) trials and selects over the first K alone (the further trials measure the search: the law
draws K <= 4 about half the time, and a pool of so few trials shows no spread). The ceiling: K = 16 trials
every time (non-private: K costs no eps, and a fixed K searches it at least as strongly as a row's
E[K] = 16). Final runs: seeds 0-4 as training seeds at split seed 0 (the ceiling
0-2), the metric the mean of the last 3 evaluations (every 20 rounds from round 160: the rounds
before train untested, which spares the -FT rows' fine-tuning passes).

While the pilot's edge or trial length is undecided the block is pending (Block.pending):
launch.fair_benchmark plans it and runs nothing.

  python3 -m launch.fair_benchmark --blocks=e --root=$HOME/fair2 --plan

Arguments: `:method=dp2fedsam,eps=0.25,seed=0,S=5`.
"""

from __future__ import annotations

import math

from dp2fedsam_jax.algorithms import METHODS
from experiments.configs import _common
from experiments.configs import fair2_edge as edge_config
from experiments.configs import fair_a_dp2fedsam as block_a
from experiments.configs import fair_c_pfeddsu as block_c
from experiments.configs import fmnist_paper_regime as regime
from experiments.studies import fair
from experiments.studies import fair2_pilot as rules

EPS, CLASSES, T = edge_config.EPS, edge_config.CLASSES, 200
SIGMA = regime.FIXED_CLIP_SIGMA[EPS]  # eps 0.25 over T = 200 rounds
DEFAULTS = dict(method='dp2fedsam', eps=EPS, seed=0, S=CLASSES)
TRIALS = {'name': 'truncated_negative_binomial', 'eta': 0.0, 'mean': 16.0}
CEILING_TRIALS = {'name': 'fixed', 'k': 16}
POOL_FLOOR = 8
FINAL_SEEDS, CEILING_SEEDS = (0, 1, 2, 3, 4), (0, 1, 2)
RHO_GRID = ('choice', [0.0, 0.02, 0.1, 0.5])
LAMBDA_GRID = ('choice', [0.0, 0.1, 1.0])
FIXED_KNOBS = {'local.personal_epochs': 1, 'local.finetune_epochs': 2,
               'dsu.keep_fraction': 0.05, 'dsu.masked_layers': 4}
EVAL_EVERY = 20
EVAL_FROM = T - 2 * EVAL_EVERY  # a final run evaluates at 160, 180, 200: the 3 its metric reads
ROWS_OF = (  # (row, method, tuner seed, paper row, mark)
    ('dp2fedsam', 'dp2fedsam', 601, 'DP2-FedSAM', ''),
    ('centaur', 'centaur', 602, 'CENTAUR', ''),
    ('dp_fedsam_ft', 'dp_fedsam_ft', 603, 'DP-FedSAM-FT', ''),
    ('dp_fedavg_ft', 'dp_fedavg_ft', 604, 'DP-FedAvg-FT', ''),
    ('dp_fedsam', 'dp_fedsam', 605, 'DP-FedSAM', ''),
    ('dp_fedavg', 'dp_fedavg', 606, 'DP-FedAvg', ''),
    ('dp_pfeddsu', 'dp_pfeddsu', 607, 'DP-pFedDSU', block_c.MASK_LEAKS),
    ('dp_pfeddsu_safe', 'dp_pfeddsu_safe', 608, 'DP-pFedDSU', 'covered form: noise on every coordinate'),
    ('ppsgd', 'ppsgd', 609, 'PPSGD', ''),
    ('dp_fedavg_fb', 'dp_fedavg_fb', 610, 'DP-FedAvg-fb', ''),
    ('pmtl_ft', 'pmtl_ft', 611, 'PMTL-FT', ''),
)
CEILING = ('ceiling_p_fedsam', 'p_fedsam', 600)
WHY_PINNED = ("C by the pilot's rule for the row's family; head and fine-tune epochs and DSU's mask "
              'fixed, so that a row searches at most one own knob')


def family(method: str) -> str:
  """'personal_head' (a private head trained first, only the rest clipped and noised),
  'global_model', or 'ceiling' (non-private)."""
  spec = METHODS[method]
  if not spec.private:
    return 'ceiling'
  return 'personal_head' if spec.personal_phase else 'global_model'


def _edge_method(fam: str) -> str:
  return next(m for m, f in rules.FAMILIES.items() if f == fam)


def step_ranges(method: str) -> tuple[tuple, tuple]:
  """((field, law), ...) of the row's client lr and server lr from its family's edges, and what is
  still pending ('' each when decided)."""
  fam = family(method)
  of_family = _edge_method(fam)
  edges = rules.edges(edge_config.REPO)
  found = [edges[(of_family, knob)] for knob in rules.KNOBS]
  pending = tuple(f'the {fam.replace("_", "-")} family\'s {e.knob} edge ({e.open_because})'
                  for e in found if e.range is None)
  # While a ladder is open its span stands in (and the block does not run).
  client_range, step_range = (e.range or (rules.ladder(of_family, e.knob)[0],
                                          rules.ladder(of_family, e.knob)[-1]) for e in found)
  clip = 1.0 if fam == 'ceiling' else edge_config.clip_norm(of_family)
  server = tuple(float(f'{x / clip:.4g}') for x in step_range)  # eta_eff / C
  return ((('local.lr_shared', ('log_uniform', *client_range)),
           ('server_lr', ('log_uniform', *server))), pending)


def pins(method: str) -> tuple:
  """((field, value), ...) a row fixes: C by rule (a private row) and FIXED_KNOBS it has."""
  knobs = fair.knobs(method)
  fixed = [(k, v) for k, v in FIXED_KNOBS.items() if k in knobs]
  if family(method) != 'ceiling':
    fixed.insert(0, ('dp.clip_norm', edge_config.clip_norm(_edge_method(family(method)))))
  return tuple(fixed)


def _row(name: str, method: str, seed: int, paper_row: str = '', mark: str = '') -> fair.Row:
  ranges, _ = step_ranges(method)
  return fair.Row(name, method, seed, mark=mark, pinned=pins(method), why_pinned=WHY_PINNED,
                  paper_row=paper_row, ranges=ranges)


def _pending() -> tuple:
  reasons = []
  for method in sorted({m for _, m, *_ in ROWS_OF} | {CEILING[1]}):
    reasons += [r for r in step_ranges(method)[1] if r not in reasons]
  length = rules.trial_length(edge_config.REPO)
  if length.rounds is None:
    reasons.append(f'T_trial ({length.open_because})')
  return tuple(reasons)


def trial_rounds() -> int:
  """T_trial by the pilot's rule (T while it is open: the block is then pending)."""
  return rules.trial_length(edge_config.REPO).rounds or T


ROWS = tuple(_row(name, method, seed, paper_row, mark)
             for name, method, seed, paper_row, mark in ROWS_OF)
BLOCK = fair.Block(
    name='e', paper='dp2-fedsam.txt Table 2 and dp-pfeddsu.txt Table II', rows=ROWS, trials=TRIALS,
    eps=EPS, score_noise=10.0,
    ranges={'local.sam_rho': RHO_GRID, 'dsu.lam': LAMBDA_GRID, 'pmtl_lambda': LAMBDA_GRID},
    ceiling=_row(*CEILING), ceiling_trials=CEILING_TRIALS,
    ceiling_reference='non-private P-FedSAM, K = 16 from its own pool, 3 seeds',
    if_rule_fails='no further step: the pilot chose this regime for its room',
    # A trial evaluates once, at T_trial; its program checkpoints every EVAL_EVERY rounds before.
    trial_fixed=(('num_rounds', trial_rounds()), ('eval_every', EVAL_EVERY),
                 ('eval_from', trial_rounds())),
    final_fixed=(('eval_every', EVAL_EVERY), ('eval_from', EVAL_FROM)),
    claims=block_a.CLAIMS + tuple(c for c in block_c.CLAIMS if c not in block_a.CLAIMS),
    final_seed_field='training_seed', final_seed_values=FINAL_SEEDS,
    ceiling_seed_values=CEILING_SEEDS, tied=(('local.lr_personal', 'local.lr_shared'),),
    pending=_pending(), design=2, pool_floor=POOL_FLOOR)


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  c = regime.get_config(f"method={args['method']},eps={args['eps']},seed={args['seed']},"
                        f"S={args['S']}")
  if METHODS[c.method].private and math.isfinite(args['eps']):
    if args['eps'] != EPS:
      raise ValueError(f"eps={args['eps']}: block (e) runs at eps {EPS} (sigma {SIGMA} over T = {T})")
    c.dp.target_epsilon, c.dp.noise_multiplier = None, SIGMA  # T_trial rounds: a prefix of T
  return c


def tuning_space() -> dict:
  return BLOCK.tuning_space()
