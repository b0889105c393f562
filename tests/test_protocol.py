"""The evaluation protocol: pooled accuracy and never-sampled clients (evaluation.py), the test-time
adaptation (adaptation.py, config.eval), the local-only baseline (local_only.py), re-evaluating a
finished run (experiments/evaluate.py) and the centralized bound (experiments/centralized.py)."""

import json
import math
import os
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from conftest import tiny_config
from test_evaluation_buckets import EOS, PAD, _setup
from dp2fedsam_jax import adaptation, cli, evaluation, local_only, run_files, sharding, train
from dp2fedsam_jax.algorithms import get_method
from dp2fedsam_jax.protocol import Adaptation, Protocol
from dp2fedsam_jax.config import ConfigError, validate_config
from dp2fedsam_jax.state import model_params
from experiments import centralized
from experiments import evaluate as evaluate_binary

NAN = float('nan')


def _per_client(spec, model, local_config, state, data, **kwargs):
  evaluate = evaluation.make_evaluate(spec, model, local_config, **kwargs)
  return jax.device_get(jax.jit(evaluate.per_client)(state, data, jax.random.key(7)))


# ------------------------------------------------------------------ pooled accuracy


def test_pooled_accuracy_by_hand():
  clients = {'accuracy': jnp.array([0.75, 0.0, 0.5, 0.0, 0.0]),
             'correct': jnp.array([3, 0, 5, 0, 0]), 'targets': jnp.array([4, 0, 10, 2, 0]),
             'took_part': jnp.array([True, False, True, False, True])}
  got = jax.device_get(evaluation.pooled_accuracy(clients))
  assert got['test_accuracy_pooled'] == pytest.approx(8 / 16)
  assert got['test_accuracy_pooled_participated'] == pytest.approx(8 / 14)
  assert got['test_accuracy_pooled_never_sampled'] == 0.0  # client 3: 0 of 2
  assert got['test_accuracy_never_sampled'] == 0.0  # client 1 has no test data: not in the mean
  everyone = {**clients, 'took_part': jnp.ones(5, bool)}
  got = jax.device_get(evaluation.pooled_accuracy(everyone))
  assert math.isnan(got['test_accuracy_pooled_never_sampled'])
  assert math.isnan(got['test_accuracy_never_sampled'])
  assert got['test_accuracy_pooled_participated'] == got['test_accuracy_pooled'] == 0.5


@pytest.mark.parametrize('kind', ['image', 'tokens'])
def test_pooled_accuracy_counts_each_target_once(kind):
  """Correct predictions over every counted target (tokens: not pad, not EOS), by hand, against
  the evaluation; never-sampled clients (1 and 3 of times_sampled [1, 0, 2, 0, 1, 1]) apart."""
  spec, model, data, state, local_config = _setup(kind, 'dp2fedsam')
  offsets = np.asarray(data.test_offsets)
  correct, targets = [], []
  for i in range(data.num_clients):
    rows = np.arange(offsets[i], offsets[i + 1])
    if rows.size == 0:
      correct.append(0), targets.append(0)
      continue
    y = np.asarray(data.test_y)[rows].astype(np.int32)
    params = model_params(spec, state.shared, jax.tree.map(lambda p, i=i: p[i], state.personal))
    predicted = np.asarray(jnp.argmax(model.apply(params, data.normalize(data.test_x[rows])), -1))
    counted = (y != PAD) & (y != EOS) if kind == 'tokens' else np.ones(len(rows), bool)
    correct.append(int(np.sum((predicted == y) & counted)))
    targets.append(int(np.sum(counted)))
  correct, targets = np.array(correct), np.array(targets)
  evaluate = evaluation.make_evaluate(spec, model, local_config, clients_per_batch=4)
  got = jax.device_get(jax.jit(evaluate)(state, data, jax.random.key(7)))
  took = np.asarray(state.times_sampled) > 0
  assert got['test_accuracy_pooled'] == pytest.approx(correct.sum() / targets.sum(), rel=1e-6)
  assert got['test_accuracy_pooled_participated'] == pytest.approx(
      correct[took].sum() / targets[took].sum(), rel=1e-6)
  assert got['test_accuracy_pooled_never_sampled'] == pytest.approx(correct[1] / targets[1])
  assert got['test_accuracy_never_sampled'] == pytest.approx(correct[1] / targets[1])
  # The pooled mean weighs clients by their targets: here it is not the mean over clients.
  assert got['test_accuracy_pooled'] != pytest.approx(got['test_accuracy'], abs=1e-4)


