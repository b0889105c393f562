"""launch/colab_tpu.ipynb: valid nbformat-4 JSON whose code cells run on CPU with a tiny config.

No Jupyter needed: launch/run_notebook.py executes the code cells in order in one namespace, skipping
the cell tagged `install` (it clones and pip-installs) and overriding the `parameters` cell's values
with a tiny synthetic run, so the notebook cannot rot without this test failing; the same runner
executes it on a GPU machine.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip('matplotlib', reason='the [report] extra (matplotlib) is not installed')

from launch import run_notebook  # pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, 'launch', 'colab_tpu.ipynb')


def _cells():
  with open(NOTEBOOK) as f:
    nb = json.load(f)
  assert nb['nbformat'] == 4 and isinstance(nb['metadata'], dict)
  for cell in nb['cells']:
    assert cell['cell_type'] in ('code', 'markdown') and isinstance(cell['source'], list)
    if cell['cell_type'] == 'code':
      assert cell['outputs'] == [] and 'execution_count' in cell  # committed without outputs
  return nb['cells']


def test_notebook_has_install_and_parameters_cells():
  tags = [t for cell in _cells() for t in run_notebook.tags(cell)]
  assert tags.count('install') == 1 and tags.count('parameters') == 1


def _tiny(tmp_path) -> dict:
  """The parameters cell's values for a 2-round synthetic run under tmp_path."""
  overrides = {
      'dataset': 'synthetic', 'model': 'mlp', 'num_clients': 6, 'partition': 'iid',
      'sampling_rate': 0.5, 'num_rounds': 2, 'eval_every': 1, 'local.batch_size': 16,
      'local.personal_epochs': 1, 'local.shared_epochs': 1, 'dp.clip_norm': 1.0,
  }
  return dict(OVERRIDES=overrides, WORKDIR=str(tmp_path / 'runs' / 'run'),
              REPORT_ROOT=str(tmp_path / 'runs'), REPORT_DIR=str(tmp_path / 'report'))


def test_notebook_code_cells_run_on_cpu(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)  # the notebook runs from the repository root, like after its install cell
  with open(NOTEBOOK) as f:
    notebook = json.load(f)
  executed, namespace, error = run_notebook.run(notebook, _tiny(tmp_path))
  assert error is None
  ran = [c for c in executed['cells'] if c['cell_type'] == 'code' and c['execution_count']]
  assert len(ran) == 4 and not any('install' in run_notebook.tags(c) for c in ran)
  assert namespace['CONFIG'] == 'experiments/configs/default.py'
  assert namespace['PLATFORM'] == 'cpu'
  assert namespace['final']['round'] == 2 and namespace['config'].method == 'dp2fedsam'
  assert namespace['final']['epsilon'] <= 2.0  # the default config's eps=2 target
  plots = namespace['paths']['plots']
  assert len(plots) == 2 and all(os.path.getsize(p) > 10_000 for p in plots)
  # The executed copy keeps what each cell printed: the device line, the final record.
  printed = [''.join(o['text'] for o in c['outputs'] if o['name'] == 'stdout') for c in ran]
  assert 'CPU device(s)' in printed[1] and "'round': 2" in printed[2]


def test_the_runner_binary_writes_the_executed_copy_and_stops_at_an_error(tmp_path):
  parameters = _tiny(tmp_path)
  argv = [sys.executable, '-m', 'launch.run_notebook', f'--out={tmp_path / "done.ipynb"}']
  argv += [f'--set={name}={value!r}' for name, value in parameters.items()]
  out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  with open(tmp_path / 'done.ipynb') as f:
    executed = json.load(f)
  assert executed['metadata']['executed']['error'] is None
  assert [c['execution_count'] for c in executed['cells'] if c['cell_type'] == 'code'] == [None, 1, 2, 3, 4]
  # A failing cell is recorded with its error, the later ones do not run, the exit says which.
  parameters['CONFIG'] = str(tmp_path / 'missing.py')
  argv = argv[:4] + [f'--set={name}={value!r}' for name, value in parameters.items()]
  out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
  assert out.returncode == 1 and 'cell 4 raised FileNotFoundError' in out.stderr
  with open(tmp_path / 'done.ipynb') as f:
    cells = [c for c in json.load(f)['cells'] if c['cell_type'] == 'code']
  assert cells[3]['outputs'][-1]['ename'] == 'FileNotFoundError' and cells[4]['execution_count'] is None
