"""`python3 -m experiments.report`: the committed results regenerated (pages, plots and the READMEs'
generated blocks; `--check` compares instead of writing), or `--root=runs --out=report`: the tables
and plots of any root of workdirs (the package's docstring says what it writes)."""

from __future__ import annotations

import json
import sys

from absl import app
from absl import flags

from dp2fedsam_jax import cli
from experiments.report import write_report

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Registers the flags. Only the program does this, so that importing the module (tests, or a
  sweep and a report in one process) never defines a second --root."""
  flags.DEFINE_string('root', None, 'Directory holding the workdirs (searched recursively). Without '
                      'it: the committed results (experiments/results) and the READMEs.')
  flags.DEFINE_string('out', None, 'Output directory for results.md, results.csv and PNGs.')
  flags.DEFINE_bool('check', False, 'Without --root: rebuild every generated page, plot and README '
                    'block from the committed runs in memory, write nothing, and exit 1 naming the '
                    'first difference of each file that differs.')
  flags.DEFINE_bool('copy_runs', False, 'Also copy each run\'s config.json, sweep.json, '
                    'metrics.jsonl and train_metrics.jsonl (not its checkpoints) to <out>/runs/, '
                    'so the results can be committed and the report rebuilt from them.')
  flags.DEFINE_string('reference', 'dp2fedsam', 'The method whose gap to every other method at '
                      'each eps gets its own table (where it has results).')
  flags.DEFINE_bool('finished_only', False, 'Leave out the runs still under way (a sweep that is '
                    'running): commit each finished run while the rest go on.')


def committed(check: bool) -> int:
  """Regenerates (or checks) the committed results; the exit status."""
  from experiments.report import generated  # pylint: disable=import-outside-toplevel
  if check:
    problems = generated.check()
    for line in problems:
      print(line)
    print(f'{len(problems)} generated file(s) differ from the committed runs' if problems else
          'every generated file is what the committed runs give')
    return 1 if problems else 0
  for path in generated.write():
    print(path)
  return 0


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if FLAGS.root is None:
    if FLAGS.out is not None:
      raise app.UsageError('--out needs --root (without --root the committed results are written '
                           'where they are).')
    sys.exit(committed(FLAGS.check))
  if FLAGS.check:
    raise app.UsageError('--check compares the committed results: leave out --root.')
  if FLAGS.out is None:
    raise app.UsageError('--root needs --out.')
  paths = write_report(FLAGS.root, FLAGS.out, FLAGS.copy_runs, FLAGS.finished_only,
                       FLAGS.reference)
  for line in paths['failures']:
    print(line)
  print(json.dumps(paths, indent=2))


if __name__ == '__main__':
  define_flags()
  cli.run(main)
