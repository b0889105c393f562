"""The wheel `pip wheel --no-deps .` builds: the package, its licence, its version, a core install
free of TensorFlow, and binaries that run from the installed files alone.

The wheel is built from a copy of the sources in a temporary directory (setuptools' build/ in the
checkout would keep files a later build no longer has). Build isolation fetches setuptools >= 77
from the package index; where the installed setuptools is new enough, --no-build-isolation builds
offline.
"""

import email.parser
import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import dp2fedsam_jax
from dp2fedsam_jax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ('pyproject.toml', 'README.md', 'LICENSE', 'dp2fedsam_jax', 'experiments', 'launch', 'benchmarks')


def _version_tuple(version: str) -> tuple[int, ...]:
  return tuple(int(part) for part in version.split('.')[:2] if part.isdigit())


def _isolation_flags() -> list[str]:
  try:
    installed = importlib.metadata.version('setuptools')
    importlib.metadata.version('wheel')
  except importlib.metadata.PackageNotFoundError:
    return []
  return ['--no-build-isolation'] if _version_tuple(installed) >= (77,) else []


@pytest.fixture(scope='module')
def wheel(tmp_path_factory) -> zipfile.ZipFile:
  source, out = tmp_path_factory.mktemp('source'), tmp_path_factory.mktemp('wheel')
  ignore = shutil.ignore_patterns('__pycache__', 'results', '*.egg-info', 'build')
  for name in SOURCES:
    path = os.path.join(ROOT, name)
    if os.path.isdir(path):
      shutil.copytree(path, source / name, ignore=ignore)
    else:
      shutil.copy(path, source / name)
  argv = [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '-q', *_isolation_flags(), '-w', str(out),
          str(source)]
  built = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
  assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
  [name] = os.listdir(out)
  return zipfile.ZipFile(out / name)


def _metadata(wheel: zipfile.ZipFile):
  [path] = [n for n in wheel.namelist() if n.endswith('.dist-info/METADATA')]
  return email.parser.Parser().parsestr(wheel.read(path).decode())


def test_wheel_carries_the_package_the_binaries_and_the_licence(wheel):
  names = set(wheel.namelist())
  assert {'dp2fedsam_jax/__init__.py', 'dp2fedsam_jax/train.py', 'experiments/train.py',
          'experiments/configs/default.py', 'experiments/report/__init__.py', 'launch/sweep.py'} <= names
  assert not any(n.startswith(('benchmarks/', 'tests/')) for n in names)
  licences = [n for n in names if '.dist-info/' in n and os.path.basename(n) == 'LICENSE']
  assert len(licences) == 1
  with open(os.path.join(ROOT, 'LICENSE'), 'rb') as f:
    assert wheel.read(licences[0]) == f.read()
  assert b'Apache License' in wheel.read(licences[0])


def test_wheel_metadata_version_licence_and_tensorflow_free_core(wheel):
  metadata = _metadata(wheel)
  assert metadata['Version'] == dp2fedsam_jax.__version__ == '0.2.0'
  assert metadata['License-Expression'] == 'Apache-2.0'
  requirements = metadata.get_all('Requires-Dist')
  core = [r for r in requirements if 'extra ==' not in r]
  assert any(r.startswith('jax') for r in core)
  assert not [r for r in core if 'tensorflow' in r.lower()], core
  # TensorFlow stays an extra (the TFDS sources) and is one.
  assert any('tensorflow' in r and 'extra == "tfds"' in r for r in requirements)


def test_installed_wheel_imports_without_the_checkout(wheel, tmp_path):
  """The wheel's files alone (no checkout on the path) give the package at its version and the
  binaries' modules."""
  wheel.extractall(tmp_path / 'site')
  code = ('import dp2fedsam_jax, experiments.train, launch.sweep; '
          'print(dp2fedsam_jax.__version__, dp2fedsam_jax.__file__)')
  env = {**os.environ, 'PYTHONPATH': str(tmp_path / 'site')}
  out = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  version, path = out.stdout.split()
  assert version == '0.2.0' and path.startswith(str(tmp_path / 'site'))


def test_installed_in_site_packages_the_console_still_shows_the_projects_lines(monkeypatch, tmp_path):
  """The binary's quiet console (cli.is_console_record) tells the project's lines from a library's
  by their file, also where both live in site-packages."""
  site = str(tmp_path / 'lib' / 'python3' / 'site-packages')
  monkeypatch.setattr(cli, '_ROOT', site)

  def record(path: str) -> logging.LogRecord:
    return logging.LogRecord('absl', logging.INFO, os.path.join(site, path), 1, 'a line', None, None)
  assert cli.is_console_record(record('dp2fedsam_jax/train.py'))
  assert cli.is_console_record(record('experiments/train.py'))
  assert not cli.is_console_record(record('orbax/checkpoint/checkpoint_manager.py'))