# ------------------------------------------------------------------ test-time adaptation


def _client(spec, state, i):
  return model_params(spec, state.shared, jax.tree.map(lambda p: p[i], state.personal))


def _client_model(spec, model, local_config, protocol, initial_head=None):
  """(state, data, client_id, key) -> the model the client tests under `protocol`."""
  build = adaptation.make_client_model(spec, model, local_config,
                                       protocol.for_method(spec, local_config), initial_head)
  return lambda state, data, i, key: build(state, jax.tree.map(lambda p: p[i], state.personal),
                                           data, i, key)


def test_the_default_protocol_is_each_methods_own_evaluation():
  spec, _, _, _, local_config = _setup('image', 'dp2fedsam')
  assert Protocol.from_config(tiny_config()) == Protocol()
  # A personal method tests its own head, a global one the global model: no adaptation.
  assert Protocol().for_method(spec, local_config) == Adaptation()
  assert Protocol().for_method(get_method('dp_fedavg'), local_config).forward_only
  # An -FT method's own fine-tuning is a protocol: its epochs and part, its round's local lr.
  assert Protocol().for_method(get_method('dp_fedavg_ft'), local_config) == Adaptation(
      'full', local_config.finetune_epochs, local_config.lr_shared, local_config.lr_decay,
      own_weights=True)
  assert Protocol().for_method(get_method('dp_fedavg_fb'), local_config) == Adaptation(
      'head', local_config.finetune_epochs, local_config.lr_personal, local_config.lr_decay)
  # A configured protocol replaces it: a constant lr.
  assert Protocol(2, 0.1).for_method(get_method('dp_fedavg_ft'), local_config) == Adaptation(
      'full', 2, 0.1, None, own_weights=True)
  old = tiny_config()
  del old['eval']  # a config.json written before the block: the same protocol
  assert Protocol.from_config(old).is_default


def test_head_refit_trains_the_head_alone_from_the_chosen_head_at_a_constant_lr():
  spec, model, data, state, local_config = _setup('image', 'dp2fedsam')
  initial = model.init(jax.random.key(5))['head']
  refit = lambda init, epochs=2: _client_model(
      spec, model, local_config, Protocol(epochs, 0.1, 'auto', init), initial)
  params, key = _client(spec, state, 2), jax.random.key(3)
  own = refit('own')(state, data, 2, key)
  chex.assert_trees_all_equal(own['extractor'], params['extractor'])
  assert not np.allclose(own['head']['kernel'], params['head']['kernel'])
  # No decay with the round (the run's local.lr_decay is 0.9): the same at round 3 and 50.
  later = refit('own')(state.replace(round=jnp.asarray(50, jnp.int32)), data, 2, key)
  chex.assert_trees_all_equal(own, later)
  # 'random' starts from the run's initial head: with 0 epochs it is that head.
  chex.assert_trees_all_equal(refit('random', 0)(state, data, 2, key)['head'], initial)
  from_random = refit('random')(state, data, 2, key)
  assert not np.allclose(from_random['head']['kernel'], own['head']['kernel'])
  # A personal-head method has no global head to start from.
  with pytest.raises(ConfigError, match=r"^config\.eval\.head_init='shared'"):
    validate_config(tiny_config(**{'eval.head_init': 'shared'}))


def test_shared_head_is_the_global_one():
  spec, model, data, state, local_config = _setup('image', 'ppsgd')  # global head + own offset
  shared = _client_model(spec, model, local_config, Protocol(0, None, 'auto', 'shared'))
  got = shared(state, data, 0, jax.random.key(0))
  chex.assert_trees_all_equal(got['head'], state.shared['head'])
  validate_config(tiny_config(method='ppsgd', **{'eval.head_init': 'shared'}))


def test_adapt_epochs_need_a_learning_rate():
  with pytest.raises(ConfigError, match=r'^config\.eval\.adapt_lr=None'):
    validate_config(tiny_config(**{'eval.adapt_epochs': 3}))
  validate_config(tiny_config(**{'eval.adapt_epochs': 3, 'eval.adapt_lr': 0.1}))


