"""experiments.train with one fault injected, for tests/test_faults.py (not a test module itself).

  FAULT=kill_in_compile            SIGKILL at a seeded random moment while the round step and the
                                   evaluation compile (at the latest when the compilation ends)
  FAULT=kill_mid_round:R           SIGKILL at a seeded random moment after round R-1's training line,
                                   at the latest before round R's (inside round R, or round R-1's
                                   evaluation and checkpoint write)
  FAULT=kill_in_checkpoint:R       SIGKILL at a seeded random moment inside the checkpoint write of
                                   round R (at the latest when it returns)
  FAULT=file_size_limit:R          from the checkpoint write of round R on, every write beyond a
                                   file's start fails (RLIMIT_FSIZE = 0: EFBIG, as a full disk gives
                                   ENOSPC), the process's own log file included

SEED=<int> seeds the moments. The rest of argv goes to experiments.train unchanged.
"""

import os
import random
import resource
import signal
import sys
import threading

import jax

from dp2fedsam_jax import checkpoint, cli, metric_writers
from experiments import train as train_binary

_rng = random.Random(int(os.environ.get('SEED', '0')))
_kind, _, _arg = os.environ['FAULT'].partition(':')
_round = int(_arg) if _arg else None


def _kill_now():
  os.kill(os.getpid(), signal.SIGKILL)


def _kill_within(seconds):
  """A SIGKILL at a random moment in the next `seconds`; returns what kills at once (the latest)."""
  timer = threading.Timer(_rng.uniform(0, seconds), _kill_now)
  timer.daemon = True
  timer.start()
  return _kill_now


if _kind == 'kill_in_compile':
  real_compile = jax.stages.Lowered.compile

  def compile_then_die(self, *args, **kwargs):
    latest = _kill_within(1.0)
    real_compile(self, *args, **kwargs)
    latest()
  jax.stages.Lowered.compile = compile_then_die

elif _kind == 'kill_mid_round':
  real_write = metric_writers.JsonlWriter.write_scalars

  def write(writer, step, scalars):
    if writer.path.endswith(metric_writers.TRAIN_FILE):
      if step == _round:
        _kill_now()  # the timer has not fired yet: die before round R's line
      real_write(writer, step, scalars)
      if step == _round - 1:
        _kill_within(0.5)
      return
    real_write(writer, step, scalars)
  metric_writers.JsonlWriter.write_scalars = write

elif _kind == 'kill_in_checkpoint':
  real_save = checkpoint.save

  def save(workdir, state, *rest):
    if int(state.round) != _round:
      return real_save(workdir, state, *rest)
    latest = _kill_within(0.3)
    real_save(workdir, state, *rest)
    latest()
  checkpoint.save = save

elif _kind == 'file_size_limit':
  real_save = checkpoint.save

  def save(workdir, state, *rest):
    if int(state.round) == _round:
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails with EFBIG instead of a signal
      resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return real_save(workdir, state, *rest)
  checkpoint.save = save

else:
  sys.exit(f'unknown FAULT={os.environ["FAULT"]}')


if __name__ == '__main__':
  train_binary.define_flags()
  cli.run(train_binary.main)
