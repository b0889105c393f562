"""The READMEs' generated tables: the methods of the registry, the findings of each published fair
block (setting, verdict, one number, its limits) and each block's tables for
experiments/results/README.md."""

from __future__ import annotations

import os

from dp2fedsam_jax import metric_writers
from experiments.report import fair, fair2, fair_pages
from experiments.report.summary import mean_std
from experiments.report.workdirs import format_value

# The field's number for the same task, where one is in print: block -> (what, number, where, what
# of ours it stands beside).
FIELD = {'d': ('non-private FedAvg on Shakespeare with a 2×256 LSTM', '53.1–56.9 %',
               'FedML, LEAF split; Reddi et al. 2021, TFF split', 'ceiling')}


def methods_lines() -> list[str]:
  """One row per registered method: private or not, whether ε covers its release, its source."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  lines = ['| method | private | ε covers the release | what it is |', '|---|---|---|---|']
  for name, spec in METHODS.items():
    covers = ('no (paper form)' if spec.privacy_caveat() else 'yes') if spec.private else '–'
    paper = spec.paper.replace('|', '\\|')  # a pipe in a formula would end the cell
    lines.append(f"| `{name}` | {'yes' if spec.private else 'no'} | {covers} | {paper} |")
  return lines


def _page(published) -> str:
  return f'experiments/results/{published.config_name}/results.md'


def setting_text(published) -> str:
  """'fashion_mnist, pathological S = 2, N = 1000, T = 200, ε = 0.25 a run' from a final run."""
  config = next((c for r in published.results.values() for c in r.configs.values()), None)
  if config is None:
    return '–'
  split = {'pathological': f"pathological S = {config.get('classes_per_client')}",
           'dirichlet': f"Dirichlet α = {format_value(config.get('dirichlet_alpha'))}"}.get(
               config.get('partition'), config.get('partition', ''))
  return (f"{config['dataset']}, {split}, N = {config['num_clients']}, T = {config['num_rounds']}, "
          f'ε = {format_value(published.block.eps)} a run')


def verdict_text(published, blocks: tuple) -> str:
  block, results = published.block, published.results
  if block.design == 2:
    entries = fair2.row_entries(published.runs, block)
    outcome = fair2.regime(block, results, entries)
    verdicts = [e['verdict'] for e in fair2.verdicts(block, results, entries)]
  else:
    outcome = fair.regime(block, results, fair_pages.ceiling(published, blocks))
    verdicts = [e['verdict'] for e in fair.verdicts(block, results)] if outcome == 'test' else []
  if outcome != 'test':
    return outcome
  return ('the paper\'s claims: ' + ', '.join(f'{verdicts.count(v)} {v}'
                                              for v in ('holds', 'level', 'contradicted')))


def _stats(published, result) -> tuple:
  """(mean, std, seeds) of a row's final accuracy (fractions): the block's design's metric."""
  if published.block.design != 2:
    return result.stats
  values = list(fair2.seed_accuracies(result, published.block.metric).values())
  mean, std = mean_std(values) if values else (float('nan'), float('nan'))
  return mean, std, len(values)


def _accuracy(stats: tuple) -> str:
  mean, std, seeds = stats
  return f'{100 * mean:.2f} ± {100 * std:.2f} %' if seeds > 1 else f'{100 * mean:.2f} %'


def number_text(published, blocks: tuple) -> str:
  """The paper's method (the block's first row), the best private row, and the ceiling."""
  block, results = published.block, published.results
  skipped = fair.subsumed(block, results)
  rows = [r for r in block.rows if r.name not in skipped and results[r.name].accuracy]
  if not rows:
    return '–'
  stats = {r.name: _stats(published, results[r.name]) for r in rows}
  first = rows[0]
  best = max(rows, key=lambda r: stats[r.name][0])
  text = f'{first.paper_row or first.name} {_accuracy(stats[first.name])}'
  if best is not first:
    text += f'; best {best.paper_row or best.name} {_accuracy(stats[best.name])}'
  top = (fair2.ceiling_accuracy(block, results) if block.design == 2
         else fair_pages.ceiling(published, blocks))
  return text + ('' if top is None else f'; ceiling {top:.2f} %')


def seed_counts(blocks: tuple) -> tuple[int, int]:
  """(final seeds a row is declared with, the ceiling's) over `blocks`: what the limits say."""
  return (max(len(p.block.final_seed_values) for p in blocks),
          max(len(p.block.ceiling_seed_values) for p in blocks))


def rule_lines(headline: tuple) -> list[str]:
  """How the headline's verdicts are reached, from the constants that reach them."""
  gap, margins = f'{100 * fair.MIN_GAP:g}', {p.block.regime_margin for p in headline}
  room = (f'The regime rule first asks whether a block has room under its non-private ceiling '
          f"(at least {' or '.join(f'{m:g}' for m in sorted(margins))} points above the best private "
          'row); a paper\'s order is judged only where it has.')
  if any(p.block.design == 2 for p in headline):
    return [f'One rule judges each order the paper claims, on paired seeds: A **holds** over B when the '
            f'mean of the per-seed differences is at least {gap} point and 2s, where s² is the '
            "differences' variance plus each row's search variance (its private search simulated "
            'on its pool of trials); **contradicted** the other way; else **level**. A row whose '
            f'noised selected score is at most chance + {100 * fair2.NOTHING_TRAINS_MARGIN:g} points '
            'found nothing that trains and gets no verdict. ' + room]
  return [f'One rule judges each order the paper claims: A **holds** over B when the seed mean gap is '
          f'at least {gap} point and twice the pooled seed std; **contradicted** the other way; else '
          '**level**. ' + room]


