"""The linter (ruff, configured in pyproject.toml) passes on everything the project ships."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_finds_nothing():
  ruff = shutil.which('ruff')
  if ruff is None:
    pytest.fail("ruff is missing: install the test extra, pip install -e '.[test]'")
  result = subprocess.run([ruff, 'check', '--no-cache', '--output-format', 'concise', '.'], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr
