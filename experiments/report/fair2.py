"""A second-design block's page (docs/benchmark.md section 5): its rows at five paired seeds, each
row's search measured (tuning curve, the private search's SD), the regime rule and the verdict on
each order the papers claim, by the rule that counts the search's spread
(experiments/studies/search_spread.paired_rule).

Reads what launch/fair_benchmark.py publishes: the rows' final runs (fair.read_row) and each row's
row.json ('selected_score', and 'search': its pool of trials, from which the page recomputes the
tuning curve, the search SD and the pool's best). A row's accuracy at a seed is the mean of its last
FINAL_EVALUATIONS evaluations; a final run that diverged is finished and scores 0 at every
evaluation from its failure on (fair.read_row). A row whose noised selected validation score is at
most chance + NOTHING_TRAINS_MARGIN found nothing that trains: shown, without a verdict.
"""

from __future__ import annotations

import math
import os

import numpy as np

from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.privacy.selection import TrialDistribution
from experiments.report import fair
from experiments.report.summary import mean_std
from experiments.report.workdirs import format_value, read_json
from experiments.studies import search_spread

FINAL_EVALUATIONS = 3
NOTHING_TRAINS_MARGIN = 0.05
NUM_CLASSES = 10  # Fashion-MNIST: chance for a global model
ROW_FILE = 'row.json'


def seed_accuracies(result: fair.RowResult, metric: str) -> dict[int, float]:
  """{seed: the mean of its last FINAL_EVALUATIONS evaluations of `metric`} (fractions)."""
  return {seed: float(np.mean([e[metric] for e in evaluations[-FINAL_EVALUATIONS:]]))
          for seed, (evaluations, _) in sorted(result.records.items())}


def row_entries(runs: str, block) -> dict:
  """{row name: its row.json} of the rows published under `runs` (absent: not there yet), each
  search's tuning curve, SD and best recomputed from its published pool."""
  out = {}
  for row in block.all_rows():
    path = os.path.join(runs, row.name, ROW_FILE)
    if os.path.exists(path):
      entry = read_json(path)
      if entry.get('search') is not None:
        law = TrialDistribution.from_dict(block.trials_of(row))
        entry['search'] = search_spread.recomputed(entry['search'], law)
      out[row.name] = entry
  return out


def chance(row, result: fair.RowResult) -> float:
  """A row's chance accuracy: 1/S for a personal head (each client holds S classes), 1/10 for a
  global model."""
  if not METHODS[row.method].personal_phase:
    return 1 / NUM_CLASSES
  config = next(iter(result.configs.values()), {})
  return 1 / int(config.get('classes_per_client') or NUM_CLASSES)


def trains(row, result: fair.RowResult, entry: dict | None) -> bool | None:
  """Whether the row's search found something that trains (None: its search has not finished, or
  the row is subsumed by another). A search that selected nothing (every trial failed) found
  nothing that trains."""
  if entry is None or entry.get('subsumed_by'):
    return None
  score = entry.get('selected_score')
  return score is not None and score > chance(row, result) + NOTHING_TRAINS_MARGIN


def _search_sd(entry: dict | None) -> float:
  value = ((entry or {}).get('search') or {}).get('search_sd')
  return math.nan if value is None else float(value)


def _pool_best(entry: dict | None) -> float:
  best = ((entry or {}).get('search') or {}).get('pool_best') or {}
  return float(best.get('test_accuracy', math.nan))


def verdicts(block, results: dict, entries: dict) -> list[dict]:
  """One entry per claim and pair of rows: paired_rule on their common seeds, d and s in points
  ("tuned privately"); 'no verdict' where a row found nothing that trains, 'undecided' before both
  have 2 seeds and a search SD. 'pool_d': the pool-best trials' difference in points ("tuned
  well", at T_trial), and 'disagree' where its sign contradicts a decided verdict."""
  out = []
  for claim, better, worse in block.claim_pairs():
    pool_d = 100 * (_pool_best(entries.get(better.name)) - _pool_best(entries.get(worse.name)))
    entry = {'claim': claim, 'better': better, 'worse': worse, 'd': math.nan, 's': math.nan,
             'pool_d': pool_d, 'disagree': False}
    found = [trains(r, results[r.name], entries.get(r.name)) for r in (better, worse)]
    a, b = (seed_accuracies(results[r.name], block.metric) for r in (better, worse))
    seeds = sorted(set(a) & set(b))
    sds = [_search_sd(entries.get(r.name)) for r in (better, worse)]
    if False in found:
      out.append({**entry, 'verdict': 'no verdict (a row found nothing that trains)'})
      continue
    if None in found or len(seeds) < 2 or any(math.isnan(sd) for sd in sds):
      out.append({**entry, 'verdict': 'undecided'})
      continue
    label, d, s = search_spread.paired_rule([a[x] for x in seeds], [b[x] for x in seeds], *sds,
                                            min_gap=fair.MIN_GAP)
    verdict = fair.VERDICT[label]
    disagree = (verdict == 'holds' and pool_d < 0) or (verdict == 'contradicted' and pool_d > 0)
    out.append({**entry, 'verdict': verdict, 'd': 100 * d, 's': 100 * s, 'disagree': disagree})
  return out


