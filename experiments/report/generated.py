"""The committed results as generated files: each study's page and plots, each fair block's page
and plot, and the tables of README.md and experiments/results/README.md between
`<!-- BEGIN GENERATED name -->` and `<!-- END GENERATED name -->` lines.

`python3 -m experiments.report` writes them all from the committed runs; `python3 -m
experiments.report --check` rebuilds them in memory and names the first difference. Texts are
compared line for line; a fair block's plot by the data it was drawn from (kept in the PNG), not by
its bytes (a rendering changes with the matplotlib version); a study's plots by their presence.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re

from experiments.configs import fair_e_design2
from experiments.report import benchmark_tables, fair2, fair_pages, findings, privacy_tables
from experiments.report.plots import plot_plan
from experiments.report.rules import seed_rule
from experiments.report.summary import summarize
from experiments.report.tables import tables_text
from experiments.report.tuning import NO_FINITE_EPSILON, load_tunings, tuning_lines
from experiments.report.workdirs import format_value, load_runs
from experiments.studies import fair2_pilot

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join('experiments', 'results')
# Each study's page: its directory under RESULTS and the reference method of its gap table.
STUDIES = {'fashion_mnist_methods': 'dp2fedsam', 'fmnist_bandmf_regime': 'dp2fedsam',
           'fmnist_paper_regime': 'dp2fedsam', 'fmnist_tuning': 'dp2fedsam',
           'shakespeare': 'dp2fedsam', 'shakespeare_field': 'fedavg'}
BEGIN, END = '<!-- BEGIN GENERATED {} -->', '<!-- END GENERATED {} -->'
MARKER = re.compile(r'<!-- BEGIN GENERATED ([\w-]+) -->\n(.*?)<!-- END GENERATED \1 -->', re.S)


@dataclasses.dataclass(frozen=True)
class Study:
  """A study's runs summarized as its page shows them."""
  name: str
  markdown: str
  csv: str
  rows: tuple
  plots: tuple  # paths relative to the repository


@functools.lru_cache(maxsize=None)
def study(name: str, repo: str = REPO) -> Study:
  """The study's results.md and results.csv (launch.sweep's runs and launch.tune's tunings under
  its runs/, the finished ones), its rows and the paths of its plots."""
  out = os.path.join(repo, RESULTS, name)
  root = os.path.join(out, 'runs')
  runs = [r for r in load_runs(root) if r.finished or r.failed]
  tunings = load_tunings(root)
  if not runs:
    return Study(name, '\n'.join(['# Results', ''] + tuning_lines(tunings, root)), '', (), ())
  rows = summarize(runs)
  markdown, table = tables_text(rows, STUDIES[name])
  plotted = [r for r in runs if r.records and not r.failed and not r.protocol]
  plots = tuple(os.path.relpath(path, repo) for path, _ in plot_plan(plotted, out))
  markdown += '\n'.join([''] + tuning_lines(tunings, root))
  markdown += '\n## Plots\n\n' + '\n'.join(
      f'![{os.path.relpath(p, out)}]({os.path.relpath(p, out)})'
      for p in (os.path.join(repo, q) for q in plots)) + '\n'
  return Study(name, markdown, table, tuple(rows), plots)


def pages(repo: str = REPO) -> dict:
  """{path relative to the repository: text} of every generated page."""
  out = {}
  for name in STUDIES:
    page = study(name, repo)
    out[os.path.join(RESULTS, name, 'results.md')] = page.markdown
    if page.csv:
      out[os.path.join(RESULTS, name, 'results.csv')] = page.csv
  published = fair_pages.published_blocks(os.path.join(repo, RESULTS))
  for block in published:
    out[os.path.relpath(os.path.join(block.directory, 'results.md'), repo)] = (
        fair_pages.page_text(block, published))
  return out


