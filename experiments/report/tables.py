"""results.md and results.csv: the run table per config and the comparison tables below it."""

from __future__ import annotations

import csv
import io
import math
import os

from experiments.report.rules import eps_sort_key, ordering, reference_gaps, variant_gaps
from experiments.report.summary import CLIP_BINDS, CLIP_WINDOW, CLIPPING, GAIN_WINDOW, POOLED, SPREAD, Row


def _pct(mean_std: tuple[float, float]) -> str:
  mean, std = mean_std
  if math.isnan(mean):
    return '–'
  return f'{100 * mean:.2f}' + ('' if math.isnan(std) else f' ± {100 * std:.2f}')


def _eps_text(eps: float) -> str:
  if math.isnan(eps):
    return '–'
  if eps == 0:
    return '0 (nothing released)'
  return '∞' if math.isinf(eps) else f'{eps:.3g}'


def _seeds_text(row: Row) -> str:
  return f'{row.num_seeds}/{row.num_runs}' if row.num_seeds < row.num_runs else str(row.num_seeds)


def _gap_cell(gap: float, units: float, ref: Row, other: Row) -> str:
  size = '–' if math.isnan(units) else f'{units:+.1f} sd'
  return f'{100 * gap:+.2f} / {size} ({ref.num_seeds} v {other.num_seeds})'


def write_tables(rows: list[Row], out: str, reference: str = 'dp2fedsam') -> tuple[str, str]:
  csv_path, md_path = os.path.join(out, 'results.csv'), os.path.join(out, 'results.md')
  markdown, table = tables_text(rows, reference)
  with open(csv_path, 'w', newline='') as f:
    f.write(table)
  with open(md_path, 'w') as f:
    f.write(markdown)
  return md_path, csv_path


