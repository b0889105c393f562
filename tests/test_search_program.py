"""dp2fedsam_jax/search_program.py: K trials as one program equal each trial run alone."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import search_program, train

TRIALS = [  # searched scalars and a training seed of each trial
    {'local.lr_shared': 0.05, 'local.lr_personal': 0.05, 'local.sam_rho': 0.05, 'server_lr': 1.0,
     'dp.clip_norm': 1.0, 'training_seed': 2**40 + 1},
    {'local.lr_shared': 0.2, 'local.lr_personal': 0.01, 'local.sam_rho': 0.0, 'server_lr': 0.5,
     'dp.clip_norm': 0.3, 'training_seed': 2**41 + 7},
    {'local.lr_shared': 0.01, 'local.lr_personal': 0.1, 'local.sam_rho': 0.2, 'server_lr': 2.0,
     'dp.clip_norm': 3.0, 'training_seed': 2**50 + 3},
]


def _configs(method, **common):
  return [tiny_config(method=method, num_clients=8, sampling_rate=0.5, num_rounds=2,
                      validation_fraction=0.25, **common, **trial) for trial in TRIALS]


def _alone(config):
  """The trial as the binary runs it: its own experiment, jitted round step and evaluations."""
  exp = train.build_experiment(config)
  step, state = jax.jit(exp.make_round_step()), exp.init_state()
  for _ in range(config.num_rounds):
    state, metrics = step(state, exp.data, exp.root_key)
  key = exp.eval_key(config.num_rounds)
  record = {**jax.jit(exp.make_evaluate())(state, exp.data, key),
            **jax.jit(train.make_validation_evaluate(exp.make_evaluate()))(state, exp.validation, key)}
  return state, metrics, record


def _close(a, b, what):
  """Relative 1e-4 in the array's norm: a traced learning rate may fuse in another order than a
  constant one, so float32 rounding differs in the last digits."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  error = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6)
  assert error <= 1e-4, (what, error)


@pytest.mark.parametrize('method,executor', [('dp2fedsam', 'sequential'), ('dp2fedsam', 'vmap'),
                                             ('dp_fedavg', 'sequential')])
def test_trial_i_of_the_program_is_trial_i_run_alone(method, executor):
  configs = _configs(method, executor=executor)
  program = search_program.SearchProgram.of_configs(configs)
  assert program.in_loop == (executor == 'sequential')
  finals, records = [], {}
  states = program.run(on_round=lambda done, m: finals.append(m),
                       on_eval=lambda done, r: records.setdefault(done, r))
  assert sorted(records) == [1, 2]  # eval_every 1
  for i, config in enumerate(configs):
    state, metrics, record = _alone(config)
    mine = jax.tree.map(lambda x: x[i], states)  # noqa: B023
    for a, b in zip(jax.tree.leaves(mine.shared), jax.tree.leaves(state.shared)):
      _close(a, b, f'trial {i} shared')
    for a, b in zip(jax.tree.leaves(mine.personal), jax.tree.leaves(state.personal)):
      _close(a, b, f'trial {i} personal')
    assert int(finals[-1]['cohort_size'][i]) == int(metrics['cohort_size'])
    for name in ('test_accuracy', 'validation_accuracy_sum', 'validation_accuracy'):
      _close(search_program.trial_records(records[2], i)[name], record[name], f'trial {i} {name}')


def test_trials_that_differ_in_more_than_their_searched_scalars_need_their_own_program():
  configs = _configs('dp2fedsam')
  configs[1].local.personal_epochs = 2
  with pytest.raises(ValueError, match='local.personal_epochs'):
    search_program.SearchProgram.of_configs(configs)


