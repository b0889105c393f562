"""train_and_evaluate(config, workdir): the whole experiment, importable from a notebook.

Host work happens only here: config checks, data loading, privacy calibration, the round loop, and
writing `config.json`, `train_metrics.jsonl` (every round) and `metrics.jsonl` (every evaluation;
metric_writers.py). The round itself is one jitted call. `build_experiment(config)` validates,
builds the privatizer (`DPMechanism.from_config`) and loads the data once; `train_and_evaluate` holds
the workdir's lock, stops at a round boundary on Ctrl-C / SIGTERM and returns at once when finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from dp2fedsam_jax import checkpoint, eval_blocks, keys, local_only, metric_writers, run_files
from dp2fedsam_jax import executors, stopping
from dp2fedsam_jax.algorithms import get_method, METHODS, MethodSpec
from dp2fedsam_jax.config import evaluates_at, validate_config
from dp2fedsam_jax.data import FederatedData, make_federated_data, sources, split_validation
from dp2fedsam_jax.data.federated import load_token_clients
from dp2fedsam_jax.evaluation import eval_client_ids, make_evaluate, make_validation_evaluate
from dp2fedsam_jax.local import LocalConfig
from dp2fedsam_jax.models import count_params, get_model
from dp2fedsam_jax.models.pretrained import CheckpointInit
from dp2fedsam_jax.progress import RoundProgress
from dp2fedsam_jax.protocol import Protocol
from dp2fedsam_jax.privacy.mechanism import DPMechanism, Privatizer
from dp2fedsam_jax import federated_round
from dp2fedsam_jax.state import init_state, ServerState, split_params


@dataclasses.dataclass
class Experiment:
  """Everything built from a config before the first round."""
  config: ml_collections.ConfigDict
  spec: MethodSpec
  model: Any
  data: FederatedData
  round_config: federated_round.RoundConfig
  # config.validation_fraction > 0: the training data with each client's validation rows as its
  # test split (data.split_validation; those rows are out of `data`'s training rows).
  validation: FederatedData | None = None

  @property
  def mechanism(self) -> Privatizer:
    """The one privatizer of the run (NonPrivate or DPMechanism): its sigma, delta and accountant are
    the run's."""
    return self.round_config.mechanism

  def epsilon_after(self, rounds: int) -> float:
    """The accounted epsilon of the executed mechanism after `rounds` rounds."""
    return self.mechanism.epsilon(rounds)

  @functools.cached_property
  def epsilon(self) -> float:
    """The accounted epsilon after all num_rounds rounds (inf if not private)."""
    return self.epsilon_after(self.config.num_rounds)

  def init_state(self, root: jax.Array | None = None, round_config=None) -> ServerState:
    """The initial state from the run's root key, or `root` (a search program's trial)."""
    model = self.model
    if self.config.get('init_checkpoint'):  # the extractor (and a fitting head) from a file
      model = CheckpointInit(model, self.config.init_checkpoint)
    round_config = round_config or self.round_config
    init = self.init_key if root is None else keys.init_key(root)
    state = init_state(self.spec, model, init, self.data.num_clients)
    return state.replace(**round_config.mechanism.init(state.shared)._asdict(),
                         server_opt_state=round_config.server_optimizer.init(state.shared))

  @property
  def root_key(self) -> jax.Array:
    return keys.root_key(self.config.seed, self.config.get('training_seed'))

  @property
  def init_key(self) -> jax.Array:
    return keys.init_key(self.root_key)

  def eval_key(self, round_index: int) -> jax.Array:
    return keys.eval_key(self.root_key, round_index)

  @property
  def privacy_caveat(self) -> str:
    return self.spec.privacy_caveat()

  @property
  def local_config(self) -> LocalConfig:
    return LocalConfig.from_config(self.config)

  def make_round_step(self):
    """The run's round step, a pure function to jit (federated_round.make_round_step); a search
    program passes each trial's searched scalars to it as traced data (its `hyperparameters`)."""
    return federated_round.make_round_step(self.spec, self.model, self.local_config, self.round_config)

  def make_evaluate(self, local_config: LocalConfig | None = None):
    """The run's evaluation, a pure function to jit (evaluation.make_evaluate): each client tests
    the model the run's test-time protocol gives it."""
    protocol = self.protocol
    own_weights = protocol.for_method(self.spec, self.local_config).own_weights
    clients_per_batch, mesh = eval_blocks.evaluation_batch(self.round_config.executor, own_weights)
    return make_evaluate(self.spec, self.model, local_config or self.local_config, clients_per_batch,
                         eval_client_ids(self.data.num_clients, self.config.get('eval_clients'),
                                         self.config.seed),
                         protocol=protocol,
                         initial_head=(self.initial_params()['head']
                                       if protocol.head_init == 'random' else None),
                         mesh=mesh)

  @property
  def protocol(self) -> Protocol:
    """config.eval: the test-time protocol (protocol.py)."""
    return Protocol.from_config(self.config)

  def initial_params(self) -> dict:
    """The run's initial model {'extractor', 'head'}: what init_state splits."""
    model = self.model
    if self.config.get('init_checkpoint'):
      model = CheckpointInit(model, self.config.init_checkpoint)
    return model.init(self.init_key)


