"""Runs a notebook's code cells in order in one Python namespace, without Jupyter, and writes the
executed copy (each cell's printed output, its seconds, an error where one was raised).

  python3 -m launch.run_notebook --out=/tmp/executed.ipynb --set=INSTALL_FROM="'.'" \
      [--set=OVERRIDES={'num_rounds':20}]

What it is for: `launch/colab_tpu.ipynb` run end to end on a machine without a Jupyter kernel (a lent
GPU machine: a kernel's ~5 MB of wheels do not fit the device transfer beside Fashion-MNIST), and the
same run on the CPU in tests/test_notebook.py. Every code cell runs, the install cell too (it
pip-installs INSTALL_FROM into the interpreter that runs this). It differs from a kernel in what a
kernel adds: rich display (the notebook's report cell falls back to printing its table without
IPython) and the `!`/`%` lines (the notebook has none in its code cells). Logging starts as in a
fresh kernel (absl at WARNING: the notebook turns on the lines it shows); `--set` assigns names after
the cell tagged `parameters`, as papermill does.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import io
import json
import os
import sys
import time
import traceback

from absl import app
from absl import flags
from absl import logging

NOTEBOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'colab_tpu.ipynb')

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Only when run as a program: tests import `run` beside other binaries' flags."""
  flags.DEFINE_string('notebook', NOTEBOOK, 'The .ipynb to run.')
  flags.DEFINE_string('out', None, 'Where to write the executed copy (.ipynb).')
  flags.DEFINE_multi_string('set', [], 'NAME=PYTHON_LITERAL, assigned after the parameters cell.')


class _Tee(io.TextIOBase):
  """Writes to the real stream and keeps a copy for the cell's output."""

  def __init__(self, stream):
    self.stream, self.kept = stream, io.StringIO()

  def write(self, text):
    self.stream.write(text)
    return self.kept.write(text)

  def flush(self):
    self.stream.flush()


def tags(cell: dict) -> list[str]:
  return cell.get('metadata', {}).get('tags', [])


def parse_assignments(assignments: list[str]) -> dict:
  values = {}
  for assignment in assignments:
    name, sep, literal = assignment.partition('=')
    if not sep or not name.isidentifier():
      raise ValueError(f'--set={assignment}: expected NAME=PYTHON_LITERAL')
    values[name] = ast.literal_eval(literal)
  return values


def run(notebook: dict, parameters: dict, name: str = 'notebook') -> tuple[dict, dict, str | None]:
  """Runs the code cells in one namespace; returns (the executed copy, the namespace, the error or
  None). An error is recorded in its cell and stops the run, as Run all
  does."""
  executed, namespace, count = copy.deepcopy(notebook), {'__name__': '__main__'}, 0
  for index, cell in enumerate(executed['cells']):
    if cell['cell_type'] != 'code':
      continue
    count += 1
    out, err = _Tee(sys.stdout), _Tee(sys.stderr)
    start, error = time.perf_counter(), None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        exec(compile(''.join(cell['source']), f'{name} cell {index}', 'exec'), namespace)
      except Exception as e:  # pylint: disable=broad-except
        error = e
        traceback.print_exc()
    if 'parameters' in tags(cell):
      namespace.update(parameters)
    cell['execution_count'] = count
    cell.setdefault('metadata', {})['execution_seconds'] = round(time.perf_counter() - start, 2)
    cell['outputs'] = [{'output_type': 'stream', 'name': stream, 'text': tee.kept.getvalue()}
                       for stream, tee in (('stdout', out), ('stderr', err)) if tee.kept.getvalue()]
    if error is not None:
      cell['outputs'].append({'output_type': 'error', 'ename': type(error).__name__,
                              'evalue': str(error), 'traceback': []})
      return executed, namespace, f'{name}: cell {index} raised {type(error).__name__}: {error}'
  return executed, namespace, None


def main(argv):
  del argv
  with open(FLAGS.notebook) as f:
    notebook = json.load(f)
  logging.set_verbosity(logging.WARNING)  # absl.app's INFO is not a kernel's
  start = time.perf_counter()
  executed, _, error = run(notebook, parse_assignments(FLAGS.set), os.path.basename(FLAGS.notebook))
  executed['metadata']['executed'] = {'seconds': round(time.perf_counter() - start, 1),
                                      'set': FLAGS.set, 'error': error,
                                      'by': 'launch.run_notebook (no kernel)'}
  if FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      json.dump(executed, f, indent=1)
  if error:
    raise SystemExit(f'error: {error}')
  print(f'ran every code cell in {executed["metadata"]["executed"]["seconds"]} s')


if __name__ == '__main__':
  define_flags()
  app.run(main)
