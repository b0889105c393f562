"""The files of a run in its workdir: one writer at a time, and the bookkeeping that makes a resume repeat
the run.

- **One writer** (`hold`): an exclusive `fcntl.flock` on `<workdir>/writer.lock`, taken before
  anything is written there. The OS releases it when the process ends, however it ends (a SIGKILL
  leaves no stale lock); a second run on the same workdir fails with `WorkdirBusyError`, naming the
  holder's pid (exit 2 in the binaries); `holder` lets launch/sweep.py skip a workdir in use.
- **config.json**: the config as run (sigma, delta, the executor resolved), written atomically; a
  resume under another config is refused (`check_same_run`), a finished run is recognised without
  loading anything (`finished_record`).
- **The metrics files**: cut back on resume to the checkpoint's round (`cut_back_metrics`), so an
  interrupted and resumed run ends with the files of an uninterrupted one (but `seconds`).
- **hosts.jsonl**: where each stretch of the run ran (`record_host`): a line per start, from the
  round it started after, with the machine (dp2fedsam_jax/host.py). The bits of a round depend on
  the instruction set and the cores a run may use, so a run resumed elsewhere says so.

Multi-host: only process 0 locks and writes (the workdir is one shared directory).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time

import jax
from absl import logging

from dp2fedsam_jax import checkpoint, config_help, host, metric_writers, protocol, stopping

CONFIG_FILE = 'config.json'
LOCK_FILE = 'writer.lock'


class WorkdirBusyError(RuntimeError):
  """Another live process writes to this workdir."""


# ---------------------------------------------------------------------------------------------
# One writer


_held: dict[str, list[int]] = {}  # lock path -> [fd, depth] of the locks this process holds


_ATTEMPTS = 5  # tries 0.1 s apart before a workdir counts as in use


def _lock_path(workdir: str) -> str:
  return os.path.realpath(os.path.join(workdir, LOCK_FILE))


def _pid_in(fd: int) -> int | None:
  try:
    text = os.pread(fd, 64, 0).decode().strip()
    return int(text) if text.isdigit() else None
  except (OSError, ValueError):
    return None


def _busy(workdir: str, pid: int | None) -> WorkdirBusyError:
  who = f'pid {pid}' if pid else 'another process'
  stop = f'stop it (kill -TERM {pid})' if pid else 'stop it'
  return WorkdirBusyError(f'--workdir={workdir} is in use by another run ({who}); wait for it to end '
                          f'or {stop}, or use another --workdir.')


@contextlib.contextmanager
def hold(workdir: str):
  """Holds the workdir's writer lock for the block (re-entrant within a process)."""
  if jax.process_index() != 0:  # multi-host: process 0 writes for all
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  path = _lock_path(workdir)
  if path in _held:
    _held[path][1] += 1
    try:
      yield
    finally:
      _held[path][1] -= 1
    return
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  for attempt in range(_ATTEMPTS):
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      break
    except OSError as e:
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or attempt == _ATTEMPTS - 1:
        pid = _pid_in(fd)
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
          raise _busy(workdir, pid) from None
        raise
      time.sleep(0.1)  # `holder` (a sweep's check) holds a shared lock for a moment
  os.ftruncate(fd, 0)
  os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
  _held[path] = [fd, 1]
  try:
    yield
  finally:
    _held.pop(path)
    os.close(fd)  # releases the lock


def holder(workdir: str) -> int | None:
  """The pid of the live process that holds the workdir's lock (0 if its pid is unknown); None when
  no process does. Writes nothing."""
  path = _lock_path(workdir)
  if path in _held:
    return os.getpid()
  try:
    fd = os.open(path, os.O_RDONLY)
  except FileNotFoundError:
    return None
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
      raise
    return _pid_in(fd) or 0
  finally:
    os.close(fd)  # also drops the shared lock just taken
  return None


# ---------------------------------------------------------------------------------------------
# config.json


# Fields a resumed run may change: how long it runs, how often it reports and checkpoints.
RESUMABLE_CHANGES = ('num_rounds', 'eval_every', 'eval_from', 'checkpoint_every',
                     'dp.target_epsilon')

