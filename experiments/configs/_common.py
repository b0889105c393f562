"""Shared helpers of the paper configs: argument parsing, grids, and fields that do not exist yet.

Every paper config is `get_config(arg)` (big_vision style, `--config=path.py:method=dp2fedsam,eps=1`)
plus `sweep_grid()`, the list of argument dicts that reproduces its table; `launch/sweep.py` reads it.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable


from dp2fedsam_jax.algorithms import METHODS

SEEDS = (0, 1, 2)  # every paper: three runs, mean and std over the final round

# Dataset and model names as the data/model registries spell them.
EMNIST_62 = 'emnist_byclass'  # EMNIST with 62 classes (dp-fedsam-topk.txt §6.1)


_TRUE, _FALSE = ('1', 'true', 'yes'), ('0', 'false', 'no')


def parse_args(arg: str | None, **defaults) -> dict[str, Any]:
  """'method=centaur,eps=1,seed=2' -> dict, values typed like their defaults.

  The one parser of every config file's `:key=value,...` argument, and a strict one: an unknown
  key, a repeated key, an item without '=', or a value that is not of its default's type (int,
  float, bool as true/false/1/0/yes/no) fails, naming the item and the known keys.
  """
  args = dict(defaults)
  seen = set()
  for item in (arg.split(',') if arg else []):
    if not item:
      continue
    if '=' not in item:
      raise ValueError(f'config argument {item!r} is not key=value (known keys: {sorted(defaults)})')
    key, value = item.split('=', 1)
    if key not in defaults:
      raise ValueError(f'unknown config argument {key!r}; known: {sorted(defaults)}')
    if key in seen:
      raise ValueError(f'config argument {key!r} is given twice in {arg!r}')
    seen.add(key)
    default = defaults[key]
    if isinstance(default, bool):
      if value.lower() not in _TRUE + _FALSE:
        raise ValueError(f'config argument {item!r}: {key} is a bool; use one of '
                         f'{list(_TRUE + _FALSE)}')
      args[key] = value.lower() in _TRUE
    elif isinstance(default, (int, float)):
      kind = type(default)
      try:
        args[key] = kind(value)
      except ValueError:
        raise ValueError(f'config argument {item!r}: {key} is {kind.__name__!r} '
                         f'(default {default!r})') from None
    else:
      args[key] = value
  return args


def grid(**axes: Iterable) -> list[dict[str, Any]]:
  """Cartesian product of the axes, as a list of argument dicts (the last axis varies fastest)."""
  keys = list(axes)
  return [dict(zip(keys, values)) for values in itertools.product(*(list(axes[k]) for k in keys))]


def set_fields(config, values: dict[str, Any]) -> None:
  """Sets dotted fields, e.g. {'local.lr_shared': 0.1}; the field must exist in the config."""
  for path, value in values.items():
    node = config
    *parents, leaf = path.split('.')
    for p in parents:
      node = node[p]
    if leaf not in node:
      raise KeyError(f'config has no field {path!r}')
    node[leaf] = value


def synthetic_mlp(config, num_clients: int):
  """`config` made a synthetic-data MLP federation of iid clients that trains in about a second a
  round on a CPU (the audit's setup and the tests'): one personal and one shared epoch of batch 16,
  lr 0.05, momentum 0.5, SAM rho 0.05, C = 1."""
  config.dataset, config.model, config.partition = 'synthetic', 'mlp', 'iid'
  config.num_clients = num_clients
  config.local.update(personal_epochs=1, shared_epochs=1, batch_size=16, lr_personal=0.05,
                      lr_shared=0.05, momentum=0.5, sam_rho=0.05)
  config.dp.clip_norm = 1.0
  return config


def noise_placement_for(method: str) -> str:
  """'distributed' for methods that sparsify each client's own noised upload (DP-FedSAM-topk
  Option II), else 'central' (the same total noise, covered by epsilon without secure aggregation)."""
  return 'distributed' if METHODS[method].postprocess.on_client_noise else 'central'
