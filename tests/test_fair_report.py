"""The fair benchmark's publishing and verdicts (launch/fair_benchmark.publish, experiments/report/fair.py),
on a made-up sweep root laid out as launch.fair_benchmark lays it out: what is copied (never the
tuning operator's file, a trial that was not selected, or the selected trial's un-noised validation
metrics; never an unfinished run), each claim judged once per pair of rows by the seed rule, and the
regime rule applied only once every private row has its seeds and the ceiling is known."""

from __future__ import annotations

import json
import os
import re

import pytest
from conftest import markdown_tables, write_run_file

from experiments.studies import fair as _fair
from experiments.report import fair as fair_report
from experiments.report import fair_pages
from launch import fair_benchmark

PATH, MODULE, BLOCK = fair_benchmark.load_block('a')
CONFIG = fair_benchmark.config_name(PATH)


_write = write_run_file


def _final(root, row, seed, accuracy, rounds=200, num_rounds=200):
  run = os.path.join(root, CONFIG, row, 'final', f'seed={seed}')
  config = fair_benchmark.row_config(MODULE, BLOCK, BLOCK.row(row)).to_dict()
  config['dp']['noise_multiplier'] = 5.9  # a resolved sigma, as a run's config.json has it
  _write(os.path.join(run, 'config.json'), {**config, 'num_rounds': num_rounds, 'seed': seed})
  _write(os.path.join(run, 'metrics.jsonl'), [{'round': 100, 'test_accuracy': accuracy - 0.1},
                                              {'round': rounds, 'test_accuracy': accuracy}])
  return run


def _search(root, row, selected='trial=aa'):
  """A finished secret-K search: tuning.json (as published), the operator's file, two trials."""
  directory = os.path.join(root, CONFIG, row)
  _write(os.path.join(directory, 'tuning.json'), {
      'status': 'done', 'selected_run': selected, 'selected_values': {'local.lr_shared': 0.05},
      'selection_epsilon': 0.9, 'per_trial_epsilon': 0.4, 'private': True,
      'trial_distribution': BLOCK.trials})
  _write(os.path.join(directory, 'tuning_operator_private.json'), {'secret': 1, 'num_trials': 2})
  for trial in ('trial=aa', 'trial=bb'):
    _write(os.path.join(directory, trial, 'config.json'), {'num_rounds': 200})
    _write(os.path.join(directory, trial, 'metrics.jsonl'),
           [{'round': 200, 'test_accuracy': 0.8, 'validation_accuracy': 0.81}])


@pytest.fixture()
def published(tmp_path):
  root, out = str(tmp_path / 'root'), str(tmp_path / 'results')
  _search(root, 'dp2fedsam')
  for seed, acc in enumerate((0.900, 0.905, 0.910)):
    _final(root, 'dp2fedsam', seed, acc)
  for seed, acc in enumerate((0.860, 0.865, 0.870)):  # 4 points below: holds
    _final(root, 'centaur', seed, acc)
  for seed, acc in enumerate((0.902, 0.899, 0.907)):  # level with dp2fedsam
    _final(root, 'dp_fedsam', seed, acc)
  for seed, acc in enumerate((0.950, 0.955)):  # two seeds only: undecided
    _final(root, 'dp_fedavg', seed, acc)
  _final(root, 'dp_fedavg', 2, 0.5, rounds=150)  # unfinished: neither counted nor copied
  results_md = fair_benchmark.publish('a', root, out)
  return root, os.path.join(out, CONFIG), open(results_md).read()


def test_publish_copies_the_search_as_published_and_only_finished_runs(published):
  _, out, _ = published
  copied = {os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs}
  assert 'runs/dp2fedsam/tuning.json' in copied and 'runs/dp2fedsam/trial=aa/metrics.jsonl' in copied
  assert not any('operator' in p or 'trial=bb' in p for p in copied), copied
  with open(os.path.join(out, 'runs/dp2fedsam/trial=aa/metrics.jsonl')) as f:
    assert all(not k.startswith('validation_') for k in json.loads(f.readline()))
  assert 'runs/dp_fedavg/final/seed=1/metrics.jsonl' in copied
  assert 'runs/dp_fedavg/final/seed=2/metrics.jsonl' not in copied  # round 150 of 200