# Fields added after runs were started, with the value those runs had.
ADDED_FIELDS = {'dp.noise_mechanism': 'independent', 'dp.num_bands': 4, 'eval_clients': None,
                'local.max_examples': None, 'server_optimizer': 'sgd', 'server_momentum': 0.9,
                'server_beta1': 0.9, 'server_beta2': 0.99, 'server_eps': 1e-3,
                'dp.poisson_draw': 'per_client',
                'dp.clipping': 'fixed', 'dp.target_quantile': 0.5, 'dp.clip_lr': 0.2,
                'dp.initial_clip_norm': None, 'dp.count_noise_multiplier': None,
                'local.subset_draw': 'argsort', 'private_metrics_only': False,
                'validation_fraction': 0.0, 'eval_from': 0,
                **{f'eval.{field}': default for field, default in protocol.DEFAULTS.items()}}


def write_json_atomic(path: str, obj) -> None:
  if jax.process_index() != 0:  # multi-host: one writer on the shared workdir
    return
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def write_config(workdir: str, resolved: dict) -> None:
  write_json_atomic(os.path.join(workdir, CONFIG_FILE), resolved)


def flatten(d: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in d.items():
    out.update(flatten(v, f'{prefix}{k}.') if isinstance(v, dict) else {f'{prefix}{k}': v})
  return out


def check_same_run(workdir: str, resolved: dict) -> None:
  """Refuses to resume a checkpoint written under a different config (it would mix two runs)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not (os.path.exists(path) and checkpoint.exists(workdir)):
    return
  with open(path) as f:
    old = config_help.with_current_names(flatten(json.load(f)))
  new = flatten(resolved)
  for k, default in ADDED_FIELDS.items():  # a run started before the field existed had its default
    old.setdefault(k, default)
  # BandMF's strategy C is optimised for num_rounds rounds: that run cannot be made longer.
  fixed = ('num_rounds',) if new.get('dp.noise_mechanism') == 'banded' else ()
  changed = sorted(k for k in set(old) | set(new)
                   if (k not in RESUMABLE_CHANGES or k in fixed) and old.get(k) != new.get(k))
  if changed:
    details = ', '.join(f'{k}: {old.get(k)!r} -> {new.get(k)!r}' for k in changed)
    raise ValueError(f'--workdir={workdir} holds a checkpoint of a run with another config ({details}). '
                     'Use a new --workdir, or the same config to resume.')


# What the mechanism computed at the run's start beyond its config (BandMF's coefficients).
MECHANISM_FILE = 'mechanism.json'


def check_same_mechanism(workdir: str, record: dict) -> None:
  """Refuses to resume a checkpoint whose run started with another noise strategy, and records it.

  BandMF's coefficients come from jax_privacy's optimiser at every start: a different result on
  resume (another library version or backend) would splice two strategies, whose columns need not
  have norm <= 1 -- less noise than accounted."""
  path = os.path.join(workdir, MECHANISM_FILE)
  if not record:
    return
  if os.path.exists(path) and checkpoint.exists(workdir):
    with open(path) as f:
      old = json.load(f)
    if old != record:
      changed = sorted(k for k in set(old) | set(record) if old.get(k) != record.get(k))
      raise ValueError(
          f'--workdir={workdir} holds a checkpoint of a run with another noise strategy ({changed} '
          f'differ from {path}: {old.get("strategy")} -> {record.get("strategy")}); resuming would '
          'splice two strategies. Use a new --workdir, or the versions that started the run.')
    return
  write_json_atomic(path, record)


def recorded_config(workdir: str) -> dict:
  """The config.json of the checkpointed run in workdir ({} if there is no such run)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not (os.path.exists(path) and checkpoint.exists(workdir)):
    return {}
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def finished_record(config, workdir: str) -> dict | None:
  """The last record of a finished run of this same config in workdir, found without loading data
  or compiling anything; None when in doubt (the full path then resumes, refuses or trains)."""
  config_path, metrics_path = (os.path.join(workdir, n)
                               for n in (CONFIG_FILE, metric_writers.EVAL_FILE))
  if not (os.path.exists(config_path) and os.path.exists(metrics_path)):
    return None
  try:
    with open(config_path) as f:
      old = config_help.with_current_names(flatten(json.load(f)))
    with open(metrics_path) as f:
      records = [json.loads(line) for line in f if line.strip()]
  except (OSError, ValueError):  # e.g. a torn line after a kill: the full path repairs it
    return None
  new = flatten(config.to_dict())
  for k, default in ADDED_FIELDS.items():
    old.setdefault(k, default)
  resolved = ('dp.noise_multiplier', 'dp.delta')  # None in the config, filled in config.json
  # How often it evaluated and checkpointed, and which executor ran the cohort (the same clients,
  # keys and steps; float rounding apart), change nothing about a finished run: a sweep's CPU-run
  # seeds count on a GPU host, and a grid moved to another executor keeps its finished runs.
  how_it_ran = ('eval_every', 'eval_from', 'checkpoint_every', 'executor')
  same = all(old.get(k) == new.get(k) or (k in resolved and new.get(k) is None)
             for k in set(old) | set(new) if k not in how_it_ran)
  if (same and records and records[-1]['round'] >= config.num_rounds
      and checkpoint.latest_round(workdir) == records[-1]['round']):
    return records[-1]
  return None


# ---------------------------------------------------------------------------------------------
# What a stop leaves


def kept(workdir: str) -> str:
  """What a stopped run leaves in workdir."""
  j = checkpoint.latest_round(workdir)
  return (f'the checkpoint of round {j} in {workdir} is intact' if j else
          f'no checkpoint was written yet in {workdir}')


def stop_message(workdir: str, done: int | None = None) -> str:
  """The one line a stopped run ends with (stopping.py: Ctrl-C or SIGTERM)."""
  after = stopping.stopped_by() + ('' if done is None else f' after round {done}')
  again = ('rerun the same command to resume' if checkpoint.latest_round(workdir) else
           'rerun the same command to start again')
  return f'{after}; {kept(workdir)}; {again}'


# ---------------------------------------------------------------------------------------------
# The metrics files


@contextlib.contextmanager
def metric_writers_for(workdir: str, resume_round: int):
  """(train, eval) metric writers for the block; they write nothing on processes other than 0
  (multi-host: one writer on the shared workdir). When the block fails, a writer that cannot close
  either (a full disk) is logged, not raised: the block's own error is the one to tell."""
  if jax.process_index() != 0:
    writers = metric_writers.MultiWriter([]), metric_writers.MultiWriter([])
  else:
    writers = (
        metric_writers.create_writer(workdir, 'train', metric_writers.TRAIN_FILE, resume_round),
        metric_writers.create_writer(workdir, 'eval', metric_writers.EVAL_FILE, resume_round))
  try:
    yield writers
  except BaseException:
    for writer in writers:
      try:
        writer.close()
      except Exception as e:  # pylint: disable=broad-except
        logging.warning('Could not close the metrics files in %s: %s', workdir, e)
    raise
  for writer in writers:
    writer.close()


def cut_back_metrics(workdir: str, start: int, records: list[dict]) -> None:
  """Metrics files as the checkpoint of round `start` left them: lines written after it go."""
  if jax.process_index() != 0:
    return
  metric_writers.rewrite_jsonl(os.path.join(workdir, metric_writers.EVAL_FILE), records)
  kept_lines = metric_writers.truncate_jsonl(os.path.join(workdir, metric_writers.TRAIN_FILE), start)
  if start and [r['round'] for r in kept_lines] != list(range(1, start + 1)):
    logging.warning('%s holds %d of the rounds 1-%d (a run started by a version without per-round '
                    'metrics?); the resumed run appends from round %d.', metric_writers.TRAIN_FILE,
                    len(kept_lines), start, start + 1)


def record_host(workdir: str, start: int) -> None:
  """Appends this start's machine to hosts.jsonl; a start from round k first drops the lines of
  starts from round k on (their rounds are being run again)."""
  if jax.process_index() != 0:
    return
  path = os.path.join(workdir, metric_writers.HOSTS_FILE)
  kept = [r for r in metric_writers.read_jsonl(path) if r.get('from_round', 0) < start]
  # No clock time: beside a search's published trial it would tell how many trials ran after it.
  metric_writers.rewrite_jsonl(path, kept + [{'from_round': start, **host.describe()}])
