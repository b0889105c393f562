"""A second-design block's page and verdicts (experiments/report/fair2.py) on a made-up published
block (e): the metric is each seed's mean of its last 3 evaluations, seeds are paired, each row's
search SD widens the rule, a row whose search found nothing that trains meets no one, and the
README's headline holds the second design's block with the first design's pages listed after it."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from conftest import markdown_tables, write_run_file

from dp2fedsam_jax.privacy import selection
from experiments.report import fair2, fair_pages, findings
from experiments.studies import search_spread
from launch import fair_benchmark

PATH, MODULE, BLOCK = fair_benchmark.load_block('e')
NAME = fair_benchmark.config_name(PATH)


_write = write_run_file


def _pool(best, spread, size=16):
  """A search's pool: validation scores all tied (the noise picks), test accuracies alternating
  `best` and `best - 2 spread`, so a search's SD is about `spread`; trial=0 is the pool's best."""
  return [{'run': f'trial={i}', 'values': {'server_lr': 1.0}, 'status': 'finished', 'metric': 0.5,
           'test_accuracy': best - 2 * spread * (i % 2)} for i in range(size)]


def _row(runs, name, accuracies, score, spread=0.002, seeds=range(5)):
  """A row's final seeds (evaluations at 160, 180, 200: acc - 0.01, acc + 0.01, acc) and row.json
  with its search's pool (the report recomputes the curve and SD from it)."""
  config = MODULE.get_config(f'method={BLOCK.row(name).method}').to_dict()
  for seed, acc in zip(seeds, accuracies):
    run = os.path.join(runs, name, 'final', f'seed={seed}')
    _write(os.path.join(run, 'config.json'), {**config, 'training_seed': seed})
    _write(os.path.join(run, 'metrics.jsonl'), [
        {'round': r, 'test_accuracy': a} for r, a in ((160, acc - 0.01), (180, acc + 0.01),
                                                      (200, acc))])
  law = selection.TrialDistribution.from_dict(BLOCK.trials_of(BLOCK.row(name)))
  search = search_spread.search_record(_pool(max(accuracies), spread), law, 0.01, seed=1,
                                       resamples=300)
  _write(os.path.join(runs, name, 'row.json'), {
      'selected_score': score, 'selection_epsilon': 0.985, 'selected_values': {'server_lr': 1.0},
      'search': {**search, 'search_sd': 0.0, 'tuning_curve': None}})  # stored numbers: not read


@pytest.fixture()
def results(tmp_path):
  root = tmp_path / 'results'
  runs = str(root / NAME / 'runs')
  _write(os.path.join(runs, 'benchmark.json'), {'block': 'e', 'design': 2})
  dp2 = [0.80, 0.82, 0.79, 0.81, 0.83]
  _row(runs, 'dp2fedsam', dp2, score=0.8)
  _row(runs, 'centaur', [a - 0.03 for a in dp2], score=0.78)   # 3 points under, every seed
  _row(runs, 'dp_fedsam', [a - 0.03 for a in dp2], score=0.7, spread=0.05)  # a wide search
  _row(runs, 'dp_fedavg', [0.1] * 5, score=0.12)  # chance 0.1 + 0.05 not cleared
  _row(runs, 'ceiling_p_fedsam', [0.9, 0.91, 0.92], score=0.9, seeds=range(3))
  for name in ('dp_pfeddsu', 'dp_pfeddsu_safe'):  # one paper row, two forms
    _row(runs, name, [a - 0.05 for a in dp2], score=0.7)
  for name in ('dp_fedsam_ft', 'dp_fedavg_ft', 'ppsgd', 'dp_fedavg_fb', 'pmtl_ft'):  # every row
    _row(runs, name, [a - 0.04 for a in dp2], score=0.7)
  return str(root)


ACCURACY = 'final accuracy (%), mean ± seed std'  # fair2.row_lines' column of a row's seeds


def _rows(lines) -> dict:
  """fair2's table of rows (in a page, or any lines that hold it), its rows by their first cell."""
  (table,) = markdown_tables(lines, 'row', ACCURACY)
  return {row['row']: row for row in table}


DP2_LABEL = fair2.row_label(BLOCK, BLOCK.row('dp2fedsam'))