def test_a_diverged_final_run_is_published_and_counts_as_finished_with_zeros(published, tmp_path):
  """A final run whose release turned NaN/Inf is final (a rerun repeats it): published with its
  failure.json, read as a finished seed that scores 0 from its failure on, counted done."""
  root, out, _ = published
  run = os.path.join(root, CONFIG, 'dp_fedavg', 'final', 'seed=2')  # stopped at round 150
  _write(os.path.join(run, 'failure.json'), {'error': 'FloatingPointError', 'round': 151})
  fair_benchmark.publish('a', root, str(tmp_path / 'results'))
  assert os.path.exists(os.path.join(out, 'runs/dp_fedavg/final/seed=2/failure.json'))
  result = fair_report.read_row(os.path.join(out, 'runs'), BLOCK.row('dp_fedavg'), BLOCK.metric)
  assert result.accuracy == pytest.approx({0: 0.950, 1: 0.955, 2: 0.0})
  assert result.diverged == {2: 151}
  _write(os.path.join(out, 'runs', 'dp_fedavg', 'tuning.json'), {'status': 'done'})  # selected
  assert fair_benchmark.row_progress(os.path.join(out, 'runs', 'dp_fedavg')) == (True, 3)


def test_each_claim_is_judged_by_the_seed_rule(published):
  _, out, text = published
  results = fair_report.read_block(os.path.join(out, 'runs'), BLOCK)
  assert results['dp_fedavg'].stats[2] == 2 and results['ceiling_p_fedsam'].stats[2] == 0
  got = {(e['better'].name, e['worse'].name): e for e in fair_report.verdicts(BLOCK, results)}
  assert len(got) == len(BLOCK.claims)
  assert got['dp2fedsam', 'centaur']['verdict'] == 'holds'
  assert got['dp2fedsam', 'centaur']['d'] == pytest.approx(4.0)
  assert got['dp2fedsam', 'dp_fedsam']['verdict'] == 'level'
  assert got['dp2fedsam', 'dp_fedavg']['verdict'] == 'undecided'  # 2 seeds
  assert got['dp_fedsam', 'dp_fedavg']['verdict'] == 'undecided'
  (claims,) = markdown_tables(text, 'rows', 'verdict')
  claim = next(c for c in claims if c['rows'] == 'dp2fedsam vs centaur')
  assert [claim[c] for c in ('the paper claims', 'd (points)', 's', 'verdict')] == [
      'DP2-FedSAM > CENTAUR', '+4.00', '0.50', 'holds']
  (table,) = markdown_tables(text, 'row', 'selected values')
  row = next(r for r in table if r['row'] == 'dp2fedsam')
  assert [row[f'{BLOCK.metric} (mean ± seed std)'], row['seeds'], row['selected values']] == [
      '90.50 ± 0.50', '3', 'lr_shared 0.05']


def test_a_claim_the_rows_contradict_says_so():
  row = lambda name: _fair.Row(name, 'dp_fedavg', seed=1, paper_row=name.upper())
  block = _fair.Block(name='t', paper='p', rows=(row('a'), row('b')), trials={}, eps=1.0,
                      score_noise=0.0, ranges={}, ceiling=None, ceiling_reference='r',
                      if_rule_fails='x', claims=(_fair.Claim('A', 'B', 'there'),))
  results = {'a': fair_report.RowResult(block.rows[0], None, {0: 0.70, 1: 0.71, 2: 0.72}),
             'b': fair_report.RowResult(block.rows[1], None, {0: 0.80, 1: 0.80, 2: 0.81})}
  (entry,) = fair_report.verdicts(block, results)
  assert entry['verdict'] == 'contradicted' and entry['d'] < -1