def tables_text(rows: list[Row], reference: str = 'dp2fedsam') -> tuple[str, str]:
  """(results.md, results.csv) as text."""
  # The spread columns only where some run records it (runs that predate it keep their tables).
  spread_columns = list(SPREAD) if any(r.has_spread for r in rows) else []
  spread_columns += list(POOLED) if any(r.has_pooled for r in rows) else []
  clip_columns = list(CLIPPING) if any(r.has_clipping for r in rows) else []
  with io.StringIO(newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['config', 'setting', 'method', 'epsilon', 'num_seeds', 'final_round',
                     'final_acc_mean', 'final_acc_std', 'best_round_acc_mean',
                     'best_round_acc_std', 'seconds_per_round', 'note', 'num_runs',
                     'participated_acc_mean', 'participated_acc_std', 'participation']
                    + [f'{k}_{stat}' for k in spread_columns for stat in ('mean', 'std')]
                    + [f'{k}_last{CLIP_WINDOW}_{stat}' for k in clip_columns
                       for stat in ('mean', 'std')])
    for r in rows:
      writer.writerow([r.config_name, r.setting, r.method, r.epsilon, r.num_seeds, r.final_round,
                       r.final_acc[0], r.final_acc[1], r.best_acc[0], r.best_acc[1],
                       r.seconds_per_round, r.note, r.num_runs, r.participated_acc[0],
                       r.participated_acc[1], r.participation]
                      + [v for k in spread_columns for v in {**r.spread, **r.pooled}[k]]
                      + [v for k in clip_columns for v in r.clipping.get(k, (math.nan,) * 2)])
    table = f.getvalue()
  lines = ['# Results', '',
           'Test accuracy (%) at the final round: mean ± sample std over seeds of the mean over '
           'clients of each client\'s test accuracy (with the model the method evaluates: own head, '
           'global model, or fine-tuned copy). *Best round* is the maximum over evaluated '
           'rounds, chosen on test data, so it is optimistic; it is shown only for comparison with '
           'papers that report it. *Participated* is the same mean over only the clients sampled at '
           'least once (a never-sampled client tests with its initial personal head), and '
           '*participation* their fraction. ε: reached after the final round (δ as in each '
           'config.json).', '']
  for config_name in sorted({r.config_name for r in rows}):
    lines += [f'## {config_name}', '',
              '| setting | method | ε | seeds | round | final-round acc | participated acc | '
              'participation | best-round acc (optimistic) | s/round | note |',
              '|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
      if r.config_name == config_name:
        lines.append(f'| {r.setting} | {r.method} | {_eps_text(r.epsilon)} | {_seeds_text(r)} | '
                     f'{r.final_round} | {_pct(r.final_acc)} | {_pct(r.participated_acc)} | '
                     f'{"–" if math.isnan(r.participation) else f"{100 * r.participation:.0f} %"} | '
                     f'{_pct(r.best_acc)} | '
                     f'{"–" if math.isnan(r.seconds_per_round) else f"{r.seconds_per_round:.2f}"} | '
                     f'{r.note} |')
    pairs = [p for p in ordering(rows) if p[0].config_name == config_name]
    if pairs:
      lines += ['', 'Each method against the next one below it in its setting (final-round mean): '
                'the gap in points and in pooled seed standard deviations '
                '√((s₁² + s₂²)/2) (– where a side has fewer than two seeds; with three seeds this '
                'is a size, not a significance test).', '',
                '| setting | higher | lower | gap (points) | gap / pooled std | seeds |',
                '|---|---|---|---|---|---|']
      lines += [f'| {hi.setting} | {hi.method} | {lo.method} | {100 * gap:.2f} | '
                f'{"–" if math.isnan(units) else f"{units:.1f}"} | '
                f'{hi.num_seeds} v {lo.num_seeds} |' for hi, lo, gap, units in pairs]
    lines += _final_round_table(rows, config_name, 'spread')
    lines += _final_round_table(rows, config_name, 'pooled')
    lines += _clipping_table(rows, config_name)
    lines += _reference_table(rows, config_name, reference)
    lines += _variant_table(rows, config_name)
    lines.append('')
  return '\n'.join(lines), table


def _final_round_table(rows: list[Row], config_name: str, kind: str) -> list[str]:
  """The final round's per-client spread (kind 'spread') or pooled accuracy ('pooled'), for the
  rows whose runs record it; mean ± std over seeds."""
  columns, intro = {
      'spread': (SPREAD, 'Spread over the clients with test data at the final round (each client '
                 'tests its own model): the std over clients, the mean over the worst 10 % of them, '
                 'and the 10th, 50th and 90th percentiles; mean ± std over seeds.'),
      'pooled': (POOLED, 'Accuracy pooled over all test targets of the evaluated clients (correct / '
                 'targets: a client weighs by its number of targets, as TFF and fedjax count), over '
                 'the clients sampled at least once, and the clients never sampled apart (their mean '
                 'over clients, and pooled; – where there are none); final round, mean ± std over '
                 f'seeds. The gain is the least-squares slope of the pooled accuracy over the last '
                 f'{GAIN_WINDOW} rounds, in points per 100 rounds (flat: under 0.3).'),
  }[kind]
  rows = [r for r in rows if r.config_name == config_name and getattr(r, f'has_{kind}')]
  if not rows:
    return []
  return ['', intro, '', '| setting | method | ' + ' | '.join(columns.values()) + ' |',
          '|---|---|' + '---|' * len(columns)] + [
              f'| {r.setting} | {r.method} | '
              + ' | '.join(_pct(getattr(r, kind)[k]) for k in columns) + ' |' for r in rows]


def _clipping_table(rows: list[Row], config_name: str) -> list[str]:
  """Whether the clip binds, for the private rows with every round's train metrics."""
  rows = [r for r in rows if r.config_name == config_name and r.has_clipping]
  if not rows:
    return []

  def plain(mean_std):
    mean, std = mean_std
    return f'{mean:.3g}' + ('' if math.isnan(std) else f' ± {std:.2g}')

  def binds(row):
    return 'yes' if row.clip_binds else f'**no** (< {CLIP_BINDS:g})'

  return ['', f'Clipping over the last {CLIP_WINDOW} rounds (private runs with every round\'s '
          'train_metrics.jsonl): each run\'s mean, then mean ± std over seeds. The clip *binds* '
          f'where the mean clipped fraction is at least {CLIP_BINDS:g}; C_t only where the clip is '
          'adaptive.', '',
          '| setting | method | ' + ' | '.join(CLIPPING.values()) + ' | clip binds |',
          '|---|---|' + '---|' * (len(CLIPPING) + 1)] + [
              f'| {r.setting} | {r.method} | '
              + ' | '.join(plain(r.clipping[k]) if k in r.clipping else '–' for k in CLIPPING)
              + f' | {binds(r)} |' for r in rows]


def _reference_table(rows: list[Row], config_name: str, reference: str) -> list[str]:
  """The reference method's gap to every other method, one column per eps: where its gain holds,
  grows or vanishes as eps shrinks. One table per config and setting without eps where the
  reference has a result."""
  lines = []
  for (name, rest), by_method in sorted(reference_gaps(rows, reference).items()):
    if name != config_name:
      continue
    eps_labels = sorted({e for cells in by_method.values() for e in cells}, key=eps_sort_key)
    columns = ' | '.join(f'ε = {"∞" if e == "inf" else e}' for e in eps_labels)
    lines += ['', f'{reference} against each other method at the same ε'
              + ('' if rest == 'default' else f' ({rest})') + ': final-round gap in points '
              f'({reference} minus the other) / in pooled seed stds √((s₁² + s₂²)/2) '
              f'(– with one seed on a side) (seeds: {reference} v the other).', '',
              f'| method | {columns} |', '|---|' + '---|' * len(eps_labels)]
    order = sorted(by_method, key=lambda m: (-len(by_method[m]), m))
    for method in order:
      cells = []
      for e in eps_labels:
        ref, other, gap, units = by_method[method].get(e, (None,) * 4)
        cells.append('' if ref is None else _gap_cell(gap, units, ref, other))
      lines.append(f'| {method} | ' + ' | '.join(cells) + ' |')
  return lines


def _variant_table(rows: list[Row], config_name: str) -> list[str]:
  pairs = [p for p in variant_gaps(rows) if p[0].config_name == config_name]
  if not pairs:
    return []
  lines = ['', 'Settings with extra arguments against the same method without them (e.g. '
           'correlated noise against independent noise at the same ε): final-round gap in points '
           '(the variant minus the baseline) / in pooled seed stds (– with one seed on a side).', '',
           '| method | variant | baseline | variant acc | baseline acc | gap (points) / pooled std '
           '(seeds) |', '|---|---|---|---|---|---|']
  for variant, base, gap, units in pairs:
    lines.append(f'| {variant.method} | {variant.setting} | {base.setting} | '
                 f'{_pct(variant.final_acc)} | {_pct(base.final_acc)} | '
                 f'{_gap_cell(gap, units, variant, base)} |')
  return lines
