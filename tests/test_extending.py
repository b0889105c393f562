"""The public extension API (dp2fedsam_jax.api, docs/extending.md): a user's own method, model,
dataset and partition, registered from outside the package, are validated, listed and run like the
built-ins; the three example files in experiments/extending/ run through the real binary."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from typing import ClassVar

import numpy as np
import pytest

import dp2fedsam_jax
from dp2fedsam_jax import api, config as config_lib, registries
from dp2fedsam_jax import federated_round

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTENDING = os.path.join('experiments', 'extending')


def _binary(*args, timeout=600):
  return subprocess.run([sys.executable, '-m', 'experiments.train', *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def registered():
  """Registers with the public API and takes every name back afterwards (one process, many tests)."""
  taken = []

  def add(registry, name):
    taken.append((registry, name))

  yield add
  for registry, name in taken:
    registry.unregister(name)


@dataclasses.dataclass(frozen=True)
class HalfStep(dp2fedsam_jax.ServerStep):
  """A server step of the tests: half the sgd step, scaled by a knob."""
  scale: float = 0.5
  name: ClassVar[str] = 'half'
  config_fields = (dp2fedsam_jax.Knob('scale', 'test_ext.scale', low=0.0, high=1.0, low_open=True,
                                      help='the tests\' server step scale'),)

  def apply(self, shared, total, denominator, learning_rate, state):
    return shared, state


@dataclasses.dataclass(frozen=True)
class ClashingStep(HalfStep):
  """A knob whose path the package's config already has."""
  config_fields = (dp2fedsam_jax.Knob('scale', 'dp.clip_norm'),)


def test_the_package_exports_the_api_without_loading_it_for_config():
  assert sorted(dp2fedsam_jax.__all__) == sorted(api.__all__)
  for name in dp2fedsam_jax.__all__:
    assert getattr(dp2fedsam_jax, name) is getattr(api, name)
  with pytest.raises(AttributeError):
    _ = dp2fedsam_jax.register_everything


def test_a_taken_name_raises_unless_replaced(registered):
  spec = dp2fedsam_jax.MethodSpec('test_ext_fedavg', private=False)
  api.register_method(spec)
  registered(api.METHODS, 'test_ext_fedavg')
  with pytest.raises(dp2fedsam_jax.RegistrationError, match="method 'dp_fedavg' is already registered"):
    api.register_method(dataclasses.replace(api.METHODS['dp_fedavg']))
  with pytest.raises(dp2fedsam_jax.RegistrationError, match="model 'mlp' is already registered"):
    api.register_model('mlp', lambda conv_impl: None)
  other = dataclasses.replace(spec, paper='replaced')
  with pytest.raises(dp2fedsam_jax.RegistrationError, match='replace=True'):
    api.register_method(other)
  api.register_method(other, replace=True)
  assert api.METHODS['test_ext_fedavg'].paper == 'replaced'
  # The package's own names stay its built-ins (the golden file lists those); a test's is not one.
  assert 'dp_fedavg' in api.METHODS.builtin_names()
  assert 'test_ext_fedavg' not in api.METHODS.builtin_names()


def test_a_file_executed_twice_registers_its_names_again_without_error(tmp_path):
  path = tmp_path / 'user.py'
  path.write_text("from dp2fedsam_jax import register_partition\n"
                  "register_partition('test_ext_twice', lambda ds, n, rng, **_: [])\n")
  try:
    for _ in range(2):  # the way a tool that loads a config file twice would
      exec(compile(path.read_text(), str(path), 'exec'), {})  # pylint: disable=exec-used
    assert 'test_ext_twice' in api.PARTITIONS
  finally:
    api.PARTITIONS.unregister('test_ext_twice')


