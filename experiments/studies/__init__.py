"""Studies: the logic applied to what a config (experiments/configs/) declares.

A study module holds a study's declared decision rules applied to the runs, its cost model, which
finished runs still need what, and its privacy accounting; fair.py is the fair benchmark's protocol
(the rows, claims and blocks its configs declare, and the rules that turn them into searches and
verdicts). A study named like its config (shakespeare_field.py for
experiments/configs/shakespeare_field.py) imports that config; a config imports no study but
fair.py, which imports no config but _common. Nothing here imports launch/ (tests/test_layers.py).
"""

from __future__ import annotations

import importlib


def of_config(config_name: str):
  """The study module of the config named `config_name` (experiments/studies/<config_name>.py), or
  None when the config has none."""
  name = f'{__name__}.{config_name}'
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name != name:
      raise  # the study exists but an import inside it failed
    return None
