"""Initialisation from a pretrained checkpoint (config.init_checkpoint).

Format: one flax msgpack file (`flax.serialization.msgpack_serialize`) of the SplitModel params
{'extractor': {...}, 'head': {...}}, as written by `save_params`. The papers start from pretrained
backbones; a run restores the extractor exactly and keeps the head only if it fits.

Rule: the extractor must match the model's extractor leaf for leaf (same names and shapes), else
an error lists the differences. The head is kept iff the file has one with exactly the model's
head shapes (same feature size and number of classes); otherwise (e.g. 10 -> 5 classes, or no head
in the file) the model's freshly initialised head is used.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization
from flax import traverse_util


def save_params(path: str, params: dict) -> None:
  """Writes {'extractor': ..., 'head': ...} params to `path` (msgpack), atomically."""
  if 'extractor' not in params:
    raise ValueError(f"params need an 'extractor' entry; got keys {sorted(params)}.")
  blob = serialization.msgpack_serialize(jax.tree.map(np.asarray, jax.device_get(dict(params))))
  tmp = f'{path}.tmp'
  with open(tmp, 'wb') as f:
    f.write(blob)
  os.replace(tmp, path)


def read_params(path: str) -> dict:
  with open(path, 'rb') as f:
    blob = f.read()
  try:
    params = serialization.msgpack_restore(blob)
  except Exception as e:  # noqa: BLE001 - any decoding error means the same thing
    raise ValueError(f'config.init_checkpoint={path!r}: not a flax msgpack params file ({e}); '
                     'write it with dp2fedsam_jax.models.save_params(path, params).') from e
  if not isinstance(params, dict) or 'extractor' not in params:
    keys = sorted(params) if isinstance(params, dict) else type(params).__name__
    raise ValueError(f"config.init_checkpoint={path!r}: expected {{'extractor': ..., 'head': ...}}; "
                     f'got {keys}.')
  return params


def _shapes(tree) -> dict:
  return {'/'.join(k): tuple(np.shape(v)) for k, v in traverse_util.flatten_dict(tree).items()}


def restore_from_checkpoint(fresh: dict, path: str) -> dict:
  """`fresh` (the model's initial params) with the extractor (and a fitting head) from `path`."""
  saved = read_params(path)
  want, have = _shapes(fresh['extractor']), _shapes(saved['extractor'])
  if want != have:
    diffs = [f'{k}: model {want.get(k)} vs file {have.get(k)}'
             for k in sorted(set(want) | set(have)) if want.get(k) != have.get(k)]
    raise ValueError(f'config.init_checkpoint={path!r}: its extractor does not fit config.model '
                     f'({len(diffs)} differences: {"; ".join(diffs[:5])}).')
  cast = lambda new, like: jnp.asarray(new, dtype=like.dtype)
  out = dict(fresh)
  out['extractor'] = jax.tree.map(cast, saved['extractor'], fresh['extractor'])
  head = saved.get('head')
  if head is not None and _shapes(head) == _shapes(fresh['head']):
    out['head'] = jax.tree.map(cast, head, fresh['head'])
  return out


@dataclasses.dataclass(frozen=True)
class CheckpointInit:
  """A model whose `init` restores from a checkpoint (what `state.init_state` calls)."""
  model: Any
  path: str

  def init(self, key: jax.Array) -> dict:
    return restore_from_checkpoint(self.model.init(key), self.path)

  def __getattr__(self, name):  # everything else is the model's
    return getattr(self.model, name)