def test_the_regime_rule_waits_for_every_seed_and_the_ceiling(published):
  _, out, text = published
  results = fair_report.read_block(os.path.join(out, 'runs'), BLOCK)
  assert fair_report.regime(BLOCK, results, None).startswith('pending: the ceiling')
  assert 'dp_fedavg' in fair_report.regime(BLOCK, results, 99.0)
  assert f"**{fair_report.regime(BLOCK, results, None)}**" in text
  full = {n: fair_report.RowResult(r.row, None, {0: 0.90, 1: 0.90, 2: 0.90}) for n, r in results.items()}
  assert fair_report.regime(BLOCK, full, 92.0) == 'test'
  assert fair_report.regime(BLOCK, full, 91.9) == _fair.AT_CEILING
  # The README table's tally column says what the rule made of it: a verdict, or measurements only.
  epsilons = {r.name: (0.9, 1.04, None) for r in BLOCK.rows}
  header = lambda ceiling: fair_report.readme_lines(BLOCK, full, epsilons, ceiling)[0]
  assert header(92.0) != header(91.9)


def test_every_block_claims_only_rows_it_has():
  for letter in fair_benchmark.BLOCK_CONFIGS:
    _, _, block = fair_benchmark.load_block(letter)
    paper_rows = {r.paper_row for r in block.rows}
    assert block.claims, letter
    for claim in block.claims:
      assert {claim.better, claim.worse} <= paper_rows and claim.better != claim.worse, claim
      assert claim.source
    assert len(block.claim_pairs()) >= len(block.claims)


def test_a_ceiling_comes_from_the_block_another_block_or_a_committed_number(tmp_path):
  out = str(tmp_path)
  assert fair_benchmark.ceiling_accuracy('a', out) is None
  seed_dir = _final(str(tmp_path / 'root'), 'ceiling_p_fedsam', 0, 0.95)
  os.makedirs(os.path.join(out, CONFIG))
  os.rename(os.path.dirname(os.path.dirname(os.path.dirname(seed_dir))),
            os.path.join(out, CONFIG, 'runs'))  # root/<config> becomes the published runs/
  assert fair_benchmark.ceiling_accuracy('a', out) == pytest.approx(95.0)
  assert fair_benchmark.ceiling_accuracy('c', out) == 87.25  # a committed run on (1000, 5)
  assert fair_benchmark.ceiling_accuracy('d', out) == 51.99


def test_block_d_ceiling_is_the_committed_fedavg_with_its_head_fine_tune():
  """Block (d)'s ceiling_accuracy: FedAvg's 10-epoch head fine-tune at round 1,000, pooled, mean over
  the 3 committed seeds (experiments/results/shakespeare_field)."""
  values = []
  for seed in (0, 1, 2):
    path = os.path.join(fair_benchmark.ROOT_DIR, 'experiments/results/shakespeare_field/runs/fedavg/'
                        f'default/seed={seed}/evaluations.jsonl')
    with open(path) as f:
      lines = [json.loads(l) for l in f if l.strip()]
    lines = [e for e in lines if e['round'] == 1000 and e['eval.adapt_epochs'] == 10
             and e['eval.adapt_part'] == 'head']
    values.append(lines[-1]['test_accuracy_pooled'])
  _, _, block_d = fair_benchmark.load_block('d')
  assert round(100 * sum(values) / 3, 2) == block_d.ceiling_accuracy


def test_block_c_ceiling_is_the_committed_p_fedsam_run_on_its_split():
  """Block (c)'s ceiling_accuracy: the last test accuracy of the committed non-private P-FedSAM run
  it names, a run of (c)'s own split and settings (the shard split s = 5, 1,000 clients, T = 200)."""
  path, module, block = fair_benchmark.load_block('c')
  run = os.path.join(fair_benchmark.ROOT_DIR, module.CEILING_RUN)
  with open(os.path.join(run, 'metrics.jsonl')) as f:
    last = [json.loads(l) for l in f if l.strip()][-1]
  with open(os.path.join(run, 'config.json')) as f:
    ran = json.load(f)
  assert round(100 * last['test_accuracy'], 2) == block.ceiling_accuracy
  assert last['round'] == ran['num_rounds'] and module.CEILING_RUN in block.ceiling_reference
  config = module.get_config('method=p_fedsam,eps=inf,seed=0')
  for field in ('dataset', 'model', 'partition', 'num_clients', 'classes_per_client', 'num_rounds',
                'sampling_rate', 'method', 'seed', 'validation_fraction'):
    assert ran[field] == config[field], field
  assert ran['classes_per_client'] == 5 and not block.ceiling_of_block


