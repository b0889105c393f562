"""The committed results are generated: `python3 -m experiments.report --check` rebuilds every page,
plot and README block from the committed runs and names any difference; the numbers it writes are
recomputed here from the runs' own files."""

import json
import os
import re
import shutil

import numpy as np
import pytest

from dp2fedsam_jax import metric_writers
from experiments.report import fair, fair_pages, generated, tuning

REPO = generated.REPO
RESULTS = os.path.join(REPO, generated.RESULTS)


PUBLISHED = fair_pages.published_blocks(RESULTS)


def _published(letter):
  return next(p for p in PUBLISHED if p.letter == letter)


def test_every_generated_file_is_what_the_committed_runs_give():
  assert generated.check() == []


@pytest.fixture(scope='module')
def copy(tmp_path_factory):
  """The files with generated blocks and experiments/results copied (what the check compares)."""
  root = tmp_path_factory.mktemp('repo')
  shutil.copytree(RESULTS, root / generated.RESULTS)
  for path in generated.blocks(REPO):
    os.makedirs(root / os.path.dirname(path), exist_ok=True)
    shutil.copyfile(os.path.join(REPO, path), root / path)
  return root


def _edit(path, old, new):
  with open(path) as f:
    text = f.read()
  assert old in text
  with open(path, 'w') as f:
    f.write(text.replace(old, new, 1))
  return text


def test_an_edited_number_in_a_copy_is_caught_with_its_block_and_line(copy):
  mean = 100 * _published('a').results['dp2fedsam'].stats[0]
  readme = copy / 'README.md'
  original = _edit(readme, f'{mean:.2f}', f'{mean + 0.01:.2f}')
  try:
    problems = generated.check(str(copy), source=REPO)
  finally:
    readme.write_text(original)
  assert len(problems) == 1 and problems[0].startswith('README.md:')
  assert '(block findings)' in problems[0] and f'{mean + 0.01:.2f}' in problems[0]


def test_an_edited_page_or_a_missing_plot_is_caught_and_the_check_writes_nothing(copy):
  page = copy / generated.RESULTS / 'fair_c_pfeddsu' / 'results.md'
  plot = copy / generated.RESULTS / 'fair_c_pfeddsu' / fair_pages.PLOT_FILE
  before = {p: p.stat().st_mtime_ns for p in (copy / 'README.md', page)}
  original = _edit(page, '| 3 |', '| 2 |')
  plot.rename(plot.with_suffix('.bak'))
  try:
    problems = generated.check(str(copy), source=REPO)
  finally:
    page.write_text(original)
    plot.with_suffix('.bak').rename(plot)
  assert [p.split(':')[0] for p in problems] == [
      f'{generated.RESULTS}/fair_c_pfeddsu/results.md', f'{generated.RESULTS}/fair_c_pfeddsu/rows.png']
  assert (copy / 'README.md').stat().st_mtime_ns == before[copy / 'README.md']


def test_a_marker_without_a_generator_is_an_error():
  with pytest.raises(ValueError, match="no generator for the block 'nothing'"):
    generated._replace('<!-- BEGIN GENERATED nothing -->\n<!-- END GENERATED nothing -->\n', {}, 'X')
  with pytest.raises(ValueError, match=r"no markers for the generated blocks \['methods'\]"):
    generated._replace('text\n', {'methods': []}, 'X')


def test_the_readmes_state_no_number_outside_their_generated_blocks():
  for path in ('README.md', os.path.join(generated.RESULTS, 'README.md'),
               os.path.join('benchmarks', 'README.md')):
    with open(os.path.join(REPO, path)) as f:
      assert generated.is_number_free(f.read()), path
  assert not generated.is_number_free('DP²-FedSAM ends at 93.38 %.\n')


def test_the_readmes_stay_short():
  with open(os.path.join(REPO, 'README.md')) as f:
    assert len(f.read().splitlines()) <= 200
  with open(os.path.join(RESULTS, 'README.md')) as f:
    assert len(f.read().splitlines()) <= 400


