"""A study's trials as one compiled program (dp2fedsam_jax/search_program.py), each trial's files in
its own workdir as `experiments.train` writes them.

launch/tune.py runs a group of >= 2 unfinished trials that share search_program.one_program_key this
way (--one_program=auto). Trial i's workdir gets what a run alone leaves there and the tuner, the
report and a rerun read: config.json (its own searched values and training_seed; sigma, delta and the
executor resolved), metrics.jsonl (round, epsilon, the window's training means, the test and
validation metrics at the same rounds), train_metrics.jsonl (every round), hosts.jsonl and, at each
evaluation and every eval_every rounds before eval_from, its checkpoint (experiments.train then
finds a finished one finished). A trial whose
release turns NaN/Inf gets failure.json, as a run alone does; the others go on.

A program stopped mid-way resumes at the next start from its trials' common last checkpoint (each
restored, stacked and run on; their metrics files cut back to that round), while trials that
finished are skipped. `seconds` in a record is the program's wall time per round (all its trials
together).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dp2fedsam_jax import checkpoint, executors, run_files, search_program, stopping, train
from experiments import train as train_binary


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def with_resolved_executor(configs: list) -> tuple[list, str]:
  """(the configs with executor 'auto' replaced by what a fresh run alone picks on this backend, how
  it was picked: '' when given). One choice for all: the trial axis is mapped as it maps clients."""
  name, chunk_size, how = executors.choose_for_run(configs[0].executor, configs[0].chunk_size, {})
  return [_with_executor(c, name, chunk_size) for c in configs] if how else configs, how


def _with_executor(config, name: str, chunk_size: int | None):
  config = config.copy_and_resolve_references()
  config.executor, config.chunk_size = name, chunk_size
  return config


def fitted_to_device(program: search_program.SearchProgram, how: str) -> search_program.SearchProgram:
  """An 'auto' program vmapping its trials on an accelerator: each trial's cohort in chunks that let
  a device's trials all fit its memory at once (as a run alone fits its one cohort)."""
  exp, how = train.fit_to_device(program.exp, how, trials=program.trials_per_device)
  if exp is program.exp:
    return program
  _log(f'program: {how}, {program.trials_per_device} trials at once on a device')
  return dataclasses.replace(program, exp=exp)


@dataclasses.dataclass
class _Trial:
  """One trial's workdir and what its run alone would hold in memory between evaluations."""
  workdir: str
  writers: tuple           # (train, eval) metric writers
  records: list = dataclasses.field(default_factory=list)
  window: list = dataclasses.field(default_factory=list)
  failed: bool = False

  def round_done(self, done: int, metrics: dict, seconds: float, private_only: bool) -> None:
    """Round `done`'s line of train_metrics.jsonl; a non-finite release ends the trial with
    failure.json (train.check_finite's error), as it ends a run alone."""
    self.writers[0].write_scalars(done, train.train_scalars(metrics, seconds, private_only))
    try:
      train.check_finite(metrics, done, self.workdir)
    except FloatingPointError as e:
      self.writers[0].flush()
      train_binary.write_failure(self.workdir, e)
      self.failed = True
      return
    self.window.append({} if private_only else {k: metrics[k] for k in train.TRAIN_SCALARS})

  def evaluated(self, exp, done: int, metrics: dict, seconds: float, private_only: bool) -> None:
    """The evaluation record of round `done`, as a run alone writes it (train.evaluation_line)."""
    record = train.evaluation_line(exp, done, metrics, self.window, private_only)
    record['seconds'] = seconds
    if private_only:
      record = train.private_record(record)
    self.records.append(record)
    self.window = []
    self.writers[1].write_scalars(done, {k: v for k, v in record.items() if k != 'round'})
    self.writers[1].flush()


def _start(exp, config, workdir: str, restored: checkpoint.Restored) -> None:
  """The trial's workdir at the program's start round (its checkpoint's, or 0): config.json (a
  checkpoint written under another config is refused), the metrics files cut back to that round,
  no failure.json of an earlier start."""
  start = int(restored.state.round)
  resolved = train.resolved_config(dataclasses.replace(exp, config=config))
  run_files.check_same_run(workdir, resolved)
  run_files.check_same_mechanism(workdir, exp.mechanism.record())
  run_files.write_config(workdir, resolved)
  run_files.cut_back_metrics(workdir, start, restored.records)
  run_files.record_host(workdir, start)
  failure = os.path.join(workdir, train_binary.FAILURE_FILE)
  if os.path.exists(failure):
    os.remove(failure)


def _stopped(*unused, **unused_kwargs) -> str:
  del unused, unused_kwargs
  return (f'{stopping.stopped_by()}: the program\'s trials resume from their last checkpoint (every '
          'eval_every rounds) at the next start; its finished trials are kept')