def test_the_general_report_reads_a_rows_final_runs_but_not_its_trials(published):
  from experiments import report  # pylint: disable=import-outside-toplevel
  root, _, _ = published
  workdirs = {os.path.relpath(r.workdir, root) for r in report.load_runs(os.path.join(root, CONFIG))}
  assert os.path.join(CONFIG, 'dp2fedsam', 'final', 'seed=0') in workdirs
  assert not any('trial=' in w for w in workdirs), workdirs


def test_the_readme_table_tallies_each_rows_claims(published):
  _, out, _ = published
  results = fair_report.read_block(os.path.join(out, 'runs'), BLOCK)
  epsilons = {r.name: (0.9, 1.04, None) for r in BLOCK.rows}
  lines = fair_report.readme_lines(BLOCK, results, epsilons, None)
  # DP2-FedSAM on top: holds against CENTAUR, level with DP-FedSAM, 3 rows without 3 seeds.
  assert _row(lines, 'DP2-FedSAM') == ['90.50 ± 0.50', '0.25', '1.04', '1 / 1 / 0 (3 undecided)']
  # A row whose K was published with its bound shows that bound and its K.
  epsilons['dp2fedsam'] = (1.02, 1.15, 5)
  lines = fair_report.readme_lines(BLOCK, results, epsilons, None)
  assert _row(lines, 'DP2-FedSAM') == ['90.50 ± 0.50', '0.25', '1.15 (K = 5)', '1 / 1 / 0 (3 undecided)']
  assert lines[-1].endswith(f'**{fair_report.regime(BLOCK, results, None)}**.')


def _row(lines, name):
  """The cells, left to right, of the table row whose first column (the method) is `name`, the
  method's own cell left out."""
  (table,) = markdown_tables(lines, 'method')
  return next(list(row.values())[1:] for row in table if row['method'] == name)


def test_the_claims_table_lists_every_claim_of_every_block_once():
  """docs/benchmark.md's fair-claims block (generated): one row a block, each claim's pair in it."""
  (table,) = markdown_tables(fair_pages.claims_lines(), 'block')
  claims_column = list(table[0])[1]  # the one column beside the block's
  rows = {row['block'].strip('()'): row[claims_column] for row in table}
  assert set(rows) == set(fair_benchmark.BLOCK_CONFIGS)
  for letter in fair_benchmark.BLOCK_CONFIGS:
    _, _, block = fair_benchmark.load_block(letter)
    listed = {(part.split(' > ')[0], worse) for part in rows[letter].split('; ')
              for worse in part.split(' > ')[1].split(', ')}
    assert listed == {(c.better, c.worse) for c in block.claims}, letter


def test_publishing_writes_the_page_the_report_writes():
  """launch.fair_benchmark --publish and python3 -m experiments.report write one page per block."""
  out_root = os.path.join(fair_benchmark.ROOT_DIR, 'experiments', 'results')
  for letter in fair_benchmark.BLOCK_CONFIGS:
    directory = fair_benchmark.published_dir(out_root, letter)
    if not os.path.exists(os.path.join(directory, 'runs', 'benchmark.json')):
      continue  # not published yet (block (e) while its sweep runs)
    page = os.path.join(directory, 'results.md')
    with open(page) as f:
      assert f.read() == fair_benchmark.results_text(letter, out_root), page