def build_experiment(config: ml_collections.ConfigDict, *, validated: bool = False) -> Experiment:
  """Validates the config, loads and partitions the data, builds the model, resolves privacy.

  Args:
    config: the experiment config.
    validated: the caller has just run validate_config on it (train_and_evaluate, the binary): the
      config is checked once per run.

  Returns:
    An Experiment: data, model, method spec, the privatizer (sigma calibrated if a target epsilon
    is set), the RoundConfig and LocalConfig, with `make_round_step()`, `make_evaluate()`, `init_state()`.
  """
  if not validated:
    validate_config(config, METHODS)
  spec = get_method(config.method).bind(config)  # its pieces carry config.keep_fraction, blur_lambda, ...
  # Before loading data, so that a bad dp field fails fast; sigma calibrated here, once.
  mechanism = DPMechanism.from_config(config, config.num_clients, spec)
  data = make_federated_data(
      dataset=config.dataset, num_clients=config.num_clients, partition=config.partition,
      classes_per_client=config.classes_per_client, dirichlet_alpha=config.dirichlet_alpha,
      seed=config.seed, data_dir=config.data_dir)
  validation = None
  if config.get('validation_fraction', 0.0) > 0:
    data, validation = split_validation(data, config.validation_fraction, config.seed)
  model = get_model(config.model, data.num_classes, data.input_shape, config.conv_impl)
  if data.num_clients != mechanism.num_clients:
    raise ValueError(f'the data holds {data.num_clients} clients, config.num_clients is '
                     f'{mechanism.num_clients}: the partition must make one client per slot.')
  return Experiment(config, spec, model, data, federated_round.round_config_from(config, mechanism),
                    validation)


def describe(config: ml_collections.ConfigDict) -> dict:
  """Model size and privacy of an experiment without loading its data (what `--dry_run` prints).

  Datasets of `sources.DATASET_SHAPES` are sized from that table; only a 'tfds:<name>' dataset is
  loaded to learn its shape. A token dataset's clients are loaded (seconds) for their count and sizes
  ('client_sizes': TokenDataset.summary())."""
  validate_config(config, METHODS)
  spec = get_method(config.method)
  mechanism = DPMechanism.from_config(config, config.num_clients, spec)
  if config.dataset in sources.DATASET_SHAPES:
    num_classes, input_shape = sources.DATASET_SHAPES[config.dataset]
  else:
    ds = sources.load_dataset(config.dataset, data_dir=config.data_dir)
    num_classes, input_shape = ds.num_classes, ds.image_shape
  model = get_model(config.model, num_classes, input_shape, config.conv_impl)
  params = jax.eval_shape(model.init, jax.random.key(0))
  shared, personal = split_params(spec, params)
  caveat = spec.privacy_caveat()
  sizes = {}
  if config.dataset in sources.TOKEN_DATASETS:
    sizes['client_sizes'] = load_token_clients(
        dataset=config.dataset, num_clients=config.num_clients, partition=config.partition,
        seed=config.seed, data_dir=config.data_dir).summary()
  return {'method': config.method, 'num_clients': config.num_clients, **sizes,
          'num_params': count_params(params),
          'num_shared_params': count_params(shared), 'num_personal_params': count_params(personal),
          'noise_mechanism': config.dp.noise_mechanism, 'neighbours': mechanism.noise.neighbours,
          **({'num_bands': config.dp.num_bands} if config.dp.noise_mechanism == 'banded' else {}),
          'noise_multiplier': mechanism.noise_multiplier,
          **_adaptive_clipping(mechanism),
          'epsilon': (mechanism.epsilon(config.num_rounds) if spec.federated
                      else LOCAL_ONLY_EPSILON), 'delta': mechanism.delta,
          **({'epsilon_caveat': caveat} if caveat else {})}


