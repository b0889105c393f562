"""Shared helpers of the paper configs: argument parsing, grids, and fields that do not exist yet.

Every paper config is `get_config(arg)` (big_vision style, `--config=path.py:method=dp2fedsam,eps=1`)
plus `sweep_grid()`, the list of argument dicts that reproduces its table; `launch/sweep.py` reads it.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable

from absl import logging

SEEDS = (0, 1, 2)  # every paper: three runs, mean and std over the final round

# Dataset and model names as the data/model registries spell them.
EMNIST_62 = 'emnist_byclass'  # EMNIST with 62 classes (dp-fedsam-topk.txt §6.1)


def parse_args(arg: str | None, **defaults) -> dict[str, Any]:
  """'method=centaur,eps=1,seed=2' -> dict, values typed like their defaults; unknown keys fail."""
  args = dict(defaults)
  for item in (arg.split(',') if arg else []):
    if not item:
      continue
    if '=' not in item:
      raise ValueError(f'config argument {item!r} is not key=value (known keys: {sorted(defaults)})')
    key, value = item.split('=', 1)
    if key not in defaults:
      raise ValueError(f'unknown config argument {key!r}; known: {sorted(defaults)}')
    default = defaults[key]
    if isinstance(default, bool):
      args[key] = value.lower() in ('1', 'true', 'yes')
    elif isinstance(default, int):
      args[key] = int(value)
    elif isinstance(default, float):
      args[key] = float(value)
    else:
      args[key] = value
  return args


def grid(**axes: Iterable) -> list[dict[str, Any]]:
  """Cartesian product of the axes, as a list of argument dicts (the last axis varies fastest)."""
  keys = list(axes)
  return [dict(zip(keys, values)) for values in itertools.product(*(list(axes[k]) for k in keys))]


def set_fields(config, values: dict[str, Any]) -> None:
  """Sets dotted fields, e.g. {'local.lr_body': 0.1}; the field must exist in the config."""
  for path, value in values.items():
    node = config
    *parents, leaf = path.split('.')
    for p in parents:
      node = node[p]
    if leaf not in node:
      raise KeyError(f'config has no field {path!r}')
    node[leaf] = value


# Fields the papers set that are added to base_config() by other changes (the methods that read
# them are being added too). Until a field exists, its paper value is logged and recorded in
# returned by set_if_defined, never silently invented; once it exists, it is set like any other.
PENDING_FIELD_NAMES = ('local.finetune_epochs', 'sparsity', 'dsu.sparsity', 'dsu.masked_layers',
                       'dsu.lam', 'blur_lambda')


def _has_field(config, path: str) -> bool:
  node = config
  for part in path.split('.'):
    if not hasattr(node, 'keys') or part not in node:
      return False
    node = node[part]
  return True


def set_if_defined(config, values: dict[str, Any]) -> dict[str, Any]:
  """Sets the fields that exist; returns (and logs) the paper values of those that do not yet."""
  missing = {}
  for path, value in values.items():
    if path not in PENDING_FIELD_NAMES:
      raise KeyError(f'{path!r} is not a known pending field; use set_fields for existing ones')
    if _has_field(config, path):
      set_fields(config, {path: value})
    else:
      missing[path] = value
  if missing:
    logging.log_first_n(logging.WARNING, 'config fields not defined yet, paper values not '
                        'applied: %s', 1, missing)
  return missing