def test_a_row_whose_k_sets_the_bound_gets_its_naive_composition_and_the_others_the_selection(
    published):
  # launch.tune publishes K (num_trials) only where K's naive composition exceeds the selection
  # epsilon: once K is known (a search's wall time tells it roughly) that is the bound.
  _, out, _ = published
  tuning_path = os.path.join(out, 'runs', 'dp2fedsam', 'tuning.json')
  with open(tuning_path) as f:
    tuning = json.load(f)
  results = fair_report.read_block(os.path.join(out, 'runs'), BLOCK)
  path, module, block = fair_benchmark.load_block('a')
  search, one, with_run = fair_benchmark.selection_epsilons(path, module, block, block.rows[0])
  assert fair_benchmark.row_epsilons(path, module, block, results)['dp2fedsam'] == (
      search, with_run, None)
  _write(tuning_path, {**tuning, 'num_trials': 5, 'epsilon_bound': 1.021})
  results = fair_report.read_block(os.path.join(out, 'runs'), BLOCK)
  epsilons = fair_benchmark.row_epsilons(path, module, block, results)
  bound, bound_with_run, k = epsilons['dp2fedsam']
  assert (bound, k) == (1.021, 5) and with_run < bound_with_run < with_run + one
  assert all(epsilons[r.name] == (search, with_run, None) for r in block.rows if r.name != 'dp2fedsam')
  (table,) = markdown_tables(fair_report.row_lines(block, results, epsilons), 'row', 'ε of the search')
  assert next(r for r in table if r['row'] == 'dp2fedsam')['ε of the search'] == '1.021 (K = 5)'


def test_a_selection_at_the_end_of_its_range_is_marked():
  assert fair_report.at_edge(('log_uniform', 0.005, 0.2), 0.005766)   # 3.9 % up the log range
  assert not fair_report.at_edge(('log_uniform', 0.02, 0.5), 0.0244)  # 6.2 %
  assert fair_report.at_edge(('uniform', 0.1, 0.8), 0.79) and not fair_report.at_edge(('choice', [1, 2]), 1)
  text = fair_report._values_text({'local.lr_shared': 0.005766, 'dp.clip_norm': 0.0244},  # pylint: disable=protected-access
                                  BLOCK.ranges)
  assert text == 'clip_norm 0.0244, lr_shared 0.005766 (edge)'


def test_a_fresh_root_seeded_from_the_published_files_never_searches_again(tmp_path, monkeypatch):
  """--seed_from: the published search counts as done (no second search: the secret stayed with its
  root, and a new one would spend the privacy again), its finished final runs are copied and the
  others run; a published plan other than the block's is refused."""
  from launch import sweep, tune  # pylint: disable=import-outside-toplevel
  out_root = str(tmp_path / 'results')
  source = os.path.join(fair_benchmark.published_dir(out_root, 'a'), 'runs')
  _, study, _, spec = tune.load_study(os.path.join(fair_benchmark.ROOT_DIR, PATH), 'dp2fedsam')
  row = BLOCK.row('dp2fedsam')
  selected = {f: law[1][0] if law[0] == 'choice' else law[1]
              for f, law in BLOCK.study(row)['space'].items()}
  _write(os.path.join(source, 'dp2fedsam', 'tuning.json'), {
      'status': 'done', 'plan': tune.public_plan(spec, study, PATH, []), 'selected_values': selected,
      'selection_epsilon': 0.9, 'per_trial_epsilon': 0.4})
  monkeypatch.setattr(tune, 'tune', lambda *a, **k: pytest.fail('searched again'))
  root = str(tmp_path / 'root')
  runs = fair_benchmark.final_runs(root, PATH, *fair_benchmark.load_block('a')[1:], row, selected)
  committed = runs[0][0]  # seed 0 finished and published: its sweep.json, config and metrics
  published_run = os.path.join(source, 'dp2fedsam', 'final', 'seed=0')
  _write(os.path.join(published_run, 'sweep.json'), {
      'config': PATH, 'config_name': CONFIG, 'args': committed.args, 'overrides': list(committed.overrides)})
  _write(os.path.join(published_run, 'config.json'), {'num_rounds': 200})
  _write(os.path.join(published_run, 'metrics.jsonl'), [{'round': 200, 'test_accuracy': 0.9}])
  executed = []
  monkeypatch.setattr(sweep, 'execute', lambda p, rs, *a: executed.extend(
      (r.workdir, os.path.exists(os.path.join(r.workdir, 'metrics.jsonl'))) for r in rs) or {})
  entry = fair_benchmark.run_row('a', 'dp2fedsam', root, 1, source)
  assert entry['selected_values'] == selected and entry['selection_epsilon'] == 0.9
  assert [done for _, done in executed] == [True, False, False]  # seed 0 seeded, 1 and 2 to run
  # A published plan the block no longer declares is refused, not run.
  other = str(tmp_path / 'root2')
  _write(os.path.join(other, CONFIG, 'dp2fedsam', 'tuning.json'), {
      'status': 'done', 'plan': {'study': 'dp2fedsam', 'space': {}}, 'selected_values': selected})
  with pytest.raises(ValueError, match='another plan'):
    fair_benchmark.run_row('a', 'dp2fedsam', other, 1)