def _adaptive_clipping(mechanism: Privatizer) -> dict:
  """--dry_run's lines for adaptive clipping: the rule, both noise parts and the one they make."""
  if not mechanism.adaptive:
    return {}
  return {'clipping': 'adaptive', 'initial_clip_norm': mechanism.clip_norm,
          **mechanism.clipping.describe(),
          'effective_noise_multiplier': mechanism.effective_noise_multiplier}


def _adaptive_header(mechanism: Privatizer) -> str:
  """The run header's words for adaptive clipping (empty for a fixed C)."""
  if not mechanism.adaptive:
    return ''
  return (f' (adaptive clipping from C_0={mechanism.clip_norm:g}: count noise '
          f's_b={mechanism.clipping.count_noise_std:.4g}, accounted together as '
          f'sigma_eff={mechanism.effective_noise_multiplier:.4f})')


def json_number(value) -> float | None:
  """A float for metrics.jsonl; None where it is undefined (NaN: strict JSON has no NaN)."""
  value = float(value)
  return None if math.isnan(value) else value


# local_only releases nothing (local_only.py).
LOCAL_ONLY_EPSILON = 0.0
# The per-round training scalars of the round step's metrics (train_metrics.jsonl).
TRAIN_SCALARS = ('train_loss', 'mean_update_norm', 'clipped_fraction', 'cohort_size',
                 'nonfinite_clients', 'noise_std', 'signal_to_noise')
# Only under adaptive clipping: the clip norm C_t the round clipped to.
ADAPTIVE_SCALARS = ('clip_norm',)
# What a run with config.private_metrics_only writes: functions of the released models and public
# constants only (clip_norm: C_t, moved by earlier releases). Every other metric is computed from
# the clients' raw data without noise (docs/privacy.md section 4), and so are the seconds a round
# takes (they grow with the cohort's size).
PRIVATE_TRAIN_SCALARS = ('clip_norm',)
PRIVATE_RECORD_KEYS = ('round', 'epsilon', 'epsilon_caveat')


def _with_executor(config, workdir: str) -> tuple[ml_collections.ConfigDict, str]:
  """The config with executor 'auto' replaced by the one the run uses, and how it was chosen.

  A resumed 'auto' run keeps the executor its config.json records (also when it resumes on another
  backend, or was started before 'auto' existed), so that the resume repeats the run exactly.
  """
  name, chunk_size, how = executors.choose_for_run(config.executor, config.chunk_size,
                                                   run_files.recorded_config(workdir))
  if not how:
    return config, ''
  config = config.copy_and_resolve_references()
  config.executor, config.chunk_size = name, chunk_size
  return config, how


def device_memory_bytes() -> int | None:
  """The default device's memory where the backend reports it (GPU, TPU); None on CPU."""
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('bytes_limit')


