"""train_and_evaluate(config, workdir): the whole experiment, importable from a notebook.

Host work happens only here: config checks, data loading, privacy calibration, the round loop, and
writing `config.json`, `train_metrics.jsonl` (every round) and `metrics.jsonl` (every evaluation;
metric_writers.py). The round itself is one jitted call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from dp2fedsam_jax import checkpoint, cli, keys, metric_writers, sharding
from dp2fedsam_jax.algorithms import get_method, METHODS, MethodSpec
from dp2fedsam_jax.algorithms.specs import MethodParams
from dp2fedsam_jax.config import validate_config, validate_privacy_fields
from dp2fedsam_jax.data import FederatedData, make_federated_data, sources
from dp2fedsam_jax.evaluation import evaluation_batch_size, make_evaluate
from dp2fedsam_jax.local import LocalConfig
from dp2fedsam_jax.models import count_params, get_model
from dp2fedsam_jax.models.pretrained import CheckpointInit
from dp2fedsam_jax.progress import RoundProgress
from dp2fedsam_jax.privacy.mechanism import DPMechanism
from dp2fedsam_jax import round as round_lib
from dp2fedsam_jax.round import (make_round_step, mechanism_from, resolve_executor,
                                  round_config_from, RoundConfig)
from dp2fedsam_jax.state import init_state, ServerState, split_params


@dataclasses.dataclass(frozen=True)
class Privacy:
  """The privacy parameters a run actually uses (sigma calibrated if a target epsilon was given)."""
  private: bool
  noise_multiplier: float
  delta: float
  epsilon: float  # after all num_rounds rounds



def resolve_privacy(config, spec: MethodSpec) -> Privacy:
  delta = config.dp.delta if config.dp.delta is not None else 1.0 / config.num_clients
  if not spec.private:
    return Privacy(False, 0.0, delta, math.inf)
  validate_privacy_fields(config)
  sigma = config.dp.noise_multiplier
  if sigma is not None and config.dp.target_epsilon is not None:
    logging.warning('dp.noise_multiplier=%s is set, so dp.target_epsilon=%s is ignored.', sigma,
                    config.dp.target_epsilon)
  # The mechanism the round step will run (the one object both use): its sigma and epsilon.
  mechanism = mechanism_from(config, config.num_clients, float(sigma or 0.0), private=True)
  if sigma is None:
    sigma = mechanism.calibrate(config.dp.target_epsilon, config.num_rounds, delta,
                                config.dp.accountant)
    mechanism = mechanism.with_noise(sigma)
  return Privacy(True, float(sigma), delta,
                 mechanism.epsilon(config.num_rounds, delta, config.dp.accountant))


@dataclasses.dataclass
class Experiment:
  """Everything built from a config before the first round."""
  config: ml_collections.ConfigDict
  spec: MethodSpec
  model: Any
  data: FederatedData
  privacy: Privacy
  round_config: RoundConfig

  @property
  def mechanism(self) -> DPMechanism:
    return self.round_config.mechanism

  def epsilon_after(self, rounds: int) -> float:
    """The accounted epsilon of the executed mechanism after `rounds` rounds."""
    return self.mechanism.epsilon(rounds, self.privacy.delta, self.config.dp.accountant)

  def init_state(self) -> ServerState:
    model = self.model
    if self.config.get('init_checkpoint'):  # the extractor (and a fitting head) from a file
      model = CheckpointInit(model, self.config.init_checkpoint)
    state = init_state(self.spec, model, self.init_key, self.data.num_clients)
    return state.replace(noise_state=self.mechanism.init_noise_state(state.shared),
                         server_opt_state=self.round_config.server_optimizer.init(state.shared))

  @property
  def root_key(self) -> jax.Array:
    return jax.random.key(self.config.seed)

  @property
  def init_key(self) -> jax.Array:
    return keys.init_key(self.root_key)

  def eval_key(self, round_index: int) -> jax.Array:
    return keys.eval_key(self.root_key, round_index)

  @property
  def privacy_caveat(self) -> str:
    return self.spec.privacy_caveat()

  @property
  def method_params(self) -> MethodParams:
    return MethodParams.from_config(self.config)

  @property
  def local_config(self) -> LocalConfig:
    return LocalConfig.from_config(self.config)

  def round_step(self):
    return make_round_step(self.spec, self.model, self.local_config, self.round_config,
                           self.method_params)

  def evaluate(self):
    return make_evaluate(self.spec, self.model, self.local_config, self.method_params,
                         evaluation_batch_size(self.spec, self.round_config.executor))


def build_experiment(config: ml_collections.ConfigDict) -> Experiment:
  """Validates the config, loads and partitions the data, builds the model, resolves privacy.

  Args:
    config: the experiment config.

  Returns:
    An Experiment: data, model, method spec, the DPMechanism (sigma calibrated if a target epsilon
    is set), the RoundConfig and LocalConfig, with `round_step()`, `evaluate()`, `init_state()`.
  """
  validate_config(config, METHODS)
  spec = get_method(config.method)
  spec.check_noise_placement(config.dp.noise_placement)
  spec.check_noise_mechanism(config.dp.noise_mechanism)
  privacy = resolve_privacy(config, spec)  # before loading data: a bad dp field fails fast
  data = make_federated_data(
      dataset=config.dataset, num_clients=config.num_clients, partition=config.partition,
      classes_per_client=config.classes_per_client, dirichlet_alpha=config.dirichlet_alpha,
      seed=config.seed, data_dir=config.data_dir)
  model = get_model(config.model, data.num_classes, data.input_shape, config.conv_impl)
  mechanism = mechanism_from(config, data.num_clients, privacy.noise_multiplier, spec.private)
  return Experiment(config, spec, model, data, privacy, round_config_from(config, mechanism))


def describe(config: ml_collections.ConfigDict) -> dict:
  """Model size and privacy of an experiment without loading its data (what `--dry_run` prints).

  Datasets of `sources.DATASET_SHAPES` are sized from that table; only a 'tfds:<name>' dataset is
  loaded to learn its shape."""
  validate_config(config, METHODS)
  spec = get_method(config.method)
  spec.check_noise_placement(config.dp.noise_placement)
  spec.check_noise_mechanism(config.dp.noise_mechanism)
  privacy = resolve_privacy(config, spec)
  if config.dataset in sources.DATASET_SHAPES:
    num_classes, input_shape = sources.DATASET_SHAPES[config.dataset]
  else:
    ds = sources.load_dataset(config.dataset, data_dir=config.data_dir)
    num_classes, input_shape = ds.num_classes, ds.image_shape
  model = get_model(config.model, num_classes, input_shape, config.conv_impl)
  params = jax.eval_shape(model.init, jax.random.key(0))
  shared, personal = split_params(spec, params)
  caveat = spec.privacy_caveat()
  return {'method': config.method, 'num_params': count_params(params),
          'num_shared_params': count_params(shared), 'num_personal_params': count_params(personal),
          'noise_mechanism': config.dp.noise_mechanism,
          **({'num_bands': config.dp.num_bands} if config.dp.noise_mechanism == 'banded' else {}),
          'noise_multiplier': privacy.noise_multiplier, 'epsilon': privacy.epsilon,
          'delta': privacy.delta, **({'epsilon_caveat': caveat} if caveat else {})}


def _write_json_atomic(path: str, obj) -> None:
  if jax.process_index() != 0:  # multi-host: one writer on the shared workdir
    return
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


# Fields a resumed run may change: how long it runs and how often it reports.
_RESUMABLE_CHANGES = ('num_rounds', 'eval_every', 'dp.target_epsilon')


# Fields added after runs were started, with the value those runs had.
_ADDED_FIELDS = {'dp.noise_mechanism': 'independent', 'dp.num_bands': 4, 'server_optimizer': 'sgd',
                 'server_momentum': 0.9, 'server_beta1': 0.9, 'server_beta2': 0.99,
                 'server_eps': 1e-3}


def _flatten(d: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flatten(v, f'{prefix}{k}.') if isinstance(v, dict) else {f'{prefix}{k}': v})
  return out


def _check_same_run(workdir: str, resolved: dict) -> None:
  """Refuses to resume a checkpoint written under a different config (it would mix two runs)."""
  path = os.path.join(workdir, 'config.json')
  if not (os.path.exists(path) and checkpoint.exists(workdir)):
    return
  with open(path) as f:
    old = _flatten(json.load(f))
  new = _flatten(resolved)
  for k, default in _ADDED_FIELDS.items():  # a run started before the field existed had its default
    old.setdefault(k, default)
  # BandMF's strategy C is optimised for num_rounds rounds: that run cannot be made longer.
  fixed = ('num_rounds',) if new.get('dp.noise_mechanism') == 'banded' else ()
  changed = sorted(k for k in set(old) | set(new)
                   if (k not in _RESUMABLE_CHANGES or k in fixed) and old.get(k) != new.get(k))
  if changed:
    details = ', '.join(f'{k}: {old.get(k)!r} -> {new.get(k)!r}' for k in changed)
    raise ValueError(f'--workdir={workdir} holds a checkpoint of a run with another config ({details}). '
                     'Use a new --workdir, or the same config to resume.')


def _json_number(value) -> float | None:
  """A float for metrics.jsonl; None where it is undefined (NaN: strict JSON has no NaN)."""
  value = float(value)
  return None if math.isnan(value) else value


# The per-round training scalars of the round step's metrics (train_metrics.jsonl).
TRAIN_SCALARS = ('train_loss', 'mean_update_norm', 'clipped_fraction', 'cohort_size',
                 'nonfinite_clients', 'noise_std', 'signal_to_noise')
# The executors 'auto' chooses from (round.resolve_executor).
_AUTO_CHOICES = ('sequential', 'vmap')


def _recorded_config(workdir: str) -> dict:
  """The config.json of the checkpointed run in workdir ({} if there is no such run)."""
  path = os.path.join(workdir, 'config.json')
  if not (os.path.exists(path) and checkpoint.exists(workdir)):
    return {}
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _with_executor(config, workdir: str) -> tuple[ml_collections.ConfigDict, str]:
  """The config with executor 'auto' replaced by the one the run uses, and how it was chosen.

  A resumed 'auto' run keeps the executor its config.json records (also when it resumes on another
  backend, or was started before 'auto' existed), so that the resume repeats the run exactly.
  """
  if config.executor != 'auto':
    return config, ''
  recorded = _recorded_config(workdir)
  config = config.copy_and_resolve_references()
  if recorded.get('executor') in _AUTO_CHOICES:
    config.executor, how = recorded['executor'], 'auto: that of the checkpointed run'
    if config.chunk_size is None:
      config.chunk_size = recorded.get('chunk_size')
  else:
    config.executor, how = resolve_executor('auto'), f'auto on {jax.default_backend()}'
  return config, how


def device_memory_bytes() -> int | None:
  """The default device's memory where the backend reports it (GPU, TPU); None on CPU."""
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('bytes_limit')


