"""The fair benchmark's published blocks (experiments/results/fair_*): each found by its
runs/benchmark.json, its page (results.md) and its plot (every row's accuracy over its final seeds,
the seed std as a bar, the ceiling as a line), all from the committed files alone."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os

from experiments.report import fair, fair2
from experiments.report.workdirs import read_json

SUMMARY_FILE = 'benchmark.json'  # launch/fair_benchmark.py's, in each block's runs/
PLOT_FILE = 'rows.png'
PLOT_DATA_KEY = 'dp2fedsam_plot'  # the PNG text chunk holding the data a plot was drawn from


@dataclasses.dataclass(frozen=True)
class Published:
  """A block as committed: its letter, config name (= its directory), Block and row results."""
  letter: str
  config_name: str
  block: object
  results: dict
  directory: str

  @property
  def runs(self) -> str:
    return os.path.join(self.directory, 'runs')


def _block_of(config_name: str):
  return importlib.import_module(f'experiments.configs.{config_name}').BLOCK


def published_blocks(results_root: str) -> tuple:
  """Every block published under results_root, by its letter ((a)'s next step (a5) after it)."""
  found = []
  for name in os.listdir(results_root):
    summary = os.path.join(results_root, name, 'runs', SUMMARY_FILE)
    if os.path.exists(summary):
      block = _block_of(name)
      directory = os.path.join(results_root, name)
      found.append(Published(read_json(summary)['block'], name, block,
                             fair.read_block(os.path.join(directory, 'runs'), block), directory))
  return tuple(sorted(found, key=lambda p: (p.letter[0], len(p.letter))))


def claims_lines() -> list[str]:
  """docs/benchmark.md's `fair-claims` block: the orders each block judges (its config's claims),
  every block of experiments/configs/fair_*.py, published or not."""
  configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
  blocks = sorted((_block_of(name[:-len('.py')]) for name in os.listdir(configs)
                   if name.startswith('fair_') and name.endswith('.py')),
                  key=lambda b: (b.name[0], len(b.name)))
  lines = ['| block | the paper claims A > B for |', '|---|---|']
  for block in blocks:
    beats = {}  # better -> [worse, ...] in the order the config declares them
    for claim in block.claims:
      beats.setdefault(claim.better, [])
      if claim.worse not in beats[claim.better]:
        beats[claim.better].append(claim.worse)
    lines.append(f'| ({block.name}) | '
                 + '; '.join(f"{better} > {', '.join(worse)}" for better, worse in beats.items())
                 + ' |')
  return lines


def ceiling(published: Published, blocks: tuple) -> float | None:
  """The block's ceiling in points: its own ceiling row's seed, another block's of `blocks`
  (Block.ceiling_of_block) or a committed reference (Block.ceiling_accuracy)."""
  block = published.block
  if block.ceiling is None and not block.ceiling_of_block:
    return block.ceiling_accuracy
  owner = next(p for p in blocks
               if p.letter == (block.ceiling_of_block or published.letter))
  mean, _, seeds = owner.results[owner.block.ceiling.name].stats
  return 100 * mean if seeds else None


def page_text(published: Published, blocks: tuple) -> str:
  """The block's results.md: settings, its table, the regime rule, the claims and the last rounds
  (a second-design block: experiments/report/fair2.py's page)."""
  block, results = published.block, published.results
  if block.design == 2:
    return '\n'.join([
        f'# Fair benchmark, block ({published.letter}) (docs/benchmark.md section 5)', '',
        'Written by `python3 -m experiments.report` from the files under runs/.', '',
        f'![every row\'s tuning curve]({PLOT_FILE})', '',
        *fair2.page_lines(block, results, fair2.row_entries(published.runs, block))])
  epsilons = fair.block_epsilons(block, results)
  top = ceiling(published, blocks)
  return '\n'.join([
      f'# Fair benchmark, block ({published.letter}) (docs/benchmark.md)', '',
      'Written by `python3 -m experiments.report` from the files under runs/ (a row appears as its '
      'search and seeds finish).', '',
      f'![every row at its final seeds]({PLOT_FILE})', '',
      *fair.block_lines(block, published.config_name, results, epsilons, top),
      '### The summary table (experiments/results/README.md)', '',
      *fair.readme_lines(block, results, epsilons, top), ''])


def plot_data(published: Published, blocks: tuple) -> dict:
  """What the block's plot draws: each row's seeds, mean and std (points), and the ceiling (a
  second-design block: its rows' tuning curves)."""
  block, results = published.block, published.results
  if block.design == 2:
    return fair2.plot_data(published)
  skipped = fair.subsumed(block, results)
  rows = []
  for r in block.rows:
    result = results[r.name]
    if r.name in skipped or not result.accuracy:
      continue
    mean, std, _ = result.stats
    label = (r.paper_row or r.name) + (' (paper form)' if result.caveat else
                                       ' (covered form)' if r.mark else '')
    rows.append({'row': label, 'seeds': [round(100 * result.accuracy[s], 4)
                                         for s in sorted(result.accuracy)],
                 'mean': round(100 * mean, 4), 'std': None if math.isnan(std) else round(100 * std, 4)})
  top = ceiling(published, blocks)
  return {'title': f'block ({published.letter}): {block.paper}', 'metric': block.metric,
          'rows': rows, 'ceiling': None if top is None else round(top, 4)}


def draw_plot(data: dict, path: str) -> None:
  """Rows top to bottom as the block lists them: each seed a dot, the mean a diamond with its seed
  std as a bar, the ceiling a dashed line. The data go into the PNG as text (PLOT_DATA_KEY), so
  that a check compares what was drawn, not the bytes of a rendering."""
  metadata = {PLOT_DATA_KEY: json.dumps(data, sort_keys=True), 'Software': None}
  if data.get('kind') == 'tuning_curves':
    fair2.draw_curves(data, path, metadata)
    return
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  rows = data['rows']
  fig, ax = plt.subplots(figsize=(7.0, 1.2 + 0.45 * len(rows)), dpi=120)
  for y, row in enumerate(rows):
    ax.plot(row['seeds'], [y] * len(row['seeds']), 'o', color='tab:gray', markersize=4, alpha=0.7)
    ax.errorbar([row['mean']], [y], xerr=[row['std'] or 0.0], fmt='D', color='tab:blue', capsize=4)
  if data['ceiling'] is not None:
    ax.axvline(data['ceiling'], color='tab:red', linestyle='--',
               label=f"non-private ceiling {data['ceiling']:.2f} %")
    ax.legend(fontsize=8, loc='lower left')
  ax.set_yticks(range(len(rows)))
  ax.set_yticklabels([row['row'] for row in rows], fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel(f"{data['metric']} at the final round (%): seeds (dots), mean ± seed std")
  ax.set_title(data['title'], fontsize=9)
  ax.grid(axis='x', alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, metadata=metadata)
  plt.close(fig)


def drawn_data(path: str) -> dict | None:
  """The data a plot of draw_plot was drawn from (None: no such plot, or none recorded)."""
  if not os.path.exists(path):
    return None
  from PIL import Image  # pylint: disable=import-outside-toplevel
  with Image.open(path) as image:
    text = getattr(image, 'text', {}).get(PLOT_DATA_KEY)
  return None if text is None else json.loads(text)