def fit_chunk_size(exp: Experiment, memory_bytes: int | None = None,
                   headroom: float = 0.8, trials: int = 1) -> int | None:
  """The chunk size that keeps a vmapped round within `headroom` of the device's memory (None: the
  whole cohort fits, or the device does not report its memory). From XLA's memory analysis of the
  compiled round step: once at the full capacity, and only if that does not fit, at chunk sizes 1
  and 2 (federated_round.fitting_chunk_size extrapolates). `trials`: K trials vmapped in one program
  (search_program.py) hold K states and K cohorts' chunks beside one copy of the data."""
  memory_bytes = memory_bytes or device_memory_bytes()
  if memory_bytes is None:
    return None
  if trials > 1:  # each trial's share of what the one copy of the data leaves
    data = exp.data.nbytes
    memory_bytes = (data + (headroom * memory_bytes - data) / trials) / headroom
  state = jax.eval_shape(exp.init_state)

  def program_bytes(chunk_size):
    rc = dataclasses.replace(exp.round_config,
                             executor=exp.round_config.executor.with_chunk_size(chunk_size))
    step = federated_round.make_round_step(exp.spec, exp.model, exp.local_config, rc)
    return federated_round.program_bytes(
        jax.jit(step, donate_argnums=0).lower(state, exp.data, exp.root_key).compile())

  capacity = exp.round_config.capacity
  if program_bytes(None) <= headroom * memory_bytes:
    return None
  return federated_round.fitting_chunk_size(capacity, program_bytes(1), program_bytes(2), memory_bytes,
                                      headroom)


def check_finite(metrics: dict, round_index: int, workdir: str) -> None:
  if not bool(metrics['finite']):
    raise FloatingPointError(
        f'round {round_index}: the new shared parameters are NaN/Inf. Lower '
        f'--config.local.lr_shared / --config.local.lr_personal (or sam_rho); {run_files.kept(workdir)}.')


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


def train_scalars(metrics: dict, seconds: float, private_only: bool = False) -> dict:
  """One round's line of train_metrics.jsonl (NaN becomes null there); with `private_only`, only
  PRIVATE_TRAIN_SCALARS."""
  if private_only:
    return {k: float(metrics[k]) for k in PRIVATE_TRAIN_SCALARS if k in metrics}
  scalars = {k: float(metrics[k]) for k in TRAIN_SCALARS + ADAPTIVE_SCALARS if k in metrics}
  for k in ('cohort_size', 'nonfinite_clients'):
    scalars[k] = int(metrics[k])
  scalars['seconds'] = seconds
  return scalars


def evaluation_line(exp: Experiment, done: int, metrics: dict, window: list[dict],
                    private_only: bool = False) -> dict:
  """Round `done`'s line of metrics.jsonl but its `seconds`: epsilon after it, the training means
  of the rounds since the last line, the evaluation's metrics and the method's privacy caveat."""
  record = {'round': done, 'epsilon': exp.epsilon_after(done),
            **({} if private_only else window_means(window)),
            **{k: json_number(v) for k, v in metrics.items()}}
  if exp.privacy_caveat:
    record['epsilon_caveat'] = exp.privacy_caveat
  return record


def window_means(window: list[dict]) -> dict:
  """The training scalars of the rounds since the last record, for its evaluation line: each a mean
  over the rounds where it is defined (NaN where none trained a client)."""
  means = {k: float(jnp.nanmean(jnp.array([m[k] for m in window])))
           for k in ('train_loss', 'mean_update_norm', 'clipped_fraction', 'cohort_size')}
  # Clients whose local training diverged (zero upload) in the rounds since the last record.
  return {**means, 'nonfinite_clients': int(sum(int(m['nonfinite_clients']) for m in window))}


def private_record(record: dict) -> dict:
  """An evaluation record as config.private_metrics_only writes it: PRIVATE_RECORD_KEYS only."""
  return {k: v for k, v in record.items() if k in PRIVATE_RECORD_KEYS}


def _stopped(config, workdir: str, **unused) -> str:
  del config, unused
  return run_files.stop_message(workdir)