def test_the_protocol_replaces_a_methods_own_finetuning():
  """-FT: the protocol's budget, not local.finetune_epochs, decides; global models under 'auto'
  adapt nothing, and adapt their head under 'head'."""
  spec, model, data, state, local_config = _setup('image', 'dp_fedavg_ft')
  longer = local_config.__class__(**{**local_config.__dict__, 'finetune_epochs': 5})
  protocol = Protocol(2, 0.1, 'auto', 'own')
  with_protocol = lambda lc: _per_client(spec, model, lc, state, data, protocol=protocol)
  # Two programs (finetune_epochs is static) that compute the same: equal up to float rounding,
  # which differs with the CPU's instruction set; the longer fine-tune moves the loss far more.
  chex.assert_trees_all_close(with_protocol(local_config), with_protocol(longer), rtol=1e-5,
                              atol=1e-6)
  assert not np.allclose(_per_client(spec, model, local_config, state, data)['loss'],
                         _per_client(spec, model, longer, state, data)['loss'])
  spec = get_method('dp_fedavg')
  plain = _per_client(spec, model, local_config, state, data)
  chex.assert_trees_all_close(_per_client(spec, model, local_config, state, data,
                                          protocol=protocol), plain, rtol=1e-5, atol=1e-6)
  head = Protocol(2, 0.1, 'head', 'own')
  assert not np.allclose(_per_client(spec, model, local_config, state, data, protocol=head)['loss'],
                         plain['loss'])


def test_a_run_started_before_the_eval_block_resumes_and_is_found_finished(tmp_path):
  workdir = str(tmp_path)
  train.train_and_evaluate(tiny_config(num_rounds=1), workdir)
  path = tmp_path / 'config.json'
  written = json.loads(path.read_text())
  del written['eval']
  path.write_text(json.dumps(written))
  resolved = train._with_executor(tiny_config(num_rounds=1), workdir)[0]
  assert run_files.finished_record(resolved, workdir)['round'] == 1  # the defaults it had
  final = train.train_and_evaluate(tiny_config(num_rounds=2), workdir)  # resumed, not refused
  assert final['round'] == 2


# ------------------------------------------------------------------ local only


def test_local_only_clients_train_alone_from_the_initial_model():
  spec, model, data, _, local_config = _setup('image', 'local_only')
  initial = model.init(jax.random.key(5))
  clients = lambda d, visits=2: jax.device_get(jax.jit(local_only.make_evaluate(
      spec, model, local_config, visits, initial, clients_per_batch=2).per_client)(
          d, jax.random.key(1)))
  base = clients(data)
  # Another label for every training row of client 4: only client 4's model changes.
  offsets = np.asarray(data.train_offsets)
  train_y = np.asarray(data.train_y).copy()
  train_y[offsets[4]:offsets[5]] = (train_y[offsets[4]:offsets[5]] + 1) % 3
  other = clients(data.replace(train_y=jnp.asarray(train_y)))
  changed = ~np.isclose(other['loss'], base['loss'])
  assert list(changed) == [False, False, False, False, True, False]
  assert base['took_part'].all()
  # No visit: every client tests the initial model, as the global model is tested.
  fedavg = get_method('fedavg')
  _, _, _, state, _ = _setup('image', 'fedavg')
  untrained = _per_client(fedavg, model, local_config, state.replace(shared=initial), data)
  np.testing.assert_allclose(clients(data, 0)['loss'], untrained['loss'], rtol=1e-6)
  np.testing.assert_array_equal(clients(data, 0)['accuracy'], untrained['accuracy'])
  # The sharded executor's 2 CPU devices share the clients, one at a time each: the same models.
  looped, spread = (jax.device_get(jax.jit(local_only.make_evaluate(
      spec, model, local_config, 2, initial, clients_per_batch=1, mesh=mesh).per_client)(
          data, jax.random.key(1))) for mesh in (None, sharding.client_mesh(jax.devices()[:2])))
  np.testing.assert_array_equal(spread['targets'], looped['targets'])
  for name in ('accuracy', 'loss'):
    np.testing.assert_allclose(spread[name], looped[name], rtol=2e-6, atol=1e-7, err_msg=name)