def _final_accuracies(block_dir, row, metric):
  """{seed: the metric at the final round} read straight from each final run's metrics.jsonl."""
  out = {}
  finals = os.path.join(block_dir, 'runs', row, 'final')
  for name in sorted(os.listdir(finals)):
    records = metric_writers.read_jsonl(os.path.join(finals, name, metric_writers.EVAL_FILE))
    out[int(name[5:])] = records[-1][metric]
  return out


@pytest.mark.parametrize('letter', ['a', 'a5', 'b', 'c', 'd'])
def test_each_blocks_readme_row_is_its_final_runs_mean_and_seed_std(letter):
  published = _published(letter)
  lines = generated._generated(REPO)[1][os.path.join(generated.RESULTS, 'README.md')]['fair-blocks']
  skipped = fair.subsumed(published.block, published.results)
  for row in published.block.rows:
    if row.name in skipped:
      continue
    values = 100 * np.array(list(_final_accuracies(published.directory, row.name,
                                                   published.block.metric).values()))
    cell = f'{values.mean():.2f} ± {values.std(ddof=1):.2f}'
    assert any(line.startswith(f'| {row.paper_row or row.name}') and f'| {cell} |' in line
               for line in lines), (letter, row.name, cell)


def test_a_paper_form_prints_not_covered_and_a_shared_seed_search_is_marked():
  published = _published('b')
  results, epsilons = published.results, fair.block_epsilons(published.block, published.results)
  table = fair.row_lines(published.block, results, epsilons)
  topk = next(line for line in table if line.startswith('| dp_fedsam_topk ('))
  assert topk.count(fair.NOT_COVERED) == 2 and fair.SHARED_SEED not in topk
  dp_fedsam = next(line for line in table if line.startswith('| dp_fedsam |'))
  assert dp_fedsam.count(fair.SHARED_SEED) == 2 and fair.SHARED_SEED_NOTE in table
  # The mark is the files' doing: the selected trial's config.seed is a final run's seed.
  result = results['dp_fedsam']
  with open(os.path.join(published.runs, 'dp_fedsam', result.tuning['selected_run'],
                         'config.json')) as f:
    assert json.load(f)['seed'] in result.accuracy
  # Runs that know config.training_seed (each trial its own secret seed) are not marked.
  fresh = {seed: {**config, 'training_seed': None} for seed, config in result.configs.items()}
  assert not fair._shared_seed(os.path.join(published.runs, 'dp_fedsam'), result.tuning, fresh)
  page = fair_pages.page_text(published, PUBLISHED)
  assert page.count(fair.COMPOSE_NOTE) == 1


def test_without_a_shared_seed_or_a_leak_the_search_epsilon_stands_alone():
  published = _published('a')
  result = published.results['dp2fedsam']
  clean = fair.RowResult(result.row, result.tuning, result.accuracy, result.records,
                         result.server_lr, result.configs)
  search, with_run, k = fair.search_epsilons(clean)
  assert fair.search_texts(clean, (search, with_run, k), 3) == (f'{search:.3f}', f'{with_run:.3f}')
  assert k is None and search == result.tuning['selection_epsilon'] < with_run


def test_the_older_searches_files_say_no_finite_epsilon_covers_them():
  found = []
  for name in generated.STUDIES:
    for directory, record in tuning.load_tunings(os.path.join(RESULTS, name)):
      if record.get('private') is False:
        continue
      found.append(directory)
      assert record['covered_by'] == tuning.NO_FINITE_EPSILON
      assert all(record[k] is None for k in ('selection_epsilon', 'naive_epsilon',
                                             'cost_on_private_clients', 'per_trial_epsilon'))
      text = json.dumps(record)
      assert not re.search(r'naive (bound|epsilon) holds|K known', text), directory
  assert len(found) == 3


def test_the_program_exits_1_and_prints_each_difference_with_check(monkeypatch, capsys):
  from experiments.report import __main__ as program  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(generated, 'check', lambda: ['README.md:7 (block findings): committed ...'])
  assert program.committed(check=True) == 1
  assert 'README.md:7 (block findings)' in capsys.readouterr().out
  monkeypatch.setattr(generated, 'check', lambda: [])
  assert program.committed(check=True) == 0
