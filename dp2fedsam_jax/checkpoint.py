"""Checkpoints (orbax), written so that a kill at any moment leaves the last finished one usable.

A checkpoint holds the server state and the evaluation records (metrics.jsonl) up to its round.
orbax finalizes a step directory atomically (an unfinished one is ignored on restore); on resume
train.py rewrites metrics.jsonl from the checkpointed records and cuts train_metrics.jsonl back to
the checkpoint's round (metric_writers.py). Keys derive from (seed, round), so a resumed run repeats
the uninterrupted one exactly.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

_DIR = 'checkpoints'


def _manager(workdir: str) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, _DIR)), options=options)


def save(workdir: str, state, records: list[dict]) -> None:
  with _manager(workdir) as manager:
    manager.save(int(state.round), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), records=ocp.args.JsonSave(records)))
    manager.wait_until_finished()


def exists(workdir: str) -> bool:
  return os.path.isdir(os.path.join(workdir, _DIR)) and any(
      name.isdigit() for name in os.listdir(os.path.join(workdir, _DIR)))


def latest_round(workdir: str) -> int:
  """The round of the last finished checkpoint in workdir; 0 when there is none."""
  directory = os.path.join(workdir, _DIR)
  steps = [int(n) for n in os.listdir(directory) if n.isdigit()] if os.path.isdir(directory) else []
  return max(steps, default=0)


def restore(workdir: str, initial_state):
  """(state, records) of the latest checkpoint in workdir, or (initial_state, []) if there is none."""
  if not os.path.isdir(os.path.join(workdir, _DIR)):
    return initial_state, []
  with _manager(workdir) as manager:
    step = manager.latest_step()
    if step is None:
      return initial_state, []
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, initial_state)
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), records=ocp.args.JsonRestore()))
  return restored['state'], list(restored['records'])