@stopping.interruptible(_stopped)
def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       validated: bool = False) -> dict:
  """Runs (or resumes) the experiment in `workdir`; returns the last metrics record.

  Args:
    config: the experiment (base_config() fields; validated here before anything is written or
      loaded, unless `validated`: the caller (experiments/train.py) has just done it).
    workdir: where the run's files go; a workdir of a finished run returns its last record at once,
      one with a checkpoint resumes from it (bit-identical to an uninterrupted run), one of another
      config is refused.

  Returns:
    The last evaluation record: round, test_accuracy, test_loss, participation,
    test_accuracy_participated, epsilon, the window means of the training scalars, seconds.

  Writes `train_metrics.jsonl` (every round), `metrics.jsonl` (every evaluation; the last line is
  the returned record), `config.json` (the config as run: sigma, delta and executor resolved),
  `checkpoints/` (every config.checkpoint_every rounds, every evaluation, and the round a stop
  reached) and TensorBoard event files when tensorboardX is installed (metric_writers.py).

  Raises:
    ConfigError / ValueError naming a bad field; run_files.WorkdirBusyError when another process
    writes to workdir; FloatingPointError when the released shared parameters are NaN/Inf (the
    message names the kept checkpoint); checkpoint.CheckpointError when a checkpoint cannot be
    written (full disk, read-only workdir) or none can be read; stopping.Interrupted on Ctrl-C or
    SIGTERM, at the next round boundary, after checkpointing that round; the same call resumes.
  """
  if not validated:
    validate_config(config, METHODS)
  with run_files.hold(workdir):  # one writer per workdir, before anything is written there
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  config, executor_choice = _with_executor(config, workdir)
  finished = run_files.finished_record(config, workdir)
  if finished is not None:
    logging.info('Already finished: %s holds all %d rounds; nothing to do.', workdir,
                 finished['round'])
    return finished
  exp, executor_choice = fit_to_device(build_experiment(config, validated=True), executor_choice)
  config = exp.config
  os.makedirs(workdir, exist_ok=True)
  resolved = resolved_config(exp)
  run_files.check_same_run(workdir, resolved)
  run_files.check_same_mechanism(workdir, exp.mechanism.record())
  if not exp.spec.federated:
    return _train_alone(exp, workdir, resolved)
  run_files.write_config(workdir, resolved)

  private_only = bool(config.get('private_metrics_only', False))
  if exp.spec.private and not private_only:
    logging.info('The metrics files hold diagnostics computed from raw client data, which void '
                 'epsilon for whoever reads them; --config.private_metrics_only=True leaves them out.')
  # The training scalars of the rounds since the last evaluation come back with the state: the
  # next record of a resumed run averages the same rounds as an uninterrupted run's.
  restored = checkpoint.restore_run(workdir, exp.init_state())
  state, records, window = restored.state, restored.records, restored.window
  start = int(state.round)
  if start:
    logging.info('Resuming %s from round %d.', workdir, start)
  run_files.cut_back_metrics(workdir, start, records)
  if start >= config.num_rounds and records:
    logging.info('Already finished: %s holds all %d rounds; nothing to do.', workdir, start)
    return records[-1]
  run_files.record_host(workdir, start)
  if exp.privacy_caveat:
    logging.warning('Privacy caveat: %s', exp.privacy_caveat)
  logging.info('%s on %s: %d clients, sigma=%.4f%s, eps=%.3f at delta=%.2g after %d rounds; '
               'executor %s%s.', config.method, config.dataset, exp.data.num_clients,
               exp.mechanism.noise_multiplier, _adaptive_header(exp.mechanism), exp.epsilon,
               exp.mechanism.delta, config.num_rounds, config.executor,
               f' ({executor_choice})' if executor_choice else _placement(config.executor))
  run, state = _CompiledRun.build(exp, workdir, state, start, private_only)
  return run.rounds(state, start, records, window)


def _placement(executor: str) -> str:
  """' (over N <backend> devices)' for the sharded executor: how many shards the cohort has."""
  if executor != 'sharded':
    return ''
  return f' (over {jax.device_count()} {jax.default_backend()} devices)'


def fit_to_device(exp: Experiment, executor_choice: str, trials: int = 1,
                  memory_bytes: int | None = None) -> tuple[Experiment, str]:
  """'auto' on an accelerator fits the vmapped cohort (of each of `trials` trials vmapped in one
  program) to the device's memory (chunk_size; `memory_bytes` in place of the device's)."""
  config, executor = exp.config, exp.round_config.executor
  if not (executor_choice and executor.vmaps_whole_chunk):
    return exp, executor_choice
  chunk_size = fit_chunk_size(exp, memory_bytes, trials=trials)
  if chunk_size is None:
    return exp, executor_choice
  config.chunk_size = chunk_size
  exp = dataclasses.replace(exp, config=config, round_config=dataclasses.replace(
      exp.round_config, executor=executor.with_chunk_size(chunk_size)))
  return exp, executor_choice + f'; chunks of {chunk_size} clients fit the device memory'


