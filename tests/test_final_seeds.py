"""A row's final seeds as one program (Block.final_seed_field='training_seed'): every final run at
the block's split, the seed as config.training_seed, so the runs share one program's key and
launch.sweep.execute_trials runs them together; with the default 'seed' each is its own split and
its own process. Nothing trains here (the program's equality with a run alone is
tests/test_search_program.py's)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from dp2fedsam_jax import search_program
from launch import fair_benchmark, sweep, trial_program, tune


@pytest.fixture(autouse=True)
def _data_everywhere(monkeypatch):
  """The grouping, whether or not this machine holds the blocks' datasets (a run without its data
  never joins a program)."""
  monkeypatch.setattr(sweep, 'missing_data', lambda config: None)


def _row_and_selection(letter: str):
  path, module, block = fair_benchmark.load_block(letter)
  row = block.rows[0]
  return path, module, block, row, fair_benchmark.smoke_values(block.study(row)['space'])[0]


@pytest.mark.parametrize('letter', ['a', 'b', 'c'])  # (d): the sharded executor, no program
def test_final_seeds_as_training_seeds_share_the_blocks_split_and_one_program(letter, tmp_path):
  path, module, block, row, selected = _row_and_selection(letter)
  paired = dataclasses.replace(block, final_seed_field='training_seed')
  runs = fair_benchmark.final_runs(str(tmp_path), path, module, paired, row, selected)
  seeds = list(block.final_seeds(row))
  block_seed = fair_benchmark.row_config(module, block, row).seed
  assert [c.seed for _, c in runs] == [block_seed] * len(seeds)
  assert [c.training_seed for _, c in runs] == seeds
  assert all('seed' not in r.args for r, _ in runs)
  assert [os.path.basename(r.workdir) for r, _ in runs] == [f'seed={s}' for s in seeds]
  assert len({search_program.one_program_key(c) for _, c in runs}) == 1
  assert sweep.execution_plan(runs) == [list(range(len(seeds)))]
  assert sweep.execution_plan(runs, 'never') == []
  # The first design: each seed its own split, so its own program key and process.
  alone = fair_benchmark.final_runs(str(tmp_path), path, module, block, row, selected)
  assert [c.seed for _, c in alone] == seeds
  assert all(c.get('training_seed') is None for _, c in alone)
  assert sweep.execution_plan(alone) == []


def test_a_rows_paired_final_seeds_run_as_one_program_and_are_recorded(tmp_path, monkeypatch):
  path, module, block, row, selected = _row_and_selection('a')
  paired = dataclasses.replace(block, final_seed_field='training_seed')
  monkeypatch.setattr(fair_benchmark, 'load_block', lambda letter: (path, module, paired))
  tuned = []
  monkeypatch.setattr(tune, 'tune', lambda *a, **k: tuned.append(k['one_program']) or {
      'status': 'done', 'selected_values': selected, 'selection_epsilon': 0.9,
      'per_trial_epsilon': 0.4})
  programs, alone = [], []

  def run_trials(configs, workdirs):
    programs.append([c.training_seed for c in configs])
    return dict(zip(workdirs, ['ran', 'failed (FloatingPointError: see failure.json)', 'ran']))
  monkeypatch.setattr(trial_program, 'run_trials', run_trials)
  monkeypatch.setattr(sweep, 'execute', lambda p, runs, *a: alone.extend(runs) or {
      r.workdir: 'ran' for r in runs})
  root = str(tmp_path)
  entry = fair_benchmark.run_row('a', row.name, root, parallel=1)
  assert tuned == ['auto'] and programs == [[0, 1, 2]] and alone == []
  assert list(entry['final_runs'].values()) == [
      'finished', 'failed (FloatingPointError: see failure.json)', 'finished']
  workdir = os.path.join(fair_benchmark.row_dir(root, path, row), 'final', 'seed=1')
  with open(os.path.join(workdir, 'sweep.json')) as f:
    record = json.load(f)
  assert record['ran_as'] == fair_benchmark.FINAL_RAN_AS
  assert '--config.training_seed=1' in record['overrides'] and 'seed' not in record['args']
  # --one_program=never: the search and each final seed in their own process.
  entry = fair_benchmark.run_row('a', row.name, str(tmp_path / 'never'), 1, one_program='never')
  assert tuned[-1] == 'never' and programs == [[0, 1, 2]] and len(alone) == 3
  assert list(entry['final_runs'].values()) == ['finished'] * 3


def test_a_block_names_a_field_its_final_seeds_can_go_in():
  _, _, block = fair_benchmark.load_block('a')
  assert block.final_seed_field == 'seed'  # the committed blocks: each final seed its own split
  with pytest.raises(ValueError, match='final_seed_field'):
    dataclasses.replace(block, final_seed_field='config.seed')
