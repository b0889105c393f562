"""`python3 -m experiments.report --root=runs --out=report`: the flags and the program (the package's
docstring says what it writes)."""

from __future__ import annotations

import json

from absl import app
from absl import flags

from dp2fedsam_jax import cli
from experiments.report import write_report

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Registers the flags. Only the program does this, so that importing the module (tests, or a
  sweep and a report in one process) never defines a second --root."""
  flags.DEFINE_string('root', None, 'Directory holding the workdirs (searched recursively).')
  flags.DEFINE_string('out', None, 'Output directory for results.md, results.csv and PNGs.')
  flags.DEFINE_bool('copy_runs', False, 'Also copy each run\'s config.json, sweep.json, '
                    'metrics.jsonl and train_metrics.jsonl (not its checkpoints) to <out>/runs/, '
                    'so the results can be committed and the report rebuilt from them.')
  flags.DEFINE_string('reference', 'dp2fedsam', 'The method whose gap to every other method at '
                      'each eps gets its own table (where it has results).')
  flags.DEFINE_bool('finished_only', False, 'Leave out the runs still under way (a sweep that is '
                    'running): commit each finished run while the rest go on.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  paths = write_report(FLAGS.root, FLAGS.out, FLAGS.copy_runs, FLAGS.finished_only,
                       FLAGS.reference)
  for line in paths['failures']:
    print(line)
  print(json.dumps(paths, indent=2))


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['root', 'out'])
  cli.run(main)