def resolved_config(exp: Experiment) -> dict:
  """config.json: the config as run, sigma, delta (and adaptive clipping's count noise) filled in."""
  config, resolved = exp.config, exp.config.to_dict()
  if exp.spec.private:
    if config.dp.noise_multiplier is not None:
      resolved['dp']['target_epsilon'] = None  # it was ignored; do not suggest otherwise
    resolved['dp'].update(noise_multiplier=exp.mechanism.noise_multiplier)
    if exp.mechanism.adaptive:  # the count's noise as run (unset: the expected cohort / 20)
      resolved['dp'].update(count_noise_multiplier=exp.mechanism.clipping.count_noise_std)
  resolved['dp'].update(delta=exp.mechanism.delta)
  return resolved


def _committed(tree):
  """The tree's arrays committed to the devices they are on (no copy). A state restored from a
  checkpoint comes back committed, one from init_state does not, and a committed argument adds its
  sharding to the lowered program: without this a resumed run's round step missed the persistent
  compilation cache that a fresh run's filled."""
  return jax.device_put(tree, jax.tree.map(lambda leaf: leaf.sharding, tree))


@dataclasses.dataclass
class _CompiledRun:
  """A federated run's compiled round step and evaluations, placed for its executor, and the loop
  over rounds that checkpoints, evaluates and writes the metrics files."""
  exp: Experiment
  workdir: str
  place: Callable  # sharded: the tree whole on every device of the mesh (of every process)
  data: object
  key: jax.Array
  validation: object
  round_step: Callable
  evaluate: Callable
  evaluate_validation: Callable | None
  private_only: bool

  @classmethod
  def build(cls, exp: Experiment, workdir: str, state, start: int, private_only: bool):
    """The compiled run and the state placed for it."""
    place = lambda tree: _committed(exp.round_config.executor.place(tree))
    state, data, key = place((state, exp.data, exp.root_key))
    validation = None if exp.validation is None else place(exp.validation)
    round_step = jax.jit(exp.make_round_step(), donate_argnums=0)
    evaluate = jax.jit(exp.make_evaluate())
    evaluate_validation = (None if validation is None
                           else jax.jit(make_validation_evaluate(exp.make_evaluate())))
    # Compiled ahead of the loop so that `seconds` measures rounds and evaluations, not compilation.
    if stopping.stop_requested():
      raise stopping.interrupted(run_files.stop_message(workdir, start))
    logging.info('Compiling the round step and the evaluation ...')
    compile_start = time.perf_counter()
    eval_key = place(exp.eval_key(start))
    with _hint_on_oom(exp.config, 'compiling the round step', workdir), stopping.critical():
      round_step = round_step.lower(state, data, key).compile()
      evaluate = evaluate.lower(state, data, eval_key).compile()
      if validation is not None:
        evaluate_validation = evaluate_validation.lower(state, validation, eval_key).compile()
    logging.info('Compiled the round step and the evaluation in %.1f s.',
                 time.perf_counter() - compile_start)
    return cls(exp, workdir, place, data, key, validation, round_step, evaluate,
               evaluate_validation, private_only), state

  def save_checkpoint(self, train_writer, state, records, window):
    with stopping.critical():  # a second stop signal waits for the checkpoint to be written
      train_writer.flush()  # on disk before the checkpoint claims these rounds
      checkpoint.save(self.workdir, state, records, window)

  def evaluation_record(self, state, done: int, window: list[dict]) -> dict:
    """The evaluation record of round `done` (but its `seconds`)."""
    eval_key = self.place(self.exp.eval_key(done))
    metrics = dict(jax.device_get(self.evaluate(state, self.data, eval_key)))
    if self.validation is not None:  # the same key: a fine-tuned copy is the test's
      metrics.update(jax.device_get(self.evaluate_validation(state, self.validation, eval_key)))
    return evaluation_line(self.exp, done, metrics, window, self.private_only)

  def rounds(self, state, start: int, records: list[dict], window: list[dict]) -> dict:
    """Rounds start+1 .. num_rounds; returns the last evaluation record."""
    config, workdir, private_only = self.exp.config, self.workdir, self.private_only
    saved = start  # the round of the last checkpoint
    timed = 0  # rounds of the window run by this process (a resumed window has untimed ones)
    window_start = time.perf_counter()
    record = records[-1] if records else {}
    # A line redrawn in place on a TTY, else silent; off with private_metrics_only (accuracy,
    # timing).
    progress = RoundProgress(config.num_rounds, enabled=False if private_only else None)
    eval_seconds = 0.0  # the last evaluation's time, spread over eval_every rounds in the estimate
    with run_files.metric_writers_for(workdir, start) as (train_writer, eval_writer):
      for r in range(start, config.num_rounds):
        if stopping.stop_requested():  # Ctrl-C / SIGTERM: stop between rounds, checkpointed
          progress.close()
          if saved < r:
            self.save_checkpoint(train_writer, state, records, window)
          raise stopping.interrupted(run_files.stop_message(workdir, r))
        round_start = time.perf_counter()
        with _hint_on_oom(config, f'round {r + 1}', workdir):
          state, metrics = self.round_step(state, self.data, self.key)
          metrics = jax.device_get(metrics)  # a device error surfaces here at the latest
        done = r + 1
        # Also the line of a round whose release is NaN: the last thing a diverged run tells.
        train_writer.write_scalars(done, train_scalars(metrics, time.perf_counter() - round_start,
                                                        private_only))
        if not bool(metrics['finite']):
          progress.close()  # end the progress line before the error
        check_finite(metrics, done, workdir)
        # The checkpoint keeps the window: with private_metrics_only it holds no scalar computed
        # from raw client data (noise_std, signal_to_noise, ...), as the metrics files hold none.
        window.append({} if private_only else {k: metrics[k] for k in TRAIN_SCALARS})
        timed += 1
        if not evaluates_at(done, config.num_rounds, config.eval_every, config.eval_from):
          progress.update(done, (time.perf_counter() - window_start) / timed
                          + eval_seconds / config.eval_every)
          # Before eval_from, every eval_every rounds checkpoint still (as a program's trials do).
          if done % config.checkpoint_every == 0 or done % config.eval_every == 0:
            self.save_checkpoint(train_writer, state, records, window)
            saved = done
          continue
        progress.clear()  # before evaluation and checkpointing log anything
        eval_start = time.perf_counter()
        record = self.evaluation_record(state, done, window)
        # Wall time per round of this window, its evaluation included (the checkpoint write below
        # counts in the next window).
        seconds = record['seconds'] = (time.perf_counter() - window_start) / timed
        if private_only:
          record = private_record(record)
        records.append(record)
        window, timed = [], 0
        window_start = time.perf_counter()
        eval_seconds = window_start - eval_start
        with stopping.critical():  # a second stop signal waits for the checkpoint and metrics
          self.save_checkpoint(train_writer, state, records, window)
          saved = done
          eval_writer.write_scalars(done, {k: v for k, v in record.items() if k != 'round'})
          eval_writer.flush()
        if private_only:  # no accuracy, loss or timing: they are computed from the clients' data
          logging.info('round %d/%d  eps %.3f', done, config.num_rounds, record['epsilon'])
          continue
        logging.info('round %d/%d  acc %.4f  loss %.4g  eps %.3f  %.2f s/round', done,
                     config.num_rounds, record['test_accuracy'], record['train_loss'],
                     record['epsilon'], seconds)
        progress.update(done, seconds, record['test_accuracy'], record['epsilon'])
        if record.get('test_nonfinite_clients'):
          logging.warning('round %d: %d clients\' tested models give a non-finite test loss (test_loss '
                          'is NaN; their accuracy is that of NaN logits): a fine-tune or head lr '
                          '(config.local.*, config.eval.adapt_lr) too high for them?', done,
                          record['test_nonfinite_clients'])
    progress.close()
    return record