def start_round(workdirs: list[str]) -> int:
  """The round the trials resume from together: their common latest checkpoint (0: none)."""
  rounds = {checkpoint.latest_round(w) for w in workdirs}
  if len(rounds) > 1:
    raise ValueError(f'the trials hold checkpoints of different rounds {sorted(rounds)}: each '
                     'resumes in its own process (launch.sweep), not in one program.')
  return rounds.pop()


def _restored(program, workdirs: list[str]) -> tuple[list[checkpoint.Restored], object]:
  """Each trial's checkpoint (or its initial state, records and window), and the stacked states."""
  initial = program.init_states()
  restored = [checkpoint.restore_run(w, jax.tree.map(lambda x: x[i], initial))  # noqa: B023
              for i, w in enumerate(workdirs)]
  if not int(restored[0].state.round):
    return restored, initial
  return restored, program.placed(jax.tree.map(lambda *xs: jnp.stack(xs), *[r.state for r in restored]))


@stopping.interruptible(_stopped)
def run_trials(configs: list, workdirs: list[str], build=None) -> dict[str, str]:
  """Runs `configs` (trials that share search_program.one_program_key, with no checkpoint or with
  checkpoints of one round) as one program to their num_rounds, trial i's files in workdirs[i], each
  trial's checkpoint written at every evaluation and every eval_every rounds before eval_from;
  returns {workdir: 'ran' | 'failed (...)'}. Holds every trial's workdir lock while it runs."""
  start = start_round(workdirs)
  configs, how = with_resolved_executor(configs)
  program = search_program.SearchProgram.of_configs(configs, build)
  fitted = program if program.in_loop else fitted_to_device(program, how)
  if fitted is not program:  # each trial's config.json records the chunk it ran with
    program = fitted
    configs = [_with_executor(c, c.executor, program.exp.config.chunk_size) for c in configs]
  exp, num_rounds = program.exp, int(configs[0].num_rounds)
  private_only = bool(configs[0].get('private_metrics_only', False))
  with contextlib.ExitStack() as stack:
    for workdir in workdirs:
      stack.enter_context(run_files.hold(workdir))
    restored, states = _restored(program, workdirs)
    trials = []
    for config, workdir, back in zip(configs, workdirs, restored):
      _start(exp, config, workdir, back)
      writers = stack.enter_context(run_files.metric_writers_for(workdir, start))
      trials.append(_Trial(workdir, writers, list(back.records), list(back.window)))
    _log(f'program: {len(trials)} trials of {configs[0].method} in one program '
         f'({"a loop" if program.in_loop else "vmapped"} over the trials), rounds {start + 1}-'
         f'{num_rounds}')
    program.run(num_rounds, start=start, states=states,
                **_callbacks(exp, trials, num_rounds, private_only))
  return {t.workdir: 'failed (FloatingPointError: see failure.json)' if t.failed else 'ran'
          for t in trials}


def _callbacks(exp, trials: list[_Trial], num_rounds: int, private_only: bool) -> dict:
  """SearchProgram.run's on_start, on_round, on_eval and on_state for the trials' files."""
  clock = {'round': time.perf_counter(), 'window': time.perf_counter(), 'rounds': 0}

  def on_start():  # compiled: the rounds' time starts now
    clock.update(window=time.perf_counter(), round=time.perf_counter())

  def on_round(done, metrics):
    if stopping.stop_requested():  # Ctrl-C / SIGTERM: between two rounds
      raise stopping.interrupted(_stopped())
    seconds = time.perf_counter() - clock['round']
    for i, trial in enumerate(trials):
      if not trial.failed:
        trial.round_done(done, {k: np.asarray(v)[i] for k, v in metrics.items()}, seconds,
                         private_only)
    clock['rounds'] += 1
    clock['round'] = time.perf_counter()

  def on_eval(done, records):
    seconds = (time.perf_counter() - clock['window']) / max(clock['rounds'], 1)
    for i, trial in enumerate(trials):
      if not trial.failed:
        trial.evaluated(exp, done, search_program.trial_records(records, i), seconds, private_only)
    _log(f'program round {done}/{num_rounds}: {sum(not t.failed for t in trials)} of '
         f'{len(trials)} trials running')
    # The next window and round start after the evaluation (on_state leaves out its checkpoints).
    clock.update(rounds=0, window=time.perf_counter(), round=time.perf_counter())

  def on_state(done, states):  # after each evaluation and every eval_every rounds before eval_from
    del done
    started = time.perf_counter()
    with stopping.critical():  # a second stop signal waits for the checkpoints
      for i, trial in enumerate(trials):
        if not trial.failed:
          trial.writers[0].flush()  # on disk before the checkpoint claims these rounds
          checkpoint.save(trial.workdir, jax.tree.map(lambda leaf: leaf[i], states),  # noqa: B023
                          trial.records, trial.window)
    spent = time.perf_counter() - started  # not a round's time: moved out of the clocks
    clock.update(window=clock['window'] + spent, round=clock['round'] + spent)

  return dict(on_start=on_start, on_round=on_round, on_eval=on_eval, on_state=on_state)