def fit_chunk_size(exp: Experiment, memory_bytes: int | None = None,
                   headroom: float = 0.8) -> int | None:
  """The chunk size that keeps a vmapped round within `headroom` of the device's memory (None: the
  whole cohort fits, or the device does not report its memory). From XLA's memory analysis of the
  compiled round step: once at the full capacity, and only if that does not fit, at chunk sizes 1
  and 2 (round.fitting_chunk_size extrapolates)."""
  memory_bytes = memory_bytes or device_memory_bytes()
  if memory_bytes is None:
    return None
  state = jax.eval_shape(exp.init_state)

  def program_bytes(chunk_size):
    rc = dataclasses.replace(exp.round_config, chunk_size=chunk_size)
    step = make_round_step(exp.spec, exp.model, exp.local_config, rc, exp.method_params)
    return round_lib.program_bytes(
        jax.jit(step, donate_argnums=0).lower(state, exp.data, exp.root_key).compile())

  capacity = exp.round_config.capacity
  if program_bytes(None) <= headroom * memory_bytes:
    return None
  return round_lib.fitting_chunk_size(capacity, program_bytes(1), program_bytes(2), memory_bytes,
                                      headroom)


def _finished_record(config, workdir: str) -> dict | None:
  """The last record of a finished run of this same config in workdir, found without loading data
  or compiling anything; None when in doubt (the full path then resumes, refuses or trains)."""
  config_path, metrics_path = (os.path.join(workdir, n)
                               for n in ('config.json', metric_writers.EVAL_FILE))
  if not (os.path.exists(config_path) and os.path.exists(metrics_path)):
    return None
  try:
    with open(config_path) as f:
      old = _flatten(json.load(f))
    with open(metrics_path) as f:
      records = [json.loads(line) for line in f if line.strip()]
  except (OSError, ValueError):  # e.g. a torn line after a kill: the full path repairs it
    return None
  new = _flatten(config.to_dict())
  for k, default in _ADDED_FIELDS.items():  # a run started before the field existed had its default
    old.setdefault(k, default)
  resolved = ('dp.noise_multiplier', 'dp.delta')  # None in the config, filled in config.json
  same = set(old) == set(new) and all(
      old[k] == new[k] or (k in resolved and new[k] is None) for k in new)
  if (same and records and records[-1]['round'] >= config.num_rounds
      and checkpoint.latest_round(workdir) == records[-1]['round']):
    return records[-1]
  return None


