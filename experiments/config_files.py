"""Config files by path: load one, write its argument string, apply `--config.x=y` overrides.

A config file (experiments/configs/*.py) is `get_config(arg)` with an argument string such as
'eps=1,method=centaur'. The launchers (launch/sweep.py, launch/tune.py, launch/fair_benchmark.py),
the audit (experiments/audit.py) and the studies (experiments/studies/) all build configs this way,
so it lives here, below them: launch/ imports experiments/, never the reverse.
"""

from __future__ import annotations

import ast
import importlib.util
import os

from dp2fedsam_jax import cli

OVERRIDE_PREFIX = '--config.'


def format_value(value) -> str:
  """Config-argument text of a value: 1.0 -> '1', 0.05 -> '0.05', inf -> 'inf'."""
  if isinstance(value, float):
    return f'{value:g}'
  return str(value)


def arg_string(args: dict) -> str:
  """{'method': 'centaur', 'eps': 1.0} -> 'eps=1,method=centaur' (sorted, so stable)."""
  return ','.join(f'{k}={format_value(v)}' for k, v in sorted(args.items()))


def config_name(path: str) -> str:
  """'experiments/configs/shakespeare_field.py[:args]' -> 'shakespeare_field': a sweep root's
  folder of the config's runs, and the name of its study (experiments/studies/)."""
  return os.path.splitext(os.path.basename(path.partition(':')[0]))[0]


def load_config_module(path: str):
  """The config file at `path` as a module of its own (name _sweep_config_<config name>)."""
  spec = importlib.util.spec_from_file_location(f'_sweep_config_{config_name(path)}', path)
  if spec is None or spec.loader is None:
    raise ValueError(f'--config={path}: not a Python file')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def parse_literal(text: str):
  """A Python literal if `text` is one ('0.5', '[1, 2]'), else the text itself."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def apply_overrides(config, overrides: list[str]):
  """Applies '--config.a.b=value' texts (typed like the field) to a copy of the config."""
  config = config.copy_and_resolve_references()
  for item in overrides:
    path, _, text = item[len(OVERRIDE_PREFIX):].partition('=')
    *parents, leaf = path.split('.')
    node = config
    for p in parents:
      node = node[p] if p in node else None
      if not hasattr(node, 'keys'):
        break
    if not hasattr(node, 'keys') or leaf not in node:
      raise ValueError(cli.unknown_field_message('config', path, cli.field_paths(config)))
    old = node[leaf]
    if text in ('None', 'none'):
      value = None
    elif isinstance(old, bool):
      value = text.lower() in ('1', 'true', 'yes')
    elif isinstance(old, int) and float(text).is_integer():
      value = int(float(text))
    elif isinstance(old, (int, float)):
      value = float(text)
    elif isinstance(old, str):
      value = text
    else:
      value = parse_literal(text)
    node[leaf] = value
  return config