def _points(values) -> tuple[float, float]:
  """(mean, seed std) in points."""
  return mean_std([100 * v for v in values])


def ceiling_accuracy(block, results: dict) -> float | None:
  """The ceiling row's mean over its seeds (points), None before one finished."""
  seeds = seed_accuracies(results[block.ceiling.name], block.metric)
  return _points(seeds.values())[0] if seeds else None


def regime(block, results: dict, entries: dict) -> str:
  """The regime rule, applied once: when the ceiling has every declared seed and every row is
  settled (its row.json written, which happens after its final runs; a row that trains with every
  final seed). Before that 'pending: ' and what it waits for."""
  ceiling_seeds = seed_accuracies(results[block.ceiling.name], block.metric)
  waiting = [] if len(ceiling_seeds) >= len(block.ceiling_seed_values) else ['the ceiling']
  counted = {}
  for row in block.rows:
    seeds = seed_accuracies(results[row.name], block.metric)
    found = trains(row, results[row.name], entries.get(row.name))
    if row.name not in entries or (found and len(seeds) < len(block.final_seed_values)):
      waiting.append(row.name)
    elif found:
      counted[row.name] = _points(seeds.values())[0]
  if waiting or not counted:
    return f"pending: {', '.join(waiting) or 'a row that trains'}"
  return block.regime(ceiling_accuracy(block, results), counted)


def epsilon_text(entry: dict) -> str:
  """A private row's ε with its K known (the pool publishes it): the selection's, or the naive
  composition of its K trials where that is larger, marked with K."""
  eps, bound = entry.get('selection_epsilon'), entry.get('epsilon_bound')
  if eps is None:
    return '–'
  if bound is not None and bound > eps:
    return f"{bound:.3f} (K = {entry.get('selection_trials')}: naive)"
  return f'{eps:.3f}'


def row_label(block, row) -> str:
  """A row as the page names it: its paper row, 'ceiling (<method>)' for the ceiling, else its name."""
  if row == block.ceiling:
    return f'ceiling ({row.method})'
  return row.paper_row or row.name


def row_lines(block, results: dict, entries: dict) -> list[str]:
  lines = ['| row | final accuracy (%), mean ± seed std | seeds | search SD (points) | '
           'pool: trials, best at T_trial (%) | selected values | ε of the selection, K known |',
           '|---|---|---|---|---|---|---|']
  for row in block.all_rows():
    result, entry = results[row.name], entries.get(row.name) or {}
    seeds = seed_accuracies(result, block.metric)
    mean, std = _points(seeds.values()) if seeds else (math.nan, math.nan)
    accuracy = '–' if not seeds else f'{mean:.2f}' + ('' if math.isnan(std) else f' ± {std:.2f}')
    if trains(row, result, entries.get(row.name)) is False:
      accuracy += ' (found nothing that trains)'
    for seed, failed_at in sorted(result.diverged.items()):
      accuracy += f' (seed {seed} diverged at round {failed_at}: 0 from there)'
    search = entry.get('search') or {}
    sd = search.get('search_sd')
    best = search.get('pool_best') or {}
    pool = ('–' if not search else f"{search['pool_size']}, " + (
        f"{100 * best['test_accuracy']:.2f}" if best else 'none trained'))
    values = ', '.join(f'{k} {format_value(v)}' for k, v in sorted(
        (entry.get('selected_values') or {}).items()))
    eps_text = 'non-private' if not METHODS[row.method].private else epsilon_text(entry)
    label = row_label(block, row)
    lines.append(f"| {label}{f' [{row.mark}]' if row.mark else ''} | {accuracy} | {len(seeds)} | "
                 f"{'–' if sd is None else f'{100 * sd:.2f}'} | {pool} | {values or '–'} | "
                 f'{eps_text} |')
  return lines