def fair_plots(repo: str = REPO) -> dict:
  """{path relative to the repository: the data the plot draws} of every fair block."""
  published = fair_pages.published_blocks(os.path.join(repo, RESULTS))
  return {os.path.relpath(os.path.join(p.directory, fair_pages.PLOT_FILE), repo):
          fair_pages.plot_data(p, published) for p in published}


def blocks(repo: str = REPO) -> dict:
  """{file relative to the repository: {block name: its lines}}: the generated parts of the three
  READMEs, docs/privacy.md and docs/benchmark.md."""
  published = fair_pages.published_blocks(os.path.join(repo, RESULTS))
  paper = study('fmnist_paper_regime', repo)
  field = study('shakespeare_field', repo)
  return {
      'README.md': {'methods': findings.methods_lines(),
                    'findings': findings.findings_lines(published)},
      os.path.join(RESULTS, 'README.md'): {
          'fair-blocks': findings.fair_block_lines(published),
          'hand-tuned-fmnist': hand_tuned_fmnist_lines(paper.rows),
          'hand-tuned-shakespeare': hand_tuned_shakespeare_lines(field.rows),
          'tunings': tuning_table_lines(repo)},
      os.path.join('docs', 'privacy.md'): {'audit-seeds': privacy_tables.audit_seed_lines(repo),
                                           'selection-costs': privacy_tables.selection_cost_lines()},
      os.path.join('benchmarks', 'README.md'): benchmark_tables.benchmark_blocks(repo),
      os.path.join('docs', 'benchmark.md'): {'fair2-pilot': fair2_pilot.table_lines(repo),
                                             'fair2-edge': fair2_pilot.edge_lines(repo),
                                             'fair2-rank': fair2_pilot.trial_length_lines(repo),
                                             'fair2-law': fair2.law_lines(fair_e_design2.BLOCK),
                                             'fair-claims': fair_pages.claims_lines()},
  }


# ------------------------------------------------------------------ the hand-tuned tables

PAPER_NAMES = {'dp2fedsam': 'DP²-FedSAM', 'centaur': 'CENTAUR', 'dp_fedsam_ft': 'DP-FedSAM-FT',
               'dp_fedavg_ft': 'DP-FedAvg-FT', 'dp_fedsam': 'DP-FedSAM', 'dp_fedavg': 'DP-FedAvg'}
PAPER_EPS = ('0.25', '0.5', '1', '2')


def hand_tuned_fmnist_lines(rows) -> list[str]:
  """Each method at each eps (independent noise, fixed clip): final-round mean ± seed std; bold
  where the seed rule says the row helps against every other row of its column; ² with 2 seeds."""
  cells = {(r.method, r.setting): r for r in rows if r.setting in {f'eps={e}' for e in PAPER_EPS}}
  lines = ['| method | ' + ' | '.join(f'ε = {e}' for e in PAPER_EPS) + ' |',
           '|---|' + '---|' * len(PAPER_EPS)]

  def stats(row):
    return (*row.final_acc, row.num_seeds)

  for method, name in PAPER_NAMES.items():
    out = []
    for eps in PAPER_EPS:
      row = cells.get((method, f'eps={eps}'))
      if row is None:
        out.append('')
        continue
      text = f'{100 * row.final_acc[0]:.2f} ± {100 * row.final_acc[1]:.2f}'
      others = [o for (m, s), o in cells.items() if s == row.setting and m != method]
      if others and all(seed_rule(stats(row), stats(o))[0] == 'helps' for o in others):
        text = f'**{text}**'
      out.append(text + (' ²' if row.num_seeds == 2 else ''))
    lines.append(f'| {name} | ' + ' | '.join(out) + ' |')
  return lines + ['', '(² two seeds; bold: helps against every other row of its column by the rule.)']


