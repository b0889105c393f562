"""Benchmark block (a5): block (a) on the pathological (1000, 5) split; docs/benchmark.md.

The step block (a)'s regime rule declares for when its non-private ceiling is not 2 points above its
best private row ("at the ceiling"): (1000, 5) at the same eps and law. Written before (a)'s
ceiling ran (2026-11-29), so that nothing of it is chosen after that result: everything of
fair_a_dp2fedsam.py (imported, not copied: rows, law, eps 0.25, score noise, ranges, claims, fixed
settings, the rule) but S = 5 (each client holds 5 of the 10 classes: more for the shared extractor
to carry, less for a personal head to separate) and new tuner seeds (500-506), its own ceiling
searched under the same law. It runs only by name (`--blocks=a5`), never in the default order.

  python3 -m launch.fair_benchmark --blocks=a5 --root=$HOME/fair --plan

Arguments: `:method=dp2fedsam,eps=0.25,seed=0,S=5`.
"""

from __future__ import annotations

import dataclasses

from experiments.configs import _common
from experiments.configs import fair_a_dp2fedsam as block_a

DEFAULTS = {**block_a.DEFAULTS, 'S': 5}
SEED_OFFSET = 400  # block (a)'s tuner seeds 100-106 -> 500-506: every row of every block its own
BLOCK = dataclasses.replace(
    block_a.BLOCK, name='a5', paper=f'{block_a.BLOCK.paper} on (1000, 5)',
    rows=tuple(dataclasses.replace(r, seed=r.seed + SEED_OFFSET) for r in block_a.BLOCK.rows),
    ceiling=dataclasses.replace(block_a.BLOCK.ceiling, seed=block_a.BLOCK.ceiling.seed + SEED_OFFSET),
    if_rule_fails='no further step: the block is published at the ceiling')


def get_config(arg: str | None = None):
  """Block (a)'s config, S = 5 unless the argument names another."""
  args = _common.parse_args(arg, **DEFAULTS)
  return block_a.get_config(','.join(f'{k}={v}' for k, v in args.items()))


tuning_space = BLOCK.tuning_space
