"""The fair benchmark's second design, its pilot's trial-length stage (docs/benchmark.md, "Second
design"; the rule that reads these runs: experiments/studies/fair2_pilot.trial_length).

Do short trials rank configurations as full runs do? Ten configurations drawn from DP2-FedSAM's
space in block (e) (experiments/configs/fair_e_design2.py: the client lr and eta_eff from the
personal-head family's edges, rho on its grid), from the public seed DRAW_SEED (a pilot: nothing is
selected from these runs), each at its own public training seed, T = 200 rounds at block (e)'s noise
(sigma of eps 0.25 over 200 rounds), validated every 20 rounds on the block's 10 % validation split.
T_trial is the smallest of 40, 60, 100 rounds whose validation ranks have Spearman's rho >= 0.8
with the ranks at T (the mean of the last 3 validations); else T. A block trial of T_trial rounds
at the same sigma is the first T_trial rounds of such a run.

The ten runs differ only in searched scalars and their training seed, so they run as one program.
Grid: 10 runs (index 0-9), seed 0 (block (e)'s split):

  python3 -m launch.sweep --config=experiments/configs/fair2_rank.py --root=$HOME/fair2 \\
      --one_program=auto

It needs the personal-head family's edges (experiments/configs/fair2_edge.py) committed: until then
a configuration cannot be drawn and loading one fails, naming them.

Arguments: `:index=0`.
"""

from __future__ import annotations

from dp2fedsam_jax.privacy import selection
from experiments.configs import _common
from experiments.configs import fair_e_design2 as block_e
from experiments.studies import fair2_pilot as rules

CONFIGURATIONS = rules.MIN_CONFIGURATIONS
DRAW_SEED = 2026
TRAINING_SEED_BASE = 1000  # configuration i trains at training_seed 1000 + i (none of the final seeds)
ROW = 'dp2fedsam'
DEFAULTS = dict(method=ROW, index=0, seed=0)


def values(index: int) -> dict:
  """Configuration `index`'s values, drawn as a block trial draws its candidate (launch.tune's
  candidate stream, from the public DRAW_SEED)."""
  block, row = block_e.BLOCK, block_e.BLOCK.row(ROW)
  waiting = [r for r in block.pending if 'personal-head' in r]
  if waiting:
    raise ValueError(f'fair2_rank draws from DP2-FedSAM\'s ranges, which are pending: {waiting}; '
                     'commit the edge runs first (experiments/configs/fair2_edge.py).')
  spec = block.study(row)
  return selection.draw_candidate(spec['space'], DRAW_SEED, index, tied=spec.get('tied'))


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  index = int(args['index'])
  if args['method'] != ROW or not 0 <= index < CONFIGURATIONS:
    raise ValueError(f"method={args['method']!r}, index={index}: the stage runs {ROW} at index "
                     f'0-{CONFIGURATIONS - 1}')
  block, row = block_e.BLOCK, block_e.BLOCK.row(ROW)
  c = block_e.get_config(f"method={ROW},seed={args['seed']}")
  spec = block.study(row)
  fixed = {k: v for k, v in spec['fixed'].items() if k not in ('num_rounds', 'eval_every')}
  _common.set_fields(c, {**fixed, **values(index)})
  c.training_seed = TRAINING_SEED_BASE + index
  c.num_rounds, c.eval_every = block_e.T, rules.RANK_EVAL_EVERY
  return c


def sweep_grid() -> list[dict]:
  return [dict(method=ROW, index=i, seed=0) for i in range(CONFIGURATIONS)]
