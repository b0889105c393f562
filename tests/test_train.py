"""Config validation, the experiment binary, train_and_evaluate end to end, and resume."""

import glob
import json
import math
import os
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

import test_metric_writers
from conftest import tiny_config
from dp2fedsam_jax import checkpoint, metric_writers, train
from dp2fedsam_jax.config import ConfigError, validate_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INVALID = [
    ('method', 'dp_fedmagic', 'config.method'),
    ('dp.noise_multiplier', -0.5, 'config.dp.noise_multiplier'),
    ('dp.clip_norm', 0.0, 'config.dp.clip_norm'),
    ('dp.clip_norm', -1.0, 'config.dp.clip_norm'),
    ('sampling_rate', 0.0, 'config.sampling_rate'),
    ('sampling_rate', 1.5, 'config.sampling_rate'),
    ('local.personal_epochs', -1, 'config.local.personal_epochs'),
    ('local.shared_epochs', -2, 'config.local.shared_epochs'),
    ('local.batch_size', 0, 'config.local.batch_size'),
    ('local.momentum', 1.0, 'config.local.momentum'),
    ('num_clients', 0, 'config.num_clients'),
    ('partition', 'zipf', 'config.partition'),
    ('executor', 'threads', 'config.executor'),
    ('dp.sampling', 'shuffle', 'config.dp.sampling'),
    ('dp.noise_placement', 'server', 'config.dp.noise_placement'),
    ('dp.accountant', 'moments', 'config.dp.accountant'),
    ('dp.delta', 1.0, 'config.dp.delta'),
    ('dp.target_epsilon', -1.0, 'config.dp.target_epsilon'),
    ('dataset', 'imagenet22k', 'config.dataset'),
    ('model', 'vit_huge', 'config.model'),
    ('conv_impl', 'winograd', 'config.conv_impl'),
]


@pytest.mark.parametrize('field,value,named', INVALID)
def test_invalid_config_fails_before_training_naming_the_field(field, value, named, tmp_path):
  config = tiny_config(**{field: value})
  with pytest.raises(ValueError, match=named.replace('.', r'\.')):
    train.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(tmp_path / 'metrics.jsonl')


def test_private_method_needs_sigma_or_target_epsilon_and_sigma_wins():
  with pytest.raises(ConfigError, match='target_epsilon'):
    train.build_experiment(tiny_config(**{'dp.noise_multiplier': None}))
  exp = train.build_experiment(tiny_config(**{'dp.target_epsilon': 3.0, 'dp.noise_multiplier': 1.3}))
  assert exp.mechanism.noise_multiplier == 1.3


def test_client_with_no_data_is_an_error():
  # 1,000 synthetic examples over 2,000 clients: most clients get nothing.
  with pytest.raises(ValueError, match='num_clients'):
    train.build_experiment(tiny_config(num_clients=2000))


def test_fixed_sampling_needs_rdp():
  with pytest.raises(ValueError, match='dp.accountant'):
    train.build_experiment(tiny_config(**{'dp.sampling': 'fixed'}))


def test_target_epsilon_calibrates_sigma_and_delta_defaults_to_one_over_n():
  exp = train.build_experiment(tiny_config(**{'dp.noise_multiplier': None, 'dp.target_epsilon': 4.0,
                                              'num_rounds': 5}))
  assert exp.mechanism.delta == pytest.approx(1 / 6)
  assert exp.epsilon <= 4.0 and exp.epsilon > 3.9
  assert exp.mechanism.noise_multiplier > 0


