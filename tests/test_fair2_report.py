"""A second-design block's page and verdicts (experiments/report/fair2.py) on a made-up published
block (e): the metric is each seed's mean of its last 3 evaluations, seeds are paired, each row's
search SD widens the rule, a row whose search found nothing that trains meets no one, and the
README's headline holds the second design's block with the first design's pages listed after it."""

from __future__ import annotations

import json
import re
import os

import pytest
from conftest import write_run_file

from experiments.report import fair2, fair_pages, findings
from launch import fair_benchmark

PATH, MODULE, BLOCK = fair_benchmark.load_block('e')
NAME = fair_benchmark.config_name(PATH)


_write = write_run_file


def _row(runs, name, accuracies, score, search_sd=0.002, seeds=range(5)):
  """A row's final seeds (evaluations at 160, 180, 200: acc - 0.01, acc + 0.01, acc) and row.json."""
  config = MODULE.get_config(f'method={BLOCK.row(name).method}').to_dict()
  for seed, acc in zip(seeds, accuracies):
    run = os.path.join(runs, name, 'final', f'seed={seed}')
    _write(os.path.join(run, 'config.json'), {**config, 'training_seed': seed})
    _write(os.path.join(run, 'metrics.jsonl'), [
        {'round': r, 'test_accuracy': a} for r, a in ((160, acc - 0.01), (180, acc + 0.01),
                                                      (200, acc))])
  _write(os.path.join(runs, name, 'row.json'), {
      'selected_score': score, 'selection_epsilon': 0.985, 'selected_values': {'server_lr': 1.0},
      'search': {'pool_size': 16, 'search_sd': search_sd, 'covered_by_epsilon': False,
                 'pool_best': {'test_accuracy': max(accuracies)},
                 'tuning_curve': {'k': [1, 2], 'mean': [0.7, 0.75], 'low': [0.6, 0.7],
                                  'high': [0.8, 0.8]}}})


@pytest.fixture()
def results(tmp_path):
  root = tmp_path / 'results'
  runs = str(root / NAME / 'runs')
  _write(os.path.join(runs, 'benchmark.json'), {'block': 'e', 'design': 2})
  dp2 = [0.80, 0.82, 0.79, 0.81, 0.83]
  _row(runs, 'dp2fedsam', dp2, score=0.8)
  _row(runs, 'centaur', [a - 0.03 for a in dp2], score=0.78)   # 3 points under, every seed
  _row(runs, 'dp_fedsam', [a - 0.03 for a in dp2], score=0.7, search_sd=0.05)  # a wide search
  _row(runs, 'dp_fedavg', [0.1] * 5, score=0.12)  # chance 0.1 + 0.05 not cleared
  _row(runs, 'ceiling_p_fedsam', [0.9, 0.91, 0.92], score=0.9, seeds=range(3))
  return str(root)


def _verdicts(results):
  (published,) = fair_pages.published_blocks(results)
  entries = fair2.row_entries(published.runs, BLOCK)
  return {(e['better'].name, e['worse'].name): e
          for e in fair2.verdicts(BLOCK, published.results, entries)}, published, entries


def test_a_seeds_accuracy_is_the_mean_of_its_last_three_evaluations(results):
  (published,) = fair_pages.published_blocks(results)
  seeds = fair2.seed_accuracies(published.results['dp2fedsam'], BLOCK.metric)
  assert seeds == pytest.approx({0: 0.80, 1: 0.82, 2: 0.79, 3: 0.81, 4: 0.83})
  assert fair2.ceiling_accuracy(BLOCK, published.results) == pytest.approx(91.0)


def test_paired_seeds_and_the_search_sd_decide_and_nothing_that_trains_meets_no_one(results):
  verdicts, _, _ = _verdicts(results)
  held = verdicts[('dp2fedsam', 'centaur')]
  assert held['verdict'] == 'holds' and held['d'] == pytest.approx(3.0)
  assert held['s'] == pytest.approx(100 * (2 * 0.002 ** 2) ** 0.5, rel=1e-6)  # seeds agree exactly
  wide = verdicts[('dp2fedsam', 'dp_fedsam')]  # the same 3 points, a 5-point search SD: level
  assert wide['verdict'] == 'level' and wide['s'] > 5
  assert verdicts[('dp2fedsam', 'dp_fedavg')]['verdict'].startswith('no verdict')
  assert verdicts[('dp2fedsam', 'dp_fedsam_ft')]['verdict'] == 'undecided'  # not searched yet


def test_the_regime_waits_for_every_row_that_trains(results):
  _, published, entries = _verdicts(results)
  assert fair2.regime(BLOCK, published.results, entries) == 'test'  # 91 >= 82.2 + 2
  os.remove(os.path.join(published.runs, 'centaur', 'final', 'seed=4', 'metrics.jsonl'))
  (published,) = fair_pages.published_blocks(results)
  assert fair2.regime(BLOCK, published.results, entries).startswith('pending')


def test_the_page_and_plot_come_from_the_rows_and_the_readme_headlines_the_second_design(results):
  (published,) = fair_pages.published_blocks(results)
  page = fair_pages.page_text(published, (published,))
  assert '81.00 ± 1.58' in page  # dp2fedsam's five seeds: their mean ± std
  data = fair_pages.plot_data(published, (published,))
  assert data['kind'] == 'tuning_curves' and len(data['curves']) == 5
  assert data['curves'][0]['mean'] == [70.0, 75.0]
  first_design = fair_pages.published_blocks(os.path.join(fair_benchmark.ROOT_DIR, 'experiments',
                                                           'results'))
  lines = findings.findings_lines(first_design + (published,))
  headline = [line for line in lines if line.startswith('| [(')]
  assert len(headline) == 1 and headline[0].startswith('| [(e)]')
  assert all(f'({p.letter})' in '\n'.join(lines) for p in first_design)  # listed, not headlined
  assert findings.seed_counts((published,)) == (5, 3)


def test_tuned_well_is_the_pool_bests_difference_and_a_disagreement_is_marked(results):
  runs = os.path.join(results, NAME, 'runs')
  entry_path = os.path.join(runs, 'centaur', 'row.json')
  with open(entry_path) as f:
    entry = json.load(f)
  entry['search']['pool_best']['test_accuracy'] = 0.90  # above dp2fedsam's pool best, 0.83
  _write(entry_path, entry)
  verdicts, _, _ = _verdicts(results)
  pair = verdicts[('dp2fedsam', 'centaur')]
  assert pair['verdict'] == 'holds' and pair['pool_d'] == pytest.approx(-7.0) and pair['disagree']
  assert not verdicts[('dp2fedsam', 'dp_fedsam')]['disagree']  # level: nothing to contradict


def test_the_rule_above_the_findings_is_built_from_the_constants_that_decide(results, monkeypatch):
  (published,) = fair_pages.published_blocks(results)
  monkeypatch.setattr(fair2, 'NOTHING_TRAINS_MARGIN', 0.07)
  monkeypatch.setattr(fair2.fair, 'MIN_GAP', 0.03)
  (rule,) = findings.rule_lines((published,))
  numbers = [float(n) for n in re.findall(r'\d+(?:\.\d+)?', rule)]
  assert numbers == [3, 2, 7, published.block.regime_margin]  # the gap, 2s, the margin, the room
  first_design = fair_pages.published_blocks(os.path.join(fair_benchmark.ROOT_DIR, 'experiments',
                                                           'results'))
  assert findings.rule_lines(first_design) != findings.rule_lines((published,))