ADAPTED = ' [adapt {} 10 ep lr 0.5]'
# The Shakespeare rows after 10 epochs of test-time adaptation: (label, {the non-private setting, or
# 'eps' for every eps setting of the study: the method (with its protocol)}).
SHAKESPEARE_ROWS = (
    ('FedAvg / DP-FedAvg, head fine-tuned from the global one',
     {'default': 'fedavg' + ADAPTED.format('head'), 'eps': 'dp_fedavg' + ADAPTED.format('head')}),
    ('the same trained models, whole model fine-tuned (FedAvg-FT / DP-FedAvg-FT)',
     {'default': 'fedavg' + ADAPTED.format('full'), 'eps': 'dp_fedavg_ft' + ADAPTED.format('auto')}),
    ('personal head trained from scratch (P-FedSAM / DP²-FedSAM, 10 head epochs a visit)',
     {'personal_epochs=10': 'p_fedsam' + ADAPTED.format('auto'),
      'eps': 'dp2fedsam' + ADAPTED.format('auto')}),
    ('the same without SAM on the body (FedRep / CENTAUR)',
     {'personal_epochs=10': 'fedrep' + ADAPTED.format('auto'),
      'eps': 'centaur' + ADAPTED.format('auto')}),
    ('each role alone (local_only, nothing released)', {'default': 'local_only'}),
)


def hand_tuned_shakespeare_lines(rows) -> list[str]:
  """Pooled · mean over roles (%) of each row, non-private and at each eps of the study."""
  by_key = {(r.setting, r.method): r for r in rows}
  eps_settings = sorted({r.setting for r in rows if r.setting.startswith('eps=')},
                        key=lambda s: float(s[4:]))
  lines = ['| row | non-private | ' + ' | '.join(f'ε = {s[4:]}' for s in eps_settings) + ' |',
           '|---|---|' + '---|' * len(eps_settings)]
  stds = []
  for label, where in SHAKESPEARE_ROWS:
    plain = [(s, m) for s, m in where.items() if s != 'eps']
    keys = plain + [(s, where['eps']) for s in eps_settings if 'eps' in where]
    cells = [''] * (1 + len(eps_settings))
    for column, key in enumerate(keys if plain else [None] + keys):
      row = by_key.get(key) if key else None
      if row is None:
        continue
      pooled, pooled_std = row.pooled['test_accuracy_pooled']
      stds.append(max(pooled_std, row.final_acc[1]))
      cells[column] = f'{100 * pooled:.2f} · {100 * row.final_acc[0]:.2f}'
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  return lines + ['', f'(pooled · mean over roles, %; seed stds ≤ {100 * max(stds):.2f} points.)']


def tuning_table_lines(repo: str = REPO) -> list[str]:
  """The older studies' tunings, one row each: what was selected and what covers it."""
  lines = ['| study | tuning | K | selected values | test acc of the selected run | ε |',
           '|---|---|---|---|---|---|']
  for name in STUDIES:
    root = os.path.join(repo, RESULTS, name)
    for directory, tuning in load_tunings(root):
      values = ', '.join(f'{k.split(".")[-1]} {format_value(v)}'
                         for k, v in sorted(tuning['selected_values'].items()))
      covered = ('none (non-private)' if tuning.get('private') is False else
                 'no finite ε' if tuning.get('covered_by') == NO_FINITE_EPSILON else
                 f"{tuning['selection_epsilon']:.3f}")
      lines.append(f"| [{name}]({name}/results.md) | {os.path.relpath(directory, root)} | "
                   f"{tuning.get('num_trials', '–')} "
                   f"| {values} | {findings.selected_accuracy(directory, tuning)} | {covered} |")
  return lines


# ------------------------------------------------------------------ writing and checking

def _replace(text: str, generated: dict, path: str) -> str:
  """The text with each marked block's lines replaced by the generated ones. A marker with no
  generator, or a generator with no marker, is an error."""
  found = set()

  def fill(match):
    name = match.group(1)
    if name not in generated:
      raise ValueError(f'{path}: no generator for the block {name!r}')
    found.add(name)
    return f"{BEGIN.format(name)}\n{chr(10).join(generated[name])}\n{END.format(name)}"

  out = MARKER.sub(fill, text)
  missing = sorted(set(generated) - found)
  if missing:
    raise ValueError(f'{path}: no markers for the generated blocks {missing}')
  return out


