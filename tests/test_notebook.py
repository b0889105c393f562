"""launch/colab_tpu.ipynb: valid nbformat-4 JSON whose code cells run on CPU with a tiny config.

No Jupyter needed: the code cells are executed in order in one namespace, skipping the cell tagged
`install` (it clones and pip-installs) and overriding the `parameters` cell's values with a tiny
synthetic run, so the notebook cannot rot without this test failing.
"""

import json
import os

import pytest

pytest.importorskip('matplotlib', reason='the [report] extra (matplotlib) is not installed')

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


def _tags(cell):
  return cell.get('metadata', {}).get('tags', [])


def test_notebook_has_install_and_parameters_cells():
  tags = [t for cell in _cells() for t in _tags(cell)]
  assert tags.count('install') == 1 and tags.count('parameters') == 1


def test_notebook_code_cells_run_on_cpu(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)  # the notebook runs from the repository root, like after its install cell
  tiny = {
      'dataset': 'synthetic', 'model': 'mlp', 'num_clients': 6, 'partition': 'iid',
      'sampling_rate': 0.5, 'num_rounds': 2, 'eval_every': 1, 'local.batch_size': 16,
      'local.personal_epochs': 1, 'local.shared_epochs': 1, 'dp.clip_norm': 1.0,
  }
  namespace = {}
  ran = []
  for index, cell in enumerate(_cells()):
    if cell['cell_type'] != 'code' or 'install' in _tags(cell):
      continue
    exec(compile(''.join(cell['source']), f'colab_tpu.ipynb cell {index}', 'exec'), namespace)
    ran.append(index)
    if 'parameters' in _tags(cell):
      assert namespace['CONFIG'] == 'experiments/configs/default.py'
      namespace.update(OVERRIDES=tiny, WORKDIR=str(tmp_path / 'runs' / 'run'),
                       REPORT_ROOT=str(tmp_path / 'runs'), REPORT_DIR=str(tmp_path / 'report'))
  assert len(ran) == 4
  assert namespace['PLATFORM'] == 'cpu'
  assert namespace['final']['round'] == 2 and namespace['config'].method == 'dp2fedsam'
  assert namespace['final']['epsilon'] <= 2.0  # the default config's eps=2 target
  plots = namespace['paths']['plots']
  assert len(plots) == 2 and all(os.path.getsize(p) > 10_000 for p in plots)