def _kept(workdir: str) -> str:
  """What a stopped run leaves in workdir."""
  j = checkpoint.latest_round(workdir)
  return (f'the checkpoint of round {j} in {workdir} is intact' if j else
          f'no checkpoint was written yet in {workdir} (none before the first evaluated round)')


def _interrupted(config, workdir: str, done: int | None = None) -> str:
  after = 'interrupted' if done is None else f'interrupted after round {done}'
  again = ('rerun the same command to resume' if checkpoint.latest_round(workdir) else
           'rerun the same command to start again')
  return f'{after}; {_kept(workdir)}; {again}'


def _check_finite(metrics: dict, round_index: int, workdir: str) -> None:
  if not bool(metrics['finite']):
    raise FloatingPointError(
        f'round {round_index}: the new shared parameters are NaN/Inf. Lower '
        f'--config.local.lr_body / --config.local.lr_head (or sam_rho); {_kept(workdir)}.')


class OutOfMemoryError(RuntimeError):
  """The device ran out of memory in the round step; the message names the fields that bound it."""


@contextlib.contextmanager
def _hint_on_oom(config, where: str, workdir: str):
  """Re-raises XLA's RESOURCE_EXHAUSTED with the config fields that bound the round's memory."""
  try:
    yield
  except jax.errors.JaxRuntimeError as e:
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    raise OutOfMemoryError(
        f'{where}: out of device memory ({str(e).splitlines()[0][:200]}). The round vmaps every '
        'client slot of a chunk at once (config.chunk_size='
        f'{config.chunk_size}, config.cohort_capacity={config.cohort_capacity}). Set '
        '--config.chunk_size=K to train K clients at a time (a loop over vmapped sub-chunks), or '
        '--config.executor=sequential, or lower --config.cohort_capacity or '
        f'--config.local.batch_size; re-running with the same --workdir={workdir} resumes from the '
        'last checkpoint.') from e