@functools.lru_cache(maxsize=None)
def _generated(source: str) -> tuple:
  """(pages, README blocks, fair plots' data) from the runs under `source` (a repository root)."""
  return pages(source), blocks(source), fair_plots(source)


def expected_texts(repo: str = REPO, source: str | None = None) -> dict:
  """{path relative to the repository: the text it should have}: the pages, and the READMEs of
  `repo` with their generated blocks filled from the runs under `source` (default: repo)."""
  texts, readme_blocks, _ = _generated(source or repo)
  out = dict(texts)
  for path, generated in readme_blocks.items():
    with open(os.path.join(repo, path)) as f:
      out[path] = _replace(f.read(), generated, path)
  return out


def _first_difference(path: str, want: str, have: str) -> str:
  want_lines, have_lines = want.split('\n'), have.split('\n')
  for number, (a, b) in enumerate(zip(want_lines, have_lines), 1):
    if a != b:
      block = _block_at(have_lines, number)
      where = f' (block {block})' if block else ''
      return f'{path}:{number}{where}: committed {b!r}, generated {a!r}'
  number = min(len(want_lines), len(have_lines)) + 1
  return f'{path}:{number}: committed {len(have_lines)} lines, generated {len(want_lines)}'


def _block_at(lines: list[str], number: int) -> str:
  """The generated block that line `number` (1-based) lies in ('' for none)."""
  name = ''
  for line in lines[:number]:
    begin, end = re.match(r'<!-- BEGIN GENERATED ([\w-]+) -->', line), line.startswith('<!-- END')
    name = begin.group(1) if begin else '' if end else name
  return name


def check(repo: str = REPO, source: str | None = None) -> list[str]:
  """Every difference between the files under `repo` and what the runs under `source` (default:
  repo) give: one line per file (its first differing line, and the block it lies in) or plot.
  Writes nothing."""
  problems = []
  for path, want in expected_texts(repo, source).items():
    full = os.path.join(repo, path)
    if not os.path.exists(full):
      problems.append(f'{path}: missing')
      continue
    with open(full, newline='') as f:  # results.csv keeps its csv line ends
      have = f.read()
    if have != want:
      problems.append(_first_difference(path, want, have))
  for path, data in _generated(source or repo)[2].items():
    if fair_pages.drawn_data(os.path.join(repo, path)) != data:
      problems.append(f'{path}: not drawn from the committed runs (run python3 -m experiments.report)')
  for name in STUDIES:
    problems += [f'{p}: missing' for p in study(name, source or repo).plots
                 if not os.path.exists(os.path.join(repo, p))]
  return problems


def write(repo: str = REPO) -> list[str]:
  """Writes every page, plot and README block; returns the paths written."""
  written = []
  for path, text in expected_texts(repo).items():
    with open(os.path.join(repo, path), 'w', newline='') as f:
      f.write(text)
    written.append(path)
  for path, data in fair_plots(repo).items():
    fair_pages.draw_plot(data, os.path.join(repo, path))
    written.append(path)
  for name in STUDIES:
    out = os.path.join(repo, RESULTS, name)
    runs = [r for r in load_runs(os.path.join(out, 'runs')) if r.finished or r.failed]
    for path, draw in plot_plan([r for r in runs if r.records and not r.failed and not r.protocol],
                                out):
      os.makedirs(os.path.dirname(path), exist_ok=True)
      draw(path)
      written.append(os.path.relpath(path, repo))
  return written


def is_number_free(text: str) -> bool:
  """Whether `text` (a README outside its generated blocks) states no measured number: digits only
  in code, links, headings' names and versions."""
  plain = MARKER.sub('', text)
  plain = re.sub(r'```.*?```', '', plain, flags=re.S)
  plain = re.sub(r'`[^`]*`|\([^)]*\.md[^)]*\)|\]\([^)]*\)', '', plain)
  return not re.search(r'\d+\.\d+|\d+ ?%', plain)

