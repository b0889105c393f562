"""Checkpoints (orbax), written so that a kill at any moment leaves the last finished one usable.

A checkpoint holds the server state and, as JSON, the evaluation records (metrics.jsonl) up to its
round, the per-round training scalars since the last evaluation (so that the next evaluation record
of a resumed run averages the same rounds as an uninterrupted run's) and a SHA-256 of the state.

- orbax finalizes a step directory atomically (an unfinished one is ignored on restore), and the
  last two are kept (`KEEP`): a latest checkpoint that cannot be read, or whose state does not match
  its hash, is moved to `corrupt_checkpoints/` with a warning and the previous one is used; when
  none is readable, `restore_run` refuses (CheckpointError) rather than start again from round 0.
- A write that fails (a full disk, a read-only workdir) raises CheckpointError in one line; the
  checkpoints written before are untouched.

On resume train.py rewrites metrics.jsonl from the checkpointed records and cuts train_metrics.jsonl
back to the checkpoint's round (workdir.py). Keys derive from (seed, round), so a resumed run repeats
the uninterrupted one exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging as std_logging
import os
import shutil
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

_DIR = 'checkpoints'
CORRUPT_DIR = 'corrupt_checkpoints'
KEEP = 2  # the latest and the one before, the fallback when the latest is unreadable


def _absl_writes_a_file() -> bool:
  stream = getattr(logging.get_absl_handler().python_handler, 'stream', None)
  return stream not in (None, sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)


class _OrbaxInfoToLogFileOnly(std_logging.Filter):
  """orbax logs ~25 INFO lines a checkpoint through absl. They go where absl writes a log file (the
  binary's train.INFO; its console shows only the project's lines, cli.is_console_record), or with
  -v 1; never to a notebook's or a script's output."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.levelno >= std_logging.WARNING or _ORBAX_DIR not in os.path.abspath(record.pathname):
      return True
    return logging.get_verbosity() >= logging.DEBUG or _absl_writes_a_file()


_ORBAX_DIR = os.path.dirname(os.path.abspath(ocp.__file__)).rsplit(os.sep, 1)[0] + os.sep
_QUIET_ORBAX = _OrbaxInfoToLogFileOnly()
if not any(isinstance(f, _OrbaxInfoToLogFileOnly) for f in std_logging.getLogger('absl').filters):
  std_logging.getLogger('absl').addFilter(_QUIET_ORBAX)


class CheckpointError(RuntimeError):
  """A checkpoint cannot be written, or none of the kept ones can be read."""


@dataclasses.dataclass
class Restored:
  state: object
  records: list[dict]       # the evaluation records up to the checkpoint's round
  window: list[dict]        # the training scalars of the rounds since the last evaluation


def _manager(workdir: str) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=KEEP, enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, _DIR)), options=options)


def _host_value(leaf) -> np.ndarray | None:
  """The whole value of a leaf on this host (a replicated array of a multi-host run included)."""
  if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
    return np.asarray(jax.device_get(leaf))
  if leaf.sharding.is_fully_replicated:
    return np.asarray(leaf.addressable_data(0))
  return None


def state_digest(state) -> str | None:
  """SHA-256 of every leaf's dtype, shape and bytes (None if a leaf is not whole on this host)."""
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(state):
    value = _host_value(leaf)
    if value is None:
      return None
    value = np.ascontiguousarray(value)
    digest.update(f'{value.dtype.str}{value.shape}'.encode())
    digest.update(value.tobytes())
  return digest.hexdigest()


def _json_scalar(value):
  """A Python number that reads back as the same float32/int32 (float(np.float32) is exact)."""
  return value.item() if hasattr(value, 'item') else value


def save(workdir: str, state, records: list[dict], window: list[dict] = ()) -> None:
  """Writes the checkpoint of round state.round; raises CheckpointError when the write fails."""
  payload = {'records': list(records),
             'window': [{k: _json_scalar(v) for k, v in m.items()} for m in window],
             'state_sha256': state_digest(state)}
  step = int(state.round)
  try:
    with _manager(workdir) as manager:
      manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), records=ocp.args.JsonSave(payload)))
      manager.wait_until_finished()
  except Exception as e:  # pylint: disable=broad-except  (orbax and tensorstore wrap OSErrors)
    reason = ' '.join(str(e).split())[:300] or type(e).__name__
    raise CheckpointError(
        f'round {step}: cannot write its checkpoint in {os.path.join(workdir, _DIR)} ({reason}); '
        f'{_previous(workdir, step)}. Free space or make the workdir writable, then rerun the same '
        'command to resume.') from e