def test_train_and_evaluate_writes_config_and_metrics(tmp_path):
  config = tiny_config(num_rounds=3, eval_every=2)
  final = train.train_and_evaluate(config, str(tmp_path))
  written = json.loads((tmp_path / 'config.json').read_text())
  assert written['method'] == 'dp2fedsam' and written['dp']['noise_multiplier'] == 1.0
  lines = [json.loads(l) for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [l['round'] for l in lines] == [2, 3]
  for key in ('round', 'epsilon', 'train_loss', 'test_accuracy', 'mean_update_norm',
              'clipped_fraction', 'seconds'):
    assert key in lines[-1] and math.isfinite(lines[-1][key])
  assert lines[0]['epsilon'] < lines[1]['epsilon']
  assert final == lines[-1]
  assert not [k for k in final if k.startswith('validation')]  # validation_fraction = 0: none
  # The spread over clients (tests/test_diagnostics.py), in metrics.jsonl and TensorBoard.
  spread = [lines[-1][f'test_accuracy_{k}'] for k in ('worst10', 'p10', 'p50', 'p90')]
  assert spread == sorted(spread) and spread[0] <= lines[-1]['test_accuracy'] <= spread[-1]
  assert 0 <= lines[-1]['test_accuracy_std'] <= 0.5
  if metric_writers.tensorboard_available():
    tags = {tag for path in glob.glob(str(tmp_path / 'tensorboard' / 'eval' / 'events.*'))
            for tag, _, _ in test_metric_writers._scalars(path)}
    assert {'test_accuracy_p10', 'test_accuracy_worst10', 'test_accuracy_std'} <= tags
  # Every round has its training scalars; an evaluation's are their mean over its window.
  rounds = [json.loads(l) for l in (tmp_path / 'train_metrics.jsonl').read_text().splitlines()]
  assert [r['round'] for r in rounds] == [1, 2, 3]
  for r in rounds:
    assert set(r) == {'round', 'seconds', *train.TRAIN_SCALARS} and r['seconds'] > 0
  for key in ('train_loss', 'mean_update_norm', 'clipped_fraction', 'cohort_size'):
    assert lines[0][key] == pytest.approx(np.mean([r[key] for r in rounds[:2]]), rel=1e-6)
    assert lines[1][key] == pytest.approx(rounds[2][key], rel=1e-6)
  assert lines[0]['nonfinite_clients'] == sum(r['nonfinite_clients'] for r in rounds[:2])
  # 'auto' (the default) is written as the executor it chose.
  assert config.executor == 'auto'
  assert written['executor'] == ('sequential' if jax.default_backend() == 'cpu' else 'vmap')


def test_a_validation_fraction_carves_validation_rows_and_writes_their_metrics(tmp_path):
  config = tiny_config(num_rounds=2, eval_every=2, validation_fraction=0.3)
  exp = train.build_experiment(config)
  plain = train.build_experiment(tiny_config(num_rounds=2, eval_every=2))
  full, kept = np.diff(np.asarray(plain.data.train_offsets)), np.diff(np.asarray(exp.data.train_offsets))
  held = np.diff(np.asarray(exp.validation.test_offsets))
  np.testing.assert_array_equal(held, np.floor(0.3 * full + 0.5))
  np.testing.assert_array_equal(kept + held, full)
  np.testing.assert_array_equal(np.asarray(exp.data.test_x), np.asarray(plain.data.test_x))
  final = train.train_and_evaluate(config, str(tmp_path))
  assert final['validation_clients'] == 6 and 0 <= final['validation_accuracy'] <= 1
  assert final['validation_accuracy_sum'] == pytest.approx(6 * final['validation_accuracy'])
  assert math.isfinite(final['validation_loss']) and math.isfinite(final['test_accuracy'])
  written = json.loads((tmp_path / 'config.json').read_text())
  assert written['validation_fraction'] == 0.3


def test_auto_executor_is_resolved_per_backend_and_a_resume_keeps_the_recorded_one(tmp_path):
  from dp2fedsam_jax import executors
  assert [executors.from_name('auto', backend=b) for b in ('cpu', 'gpu', 'tpu')] == [
      executors.Sequential(), executors.Vmap(), executors.Vmap()]
  assert executors.from_name('sharded', 4, 'cpu') == executors.Sharded(chunk_size=4)
  # A checkpointed run recorded as vmap (e.g. started before 'auto' was the default, or on a GPU)
  # resumes with vmap under 'auto'; an explicit executor is kept as it is.
  (tmp_path / 'checkpoints' / '2').mkdir(parents=True)
  (tmp_path / 'config.json').write_text(json.dumps({'executor': 'vmap'}))
  config, how = train._with_executor(tiny_config(), str(tmp_path))
  assert config.executor == 'vmap' and 'checkpointed run' in how
  config, how = train._with_executor(tiny_config(executor='sequential'), str(tmp_path))
  assert config.executor == 'sequential' and how == ''
  config, how = train._with_executor(tiny_config(), str(tmp_path / 'new'))
  assert config.executor == executors.resolve_name('auto') and how == f'auto on {jax.default_backend()}'


def test_interrupted_run_resumes_to_the_same_result(tmp_path):
  full_dir, split_dir = str(tmp_path / 'full'), str(tmp_path / 'split')
  full = train.train_and_evaluate(tiny_config(num_rounds=4, eval_every=1), full_dir)
  train.train_and_evaluate(tiny_config(num_rounds=2, eval_every=1), split_dir)  # "killed" after 2
  resumed = train.train_and_evaluate(tiny_config(num_rounds=4, eval_every=1), split_dir)
  drop_time = lambda r: {k: v for k, v in r.items() if k != 'seconds'}
  assert drop_time(resumed) == drop_time(full)
  exp = train.build_experiment(tiny_config())
  a, _ = checkpoint.restore(full_dir, exp.init_state())
  b, _ = checkpoint.restore(split_dir, exp.init_state())
  chex.assert_trees_all_equal(a, b)
  lines = (tmp_path / 'split' / 'metrics.jsonl').read_text().splitlines()
  assert [json.loads(l)['round'] for l in lines] == [1, 2, 3, 4]


def test_resuming_with_another_config_is_refused(tmp_path):
  train.train_and_evaluate(tiny_config(num_rounds=1), str(tmp_path))
  with pytest.raises(ValueError, match=r'dp\.clip_norm: 1\.0 -> 0\.5'):
    train.train_and_evaluate(tiny_config(num_rounds=2, **{'dp.clip_norm': 0.5}), str(tmp_path))


def test_binary_dry_run_prints_sizes_and_privacy():
  out = subprocess.run(
      [sys.executable, '-m', 'experiments.train', '--config=experiments/configs/default.py',
       '--dry_run', '--config.num_rounds=10', '--config.dataset=synthetic', '--config.num_clients=20',
       '--config.model=mlp'],
      cwd=ROOT, capture_output=True, text=True, check=True, timeout=300)
  info = json.loads(out.stdout.strip().splitlines()[-1])
  assert info['method'] == 'dp2fedsam'
  assert info['num_params'] == info['num_shared_params'] + info['num_personal_params']
  assert info['num_personal_params'] == 64 * 4 + 4  # the MLP's head; synthetic data has 4 classes
  assert info['epsilon'] <= 2.0 and info['noise_multiplier'] > 0 and info['delta'] == 1 / 20


def test_dry_run_reads_no_data(monkeypatch):
  """Sizing a CIFAR model must not need the data (nor TensorFlow)."""
  from dp2fedsam_jax.data import sources
  def no_loading(*args, **kwargs):
    raise AssertionError('the dry run loaded a dataset')
  monkeypatch.setattr(sources, 'load_dataset', no_loading)
  info = train.describe(tiny_config(dataset='cifar10', model='cifar_cnn', num_clients=1000))
  assert info['num_params'] == 667_402 and info['num_personal_params'] == 128 * 10 + 10


def test_dry_run_names_the_noise_mechanism_and_its_calibrated_sigma():
  """The same target epsilon calibrates another sigma under BandMF (q b sampling, ceil(T/b)
  chances): the dry run says which mechanism its sigma is for."""
  target = dict(num_clients=100, sampling_rate=0.1, num_rounds=8, **{
      'dp.noise_multiplier': None, 'dp.target_epsilon': 2.0})
  independent = train.describe(tiny_config(**target))
  banded = train.describe(tiny_config(**target, **{'dp.noise_mechanism': 'banded',
                                                   'dp.num_bands': 2}))
  assert independent['noise_mechanism'] == 'independent' and 'num_bands' not in independent
  assert banded['noise_mechanism'] == 'banded' and banded['num_bands'] == 2
  assert banded['epsilon'] == pytest.approx(2.0, rel=2e-2) == independent['epsilon']
  assert banded['noise_multiplier'] != pytest.approx(independent['noise_multiplier'], rel=1e-2)


def test_private_metrics_only_writes_nothing_that_voids_epsilon(tmp_path, caplog):
  """train_metrics.jsonl, metrics.jsonl, TensorBoard and the log hold round, epsilon and (adaptive
  clipping) clip_norm only: no training scalar, test metric, cohort size, noise diagnostic or time."""
  config = tiny_config(num_rounds=2, eval_every=1, private_metrics_only=True,
                       **{'dp.clipping': 'adaptive'})
  with caplog.at_level('INFO'):
    final = train.train_and_evaluate(config, str(tmp_path))
  assert set(final) == {'round', 'epsilon'} and math.isfinite(final['epsilon'])
  rounds = [json.loads(l) for l in (tmp_path / 'train_metrics.jsonl').read_text().splitlines()]
  assert [set(r) for r in rounds] == [{'round', 'clip_norm'}] * 2
  records = [json.loads(l) for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [set(r) for r in records] == [{'round', 'epsilon'}] * 2
  if metric_writers.tensorboard_available():
    tags = {tag for path in glob.glob(str(tmp_path / 'tensorboard' / '*' / 'events.*'))
            for tag, _, _ in test_metric_writers._scalars(path)}
    assert tags == {'clip_norm', 'epsilon'}, tags
  logged = caplog.text
  assert 'eps ' in logged and 'acc ' not in logged and 's/round' not in logged
  # A resumed (finished) run returns the same record.
  assert train.train_and_evaluate(config, str(tmp_path)) == final


def test_private_metrics_only_keeps_the_noise_diagnostics_out_of_checkpoints(tmp_path, monkeypatch):
  """A checkpoint between evaluations holds the rounds' window: under private_metrics_only it carries
  no training scalar (noise_std, signal_to_noise, cohort size, loss), as the metrics files carry none."""
  written = []
  real = checkpoint.save

  def save(workdir, state, records, window=()):
    written.append((int(state.round), [dict(r) for r in records], [dict(m) for m in window]))
    real(workdir, state, records, window)
  monkeypatch.setattr(checkpoint, 'save', save)
  config = tiny_config(num_rounds=3, eval_every=2, checkpoint_every=1, private_metrics_only=True)
  train.train_and_evaluate(config, str(tmp_path))
  assert [(r, len(w)) for r, _, w in written] == [(1, 1), (2, 0), (3, 0)]
  assert all(m == {} for _, _, window in written for m in window)
  assert all(set(rec) <= set(train.PRIVATE_RECORD_KEYS) for _, records, _ in written for rec in records)
  # Without it, the same window holds the diagnostics (what the option leaves out).
  written.clear()
  train.train_and_evaluate(tiny_config(num_rounds=2, eval_every=2, checkpoint_every=1),
                           str(tmp_path / 'all_metrics'))
  assert {'noise_std', 'signal_to_noise'} <= set(written[0][2][0])


def test_private_metrics_only_is_refused_for_a_non_private_method():
  with pytest.raises(ConfigError, match=r'^config\.private_metrics_only=True: method fedavg is not '
                                        r'private'):
    validate_config(tiny_config(method='fedavg', private_metrics_only=True))