def _headline_letters(lines) -> list[str]:
  """The blocks of the README's findings table, by letter ('[(e)](page) ...' -> 'e')."""
  (table,) = markdown_tables(lines, 'block', 'verdict')
  return [re.match(r'\[\((\w+)\)\]', row['block'])[1] for row in table]


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
  verdicts, _, entries = _verdicts(results)
  sds = {name: entries[name]['search']['search_sd'] for name in ('dp2fedsam', 'centaur')}
  assert sds['dp2fedsam'] == pytest.approx(0.002, rel=0.3)  # recomputed from the pool
  held = verdicts[('dp2fedsam', 'centaur')]
  assert held['verdict'] == 'holds' and held['d'] == pytest.approx(3.0)
  # The seeds agree exactly: s is the two searches' SDs alone.
  assert held['s'] == pytest.approx(100 * (sds['dp2fedsam'] ** 2 + sds['centaur'] ** 2) ** 0.5)
  wide = verdicts[('dp2fedsam', 'dp_fedsam')]  # the same 3 points, a ~5-point search SD: level
  assert wide['verdict'] == 'level' and wide['s'] > 3
  assert verdicts[('dp2fedsam', 'dp_fedavg')]['verdict'].startswith('no verdict')
  shutil.rmtree(os.path.join(results, NAME, 'runs', 'dp_fedsam_ft'))
  verdicts, _, _ = _verdicts(results)
  assert verdicts[('dp2fedsam', 'dp_fedsam_ft')]['verdict'] == 'undecided'  # not searched yet


def test_the_regime_waits_for_every_row_that_trains(results):
  _, published, entries = _verdicts(results)
  assert fair2.regime(BLOCK, published.results, entries) == 'test'  # 91 >= 82.2 + 2
  os.remove(os.path.join(published.runs, 'centaur', 'final', 'seed=4', 'metrics.jsonl'))
  (published,) = fair_pages.published_blocks(results)
  assert fair2.regime(BLOCK, published.results, entries) == 'pending: centaur'
  # A row whose search has not finished (no row.json yet) and the ceiling's three seeds: waited for.
  os.remove(os.path.join(published.runs, 'ceiling_p_fedsam', 'final', 'seed=2', 'metrics.jsonl'))
  (published,) = fair_pages.published_blocks(results)
  entries = {k: v for k, v in entries.items() if k != 'ppsgd'}
  assert fair2.regime(BLOCK, published.results, entries) == 'pending: the ceiling, centaur, ppsgd'


def _committed_first_design() -> tuple:
  """The committed first-design blocks (the committed results also hold block (e) as it runs)."""
  committed = fair_pages.published_blocks(os.path.join(fair_benchmark.ROOT_DIR, 'experiments',
                                                        'results'))
  return tuple(p for p in committed if p.block.design != 2)


def test_the_page_and_plot_come_from_the_rows_and_the_readme_headlines_the_second_design(results):
  (published,) = fair_pages.published_blocks(results)
  page = fair_pages.page_text(published, (published,))
  assert _rows(page)[DP2_LABEL][ACCURACY] == '81.00 ± 1.58'  # dp2fedsam's five seeds: mean ± std
  data = fair_pages.plot_data(published, (published,))
  assert data['kind'] == 'tuning_curves' and len(data['curves']) == 12
  curve = data['curves'][0]['mean']  # dp2fedsam's, from its pool: 16 draws of 0.83 and 0.826
  assert len(curve) == 16 and curve[0] == pytest.approx(82.8)
  assert len({c['row'] for c in data['curves']}) == len(data['curves'])  # each curve its own name
  first_design = _committed_first_design()
  lines = findings.findings_lines(first_design + (published,))
  assert _headline_letters(lines) == ['e']
  assert all(f'({p.letter})' in '\n'.join(lines) for p in first_design)  # listed, not headlined
  assert findings.seed_counts((published,)) == (5, 3)
  # Before its regime rule applies (a row still searching), the first design keeps the headline.
  os.remove(os.path.join(published.runs, 'ppsgd', 'row.json'))
  (published,) = fair_pages.published_blocks(results)
  lines = findings.findings_lines(first_design + (published,))
  assert _headline_letters(lines) == [p.letter for p in first_design]
  assert sum(line.startswith('- Under way: [(e)]') for line in lines) == 1


def test_tuned_well_is_the_pool_bests_difference_and_a_disagreement_is_marked(results):
  runs = os.path.join(results, NAME, 'runs')
  entry_path = os.path.join(runs, 'centaur', 'row.json')
  with open(entry_path) as f:
    entry = json.load(f)
  for trial in entry['search']['pool']:  # 10 points up: its best 0.90 (dp2fedsam's 0.83), same SD
    trial['test_accuracy'] += 0.10
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
  first_design = _committed_first_design()
  assert findings.rule_lines(first_design) != findings.rule_lines((published,))