def test_registered_names_are_validated_listed_and_suggested(registered):
  api.register_dataset('test_ext_data', lambda data_dir=None, split='train': api.synthetic(split=split),
                       shape=(4, (8, 8, 1)), description='the tests\' dataset')
  registered(api.DATASETS, 'test_ext_data')
  api.register_partition('test_ext_halves', lambda ds, n, rng, **_: np.array_split(np.arange(len(ds.y)), n))
  registered(api.PARTITIONS, 'test_ext_halves')
  c = config_lib.base_config()
  c.dataset, c.partition, c.model, c.dp.noise_multiplier = 'test_ext_data', 'test_ext_halves', 'mlp', 1.0
  config_lib.validate_config(c)
  c.partition = 'test_ext_halvse'
  with pytest.raises(config_lib.ConfigError, match=r"config.partition='test_ext_halvse': unknown; "
                     r"did you mean 'test_ext_halves'\?"):
    config_lib.validate_config(c)
  listing = api.listing()
  assert re.search(r'^  test_ext_data +the tests\' dataset$', listing, re.M)
  assert re.search(r'^  test_ext_halves$', listing, re.M)
  help_lines = config_lib.field_help()
  assert 'test_ext_data' in help_lines['dataset'] and 'shakespeare' in help_lines['dataset']
  assert 'char_lstm_small' in help_lines['model']


def test_a_registered_partition_splits_the_data_the_run_trains_on(registered):
  api.register_partition('test_ext_first_n', lambda ds, n, rng, **_: [np.arange(i * 5, i * 5 + 5)
                                                                       for i in range(n)])
  registered(api.PARTITIONS, 'test_ext_first_n')
  from dp2fedsam_jax.data import make_federated_data  # pylint: disable=import-outside-toplevel
  data = make_federated_data(dataset='synthetic', num_clients=3, partition='test_ext_first_n')
  assert np.diff(np.asarray(data.train_offsets)).tolist() == [5, 5, 5]  # 5 rows -> 5 train, 0 test
  api.register_partition('test_ext_one', lambda ds, n, rng, **_: [np.arange(5)])
  registered(api.PARTITIONS, 'test_ext_one')
  with pytest.raises(ValueError, match=r"config.partition='test_ext_one' made 1 clients for "
                     'config.num_clients=3'):
    make_federated_data(dataset='synthetic', num_clients=3, partition='test_ext_one')


def test_a_pieces_knob_becomes_a_validated_config_field(registered):
  spec = dp2fedsam_jax.MethodSpec('test_ext_half', server_step=HalfStep())
  api.register_method(spec)
  registered(api.METHODS, 'test_ext_half')
  registered(api.KNOBS, 'test_ext.scale')
  c = config_lib.base_config()
  assert c.test_ext.scale == 0.5  # the piece's default
  c.method, c.dp.noise_multiplier = 'test_ext_half', 1.0
  config_lib.validate_config(c)
  c.test_ext.scale = 0.25
  assert federated_round.server_step_of(c) == HalfStep(scale=0.25)  # the run's value reaches the piece
  for bad in (0.0, 1.5):
    c.test_ext.scale = bad
    with pytest.raises(config_lib.ConfigError, match=rf'^config.test_ext.scale={bad}: must lie in '
                       r'\(0, 1\] \(HalfStep.scale of method test_ext_half\); '
                       r'e.g. --config.test_ext.scale=0.5.$'):
      config_lib.validate_config(c)
  c.test_ext.scale, c.server_optimizer = 0.5, 'adam'
  with pytest.raises(config_lib.ConfigError, match=r"config.server_optimizer='adam': method "
                     r'test_ext_half brings its own server step \(half\)'):
    config_lib.validate_config(c)
  assert 'the tests\' server step scale; in (0, 1]' == config_lib.field_help()['test_ext.scale']