def _train_alone(exp: Experiment, workdir: str, resolved: dict) -> dict:
  """local_only: every client trains alone, then tests its own model; one record at round
  num_rounds, epsilon 0. No rounds, no checkpoint: an unfinished one starts again."""
  config = exp.config
  metrics_path = os.path.join(workdir, metric_writers.EVAL_FILE)
  records = metric_writers.read_jsonl(metrics_path)
  if records:
    with open(os.path.join(workdir, run_files.CONFIG_FILE)) as f:
      old = run_files.flatten(json.load(f))
    changed = sorted(k for k, v in run_files.flatten(resolved).items()
                     if k not in ('eval_every', 'eval_from', 'checkpoint_every') and old.get(k) != v)
    if changed:
      raise ValueError(f'--workdir={workdir} holds the metrics of a run with another config '
                       f'({", ".join(changed)} differ). Use a new --workdir.')
    if records[-1]['round'] >= config.num_rounds:
      logging.info('Already finished: %s holds its local-only record; nothing to do.', workdir)
      return records[-1]
  run_files.write_config(workdir, resolved)
  run_files.record_host(workdir, 0)
  metric_writers.rewrite_jsonl(metrics_path, [])
  logging.info('local_only on %s: %d clients each train alone for %d visits; nothing released.',
               config.dataset, exp.data.num_clients, config.num_rounds)
  start = time.perf_counter()
  # Every client trains its own model: one at a time where the round loops, as -FT evaluations.
  clients_per_batch, mesh = eval_blocks.evaluation_batch(exp.round_config.executor, own_weights=True)
  evaluate = jax.jit(local_only.make_evaluate(
      exp.spec, exp.model, exp.local_config, config.num_rounds, exp.initial_params(),
      clients_per_batch, eval_client_ids(exp.data.num_clients, config.get('eval_clients'), config.seed),
      mesh=mesh))
  metrics = jax.device_get(evaluate(exp.data, exp.eval_key(config.num_rounds)))
  record = {'round': config.num_rounds, 'epsilon': LOCAL_ONLY_EPSILON,
            'released': local_only.RELEASED,
            **{k: json_number(v) for k, v in metrics.items()}}
  record['seconds'] = (time.perf_counter() - start) / max(config.num_rounds, 1)
  with run_files.metric_writers_for(workdir, 0) as (_, eval_writer):
    eval_writer.write_scalars(record['round'], {k: v for k, v in record.items() if k != 'round'})
    eval_writer.flush()
  logging.info('local_only: acc %.4f (pooled %.4f), %.2f s per visit.', record['test_accuracy'],
               record['test_accuracy_pooled'], record['seconds'])
  return record


