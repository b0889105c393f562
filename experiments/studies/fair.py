"""The fair-comparison protocol of the benchmark blocks (docs/benchmark.md): the types the block configs
(experiments/configs/fair_*.py) declare their rows, claims and blocks in, and its rules.

Within a block every row is searched by launch.tune under one trial law (the same K distribution and
mean, each row its own tuner seed), at one eps per trial, selected by the noised validation score,
over a space that holds

  the knobs every method has     client lr, server lr, C (COMMON_KNOBS)
  the knobs that are its own     read off the method's pieces in the registry (own_knobs): SAM rho
                                 for a SAM optimizer, head lr and head epochs for a head phase, the
                                 fraction kept for a top-k / rand-k mask or post-processing, lambda
                                 for BLUR / PMTL / DSU's adaptive norm, DSU's mask (fraction, layers),
                                 fine-tune epochs (and the head lr of a head fine-tune) for -FT / -fb

each range declared in the block's config before any trial runs; a paper's value may be one
candidate inside a range, never the whole range. Then the selected values train at 3 seeds on the
full training split (validation_fraction 0), and the non-private ceiling at 1 seed (searched under
the block's law, or under its own where the block declares one: its K costs no eps). A knob no piece
maps to fails here (KNOBS_OF_PIECE must name every piece class of algorithms/pieces.py), so a new
piece cannot silently go untuned.

This module holds the rules; the blocks hold the values (ranges, law, eps, regime rule). It imports
no config but _common (FINAL_SEEDS), so the block configs can import it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dp2fedsam_jax import local
from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.privacy import selection
from experiments.configs import _common

COMMON_KNOBS = ('local.lr_shared', 'server_lr', 'dp.clip_norm')
FINAL_SEEDS = _common.SEEDS
CEILING_SEEDS = (0,)
# The config field a final run's seed goes in (Block.final_seed_field).
FINAL_SEED_FIELDS = ('seed', 'training_seed')
VALIDATION_FRACTION = 0.1  # the trials' validation split; the final runs train on every row
# The regime rule of every block: the non-private ceiling at least this many points above the best
# private row, else the block is no test of the paper's order (its rows still shown).
REGIME_MARGIN = 2.0
AT_CEILING = "at the ceiling: no verdict on the paper's order"
# A ceiling under the best private row did not measure the regime's room (its search found nothing
# that trains): the rule's outcome is still no verdict, and the block's next step (meant for a
# saturated regime) does not follow.
CEILING_FAILED = ("the ceiling's search failed (under the best private row): no verdict on the "
                  "paper's order, no further step")

# The config fields each piece of a MethodSpec adds to the search (by the piece's class name, so that
# this module needs no engine import). Every class of algorithms/pieces.py is listed: a new piece
# must say here what it adds (tests/test_benchmark_blocks.py checks the list is complete).
KNOBS_OF_PIECE = {
    'NoRegularizer': (), 'BLUR': ('blur_lambda',), 'Proximal': ('pmtl_lambda',),
    'AdaptiveNorm': ('dsu.lam',),
    'NoWeightMask': (), 'DSUWeightMask': ('dsu.keep_fraction', 'dsu.masked_layers'),
    'NoPersonal': (), 'OwnHead': (), 'HeadOffset': (),  # the head phase's knobs come with it
    'NoUploadMask': (), 'RandKMask': ('keep_fraction',), 'TopKMask': ('keep_fraction',),
    'DSUUploadMask': (),  # the mask of the DSU forward pass: DSUWeightMask's knobs
    'NoPostprocess': (), 'TopKOfClientUpload': ('keep_fraction',),
    'TopKOfNoisedSum': ('keep_fraction',),
    'TestGlobal': (), 'TestPersonal': (), 'FineTune': ('local.finetune_epochs',),
    'FineTuneHead': ('local.finetune_epochs', 'local.lr_personal'),
}
PIECE_FIELDS = ('personal', 'regularizer', 'weight_mask', 'upload_mask', 'postprocess', 'evaluation')
HEAD_PHASE_KNOBS = ('local.lr_personal', 'local.personal_epochs')
SAM_KNOBS = ('local.sam_rho',)


def own_knobs(method: str) -> tuple[str, ...]:
  """The config fields only `method` has, from its row of pieces in the registry (sorted)."""
  spec = METHODS[method]
  knobs = set(SAM_KNOBS if isinstance(spec.shared_optimizer, local.SAM) else ())
  if spec.personal_phase:
    knobs.update(HEAD_PHASE_KNOBS)
  for field in PIECE_FIELDS:
    piece = type(getattr(spec, field)).__name__
    if piece not in KNOBS_OF_PIECE:
      raise ValueError(f'method {method!r}: piece {piece} ({field}) is not in KNOBS_OF_PIECE of '
                       'experiments/studies/fair.py; say there which config fields it adds to a '
                       'search.')
    knobs.update(KNOBS_OF_PIECE[piece])
  return tuple(sorted(knobs))


def knobs(method: str) -> tuple[str, ...]:
  """Every field a search of `method` must hold: the common ones (C only for a private method)."""
  common = COMMON_KNOBS if METHODS[method].private else tuple(
      k for k in COMMON_KNOBS if k != 'dp.clip_norm')
  return tuple(common) + tuple(k for k in own_knobs(method) if k not in common)


def is_single_value(law) -> bool:
  """A law that can draw only one value (a paper value alone is no search)."""
  if law[0] == 'choice':
    return len(set(map(repr, law[1]))) < 2
  return float(law[1]) == float(law[2])


def contains(law, value) -> bool:
  """Whether `value` is one candidate of `law`."""
  if law[0] == 'choice':
    return value in law[1]
  return float(law[1]) <= float(value) <= float(law[2])


def product_at_most(law_a, law_b, bound: float, points: int = 200_001) -> float:
  """P[a × b <= bound] for a, b drawn from two log-uniform laws: e.g. server lr × C, which sets the
  noise a round puts on each weight of a plain-SGD server (server lr × σC / (qN)). The sum of two
  uniform logs, integrated on a grid."""
  if law_a[0] != 'log_uniform' or law_b[0] != 'log_uniform':
    raise ValueError(f'product_at_most takes two log_uniform laws, not {law_a[0]}, {law_b[0]}.')
  (lo_a, hi_a), (lo_b, hi_b) = ((math.log(law[1]), math.log(law[2])) for law in (law_a, law_b))
  log_a = np.linspace(lo_a, hi_a, points)
  return float(np.mean(np.clip(math.log(bound) - log_a - lo_b, 0.0, hi_b - lo_b)) / (hi_b - lo_b))


def every_draw_misses(trials: dict, fraction: float, max_trials: int = 1_000) -> float:
  """P[none of a search's K draws lands in a part of its space that holds `fraction` of the draws]:
  E[(1 - fraction)^K] under the block's law of K (launch.tune's `trials`)."""
  law = selection.TrialDistribution.from_dict(trials)
  pmf = [law.pmf(k) for k in range(max_trials + 1)]
  if not math.isclose(sum(pmf), 1.0, abs_tol=1e-9):
    raise ValueError(f'the law {trials} holds mass beyond K = {max_trials}; raise max_trials.')
  return sum(p * (1.0 - fraction) ** k for k, p in enumerate(pmf))


@dataclasses.dataclass(frozen=True)
class Row:
  """One row of a block's table: a method searched under the block's law.

  name          the row (the study's name); the method's own unless a variant of it
  method        the registry's method
  seed          the tuner's seed, recorded in tuning.json; different for every row of every block
  mark          what a reader must know (e.g. 'paper form: the mask leaks; eps does not cover it')
  pinned        ((field, value), ...) a variant fixes instead of searching, with why_pinned (e.g. the
                whole-model fine-tune of a symmetric-adaptation row); not searched at all when its
                base row's search already selected every pin (Block.is_subsumed)
  paper_row     the paper's table row this row reproduces ('' for a variant the paper lacks)
  ranges        ((field, law), ...) that replace the block's range of a field for this row (e.g. a
                family's steps, from its own pilot)
  """
  name: str
  method: str
  seed: int
  mark: str = ''
  pinned: tuple = ()
  why_pinned: str = ''
  paper_row: str = ''
  ranges: tuple = ()


@dataclasses.dataclass(frozen=True)
class Claim:
  """The paper claims `better` > `worse` (two of its table rows, Row.paper_row), where it says so.

  Every row reproducing a paper row takes part (a paper form and its covered form both), so a claim
  is judged once for each pair of rows: holds / level / contradicted by the seed rule
  (experiments/report/rules.py), declared with the block before any run."""
  better: str
  worse: str
  source: str


def claims(better: str, worse: tuple, source: str) -> tuple:
  """One Claim per row of `worse` (the paper says `better` beats each)."""
  return tuple(Claim(better, w, source) for w in worse)


@dataclasses.dataclass(frozen=True)
class Block:
  """A block: rows, one trial law and eps per trial, the ranges, the regime rule and its ceiling."""
  name: str
  paper: str
  rows: tuple
  trials: dict              # launch.tune's law of K, the same for every row
  eps: float                # per trial and per final run, every private row
  score_noise: float        # on the sum of the clients' validation accuracies
  ranges: dict              # {field: law} every knob of every row draws from
  ceiling: Row | None       # the non-private ceiling's search (None: a committed reference)
  ceiling_reference: str    # what the ceiling is when it is not searched here
  if_rule_fails: str        # declared before any run: the block's next step when the rule fails
  metric: str = 'test_accuracy'
  block_fixed: tuple = ()   # ((field, value), ...) every trial and final run of the block sets
  trial_fixed: tuple = ()   # ((field, value), ...) the trials set besides the validation split
  final_fixed: tuple = ()   # ((field, value), ...) the final runs set
  regime_margin: float = REGIME_MARGIN
  claims: tuple = ()        # Claim, ...: the ordered pairs of the paper's table this block judges
  ceiling_of_block: str = ''  # no ceiling row: another block's (same split and settings) serves
  ceiling_accuracy: float | None = None  # no ceiling row: a committed reference's accuracy (points)
  # The ceiling row's own law of K (None: the block's). Only for a non-private ceiling: its trials
  # release unprotected models, so K costs no eps, and more trials measure the room better.
  ceiling_trials: dict | None = None
  # Where a final run's seed goes. 'seed': config.seed, so each final seed is its own data split,
  # validation rows and evaluated clients (one process per seed). 'training_seed': every final run
  # at the block's split (config.seed as the block sets it) and the seed as config.training_seed,
  # which keys only cohorts, noise, init and local shuffles, so a row's final seeds run as one
  # program. Paired seeds then share cohorts across the block's rows (one sampling key, N and q).
  # The final seeds are public and below 2**32: never the key of a tuner's trial (>= 2**32).
  final_seed_field: str = 'seed'
  final_seed_values: tuple = FINAL_SEEDS      # every private row's final seeds
  ceiling_seed_values: tuple = CEILING_SEEDS  # the ceiling row's
  # ((follower, leader), ...): the follower field is not searched but takes the leader's drawn value
  # (launch.tune's spec['tied']), e.g. one client lr for the head and the extractor.
  tied: tuple = ()
  # What the block waits for before any trial may run (a pilot's rule not yet decided), each a
  # sentence; launch.fair_benchmark plans such a block but refuses to run it.
  pending: tuple = ()
  # 1: the first design (a small search each row); 2: the second (docs/benchmark.md section 5: C and
  # the other knobs pinned by a pilot's rule, not by a variant, so a pin needs no mark).
  design: int = 1
  # P: a row searched under the block's random law runs max(K, P) trials, its selection over the
  # first K alone; the pool (every trial) then measures the search even where K is small (the
  # logarithmic law draws K <= 4 about half the time, and a pool of one trial has no spread).
  pool_floor: int = 0

  def __post_init__(self):
    if self.final_seed_field not in FINAL_SEED_FIELDS:
      raise ValueError(f'block {self.name}: final_seed_field={self.final_seed_field!r}; choose one '
                       f'of {FINAL_SEED_FIELDS} (the config field a final run\'s seed sets).')
    if self.ceiling_trials is not None and (
        self.ceiling is None or METHODS[self.ceiling.method].private):
      raise ValueError(f'block {self.name}: ceiling_trials is for a non-private ceiling row; a '
                       "private row's K is part of its eps and must follow the block's law.")

  @property
  def regime_rule(self) -> str:
    return (f'the ceiling >= the best private row ({len(self.final_seed_values)}-seed mean) + '
            f'{self.regime_margin:g} points; '
            f'else "{AT_CEILING}", then {self.if_rule_fails}')

  def regime(self, ceiling: float, private_means: dict) -> str:
    """'test' when the ceiling's accuracy (points) clears the best private row's mean by the
    margin, else AT_CEILING, or CEILING_FAILED where it is under that row: the rule applied, once
    every row has its final seeds."""
    best = max(private_means.values())
    if ceiling < best:
      return CEILING_FAILED
    return 'test' if ceiling >= best + self.regime_margin else AT_CEILING

  def trials_of(self, row: Row) -> dict:
    """The law of K `row` is searched under: the block's, or the ceiling's own."""
    if self.ceiling_trials is not None and row == self.ceiling:
      return dict(self.ceiling_trials)
    return dict(self.trials)

  def claim_pairs(self) -> list:
    """[(claim, better row, worse row)]: each claim once for every pair of rows reproducing its two
    paper rows (a paper form and its covered form each meet the other side)."""
    rows = lambda paper_row: [r for r in self.rows if r.paper_row == paper_row]
    return [(c, a, b) for c in self.claims for a in rows(c.better) for b in rows(c.worse)]

  def row(self, name: str) -> Row:
    for r in self.all_rows():
      if r.name == name:
        return r
    raise ValueError(f'block {self.name}: no row {name!r}; rows: {[r.name for r in self.all_rows()]}')

  def base_of(self, row: Row) -> Row | None:
    """The row a variant pins knobs of: the block's unpinned row of the same method (None for an
    unpinned row)."""
    if not row.pinned:
      return None
    return next((r for r in self.rows if r.method == row.method and not r.pinned), None)

  def is_subsumed(self, row: Row, base_selected: dict | None) -> bool:
    """Whether a variant is its base row: the base's finished search (`base_selected`, its
    selected values) chose every value the variant pins. The variant is then not searched: its
    purpose is met, and a second search would give the method a second draw under the law (a
    best-of-two no other row gets). Its claims are the base row's."""
    return (self.base_of(row) is not None and base_selected is not None
            and all(k in base_selected and base_selected[k] == v for k, v in row.pinned))

  def all_rows(self) -> tuple:
    return self.rows + ((self.ceiling,) if self.ceiling else ())

  def space(self, row: Row) -> dict:
    """The row's search space: the block's range of each of its knobs, less what it pins."""
    pinned = {**dict(row.pinned), **dict(self.tied)}  # a tied field follows its leader
    ranges = {**self.ranges, **dict(row.ranges)}
    missing = [k for k in knobs(row.method) if k not in ranges and k not in pinned]
    if missing:
      raise ValueError(f'block {self.name}, row {row.name}: no range for {missing}; declare one in '
                       'the block before any trial runs.')
    extra = tuple(k for k in ranges if k.startswith('eval.'))  # a block-wide test-time knob
    return {k: ranges[k] for k in knobs(row.method) + extra if k not in pinned}

  def study(self, row: Row) -> dict:
    """launch.tune's spec of the row (tuning_space()'s value)."""
    private = METHODS[row.method].private
    args = {'method': row.method, 'eps': self.eps if private else math.inf}
    fixed = {**dict(self.block_fixed), **dict(self.trial_fixed), **dict(row.pinned),
             'validation_fraction': VALIDATION_FRACTION}
    tied = self.ties(row)
    floor = self.pool_floor if self.trials_of(row) == dict(self.trials) else 0  # (not a fixed K)
    return dict(args=args, fixed=fixed, space=self.space(row), trials=self.trials_of(row),
                seed=row.seed, selected_by='validation_accuracy',
                score_noise=self.score_noise if private else 0.0, **({'tied': tied} if tied else {}),
                **({'pool_floor': floor} if floor else {}))

  def expected_trials(self, row: Row) -> float:
    """E[max(K, P)]: the trials a row's search runs on average (its law's mean without a floor)."""
    law = selection.TrialDistribution.from_dict(self.trials_of(row))
    floor = self.study(row).get('pool_floor', 0)
    return law.mean + sum((floor - k) * law.pmf(k) for k in range(floor))

  def tuning_space(self) -> dict:
    return {r.name: self.study(r) for r in self.all_rows()}

  def ties(self, row: Row) -> dict:
    """{follower: leader} of the row: each tie whose follower is a knob of its method and whose
    leader it searches."""
    space = self.space(row)
    return {f: leader for f, leader in self.tied if leader in space and f in knobs(row.method)}

  def tied_values(self, row: Row, values: dict) -> dict:
    """`values` (a candidate or a selection) with each tied field of the row set to its leader's."""
    return {**values, **{f: values[leader] for f, leader in self.ties(row).items() if leader in values}}

  def final_fixed_for(self, row: Row) -> dict:
    """What a final run sets besides the selected values: the block's settings, the row's pins."""
    return {**dict(self.block_fixed), **dict(self.final_fixed), **dict(row.pinned),
            'validation_fraction': 0.0}

  def final_seeds(self, row: Row) -> tuple:
    is_ceiling = self.ceiling is not None and row.name == self.ceiling.name
    return self.ceiling_seed_values if is_ceiling else self.final_seed_values
