"""The stop protocol: Ctrl-C (SIGINT) and SIGTERM end a run at a round boundary, its checkpoint intact.

Inside an `interruptible` function (train_and_evaluate) the first SIGINT or SIGTERM only asks the
round loop to stop: it checks `stop_requested()` between rounds, writes the checkpoint of the round it
reached and raises `Interrupted`, whose `exit_code` the binaries exit with (`cli.run`):

- Ctrl-C (SIGINT): exit 130 (128 + 2), `interrupted after round k; ...`;
- SIGTERM (what SLURM, Kubernetes and preemptible VMs send first): exit 143 (128 + 15),
  `terminated (SIGTERM) after round k; ...`.

A second signal of either kind stops at once, but never inside a `critical()` block (compilation, a
checkpoint write): it stops right after the block. In a binary (`cli.run`), a SIGTERM also starts a
deadline (DEADLINE_ENV, default 25 s: schedulers send SIGKILL 30 s after SIGTERM): if the run has not
stopped by then, the process ends at once with exit 143. That is safe at any moment, critical blocks
included: every file a run writes is replaced atomically or repaired on resume (checkpoint.py,
metric_writers.py), which is why a SIGKILL loses nothing but the unfinished round either.

No KeyboardInterrupt is ever raised inside XLA's compiler (it used to end the process with a
segfault). This module imports nothing from the package and no JAX.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from typing import Callable

EXIT_INTERRUPTED = 128 + signal.SIGINT   # 130
EXIT_TERMINATED = 128 + signal.SIGTERM   # 143
DEADLINE_ENV = 'DP2FEDSAM_STOP_DEADLINE'  # seconds from the first SIGTERM to a forced stop
DEFAULT_DEADLINE_S = 25.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
  """A stop signal ended a run between two steps; the message says what is kept and how to resume."""

  def __init__(self, message: str = 'interrupted', exit_code: int = EXIT_INTERRUPTED):
    super().__init__(message)
    self.exit_code = exit_code


class _State:
  """The handler's state while an `interruptible` call runs (main thread only)."""
  count = 0           # stop signals since the handler was installed
  signum: int | None = None  # the first one
  critical = 0        # depth of critical() blocks
  pending = False     # a second signal arrived inside a critical block
  describe: Callable[[], str] | None = None  # what a stop now leaves behind
  hard_exit = False   # set by cli.run: in a binary, a forced stop ends the process at once
  deadline: threading.Timer | None = None


def stop_requested() -> bool:
  """True once SIGINT or SIGTERM arrived inside an `interruptible` call: stop at the next boundary."""
  return _State.count > 0


def exit_code() -> int:
  """The exit code of the stop under way: 143 after SIGTERM, else 130."""
  return EXIT_TERMINATED if _State.signum == signal.SIGTERM else EXIT_INTERRUPTED


def stopped_by() -> str:
  """How a stop message starts: 'interrupted' (Ctrl-C) or 'terminated (SIGTERM)'."""
  return 'terminated (SIGTERM)' if _State.signum == signal.SIGTERM else 'interrupted'


def interrupted(message: str) -> Interrupted:
  """The exception that ends a run stopped by the signal under way."""
  return Interrupted(message, exit_code())


def deadline_seconds() -> float:
  text = os.environ.get(DEADLINE_ENV, '')
  try:
    return float(text) if text else DEFAULT_DEADLINE_S
  except ValueError:
    return DEFAULT_DEADLINE_S


def _message() -> str:
  try:
    return _State.describe() if _State.describe else stopped_by()
  except Exception:  # pylint: disable=broad-except  (a forced stop must never fail)
    return stopped_by()


def _exit_now(message: str) -> None:
  # Every file the runs write is replaced atomically or repaired on resume, so ending here leaves
  # nothing half-written; os._exit skips the interpreter's teardown, which can crash while XLA
  # threads still run.
  try:
    sys.stdout.flush()
    sys.stderr.write(f'\n{message}\n')
    sys.stderr.flush()
  finally:
    os._exit(exit_code())  # pylint: disable=protected-access


def _stop_now() -> None:
  if _State.hard_exit:
    _exit_now(_message())
  raise interrupted(_message())


def _deadline_passed(seconds: float) -> None:
  """The deadline thread: the run did not stop in time after SIGTERM; end the process."""
  _exit_now(f'the stop deadline ({seconds:g} s after SIGTERM, {DEADLINE_ENV}) passed: stopped at '
            f'once; {_message()}')


def _handler(signum, frame) -> None:
  del frame
  _State.count += 1
  if _State.count == 1:
    _State.signum = signum
    if signum == signal.SIGTERM:
      seconds = deadline_seconds()
      deadline = f' (at most {seconds:g} s)' if _State.hard_exit else ''
      sys.stderr.write(f'\nSIGTERM: stopping at the end of the current round{deadline}; send it '
                       'again to stop at once.\n')
      if _State.hard_exit:
        _State.deadline = threading.Timer(seconds, _deadline_passed, args=(seconds,))
        _State.deadline.daemon = True
        _State.deadline.start()
    else:
      sys.stderr.write('\nCtrl-C: stopping at the end of the current round; press Ctrl-C again to '
                       'stop at once.\n')
    sys.stderr.flush()
  elif _State.critical:
    _State.pending = True
  else:
    _stop_now()


@contextlib.contextmanager
def critical():
  """A block a second stop signal must not cut (compilation, a checkpoint write): it stops after it."""
  _State.critical += 1
  try:
    yield
  finally:
    _State.critical -= 1
  if not _State.critical and _State.pending:
    _State.pending = False
    _stop_now()


def _ours_to_take(signum: int) -> bool:
  """Only Python's default handlers are replaced (a notebook kernel may have its own)."""
  default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
  return signal.getsignal(signum) is default


def interruptible(describe: Callable[..., str]):
  """Decorator: while the function runs, SIGINT and SIGTERM are stop requests (module docstring).

  describe(*args, **kwargs) says, at the moment of a forced stop, what is left (e.g. the last
  checkpoint). Outside the main thread the function runs with the handlers it found; so does each
  signal whose handler is not Python's default.
  """
  def decorator(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
      if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
      taken = [s for s in STOP_SIGNALS if _ours_to_take(s)]
      if not taken:
        return fn(*args, **kwargs)
      saved = (_State.count, _State.signum, _State.pending, _State.describe, _State.deadline)
      _State.count, _State.signum, _State.pending, _State.deadline = 0, None, False, None
      _State.describe = lambda: describe(*args, **kwargs)
      previous = {s: signal.signal(s, _handler) for s in taken}
      stopping = False
      try:
        return fn(*args, **kwargs)
      except KeyboardInterrupt:
        stopping = True
        raise
      finally:
        if _State.deadline is not None:
          _State.deadline.cancel()
        # A binary exits after a stop: one more signal must not cut its message short.
        for s, handler in previous.items():
          signal.signal(s, signal.SIG_IGN if stopping and _State.hard_exit else handler)
        (_State.count, _State.signum, _State.pending, _State.describe,
         _State.deadline) = saved
    return wrapper
  return decorator


def set_hard_exit(value: bool = True) -> None:
  """cli.run: in a binary, a forced stop ends the process (os._exit) instead of raising."""
  _State.hard_exit = value