def test_a_block_with_nothing_published_yet_runs_under_seed_from(tmp_path, monkeypatch):
  """--seed_from=<out root> before the block's first --publish: nothing to seed, the rows run (the
  final seeds of block (a5)'s first row once stopped on 'no such directory'); a root that does not
  exist at all is a typo, refused."""
  from launch import sweep, tune  # pylint: disable=import-outside-toplevel
  row = BLOCK.row('dp2fedsam')
  selected = {f: law[1][0] if law[0] == 'choice' else law[1]
              for f, law in BLOCK.study(row)['space'].items()}
  monkeypatch.setattr(tune, 'tune', lambda *a, **k: {'selected_values': selected})
  executed = []
  monkeypatch.setattr(sweep, 'execute', lambda p, rs, *a: executed.extend(r.workdir for r in rs) or {})
  out_root = tmp_path / 'results'
  out_root.mkdir()
  fair_benchmark.run_block('a', str(tmp_path / 'root'), 1, ['dp2fedsam'], str(out_root))
  assert len(executed) == 3  # its three final seeds
  with pytest.raises(ValueError, match='no such directory'):
    fair_benchmark.run_block('a', str(tmp_path / 'root'), 1, ['dp2fedsam'], str(tmp_path / 'typo'))


def test_a_variant_whose_pins_its_base_row_selected_is_not_searched_and_meets_no_one(
    tmp_path, monkeypatch, capsys):
  """Block (d)'s dp2fedsam_full_ft pins the whole-model fine-tune that dp2fedsam's own search may
  pick. Where that search picked it, the variant runs nothing (a second search would give DP2-FedSAM a
  best-of-two), the plan says so, and the page judges only the base row; where it picked the head
  re-fit, or the variant's own search has begun, the variant is searched as declared."""
  from launch import sweep, tune  # pylint: disable=import-outside-toplevel
  path, _, block = fair_benchmark.load_block('d')
  name = fair_benchmark.config_name(path)
  base, variant = block.row('dp2fedsam'), block.row('dp2fedsam_full_ft')
  assert block.base_of(variant) == base and block.base_of(base) is None
  out_root = str(tmp_path / 'results')
  source = os.path.join(fair_benchmark.published_dir(out_root, 'd'), 'runs')

  def base_selects(part):
    _write(os.path.join(source, 'dp2fedsam', 'tuning.json'), {
        'status': 'done', 'selected_values': {'eval.adapt_part': part, 'local.lr_shared': 1.0},
        'selection_epsilon': 4.6, 'per_trial_epsilon': 2.3})

  searched = []
  monkeypatch.setattr(tune, 'tune', lambda p, root, row, **k: searched.append(row) or {})
  monkeypatch.setattr(sweep, 'execute', lambda *a: pytest.fail('a final run of the variant'))
  base_selects('full')
  root = str(tmp_path / 'root')
  entry = fair_benchmark.run_row('d', variant.name, root, 1, source)
  assert entry['subsumed_by'] == 'dp2fedsam' and searched == [] and entry['final_runs'] == {}
  assert entry['note'] == fair_report.subsumed_text(variant, base)
  fair_benchmark.print_plan(['d'], root, out_root)
  line = next(l for l in capsys.readouterr().out.splitlines() if variant.name in l)
  assert 'not searched' in line and 'CPU h' not in line
  assert not any(r.name == variant.name and hours for r, _, _, hours, _, _ in
                 fair_benchmark.block_plan('d', root, out_root)['rows'])
  # The page: the base row's finals, the variant's line, no claim of the variant's.
  for row, accuracy in (('dp2fedsam', 0.36), ('centaur', 0.30), ('dp_fedavg', 0.32)):
    for seed in range(3):
      run = os.path.join(source, row, 'final', f'seed={seed}')
      _write(os.path.join(run, 'config.json'), {'num_rounds': 1000})
      _write(os.path.join(run, 'metrics.jsonl'),
             [{'round': 1000, 'test_accuracy_pooled': accuracy + seed / 1000}])
  results = fair_report.read_block(source, block)
  assert fair_report.subsumed(block, results) == {variant.name: base}
  pairs = [(e['better'].name, e['worse'].name) for e in fair_report.verdicts(block, results)]
  assert pairs == [('dp2fedsam', 'centaur'), ('dp2fedsam', 'dp_fedavg'), ('centaur', 'dp_fedavg')]
  assert fair_report.regime(block, results, 51.99) == 'test'  # the variant's missing seeds wait for no one
  epsilons = fair_benchmark.row_epsilons(path, *fair_benchmark.load_block('d')[1:], results)
  table = '\n'.join(fair_report.row_lines(block, results, epsilons))
  assert fair_report.subsumed_text(variant, base) in table
  readme = fair_report.readme_lines(block, results, epsilons, 51.99)
  assert sum('variant' in l for l in readme if l.startswith('|')) == 0
  assert any(l.startswith(f'{variant.name}: not searched') for l in readme)
  # The base chose the head re-fit: the variant is searched, as declared.
  base_selects('head')
  fair_benchmark.run_row('d', variant.name, str(tmp_path / 'root2'), 1, source)
  assert searched == [variant.name]
  assert fair_report.subsumed(block, fair_report.read_block(source, block)) == {}
  # The variant's own search has begun (its tuning.json under root): it goes on, whatever the base.
  base_selects('full')
  _write(os.path.join(str(tmp_path / 'root3'), name, variant.name, 'tuning.json'), {'status': 'running'})
  fair_benchmark.run_row('d', variant.name, str(tmp_path / 'root3'), 1, source)
  assert searched == [variant.name] * 2