def _writers(workdir: str, resume_round: int):
  """(train, eval) metric writers; they write nothing on processes other than 0 (multi-host: one
  writer on the shared workdir)."""
  if jax.process_index() != 0:
    return metric_writers.MultiWriter([]), metric_writers.MultiWriter([])
  return (metric_writers.create_writer(workdir, 'train', metric_writers.TRAIN_FILE, resume_round),
          metric_writers.create_writer(workdir, 'eval', metric_writers.EVAL_FILE, resume_round))


def _cut_back_metrics(workdir: str, start: int, records: list[dict]) -> None:
  """Metrics files as the checkpoint of round `start` left them: lines written after it go."""
  if jax.process_index() != 0:
    return
  metric_writers.rewrite_jsonl(os.path.join(workdir, metric_writers.EVAL_FILE), records)
  kept = metric_writers.truncate_jsonl(os.path.join(workdir, metric_writers.TRAIN_FILE), start)
  if start and [r['round'] for r in kept] != list(range(1, start + 1)):
    logging.warning('%s holds %d of the rounds 1-%d (a run started by a version without per-round '
                    'metrics?); the resumed run appends from round %d.', metric_writers.TRAIN_FILE,
                    len(kept), start, start + 1)


def _train_scalars(metrics: dict, seconds: float) -> dict:
  """One round's line of train_metrics.jsonl (NaN becomes null there)."""
  scalars = {k: float(metrics[k]) for k in TRAIN_SCALARS}
  for k in ('cohort_size', 'nonfinite_clients'):
    scalars[k] = int(metrics[k])
  scalars['seconds'] = seconds
  return scalars