def summary(record: dict, workdir: str) -> str:
  """The binary's closing lines: a finished (or already finished) run's accuracy and epsilon from its
  last evaluation record, and where its files are (every metric stays in metrics.jsonl)."""
  try:
    with open(os.path.join(workdir, run_files.CONFIG_FILE)) as f:
      config = json.load(f)
  except (OSError, ValueError):
    config = {}
  rounds = f'round {record["round"]}' + (f'/{config["num_rounds"]}' if 'num_rounds' in config else '')
  what = f'{config["method"]} on {config["dataset"]}, ' if 'method' in config else ''
  if 'test_accuracy' in record:
    pooled = record.get('test_accuracy_pooled')
    accuracy = f'test accuracy {100 * record["test_accuracy"]:.2f} %' + (
        f' (pooled {100 * pooled:.2f} %)' if pooled is not None else '')
  else:
    accuracy = 'accuracy not recorded (private_metrics_only)'
  epsilon, delta = record.get('epsilon', math.inf), config.get('dp', {}).get('delta')
  if math.isinf(epsilon):
    privacy = 'not private (epsilon = inf)'
  else:
    privacy = f'epsilon = {epsilon:.3f}' + (f' at delta = {delta:.2g}' if delta else '')
  lines = [f'Done: {what}{rounds}: {accuracy}, {privacy}.']
  if record.get('epsilon_caveat'):
    lines.append(f'Epsilon caveat: {record["epsilon_caveat"]}')
  described = ((metric_writers.EVAL_FILE, 'every evaluation, every metric'),
               (metric_writers.TRAIN_FILE, 'every round'), (run_files.CONFIG_FILE, 'the config as run'),
               ('train.INFO', 'the full log'), (metric_writers.TENSORBOARD_DIR + '/', 'TensorBoard'),
               ('checkpoints/', 'resume from here'))
  files = [f'{name} ({why})' for name, why in described if os.path.exists(os.path.join(workdir, name))]
  lines.append(f'Files in {workdir}: {", ".join(files)}.')
  return '\n'.join(lines)