def test_a_piece_of_the_wrong_slot_and_a_bad_default_are_refused():
  with pytest.raises(ValueError, match=r'server_step=.* is not an instance of ServerStep or NoneType'):
    dp2fedsam_jax.MethodSpec('test_ext_bad', server_step=dp2fedsam_jax.BLUR())
  with pytest.raises(dp2fedsam_jax.RegistrationError, match=r'HalfStep.scale of method test_ext_zero: '
                     r'its default 0.0 must lie in \(0, 1\]'):
    api.register_method(dp2fedsam_jax.MethodSpec('test_ext_zero', server_step=HalfStep(scale=0.0)))
  assert 'test_ext_zero' not in api.METHODS
  with pytest.raises(dp2fedsam_jax.RegistrationError, match=r"config.dp.clip_norm is a field of the "
                     "package's config"):
    api.register_method(dp2fedsam_jax.MethodSpec('test_ext_taken', server_step=ClashingStep()))
  assert 'test_ext_taken' not in api.METHODS


def test_knob_ranges_and_types():
  knob = registries.Knob('k', 'k', low=1)  # an int default: an integer knob
  assert knob.problem(3, 2) is None
  assert knob.problem(2.5, 2) == 'must be an integer in [1, inf)'
  assert knob.problem(2.5, 2.0) is None
  assert knob.problem(0, 2) == 'must lie in [1, inf)'
  assert registries.Knob('b', 'b').problem('yes', True) == 'must be True or False'
  assert registries.Knob('x', 'x').problem(float('nan'), 1.0) == 'must be a finite number'


# ------------------------------------------------------------------ the example files, through the binary


def _finished_rounds(workdir) -> list[int]:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line)['round'] for line in f if line.strip()]


@pytest.mark.parametrize('name, registered_name', [('own_model', 'tiny_cnn'),
                                                   ('own_dataset', 'stripes'),
                                                   ('own_method', 'dp2fedsam_ema')])
def test_each_example_file_runs_its_rounds_through_the_binary(name, registered_name, tmp_path):
  config = os.path.join(EXTENDING, f'{name}.py')
  workdir = str(tmp_path / name)
  out = _binary(f'--config={config}', f'--workdir={workdir}')
  assert out.returncode == 0, out.stderr[-3000:]
  assert _finished_rounds(workdir) == [3]
  with open(os.path.join(workdir, 'config.json')) as f:
    assert registered_name in json.load(f).values()


def test_the_method_files_knob_is_validated_by_the_binary():
  config = os.path.join(EXTENDING, 'own_method.py')
  out = _binary(f'--config={config}', '--config.ema_beta=1.5', '--workdir=/nonexistent/never')
  assert out.returncode == 2, out.stderr[-3000:]
  assert out.stderr.strip().splitlines()[-1].startswith('error: config.ema_beta=1.5: must lie in [0, 1)')
  printed = _binary(f'--config={config}', '--print_config')
  assert printed.returncode == 0, printed.stderr[-3000:]
  assert re.search(r'^ema_beta = 0.5 +# beta of the moving average', printed.stdout, re.M)


def test_list_prints_every_registry_with_a_files_registrations():
  out = _binary('--list')
  assert out.returncode == 0, out.stderr[-3000:]
  assert re.search(r'^  dp2fedsam +DP²-FedSAM, dp2-fedsam.txt Algorithm 2$', out.stdout, re.M)
  for section in ('methods', 'models', 'datasets', 'partitions'):
    assert re.search(rf'^{section} \(\d+\):$', out.stdout, re.M)
  assert 'tiny_cnn' not in out.stdout
  mine = _binary(f'--config={os.path.join(EXTENDING, "own_model.py")}', '--list')
  assert mine.returncode == 0, mine.stderr[-3000:]
  assert re.search(r'^  tiny_cnn +a 3x3 conv', mine.stdout, re.M)


def test_print_config_validates():
  out = _binary('--config=experiments/configs/default.py', '--config.method=centuar', '--print_config')
  assert out.returncode == 2
  assert "error: config.method='centuar': unknown method; did you mean 'centaur'?" in out.stderr