def _previous(workdir: str, step: int) -> str:
  earlier = [s for s in _steps(workdir) if s < step]
  return (f'the checkpoint of round {max(earlier)} is intact' if earlier else
          'no earlier checkpoint exists')


def _steps(workdir: str) -> list[int]:
  directory = os.path.join(workdir, _DIR)
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []


def exists(workdir: str) -> bool:
  return bool(_steps(workdir))


def latest_round(workdir: str) -> int:
  """The round of the last finished checkpoint in workdir; 0 when there is none."""
  return max(_steps(workdir), default=0)


def _missing_fields(manager: ocp.CheckpointManager, step: int, initial_state) -> set[str]:
  """The state's fields a checkpoint written before they existed lacks. Only a field that is empty
  in this run's initial state (no arrays: e.g. clip_state under fixed clipping) may be missing;
  the run then resumes with it as initialised."""
  if not dataclasses.is_dataclass(initial_state):
    return set()
  # The item's own metadata, through its handler: the Checkpointer would also look for a step's
  # metadata file inside the item and warn on the console that it is missing.
  on_disk = ocp.StandardCheckpointHandler().metadata(manager.directory / str(step) / 'state')
  names = set(on_disk.tree.keys())
  missing = {f.name for f in dataclasses.fields(initial_state)} - names
  if any(jax.tree.leaves(getattr(initial_state, name)) for name in missing):
    raise CheckpointError(f'it lacks the state field(s) {sorted(missing)} this run needs (a '
                          'checkpoint written before they existed)')
  return missing


def _read(manager: ocp.CheckpointManager, step: int, initial_state) -> Restored:
  missing = _missing_fields(manager, step, initial_state)
  target = initial_state
  if missing:  # restore the fields it has; the others stay as initialised
    target = {f.name: getattr(initial_state, f.name) for f in dataclasses.fields(initial_state)
              if f.name not in missing}
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract), records=ocp.args.JsonRestore()))
  payload, state = restored['records'], restored['state']
  if missing:
    state = initial_state.replace(**state)
  if isinstance(payload, list):  # written before the window and the hash were saved
    return Restored(state, payload, [])
  want = payload.get('state_sha256')
  if want is not None and state_digest(state) not in (want, None):
    raise CheckpointError('its state does not match the SHA-256 saved with it')
  return Restored(state, list(payload['records']), list(payload.get('window', [])))


def _set_aside(workdir: str, step: int) -> str:
  target = os.path.join(workdir, CORRUPT_DIR, f'{step}-{time.strftime("%Y%m%d-%H%M%S")}')
  os.makedirs(os.path.dirname(target), exist_ok=True)
  shutil.move(os.path.join(workdir, _DIR, str(step)), target)
  return target


def restore_run(workdir: str, initial_state) -> Restored:
  """The latest readable checkpoint in workdir, or (initial_state, [], []) if there is none.

  A checkpoint that fails to read or to match its hash is moved to corrupt_checkpoints/ with a
  warning, and the one before it is tried; CheckpointError when there are checkpoints and none of
  them is readable (never a silent start from round 0)."""
  failures = []
  while _steps(workdir):
    step = _steps(workdir)[-1]
    try:
      with _manager(workdir) as manager:
        return _read(manager, step, initial_state)
    except Exception as e:  # pylint: disable=broad-except  (whatever a damaged file raises)
      reason = ' '.join(str(e).split())[:200] or type(e).__name__
      if jax.process_count() > 1:  # the other processes would not follow a fallback
        raise CheckpointError(f'the checkpoint of round {step} in {workdir} is unreadable '
                              f'({reason})') from e
      moved = _set_aside(workdir, step)
      failures.append(f'round {step}: {reason}')
      logging.warning('The checkpoint of round %d in %s is unreadable (%s); moved to %s, trying the '
                      'one before.', step, workdir, reason, moved)
  if failures:
    raise CheckpointError(
        f'no readable checkpoint in {os.path.join(workdir, _DIR)} ({"; ".join(failures)}); they '
        f'are in {os.path.join(workdir, CORRUPT_DIR)}. Use a new --workdir, or remove the old run\'s '
        'files from this one to start again from round 0.')
  return Restored(initial_state, [], [])


def restore(workdir: str, initial_state):
  """(state, records) of the latest readable checkpoint in workdir, or (initial_state, [])."""
  restored = restore_run(workdir, initial_state)
  return restored.state, restored.records