def test_local_only_run_releases_nothing_and_is_not_run_twice(tmp_path, monkeypatch):
  config = tiny_config(method='local_only', num_rounds=2, **{'dp.noise_multiplier': None})
  assert train.describe(config)['epsilon'] == 0.0
  final = train.train_and_evaluate(config, str(tmp_path))
  lines = [json.loads(l) for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert lines == [final] and final['round'] == 2 and final['epsilon'] == 0.0
  assert final['released'] == local_only.RELEASED and final['participation'] == 1.0
  assert 0.0 <= final['test_accuracy_pooled'] <= 1.0
  assert not os.path.exists(tmp_path / 'checkpoints')
  def no_training(*args, **kwargs):
    raise AssertionError('a finished local-only run trained again')
  monkeypatch.setattr(local_only, 'make_evaluate', no_training)
  assert train.train_and_evaluate(config, str(tmp_path)) == final
  with pytest.raises(ValueError, match='another config'):
    train.train_and_evaluate(tiny_config(method='local_only', num_rounds=2,
                                         **{'local.lr_shared': 0.2}), str(tmp_path))
  with pytest.raises(ConfigError, match=r'^config\.eval\.adapt_epochs=3.*local_only trains'):
    validate_config(tiny_config(method='local_only', **{'eval.adapt_epochs': 3,
                                                        'eval.adapt_lr': 0.1}))
  with pytest.raises(ValueError, match='keeps none'):
    evaluate_binary.evaluate_workdir(str(tmp_path))


# ------------------------------------------------------------------ re-evaluating a finished run


def test_evaluate_command_re_evaluates_a_finished_run_without_touching_its_metrics(tmp_path,
                                                                                  monkeypatch):
  workdir = str(tmp_path)
  train.train_and_evaluate(tiny_config(num_rounds=2), workdir)
  metrics = (tmp_path / 'metrics.jsonl').read_text()
  last = json.loads(metrics.splitlines()[-1])
  again = evaluate_binary.evaluate_workdir(workdir)
  # The default protocol repeats the run's own last evaluation, bit for bit.
  shared = [k for k in last if k in again and k not in ('seconds',)]
  assert {k: again[k] for k in shared} == {k: last[k] for k in shared}
  assert 'test_accuracy_pooled' in shared and again['finished'] and again['eval.adapt_epochs'] == 0
  other = evaluate_binary.evaluate_workdir(workdir, {'eval.adapt_epochs': 2, 'eval.adapt_lr': 0.05,
                                                     'eval.head_init': 'random'})
  assert other['eval.head_init'] == 'random' and other['round'] == 2
  assert other['test_loss'] != again['test_loss']
  assert (tmp_path / 'metrics.jsonl').read_text() == metrics
  lines = [json.loads(l) for l in (tmp_path / 'evaluations.jsonl').read_text().splitlines()]
  assert lines == [again, other]
  with pytest.raises(ValueError, match=r'--config\.local\.lr_shared: a re-evaluation sets only'):
    evaluate_binary.evaluate_workdir(workdir, {'local.lr_shared': 0.1})
  # The binary's flags: only what the command line sets overrides the run's config.
  argv = ['evaluate', f'--workdir={workdir}', '--config.eval.adapt_epochs=0',
          '--config.eval.head_init=own']
  monkeypatch.setattr(sys, 'argv', argv)  # a config_dict flag reads its overrides from sys.argv
  fv = flags.FlagValues()
  evaluate_binary.define_flags(fv)
  cli.parse_flags(argv, fv)
  assert dict(fv['config'].override_values) == {'eval.adapt_epochs': 0, 'eval.head_init': 'own'}


# ------------------------------------------------------------------ the centralized bound


def test_centralized_bound_counts_targets_as_the_federated_evaluation():
  spec, model, data, state, local_config = _setup('tokens', 'fedavg')
  params, records = centralized.train_centralized(data, model, epochs=2, batch_size=4, lr=0.5,
                                                  steps_per_call=3)
  assert [r['epoch'] for r in records] == [1, 2] and records[-1]['steps'] == 2 * 15
  evaluate = evaluation.make_evaluate(spec, model, local_config)
  pooled = jax.device_get(jax.jit(evaluate)(state.replace(shared=params), data,
                                            jax.random.key(0)))['test_accuracy_pooled']
  assert records[-1]['test_accuracy_pooled'] == pytest.approx(float(pooled), rel=1e-6)
  y = np.asarray(data.test_y)
  assert records[-1]['test_targets'] == int(np.sum((y != PAD) & (y != EOS)))
  _, smoke = centralized.train_centralized(data, model, epochs=5, batch_size=4, lr=0.5,
                                           max_steps=5, steps_per_call=2)
  assert len(smoke) == 1 and smoke[0]['steps'] == 5 and smoke[0]['estimated_seconds_per_epoch'] > 0
