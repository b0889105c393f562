"""launch/colab_tpu.ipynb: valid nbformat-4 JSON whose every code cell, the install cell included, runs
on the CPU with a tiny config.

No Jupyter needed: launch/run_notebook.py executes the code cells in order in one namespace. The full
run installs this checkout (INSTALL_FROM) into a virtual environment that sees this interpreter's
packages (the dependencies are there, and nothing outside the environment changes) and runs from a
directory outside the checkout, so the cells after the install import the installed copy, as on Colab.
"""

import glob
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip('matplotlib', reason='the [report] extra (matplotlib) is not installed')

from dp2fedsam_jax import metric_writers  # pylint: disable=wrong-import-position
from launch import run_notebook  # pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, 'launch', 'colab_tpu.ipynb')


def _notebook() -> dict:
  with open(NOTEBOOK) as f:
    return json.load(f)


def _code_cells(notebook: dict) -> list[dict]:
  return [c for c in notebook['cells'] if c['cell_type'] == 'code']


def test_notebook_is_committed_without_outputs_with_parameters_before_install():
  notebook = _notebook()
  assert notebook['nbformat'] == 4 and isinstance(notebook['metadata'], dict)
  for cell in notebook['cells']:
    assert cell['cell_type'] in ('code', 'markdown') and isinstance(cell['source'], list)
  code = _code_cells(notebook)
  assert all(c['outputs'] == [] and c['execution_count'] is None for c in code)
  assert [run_notebook.tags(c) for c in code[:2]] == [['parameters'], ['install']]
  assert sum(bool(run_notebook.tags(c)) for c in code) == 2


@pytest.mark.parametrize('install_from, error', [
    ('', r'ValueError: INSTALL_FROM is not set'),
    ('/no/such/dp2fedsam_jax-0.2.0-py3-none-any.whl', r'FileNotFoundError: INSTALL_FROM=.*no such wheel'),
])
def test_the_install_cell_stops_the_run_without_a_source(install_from, error):
  executed, _, message = run_notebook.run(_notebook(), {'INSTALL_FROM': install_from})
  code = _code_cells(executed)
  assert re.search(r'cell \d+ raised ' + error, message), message
  assert code[1]['outputs'][-1]['output_type'] == 'error'
  assert [c['execution_count'] for c in code[2:]] == [None] * (len(code) - 2)  # nothing after it ran


def _tiny(tmp_path) -> dict:
  """The parameters cell's values for a 2-round synthetic run under tmp_path."""
  overrides = {
      'dataset': 'synthetic', 'model': 'mlp', 'num_clients': 6, 'partition': 'iid',
      'sampling_rate': 0.5, 'num_rounds': 2, 'eval_every': 1, 'local.batch_size': 16,
      'local.personal_epochs': 1, 'local.shared_epochs': 1, 'dp.clip_norm': 1.0,
  }
  return dict(INSTALL_FROM=ROOT, OVERRIDES=overrides, WORKDIR=str(tmp_path / 'runs' / 'run'),
              REPORT_ROOT=str(tmp_path / 'runs'), REPORT_DIR=str(tmp_path / 'report'))


def test_every_cell_runs_on_cpu_the_install_included(tmp_path):
  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', '--system-site-packages', '--without-pip', str(venv)],
                 check=True, timeout=120)
  parameters = _tiny(tmp_path)
  argv = [str(venv / 'bin' / 'python'), os.path.join(ROOT, 'launch', 'run_notebook.py'),
          f'--out={tmp_path / "done.ipynb"}', *[f'--set={k}={v!r}' for k, v in parameters.items()]]
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}  # the installed copy, not ROOT
  out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
                       check=False)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  with open(tmp_path / 'done.ipynb') as f:
    executed = json.load(f)
  assert executed['metadata']['executed']['error'] is None
  code = _code_cells(executed)
  assert [c['execution_count'] for c in code] == list(range(1, len(code) + 1))
  printed = [''.join(o['text'] for o in c['outputs'] if o['name'] == 'stdout') for c in code]
  # The install: the runtime's jax pinned and left where it was, no TensorFlow, the package in the venv.
  site = glob.glob(str(venv / 'lib' / 'python*' / 'site-packages'))[0]
  assert re.search(r'Keeping .*\bjax==[\w.]+, jaxlib==', printed[1]), printed[1]
  assert f'dp2fedsam_jax 0.2.0 in {site}' in printed[1]
  assert not glob.glob(os.path.join(site, 'jax*')) and not glob.glob(os.path.join(site, '*tensorflow*'))
  print(f'install cell: {code[1]["metadata"]["execution_seconds"]} s')
  assert 'CPU device(s)' in printed[2]
  assert printed[4].startswith('Done: dp2fedsam on synthetic, round 2/2: test accuracy')
  final = metric_writers.read_jsonl(os.path.join(parameters['WORKDIR'], metric_writers.EVAL_FILE))[-1]
  assert final['round'] == 2 and final['epsilon'] <= 2.0  # the default config's eps=2 target
  plots = glob.glob(str(tmp_path / 'report' / '**' / '*.png'), recursive=True)
  assert len(plots) == 2 and all(os.path.getsize(p) > 10_000 for p in plots)
  # The run's own lines are on the console, library INFO lines (orbax's, JAX's) are not.
  assert re.search(r'round 2/2  acc ', out.stderr)
  assert 'CheckpointManager' not in out.stderr and 'xla_bridge' not in out.stderr, out.stderr[-3000:]
