r"""The committed results and any root of workdirs, as tables and plots.

`python3 -m experiments.report` regenerates the committed results (generated.py): each study's page
and plots under experiments/results, each fair block's page and plot, and the tables of README.md
and experiments/results/README.md between their GENERATED markers; `--check` rebuilds them in
memory and exits 1 naming the first differing line of each file. `python3 -m experiments.report
--root=runs --out=report` reports on any root of workdirs (hand-started ones under the root's name,
side by side):

Reads every `metrics.jsonl` (one line per evaluated round) under --root, with its `config.json`,
`train_metrics.jsonl` (one line per round) where the run has one, and `sweep.json` when
launch/sweep.py made it; groups the runs by config, setting (the sweep's arguments other than
method and seed) and method, and writes to --out:

  results.md, results.csv   final-round test accuracy, mean ± sample std over seeds, per method and
                            setting; the best round's accuracy in a separate, labelled column (it
                            is chosen on test data, so it is optimistic); epsilon reached; seeds;
                            each method against the next below it: gap in points and in pooled
                            seed stds, with the seeds on each side; --reference (dp2fedsam)
                            against every other method, one column per eps; each setting with
                            extra arguments (noise=banded) against the same method without them;
                            the accuracy pooled over all test targets and the never-sampled
                            clients apart where the runs record them; local_only (nothing
                            released) shows ε = 0, a dotted line in the plot against ε; a run's
                            re-evaluations under other protocols (experiments.evaluate's
                            evaluations.jsonl, at its final round) as rows 'method [protocol]'
  <config>/<setting>_accuracy.png      test accuracy vs round per method, ±std band over seeds
  <config>/<setting>_update_norm.png   mean pre-clip update norm vs round, ±std band over seeds
                            (every round from train_metrics.jsonl when all its runs have one, as
                            the papers' update-norm figures; else at the evaluated rounds;
                            values 100x above the median are drawn at the top edge, labelled)
  <config>/<setting>_clip_norm.png     the clip norm C_t every round, ±std band over seeds, for
                            settings whose runs all clip adaptively (train_metrics' clip_norm)
  <config>/<setting>_accuracy_vs_eps.png   final accuracy vs epsilon, when settings differ only in
                            eps: seed-std error bars, log eps axis, eps = inf as horizontal lines,
                            values far off the curves' range listed in a note, not drawn
  runs/...                  with --copy_runs: the runs' small files (with experiments.evaluate's
                            evaluations.jsonl), for committing the results
                            (--finished_only: only runs that finished or failed, while a sweep runs)

Matplotlib comes with the `[report]` extra.

The package, by job: workdirs (reading runs and re-evaluations, copying their small files), summary
(a Row per config, setting and method over seeds), rules (gaps and the pre-declared rule_label),
tables (results.md, results.csv), plots (the PNGs), tuning (launch/tune.py's tunings), fair and
fair_pages (the fair benchmark's tables, pages and plots), findings (the READMEs' tables), generated
(writing and checking the committed results), and __main__ (the flags). write_report below puts
the first ones together.
"""

from __future__ import annotations

import os

# The names other modules and tests use, importable from the package as before the split.
from experiments.report.plots import method_styles, write_plots
from experiments.report.rules import ordering, reference_gaps, rule_label, variant_gaps
from experiments.report.summary import (CLIP_BINDS, CLIP_WINDOW, CLIPPING, POOLED, SPREAD, Row,
                                        clipping_over_last_rounds, failure_lines,
                                        pooled_gain_per_100_rounds, summarize)
from experiments.report.tables import write_tables
from experiments.report.tuning import copy_tuning_files, load_tunings, trial_lines, tuning_lines
from experiments.report.workdirs import (PROTOCOL_FIELDS, TUNING_FILE, RunResult, copy_run_files,
                                         load_runs, protocol_label, setting_label)

__all__ = ['CLIP_BINDS', 'CLIP_WINDOW', 'CLIPPING', 'POOLED', 'PROTOCOL_FIELDS', 'SPREAD', 'TUNING_FILE',
           'Row', 'RunResult', 'clipping_over_last_rounds', 'copy_run_files', 'copy_tuning_files',
           'failure_lines', 'load_runs', 'load_tunings', 'method_styles', 'ordering',
           'pooled_gain_per_100_rounds', 'protocol_label', 'reference_gaps', 'rule_label',
           'setting_label', 'summarize', 'trial_lines', 'tuning_lines', 'variant_gaps', 'write_plots',
           'write_report', 'write_tables']


def write_report(root: str, out: str, copy_runs: bool = False, finished_only: bool = False,
                 reference: str = 'dp2fedsam') -> dict:
  """Writes the tables and plots; returns their paths. `finished_only` leaves out the runs still
  under way (failed runs stay: the table says why they stopped)."""
  runs = load_runs(root)
  if finished_only:
    runs = [r for r in runs if r.finished or r.failed]
  tunings = load_tunings(root)
  if not runs and not tunings:
    raise ValueError(f'no workdir with metrics.jsonl and config.json under {root}')
  os.makedirs(out, exist_ok=True)
  if copy_runs:
    copy_run_files([r for r in runs if not r.protocol], root, out)
    copy_tuning_files(tunings, root, out)
  if not runs:  # tunings only: their trials are in their own section, not in the run tables
    md = os.path.join(out, 'results.md')
    with open(md, 'w') as f:
      f.write('\n'.join(['# Results', ''] + tuning_lines(tunings, root)))
    return {'markdown': md, 'csv': None, 'plots': [], 'num_runs': 0, 'failures': []}
  rows = summarize(runs)
  md, csv_path = write_tables(rows, out, reference)
  # Re-evaluations are one final point each: in the tables, not in the plots.
  plots = write_plots([r for r in runs if r.records and not r.failed and not r.protocol], out)
  with open(md, 'a') as f:
    f.write('\n'.join([''] + tuning_lines(tunings, root)))
    f.write('\n## Plots\n\n' + '\n'.join(f'![{os.path.relpath(p, out)}]({os.path.relpath(p, out)})'
                                          for p in plots) + '\n')
  return {'markdown': md, 'csv': csv_path, 'plots': plots, 'num_runs': len(runs),
          'failures': failure_lines(rows)}