@cli.interruptible(_interrupted)
def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) the experiment in `workdir`; returns the last metrics record.

  Args:
    config: the experiment (base_config() fields; validated here, before any data is loaded).
    workdir: where the run's files go; a workdir of a finished run returns its last record at once,
      one with a checkpoint resumes from it (bit-identical to an uninterrupted run), one of another
      config is refused.

  Returns:
    The last evaluation record: round, test_accuracy, test_loss, participation,
    test_accuracy_participated, epsilon, the window means of the training scalars, seconds.

  Writes `train_metrics.jsonl` (every round), `metrics.jsonl` (every evaluation; the last line is
  the returned record), `config.json` (the config as run: sigma, delta and executor resolved) and
  TensorBoard event files when tensorboardX is installed (metric_writers.py).

  Raises:
    ConfigError / ValueError naming a bad field; FloatingPointError when the released shared
    parameters are NaN/Inf (the message names the kept checkpoint); cli.Interrupted on Ctrl-C
    (SIGINT), at the next round boundary, naming the last checkpoint; the same call resumes from it.
  """
  config, executor_choice = _with_executor(config, workdir)
  finished = _finished_record(config, workdir)
  if finished is not None:
    logging.info('Already finished: %s holds all %d rounds; nothing to do.', workdir,
                 finished['round'])
    return finished
  exp = build_experiment(config)
  if executor_choice and config.executor == 'vmap' and config.chunk_size is None:
    chunk_size = fit_chunk_size(exp)  # 'auto' on an accelerator fits the cohort to its memory
    if chunk_size is not None:
      config.chunk_size = chunk_size
      exp = dataclasses.replace(exp, config=config, round_config=dataclasses.replace(
          exp.round_config, chunk_size=chunk_size))
      executor_choice += f'; chunks of {chunk_size} clients fit the device memory'
  os.makedirs(workdir, exist_ok=True)
  resolved = config.to_dict()
  if exp.spec.private:
    if config.dp.noise_multiplier is not None:
      resolved['dp']['target_epsilon'] = None  # it was ignored; do not suggest otherwise
    resolved['dp'].update(noise_multiplier=exp.privacy.noise_multiplier)
  resolved['dp'].update(delta=exp.privacy.delta)
  _check_same_run(workdir, resolved)
  _write_json_atomic(os.path.join(workdir, 'config.json'), resolved)

  data = exp.data
  round_step = jax.jit(exp.round_step(), donate_argnums=0)
  evaluate = jax.jit(exp.evaluate())
  state, records = checkpoint.restore(workdir, exp.init_state())
  start = int(state.round)
  if start:
    logging.info('Resuming %s from round %d.', workdir, start)
  _cut_back_metrics(workdir, start, records)
  if start >= config.num_rounds and records:
    logging.info('Already finished: %s holds all %d rounds; nothing to do.', workdir, start)
    return records[-1]
  if exp.privacy_caveat:
    logging.warning('Privacy caveat: %s', exp.privacy_caveat)
  logging.info('%s on %s: %d clients, sigma=%.4f, eps=%.3f at delta=%.2g after %d rounds; '
               'executor %s%s.', config.method, config.dataset, data.num_clients,
               exp.privacy.noise_multiplier, exp.privacy.epsilon, exp.privacy.delta,
               config.num_rounds, config.executor,
               f' ({executor_choice})' if executor_choice else '')

  # sharded: state, data and keys whole on every device of the mesh (of every process).
  place = sharding.replicate if config.executor == 'sharded' else (lambda tree: tree)
  state, data, key = place((state, data, exp.root_key))
  # Compiled ahead of the loop so that `seconds` measures rounds and evaluations, not compilation.
  if cli.interrupt_requested():
    raise cli.Interrupted(_interrupted(config, workdir, start))
  logging.info('Compiling the round step and the evaluation ...')
  compile_start = time.perf_counter()
  with _hint_on_oom(config, 'compiling the round step', workdir), cli.critical():
    round_step = round_step.lower(state, data, key).compile()
    evaluate = evaluate.lower(state, data, place(exp.eval_key(start))).compile()
  logging.info('Compiled the round step and the evaluation in %.1f s.',
               time.perf_counter() - compile_start)
  train_writer, eval_writer = _writers(workdir, start)
  window: list[dict] = []
  window_start = time.perf_counter()
  record = records[-1] if records else {}
  progress = RoundProgress(config.num_rounds)  # a line redrawn in place on a TTY, else silent
  eval_seconds = 0.0  # the last evaluation's time, spread over eval_every rounds in the estimate
  with contextlib.closing(train_writer), contextlib.closing(eval_writer):
    for r in range(start, config.num_rounds):
      if cli.interrupt_requested():  # Ctrl-C: stop between rounds, the checkpoint intact
        progress.close()
        raise cli.Interrupted(_interrupted(config, workdir, r))
      round_start = time.perf_counter()
      with _hint_on_oom(config, f'round {r + 1}', workdir):
        state, metrics = round_step(state, data, key)
        metrics = jax.device_get(metrics)  # a device error surfaces here at the latest
      done = r + 1
      # Also the line of a round whose release is NaN: the last thing a diverged run tells.
      train_writer.write_scalars(done, _train_scalars(metrics, time.perf_counter() - round_start))
      if not bool(metrics['finite']):
        progress.close()  # end the progress line before the error
      _check_finite(metrics, done, workdir)
      window.append(metrics)
      if done % config.eval_every and done != config.num_rounds:
        progress.update(done, (time.perf_counter() - window_start) / len(window)
                        + eval_seconds / config.eval_every)
        continue
      progress.clear()  # before evaluation and checkpointing log anything
      eval_start = time.perf_counter()
      record = {
          'round': done,
          'epsilon': exp.epsilon_after(done),
          **{k: float(jnp.mean(jnp.array([m[k] for m in window])))
             for k in ('train_loss', 'mean_update_norm', 'clipped_fraction', 'cohort_size')},
          # Clients whose local training diverged (zero upload) in the rounds since the last record.
          'nonfinite_clients': int(sum(int(m['nonfinite_clients']) for m in window)),
          **{k: _json_number(v)
             for k, v in jax.device_get(evaluate(state, data, place(exp.eval_key(done)))).items()},
      }
      if exp.privacy_caveat:
        record['epsilon_caveat'] = exp.privacy_caveat
      # Wall time per round of this window, its evaluation included (the checkpoint write below
      # counts in the next window).
      seconds = record['seconds'] = (time.perf_counter() - window_start) / len(window)
      records.append(record)
      window_start = time.perf_counter()
      eval_seconds = window_start - eval_start
      with cli.critical():  # a second Ctrl-C waits for the checkpoint and metrics to be written
        train_writer.flush()  # on disk before the checkpoint claims these rounds
        checkpoint.save(workdir, state, records)
        eval_writer.write_scalars(done, {k: v for k, v in record.items() if k != 'round'})
        eval_writer.flush()
      logging.info('round %d/%d  acc %.4f  loss %.4g  eps %.3f  %.2f s/round', done,
                   config.num_rounds, record['test_accuracy'], record['train_loss'],
                   record['epsilon'], seconds)
      progress.update(done, seconds, record['test_accuracy'], record['epsilon'])
      window = []
  progress.close()
  return record