def verdict_lines(entries: list[dict]) -> list[str]:
  lines = ['| claim (paper) | better | worse | d (points) | s (points) | tuned privately | '
           'tuned well: pool bests (points, T_trial) |', '|---|---|---|---|---|---|---|']
  for e in entries:
    d = '–' if math.isnan(e['d']) else f"{e['d']:+.2f}"
    s = '–' if math.isnan(e['s']) else f"{e['s']:.2f}"
    pool = '–' if math.isnan(e['pool_d']) else f"{e['pool_d']:+.2f}" + (
        ' (the orders disagree)' if e['disagree'] else '')
    lines.append(f"| {e['claim'].source} | {e['better'].name} | {e['worse'].name} | {d} | {s} | "
                 f"{e['verdict']} | {pool} |")
  return lines


def page_lines(block, results: dict, entries: dict) -> list[str]:
  """The block's part of its results.md: rows, regime, verdicts and what no ε covers."""
  return [
      f'Second design: K of every row\'s search {fair.law_text(block.trials)}'
      + (f', pool floor {block.pool_floor}' if block.pool_floor else '')
      + (f'; of the ceiling\'s {fair.law_text(block.ceiling_trials)}' if block.ceiling_trials else '')
      + f'; ε {block.eps:g} per run, final seeds {", ".join(map(str, block.final_seed_values))} as '
      f'training seeds; the metric the mean of the last {FINAL_EVALUATIONS} evaluations.', '',
      *row_lines(block, results, entries), '',
      f'Regime rule: {block.regime_rule}. Outcome: {regime(block, results, entries)}.', '',
      'The rule: d the mean of the paired per-seed differences, s² their variance plus both rows\' '
      'search variance; holds if d ≥ max(1 point, 2 s), contradicted if d ≤ −max(1 point, 2 s), else '
      'level.', '',
      *verdict_lines(verdicts(block, results, entries)), '',
      'Limits:', '',
      '- The pools (tuning curves, search SD, the pool\'s best) are measurements no ε covers; '
      'publishing them tells K.',
      '- A trial\'s test accuracy is at T_trial, not T: the curves and the search SD are in '
      'short-trial units.',
      '- One split, one ε, one T; the rows use the same clients, each row\'s ε is its own.', '']


def law_lines(block) -> list[str]:
  """docs/benchmark.md's `fair2-law` block: what the block's declared law of K draws, and the
  trials a row runs under its pool floor."""
  law = TrialDistribution.from_dict(block.trials)
  cdf = np.cumsum([law.pmf(k) for k in range(0, 100 * int(law.mean) + 1)])
  quantile = lambda p: int(np.searchsorted(cdf, p))
  lines = [f'- K ({fair.law_text(block.trials)}): E[K] = {law.mean:g}; P(K = 1) {law.pmf(1):.2f}, '
           f'P(K ≤ 4) {cdf[4]:.2f}; median {quantile(0.5)}, 95th percentile {quantile(0.95)}.']
  if block.pool_floor:
    lines.append(f'- A row runs max(K, {block.pool_floor}) trials: '
                 f'{block.expected_trials(block.rows[0]):.1f} on average; the selection sees K.')
  if block.ceiling_trials:
    lines.append(f'- The ceiling: {fair.law_text(block.ceiling_trials)}, no floor.')
  return lines


def plot_data(published) -> dict:
  """Each row's tuning curve (points, with its band) for the block's plot."""
  curves = []
  entries = row_entries(published.runs, published.block)
  rows = published.block.all_rows()
  labels = [row_label(published.block, row) for row in rows]
  for row, label in zip(rows, labels):
    curve = ((entries.get(row.name) or {}).get('search') or {}).get('tuning_curve')
    if curve:  # two rows of one paper row (a paper form and its covered form): their names tell
      curves.append({'row': label if labels.count(label) == 1 else f'{label} ({row.name})',
                     **{k: [round(100 * v, 4) for v in curve[k]] for k in ('mean', 'low', 'high')},
                     'k': curve['k']})
  return {'kind': 'tuning_curves', 'title': f'block ({published.letter}): {published.block.paper}',
          'curves': curves}


def draw_curves(data: dict, path: str, metadata: dict) -> None:
  """Each row's expected test accuracy of the validation-best of k trials, k = 1..K, with its
  bootstrap band (Dodge et al. 2019)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(7.0, 4.5), dpi=120)
  for curve in data['curves']:
    line, = ax.plot(curve['k'], curve['mean'], label=curve['row'])
    ax.fill_between(curve['k'], curve['low'], curve['high'], color=line.get_color(), alpha=0.15)
  ax.set_xlabel('k trials drawn from the row\'s pool')
  ax.set_ylabel('expected test accuracy of the validation-best (%), at T_trial')
  ax.set_title(data['title'], fontsize=9)
  if data['curves']:
    ax.legend(fontsize=7, loc='lower right')
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, metadata=metadata)
  plt.close(fig)