@pytest.mark.parametrize('method,field', [('dp_fedavg_blur', 'blur_lambda')])  # every penalty's lam: one path
def test_a_penalty_weight_is_searched_as_data(method, field):
  """lam of the method's penalty is a traced scalar: trials at three lams share one program, and
  trial i is the run alone at its own lam (a lam left at trial 0's would fail trials 1 and 2)."""
  configs = _configs(method, executor='sequential')
  for config, lam in zip(configs, (0.0, 0.5, 5.0)):
    *parents, leaf = field.split('.')
    setattr(functools.reduce(getattr, parents, config), leaf, lam)
  assert search_program.searched(configs[0])[field] == 'penalty_weight'
  assert len({search_program.one_program_key(c) for c in configs}) == 1
  program = search_program.SearchProgram.of_configs(configs)
  np.testing.assert_allclose(program.values.penalty_weight, [0.0, 0.5, 5.0])
  states = program.run()
  alone = [_alone(config)[0] for config in configs]
  for i, state in enumerate(alone):
    mine = jax.tree.map(lambda x: x[i], states)  # noqa: B023
    for a, b in zip(jax.tree.leaves(mine.shared), jax.tree.leaves(state.shared)):
      _close(a, b, f'trial {i} shared')
  moved = [np.linalg.norm(np.concatenate([np.ravel(a - b) for a, b in zip(
      jax.tree.leaves(s.shared), jax.tree.leaves(alone[0].shared))])) for s in alone[1:]]
  assert min(moved) > 1e-4, moved  # lam changes the run: the test above can tell them apart


def test_a_method_without_a_penalty_searches_no_weight():
  config = _configs('dp2fedsam')[0]
  assert 'penalty_weight' not in search_program.searched(config).values()
  assert search_program.hyperparameters(config)['penalty_weight'] == 0.0
  for method, field in (('pmtl_ft', 'pmtl_lambda'), ('dp_pfeddsu', 'dsu.lam')):  # the others' lam
    assert search_program.searched(_configs(method)[0])[field] == 'penalty_weight'


def test_k_vmapped_trials_fit_the_memory_their_chunks_were_sized_for():
  """On an accelerator the K trials' cohorts run at once: their chunks are sized for K, not for one
  (a run alone's chunk would not fit K times beside the data)."""
  from dp2fedsam_jax.federated_round import program_bytes  # pylint: disable=import-outside-toplevel
  configs = _configs('dp2fedsam', executor='vmap')
  program = search_program.SearchProgram.of_configs(configs)

  def bytes_of(prog):
    states = jax.eval_shape(prog.init_states)
    return program_bytes(jax.jit(prog.round_step(), donate_argnums=0).lower(
        states, prog.exp.data, prog.roots, prog.values).compile())

  whole = bytes_of(program)
  fake = 0.7 * whole / 0.8  # the three whole cohorts at once do not fit
  exp, how = train.fit_to_device(program.exp, 'auto', trials=3, memory_bytes=fake)
  chunk = exp.round_config.executor.chunk_size
  assert chunk is not None and 'fit the device memory' in how, how
  assert bytes_of(dataclasses.replace(program, exp=exp)) <= 0.8 * fake
  alone = train.fit_chunk_size(program.exp, memory_bytes=fake)
  assert alone is None or alone > chunk  # sized for one trial it would be larger


def test_the_trial_axis_is_split_over_the_devices_and_each_trial_is_its_run_alone():
  """Vmapped trials on several devices (the tests' 8 forced CPU devices): JAX's SPMD engine splits
  the program by trial; the data is on every device; trial i is still the run alone."""
  devices = jax.device_count()
  if devices == 1:
    pytest.skip('one device: nothing to split (the tests force 8 CPU devices: conftest.py)')
  configs = [tiny_config(method='dp2fedsam', num_clients=8, sampling_rate=0.5, num_rounds=2,
                         executor='vmap', validation_fraction=0.25, training_seed=2**40 + i,
                         **{'local.lr_shared': 0.02 * (i + 1)})
             for i in range(devices)]
  program = search_program.SearchProgram.of_configs(configs)
  assert program.mesh is not None and program.trials_per_device == 1
  states = program.run()
  leaf = jax.tree.leaves(states.shared)[0]
  assert len(leaf.sharding.device_set) == devices and not leaf.sharding.is_fully_replicated
  for i in (0, devices - 1):
    state = _alone(configs[i])[0]
    for a, b in zip(jax.tree.leaves(jax.tree.map(lambda x: x[i], states).shared),  # noqa: B023
                    jax.tree.leaves(state.shared)):
      _close(a, b, f'trial {i} shared')
  assert search_program.SearchProgram.of_configs(configs[:3]).mesh is None  # 3 trials, 8 devices
