"""A search as one compiled program: the trials of a study (or a selection's final seeds) as an axis.

Within a study every trial has the same method, model, data, sigma, q, T and delta; only scalars
differ. Those scalars (SEARCHED, and the weight lam of a method's penalty) enter the round step as
a traced pytree, so one compile serves every trial, and the trials run as one more mapped axis of
the same XLA program:

    states[k], metrics[k] = round_step(states[k], data, roots[k], hyperparameters[k])   k = 1..K

The trial axis is vmapped where the run's executor vmaps its clients (an accelerator) and a loop
inside the program (lax.map) where it runs them one by one (the CPU, where a vmapped convolution is a
slow grouped one). Each trial keeps its own root key (keys.root_key of its training seed: its own
cohorts, noise and init), clip state and server state. Static choices (method, model, shapes, T,
sigma's calibration, epochs, a top-k/rand-k keep fraction: k is a shape) must agree across the
trials: `one_program_key` says which do.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dp2fedsam_jax import executors, keys, run_files, stopping
from dp2fedsam_jax.config import evaluates_at
from dp2fedsam_jax.evaluation import make_validation_evaluate
from dp2fedsam_jax.algorithms.specs import METHODS
from dp2fedsam_jax.federated_round import Hyperparameters, penalty_weight_field

# config field -> its field of the round's traced bag (federated_round.Hyperparameters)
SEARCHED = {
    'local.lr_shared': 'lr_shared',
    'local.lr_personal': 'lr_personal',
    'local.sam_rho': 'sam_rho',
    'server_lr': 'server_lr',
    'dp.clip_norm': 'clip_norm',
}
# Differ across the trials without changing the program: their keys' seed.
PER_TRIAL = ('training_seed',)


def searched(config) -> dict[str, str]:
  """SEARCHED, plus the config field of the method's penalty weight lam where it has one
  (blur_lambda, dsu.lam, pmtl_lambda -> 'penalty_weight')."""
  field = penalty_weight_field(METHODS.lookup(config.method))
  return {**SEARCHED, **({field: 'penalty_weight'} if field else {})}


def hyperparameters(config) -> dict[str, float]:
  """The searched scalars of one config, by their name in the round's bag (a method without a
  penalty: weight 0, which nothing reads)."""
  flat = run_files.flatten(config.to_dict())
  values = {name: float(flat[field]) for field, name in searched(config).items()}
  return {'penalty_weight': 0.0, **values}


def one_program_key(config) -> tuple:
  """What must agree for two configs to run in one program: every field but the searched ones and
  PER_TRIAL (a trial of another method, epoch count, keep fraction or sigma target needs its own)."""
  flat = run_files.flatten(config.to_dict())
  varying = set(searched(config)) | set(PER_TRIAL)
  return tuple(sorted((k, repr(v)) for k, v in flat.items() if k not in varying))


def stacked_hyperparameters(configs: list) -> Hyperparameters:
  """The configs' searched scalars as the round's bag, each field float32[K]."""
  values = [hyperparameters(c) for c in configs]
  return Hyperparameters(**{name: jnp.asarray([v[name] for v in values], jnp.float32)
                            for name in Hyperparameters._fields})


def maps_trials_in_a_loop(exp) -> bool:
  """The trial axis as a loop inside the program where the executor runs clients one by one."""
  return isinstance(exp.round_config.executor, executors.Sequential)


def _over_trials(fn: Callable, in_loop: bool) -> Callable:
  """fn(*per_trial, shared) -> f(per_trial, shared) over the leading trial axis of every per-trial
  argument; `shared` (the data) is read by every trial, never copied per trial."""
  if not in_loop:
    return lambda per_trial, shared: jax.vmap(lambda *a: fn(*a, shared))(*per_trial)
  return lambda per_trial, shared: jax.lax.map(lambda a: fn(*a, shared), per_trial)


@dataclasses.dataclass
class SearchProgram:
  """K trials of one experiment's program: their hyperparameters [K] and root keys [K]."""
  exp: object                      # train.Experiment of the first trial (the static part)
  values: Hyperparameters          # each searched scalar, float32[K]
  roots: jax.Array                 # key[K]

  @classmethod
  def of_configs(cls, configs: list, build=None) -> 'SearchProgram':
    """The program of `configs` (one experiment built from the first; the others must share its
    one_program_key)."""
    if build is None:
      from dp2fedsam_jax.train import build_experiment  # pylint: disable=import-outside-toplevel
      build = build_experiment
    first = one_program_key(configs[0])
    for i, config in enumerate(configs[1:], 1):
      if one_program_key(config) != first:
        differ = sorted(dict(one_program_key(config)).items() ^ dict(first).items())
        raise ValueError(f'trial {i} differs from trial 0 in more than its searched scalars '
                         f'({sorted({k for k, _ in differ})}): it needs a program of its own.')
    stacked = stacked_hyperparameters(configs)
    roots = jnp.stack([keys.root_key(c.seed, c.get('training_seed')) for c in configs])
    return cls(build(configs[0]), stacked, roots).on_mesh()

  @property
  def num_trials(self) -> int:
    return int(self.roots.shape[0])

  @property
  def in_loop(self) -> bool:
    return maps_trials_in_a_loop(self.exp)

  @property
  def mesh(self) -> Mesh | None:
    """The devices the trial axis is split over: every device where the trials are vmapped, there
    are several and they divide K (JAX's SPMD engine partitions the program by trial); else None."""
    devices = jax.devices()
    if self.in_loop or len(devices) == 1 or self.num_trials % len(devices):
      return None
    return Mesh(np.array(devices), ('trials',))

  @property
  def trials_per_device(self) -> int:
    mesh = self.mesh
    return self.num_trials if mesh is None else self.num_trials // mesh.devices.size

  def on_mesh(self) -> 'SearchProgram':
    """This program with its per-trial arrays split by trial over the mesh and its data on every
    device (itself where there is no mesh)."""
    mesh = self.mesh
    if mesh is None:
      return self
    everywhere = NamedSharding(mesh, PartitionSpec())
    validation = self.exp.validation
    exp = dataclasses.replace(self.exp, data=jax.device_put(self.exp.data, everywhere),
                              validation=None if validation is None else jax.device_put(validation,
                                                                                       everywhere))
    by_trial = NamedSharding(mesh, PartitionSpec('trials'))
    return dataclasses.replace(self, exp=exp, roots=jax.device_put(self.roots, by_trial),
                               values=jax.device_put(self.values, by_trial))

  def init_states(self):
    """Each trial's initial state from its own root (its init key), stacked over the trials."""
    exp = self.exp

    def one(root, values, _):
      return exp.init_state(root=root, round_config=exp.round_config.with_hyperparameters(values))
    return self.placed(jax.jit(_over_trials(one, self.in_loop))((self.roots, self.values), None))

  def placed(self, states):
    """Stacked states where the program reads them: split by trial over the mesh, if any."""
    mesh = self.mesh
    return states if mesh is None else jax.device_put(states, NamedSharding(mesh, PartitionSpec('trials')))

  def round_step(self) -> Callable:
    """step(states, data, roots, values) -> (states, metrics [K]), to jit once."""
    exp = self.exp

    step = exp.make_round_step()

    def one(state, root, values, data):
      return step(state, data, root, values)
    mapped = _over_trials(one, self.in_loop)
    return lambda states, data, roots, values: mapped((states, roots, values), data)

  def evaluate(self, validation: bool = False) -> Callable:
    """evaluate(states, data, roots, values, round) -> each trial's evaluation record [K] (its
    eval key folded from its own root, as a run alone draws it)."""
    exp = self.exp

    def one(state, root, values, data_and_round):
      data, round_index = data_and_round
      evaluate = exp.make_evaluate(exp.local_config.with_hyperparameters(values))
      if validation:
        evaluate = make_validation_evaluate(evaluate)
      return evaluate(state, data, keys.eval_key(root, round_index))
    mapped = _over_trials(one, self.in_loop)
    return lambda states, data, roots, values, round_index: mapped((states, roots, values),
                                                                    (data, round_index))

  def compiled(self, states) -> tuple[Callable, Callable, Callable | None]:
    """(round step, evaluation, validation evaluation or None), compiled before the first round (as
    a run alone compiles ahead: a round's time is then a round's, not the compiler's)."""
    data, at = self.exp.data, jnp.int32(0)
    args = (self.roots, self.values)
    with stopping.critical():  # a second stop signal waits for the compiler
      step = jax.jit(self.round_step(), donate_argnums=0).lower(states, data, *args).compile()
      # The round index is traced (fold_in takes it as data): one compile serves every evaluation.
      evaluate = jax.jit(self.evaluate()).lower(states, data, *args, at).compile()
      validate = None
      if self.exp.validation is not None:
        validate = jax.jit(self.evaluate(validation=True)).lower(
            states, self.exp.validation, *args, at).compile()
    return step, evaluate, validate

  def run(self, num_rounds: int | None = None, eval_every: int | None = None,
          on_round: Callable | None = None, on_eval: Callable | None = None,
          on_start: Callable | None = None, on_state: Callable | None = None,
          start: int = 0, states=None):
    """All trials to round num_rounds (the config's by default) in one jitted round step and one
    jitted evaluation, from round `start` at `states` (default: 0, init_states()); on_start() once
    they are compiled, on_round(done, metrics [K]) after each round, on_eval(done, records [K]) at
    each evaluation (config.evaluates_at: every eval_every rounds from eval_from on, and the last),
    and on_state(done, states) after it and at every eval_every rounds before eval_from (the
    trials' checkpoints). Returns the final states."""
    config = self.exp.config
    num_rounds = config.num_rounds if num_rounds is None else num_rounds
    eval_every = config.eval_every if eval_every is None else eval_every
    states = self.init_states() if states is None else states
    step, evaluate, validate = self.compiled(states)
    if on_start is not None:
      on_start()
    for r in range(start, num_rounds):
      states, metrics = step(states, self.exp.data, self.roots, self.values)
      done = r + 1
      if on_round is not None:
        on_round(done, jax.device_get(metrics))
      evaluates = evaluates_at(done, num_rounds, eval_every, config.eval_from)
      if on_eval is not None and evaluates:
        at = jnp.int32(done)
        records = dict(jax.device_get(evaluate(states, self.exp.data, self.roots, self.values, at)))
        if validate is not None:
          records.update(jax.device_get(validate(states, self.exp.validation, self.roots,
                                                 self.values, at)))
        on_eval(done, records)
      if on_state is not None and (evaluates or done % eval_every == 0):
        on_state(done, states)
    return states


def trial_records(records: dict, index: int) -> dict:
  """Trial `index`'s entries of a mapped record (every leaf has the trial axis first)."""
  return {k: np.asarray(v)[index].item() for k, v in records.items()}