def test_a_rows_epsilon_is_the_bound_that_holds_with_its_published_k():
  """The pool publishes K: where the naive composition of K trials exceeds the selection's ε, the
  table shows that bound, marked with K; else the selection's ε."""
  entry = {'selection_epsilon': 0.819, 'epsilon_bound': 1.234, 'selection_trials': 30}
  assert fair2.epsilon_text(entry).startswith('1.234') and 'K = 30' in fair2.epsilon_text(entry)
  assert fair2.epsilon_text({**entry, 'epsilon_bound': 0.819}) == '0.819'
  assert fair2.epsilon_text({'selection_epsilon': None}) == '–'


def test_a_diverged_final_seed_is_finished_and_scores_zero_from_its_failure_on(results):
  """Declared before block (e)'s first final run: a final run whose release turned NaN/Inf counts
  (a rerun repeats it), its evaluations before the failure stand and every later one scores 0."""
  runs = os.path.join(results, NAME, 'runs')
  for seed, failed_at, kept in ((1, 170, [(160, 0.5)]), (3, 50, [])):
    run = os.path.join(runs, 'dp2fedsam', 'final', f'seed={seed}')
    with open(os.path.join(run, 'config.json')) as f:
      config = {**json.load(f), 'eval_from': 160, 'eval_every': 20}  # as a final run's
    _write(os.path.join(run, 'config.json'), config)
    _write(os.path.join(run, 'metrics.jsonl'), [{'round': r, 'test_accuracy': a} for r, a in kept])
    _write(os.path.join(run, 'failure.json'), {'error': 'FloatingPointError', 'round': failed_at})
  with open(os.path.join(runs, 'dp2fedsam', 'final', 'seed=4', 'failure.json'), 'w') as f:
    json.dump({'error': 'OSError', 'round': 190}, f)  # another failure: the finished run stands
  (published,) = fair_pages.published_blocks(results)
  result = published.results['dp2fedsam']
  assert result.diverged == {1: 170, 3: 50}
  seeds = fair2.seed_accuracies(result, BLOCK.metric)
  assert seeds == pytest.approx({0: 0.80, 1: 0.5 / 3, 2: 0.79, 3: 0.0, 4: 0.83})
  verdicts, published, entries = _verdicts(results)
  assert verdicts[('dp2fedsam', 'centaur')]['d'] < 0  # the zeros count against the row
  accuracy = _rows(fair2.row_lines(BLOCK, published.results, entries))[DP2_LABEL][ACCURACY]
  # Each diverged seed is marked after the mean, with the round it diverged at.
  marks = [re.findall(r'\d+', mark)[:2] for mark in re.findall(r'\(([^)]*)\)', accuracy)]
  assert marks == [['1', '170'], ['3', '50']]


def test_a_search_that_selected_nothing_found_nothing_that_trains(results):
  """Every trial failed (run_row's 'nothing selected'): the row is settled, without a verdict."""
  _write(os.path.join(results, NAME, 'runs', 'ppsgd', 'row.json'), {
      'selected_score': None, 'selected_values': None, 'search': None,
      'note': 'nothing selected (K = 0 or every trial failed): the row has no final runs'})
  shutil.rmtree(os.path.join(results, NAME, 'runs', 'ppsgd', 'final'))
  verdicts, published, entries = _verdicts(results)
  assert verdicts[('dp_pfeddsu', 'ppsgd')]['verdict'].startswith('no verdict')
  assert fair2.regime(BLOCK, published.results, entries) == 'test'  # it waits for it no longer


def test_the_results_index_shows_a_second_design_block_by_its_own_rule(results):
  """experiments/results/README.md's section of block (e): the page's rows (the mean of the last 3
  evaluations), its regime rule and its paired verdicts, never the first design's tables."""
  (published,) = fair_pages.published_blocks(results)
  lines = findings.fair_block_lines((published,))
  entries = fair2.row_entries(published.runs, BLOCK)
  assert fair2.row_lines(BLOCK, published.results, entries)[2] in lines  # DP2-FedSAM's row
  assert _rows(lines)[DP2_LABEL][ACCURACY] == '81.00 ± 1.58'
  assert fair2.verdict_lines(fair2.verdicts(BLOCK, published.results, entries))[0] in lines
  rule = fair2.regime(BLOCK, published.results, entries)
  assert rule == 'test' and sum(f'**{rule}**' in line for line in lines) == 1  # the rule's outcome


def test_a_row_not_searched_yet_is_pending_on_its_page_not_found_wanting(results):
  shutil.rmtree(os.path.join(results, NAME, 'runs', 'ppsgd'))
  (published,) = fair_pages.published_blocks(results)
  entries = fair2.row_entries(published.runs, BLOCK)
  row = _rows(fair2.row_lines(BLOCK, published.results, entries))['PPSGD']
  assert (row[ACCURACY], row['seeds']) == ('–', '0')  # no accuracy yet, and no "found nothing" mark
