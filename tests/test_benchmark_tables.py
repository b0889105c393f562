"""benchmarks/README.md's tables come from the committed JSON (experiments/report/benchmark_tables.py):
every file a block names exists, and an edited measurement in a copy of the results moves the cell
and the derived numbers that print it (tests/test_generated_docs.py checks the README against them)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from conftest import markdown_tables

from experiments.report import benchmark_tables

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture()
def copy(tmp_path):
  shutil.copytree(os.path.join(REPO, benchmark_tables.RESULTS), tmp_path / benchmark_tables.RESULTS)
  return tmp_path


def _edit(repo, name: str, edit) -> None:
  path = os.path.join(repo, benchmark_tables.RESULTS, name)
  with open(path) as f:
    record = json.load(f)
  edit(record)
  with open(path, 'w') as f:
    json.dump(record, f)


@pytest.mark.parametrize('block', sorted(benchmark_tables.BLOCKS))
def test_every_block_names_files_that_exist(block):
  text = '\n'.join(benchmark_tables.BLOCKS[block](REPO))
  named = re.findall(r'`results/([^`]+\.json)`', text)
  assert named and all(os.path.exists(os.path.join(REPO, benchmark_tables.RESULTS, n)) for n in named)


def test_an_edited_round_time_moves_its_cell_and_the_speed_up(copy):
  def slower_vmap(record):
    for r in record['results']:
      if (r['mode'], r['clients']) == ('vmap', 10):
        r['seconds_per_round'] = 0.0347  # the sequential line's 0.347 s, a tenth of it
  _edit(copy, 'gpu-h200/lstm_speedups.json', slower_vmap)
  (table,) = markdown_tables(benchmark_tables.vmap_gpu_lines(str(copy)), 'cohort', 'vmap speed-up')
  row = next(r for r in table if r['cohort'] == '10')
  assert [row['vmap s/round'], row['sequential s/round'], row['vmap speed-up']] == [
      '0.035', '0.347', '10.0×'], row


def test_the_population_ratio_and_sizes_follow_their_records(copy):
  def doubled_last_round(record):
    record['records'][-1]['seconds_per_round'] = 2 * record['records'][0]['seconds_per_round']
    record['records'][-1]['padded_data_bytes'] = 3 * 2 ** 30
  _edit(copy, 'cpu-2core-epyc-shared/population/population.json', doubled_last_round)
  lines = benchmark_tables.population_lines(str(copy))
  (table,) = markdown_tables(lines, 'N', 'padded [N, max] data')
  assert table[-1]['padded [N, max] data'] == '3.0 GiB'
  assert re.findall(r'[\d.]+×', lines[-1]) == ['2.00×']  # the last size's round against the first's


def test_a_skipped_cohort_keeps_its_reason_and_an_empty_column_goes():
  lines = benchmark_tables.cohort_lines(REPO)
  (table,) = markdown_tables(lines, 'model', 'executor')
  assert [int(c) for c in list(table[0])[2:]] == [1, 4, 16, 64]  # 256: skipped on every line
  with open(os.path.join(REPO, benchmark_tables.RESULTS, 'cpu-2core-epyc-quiet', 'scaling',
                         'cohort_scaling.json')) as f:
    statuses = {r['status'] for r in json.load(f)['rows']} - {'ok'}
  reasons = {s.split(': ', 1)[1] for s in statuses}  # 'skipped: <why>'
  assert reasons and all(why.lower() in lines[-1].lower() for why in reasons)