def _decided(published) -> bool:
  """Whether a second-design block's regime rule has been applied (it waits for every row)."""
  entries = fair2.row_entries(published.runs, published.block)
  return not fair2.regime(published.block, published.results, entries).startswith('pending')


def findings_lines(published: tuple) -> list[str]:
  """The README's findings: one row per block (the second design's once its regime rule applied;
  the first design's pages then listed in the limits; until then the first design's, the second
  named as under way), then where the field has a number, then limits."""
  under_way = tuple(p for p in published if p.block.design == 2 and not _decided(p))
  second = tuple(p for p in published if p.block.design == 2 and p not in under_way)
  headline = second or tuple(p for p in published if p.block.design != 2)
  metric = f'mean of the last {fair2.FINAL_EVALUATIONS} evaluations' if second else 'final round'
  lines = [*rule_lines(headline), '',
           f'| block | setting | verdict | one number ({metric}, mean ± seed std) |',
           '|---|---|---|---|']
  for p in headline:
    lines.append(f'| [({p.letter})]({_page(p)}) {p.block.paper} | {setting_text(p)} | '
                 f'{verdict_text(p, published)} | {number_text(p, published)} |')
  field = []
  for p in headline:
    if p.letter in FIELD:
      what, number, where, ours = FIELD[p.letter]
      top = fair_pages.ceiling(p, published)
      field.append(f'- ({p.letter}): our {ours} {top:.2f} % beside the field\'s {what}: {number} '
                   f'({where}).')
  seeds, ceiling_seeds = seed_counts(headline)
  limits = [
      '', 'Limits:', '',
      '- Each block is one split, one ε and one T.',
      f"- Each row is {seeds} final seeds; the ceiling, "
      f"{'one' if ceiling_seeds == 1 else ceiling_seeds}.",
      '- No ε covers the test accuracies, the seeds after the first, or the choice of ranges.',
      "- Each row's ε is its own: the rows of a block use the same clients.",
      '- A paper form\'s ε does not cover its release ("not covered").']
  if second:
    limits += ['- No ε covers the searches\' pools (tuning curves, search SD): publishing them tells '
               'K.',
               '- The first design\'s blocks (one small search a row) stay on their pages: '
               + ', '.join(f'[({p.letter})]({_page(p)})' for p in published if p not in second)
               + '.']
  limits += [f'- Under way: [({p.letter})]({_page(p)}), the second design ({p.block.paper}); its page '
             'shows what has finished, and its verdicts replace this table once its regime rule '
             'applies.' for p in under_way]
  if any(r.shared_seed for p in headline for r in p.results.values()):
    limits.append(f'- {fair.SHARED_SEED} The committed searches shared one public seed: their search '
                  'ε does not hold as stated.')
  no_field = [p.letter for p in headline if p.letter not in FIELD]
  if no_field:
    limits.append(f"- No number of the same setup is in print for ({'), ('.join(no_field)}).")
  return lines + ([''] + field if field else []) + limits


def fair_block_lines(published: tuple) -> list[str]:
  """Per block: its setting, page, plot, the README's table and the paper's claims judged."""
  lines = []
  for p in published:
    block, results = p.block, p.results
    plot = f'{p.config_name}/{fair_pages.PLOT_FILE}'
    if block.design == 2:  # its own rows, rule and verdicts (experiments/report/fair2.py)
      entries = fair2.row_entries(p.runs, block)
      metric = f'the mean of the last {fair2.FINAL_EVALUATIONS} evaluations of {block.metric}'
      body = [*fair2.row_lines(block, results, entries), '',
              f'The regime rule: **{fair2.regime(block, results, entries)}**.', '',
              *fair2.verdict_lines(fair2.verdicts(block, results, entries))]
    else:
      metric = block.metric
      body = [*fair.readme_lines(block, results, fair.block_epsilons(block, results),
                                 fair_pages.ceiling(p, published)), '',
              *fair.verdict_lines(fair.verdicts(block, results))]
    lines += [f'### Block ({p.letter}): {block.paper}', '',
              f'{setting_text(p)}; metric {metric}. [Its page]({p.config_name}/results.md).', '',
              f'![block ({p.letter})]({plot})', '', *body, '']
  return lines[:-1]


def selected_accuracy(directory: str, tuning: dict) -> str:
  """The selected run's final test accuracy (%), '–' where its metrics are not committed."""
  records = metric_writers.read_jsonl(os.path.join(directory, tuning.get('selected_run') or '',
                                                   metric_writers.EVAL_FILE))
  return f"{100 * records[-1]['test_accuracy']:.2f}" if records else '–'