def test_the_sweep_continues_from_the_published_blocks_unless_told_to_start_from_scratch(monkeypatch):
  """--seed_from defaults to this checkout's experiments/results, so that `launch.fair_benchmark
  --root=<fresh root>` never searches a published row again (a second privacy spend); '' turns it off."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  seen, caches = [], []
  monkeypatch.setattr(fair_benchmark, 'run_block', lambda letter, root, parallel, rows, seed_from, **_:
                      seen.append(seed_from))
  # The rows' programs compile in this process: they share the root's cache (not this test's).
  monkeypatch.setattr(fair_benchmark.sweep, 'enable_program_cache', caches.append)
  for argv, expected in (([], fair_benchmark.PUBLISHED_ROOT), (['--seed_from='], None)):
    fv = flags.FlagValues()
    fair_benchmark.define_flags(fv)
    fv(['fair_benchmark', '--root=/tmp/unused', '--blocks=d', *argv])
    monkeypatch.setattr(fair_benchmark, 'FLAGS', fv)
    fair_benchmark.main(['fair_benchmark'])
    assert seen.pop() == expected and caches.pop() == '/tmp/unused'
  assert os.path.isdir(os.path.join(fair_benchmark.PUBLISHED_ROOT, CONFIG, 'runs'))


def test_the_last_rounds_table_reads_each_seeds_loss_windows_metric_gain_and_clip():
  """T = 200: loss windows 161-180 and 181-200 (T / 10 each), the metric from round 150 to 200, the
  clip, the signal-to-noise ratio and the noise on the mean over rounds 151-200 and only for a
  private run, that noise times each seed's server lr; the mean over the finished seeds."""
  def seed(loss_before, loss_last, gain, clipped, epsilon=1.0):
    rounds = [{'round': t, 'train_loss': loss_before if t <= 180 else loss_last,
               'clipped_fraction': 0.0 if t <= 150 else clipped, 'mean_update_norm': 2.0,
               'signal_to_noise': 9.0 if t <= 150 else clipped / 100, 'noise_std': 0.01}
              for t in range(141, 201)]
    rounds[-1]['train_loss'] = None  # a round with no finite client is left out, not counted as 0
    evaluations = [{'round': 150, 'test_accuracy': 0.5, 'epsilon': epsilon},
                   {'round': 200, 'test_accuracy': 0.5 + gain, 'epsilon': epsilon}]
    return evaluations, rounds

  row = BLOCK.row('dp2fedsam')
  result = fair_report.RowResult(row, None, {0: 0.6, 1: 0.5},
                                 {0: seed(1.0, 0.8, 0.10, 0.4), 1: seed(2.0, 1.6, 0.0, 0.2)},
                                 {0: 1.0, 1: 0.5})
  end = fair_report.run_ends(result, 'test_accuracy')
  assert (end['width'], end['last']) == (20, 200)
  assert end['loss_before'] == pytest.approx(1.5) and end['loss_last'] == pytest.approx(1.2)
  assert end['metric_gain'] == pytest.approx(0.05) and end['clipped_fraction'] == pytest.approx(0.3)
  assert end['signal_to_noise'] == pytest.approx(0.003)  # rounds 151-200 only
  assert end['step_noise'] == pytest.approx(0.0075)  # (1.0 x 0.01 + 0.5 x 0.01) / 2
  empty = lambda r: fair_report.RowResult(r, None, {})
  diverged = fair_report.RowResult(BLOCK.row('dp_fedavg'), None, {0: 0.1},
                                   {0: seed(2.5e30, 1.234567e35, 0.0, 1.0)}, {0: 1.0})
  results = {r.name: empty(r) for r in BLOCK.all_rows()} | {row.name: result,
                                                             'dp_fedavg': diverged}
  results[BLOCK.ceiling.name] = fair_report.RowResult(
      BLOCK.ceiling, None, {0: 0.6}, {0: seed(1.0, 0.8, 0.10, 0.4, epsilon=float('inf'))})
  (table,) = markdown_tables(fair_report.end_lines(BLOCK, results), 'row', 'clipped fraction')
  # The loss column names its two windows, the metric column its lookback: found by what they hold.
  loss = next(c for c in table[0] if c.startswith('train loss'))
  assert re.findall(r'\d+', loss) == ['161', '180', '181', '200']
  gain = next(c for c in table[0] if c.startswith(BLOCK.metric))
  columns = ('seeds', loss, gain, 'clipped fraction', 'pre-clip update norm', 'signal-to-noise',
             'noise per weight a step')
  assert {r['row']: [r[c] for c in columns] for r in table} == {  # centaur: no finished seed, no row
      'dp2fedsam': ['2', '1.5000 → 1.2000', '+5.00', '0.30', '2', '0.0030', '0.0075'],
      BLOCK.ceiling.name: ['1', '1.0000 → 0.8000', '+10.00', '–', '–', '–', '–'],
      'dp_fedavg': ['1', '2.5e+30 → 1.235e+35', '+0.00', '1.00', '2', '0.0100', '0.0100']}
  assert fair_report.end_lines(BLOCK, {r.name: empty(r) for r in BLOCK.all_rows()}) == []
