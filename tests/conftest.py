"""Shared fixtures: tiny configs and data so the whole suite runs in minutes on 2 CPU cores."""

import atexit
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest

# Must precede JAX's initialisation: the sharding tests need several (virtual) CPU devices. The suite
# is compile-bound, so the rest trades the compiled code's speed for compile time: LLVM's
# optimisations off halve its CPU time (tests/test_engine.py 227 s -> 110 s of CPU); XLA:CPU's older
# loop emitters instead of its fusion emitters, and no expensive LLVM passes, take another third off
# the compile of a round step (3 tiny runs: 21.1 -> 12.9 s of CPU). Every program a test compares is
# compiled the same way. A JAX that no longer knows a flag dies on it, so they are tried first (~2 s).
_XLA_BASE = '--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0'
_XLA_FAST_COMPILE = ('--xla_cpu_use_fusion_emitters=false --xla_llvm_disable_expensive_passes=true '
                     '--xla_cpu_opt_preset=FAST_COMPILE')


def _xla_accepts(flags: str) -> bool:
  probe = subprocess.run([sys.executable, '-c', 'import jax; jax.numpy.zeros(1).block_until_ready()'],
                         env={**os.environ, 'XLA_FLAGS': flags}, capture_output=True, timeout=300)
  return probe.returncode == 0


def _missing(flags: str, wanted: str) -> str:
  """The flags of `wanted` whose names `flags` does not set already."""
  named = {f.split('=')[0] for f in flags.split()}
  return ' '.join(f for f in wanted.split() if f.split('=')[0] not in named)


# A user's own XLA_FLAGS stay and come first (e.g. `--xla_cpu_max_isa=AVX2`, which makes an AVX-512
# machine compile what an AVX2 laptop compiles); the suite's flags are added where the user set none.
# Set once here; pytest-xdist's workers inherit it and find nothing missing.
_user_flags = os.environ.get('XLA_FLAGS', '')
if _missing(_user_flags, f'{_XLA_BASE} {_XLA_FAST_COMPILE}'):
  _base = f'{_user_flags} {_missing(_user_flags, _XLA_BASE)}'.strip()
  _fast = f'{_base} {_missing(_base, _XLA_FAST_COMPILE)}'.strip()
  os.environ['XLA_FLAGS'] = _fast if _xla_accepts(_fast) else _base


def xla_flags(devices: int) -> str:
  """This session's XLA_FLAGS for a process with `devices` virtual CPU devices."""
  return re.sub(r'--xla_force_host_platform_device_count=\d+',
                f'--xla_force_host_platform_device_count={devices}', os.environ['XLA_FLAGS'])

# The binaries the tests start keep their compiled programs in a cache of this session, never in the
# user's (dp2fedsam_jax/compilation_cache.py).
if 'DP2FEDSAM_COMPILATION_CACHE' not in os.environ:
  _CACHE = tempfile.mkdtemp(prefix='dp2fedsam_test_jax_cache_')
  os.environ['DP2FEDSAM_COMPILATION_CACHE'] = _CACHE
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

from dp2fedsam_jax import compilation_cache  # noqa: E402  (JAX reads XLA_FLAGS above on import)
from dp2fedsam_jax.config import base_config  # noqa: E402
from experiments.configs import _common  # noqa: E402

# The tests' own compilations use that cache too: many tests compile the same programs (the tiny
# config's round step, the evaluation), and a cached one loads in milliseconds (~25 % less CPU for
# tests/test_methods.py and test_engine.py). pytest-xdist's workers inherit the directory, so they
# share it; entries are written atomically (compilation_cache.enable).
compilation_cache.enable(os.environ['DP2FEDSAM_COMPILATION_CACHE'])

# A suite started in the background by a non-interactive shell (`... &`) inherits SIGINT ignored,
# and so would every binary it starts: the Ctrl-C tests (tests/test_cli.py) need Python's default.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _process_state_restored():
  """Tests share a process: a user file loaded in-process (a README command, an example config)
  registers methods and knobs, and a logging test sets absl's level. Each test starts from the
  state the one before it found."""
  from dp2fedsam_jax import api  # pylint: disable=import-outside-toplevel
  registries = (api.METHODS, api.MODELS, api.DATASETS, api.PARTITIONS, api.KNOBS)
  snapshots = [r.snapshot() for r in registries]
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  yield
  for registry, snapshot in zip(registries, snapshots):
    registry.restore(snapshot)
  absl_logger.setLevel(level)


# conftest.tiny_config() as --config.x flags on top of the default config file.
TINY_FLAGS = ['--config.dataset=synthetic', '--config.model=mlp', '--config.num_clients=6',
              '--config.partition=iid', '--config.sampling_rate=0.5', '--config.local.personal_epochs=1',
              '--config.local.shared_epochs=1', '--config.local.batch_size=16',
              '--config.dp.clip_norm=1.0', '--config.dp.target_epsilon=None',
              '--config.dp.noise_multiplier=1.0']

def token_federation(train_sizes, test_sizes, *, vocab: int, length: int, pad: int, eos: int,
                     seed: int):
  """A ragged token federation: client i holds train_sizes[i] / test_sizes[i] sequences over ids
  1..eos-1, each ending in an EOS then pads; y is x shifted by one."""
  from dp2fedsam_jax.data import from_flat_arrays
  rng = np.random.default_rng(seed)

  def split(sizes):
    total = sum(sizes)
    seq = rng.integers(1, eos, (total, length + 1))
    for row, n in zip(seq, rng.integers(2, length + 1, total)):
      row[n - 1], row[n:] = eos, pad
    return seq[:, :-1].astype(np.uint8), seq[:, 1:].astype(np.uint8), np.r_[0, np.cumsum(sizes)]

  (tx, ty, to), (ex, ey, eo) = split(train_sizes), split(test_sizes)
  return from_flat_arrays(train_x=tx, train_y=ty, train_offsets=to, test_x=ex, test_y=ey,
                          test_offsets=eo, num_classes=vocab, input_kind='tokens', pad_id=pad,
                          accuracy_ignore_ids=(eos,))


def _table_cells(line: str) -> list[str]:
  # A cell may hold an escaped pipe (\|), as Markdown writes one.
  return [cell.strip() for cell in re.split(r'(?<!\\)\|', line.strip()[1:-1])]


def markdown_tables(text, *columns: str) -> list[list[dict[str, str]]]:
  """The Markdown tables of `text` (a string, or a list of lines) whose header names every one of
  `columns` (all tables without any), each as its rows: {column header: cell, stripped}. Tests
  check the cells that carry numbers and names by column, so a reworded sentence or header they do
  not read leaves them passing; a row whose cells do not match its header fails here."""
  lines = text.splitlines() if isinstance(text, str) else '\n'.join(text).splitlines()
  tables = []
  for index, line in enumerate(lines[1:], start=1):
    header = lines[index - 1].strip()
    if not (header.startswith('|') and set(line.strip()) <= {'|', '-', ':'} and '---' in line):
      continue
    names = _table_cells(header)
    assert len(set(names)) == len(names), f'a column named twice: {header}'
    rows = []
    for row in lines[index + 1:]:
      if not row.strip().startswith('|'):
        break
      cells = _table_cells(row)
      assert len(cells) == len(names), f'{len(cells)} cells under {len(names)} columns: {row}'
      rows.append(dict(zip(names, cells)))
    if set(columns) <= set(names):
      tables.append(rows)
  return tables


def numbers_in(text: str) -> list[str]:
  """The numbers written in `text`, as written and in order (0.0244, 1.2e5, -7.17; a '-' after a
  space or '(' is a sign, in 43.6-51.7 a range): a test holds a written number to what it
  recomputes without pinning the sentence around it."""
  number = r'(\d+(?:\.\d+)?(?:e[+-]?\d+)?)'
  found = re.findall(rf'(?:(?<=[\s(=])|^)(-?){number}|(?<![\w.]){number}', text)
  return [sign + number if number else other for sign, number, other in found]


def tiny_config(**overrides):
  """A synthetic-data, MLP config that trains in about a second per round."""
  c = _common.synthetic_mlp(base_config(), num_clients=6)
  c.method = 'dp2fedsam'
  c.sampling_rate = 0.5
  c.num_rounds = 2
  c.eval_every = 1
  c.dp.noise_multiplier = 1.0
  _common.set_fields(c, overrides)
  return c


def flat_config(path):
  """A run's config.json as one level: {'dp.clip_norm': ..., 'server_lr': ...}."""
  with open(path) as f:
    config = json.load(f)
  return {**{k: v for k, v in config.items() if not isinstance(v, dict)},
          **{f'{k}.{kk}': vv for k, v in config.items() if isinstance(v, dict) for kk, vv in v.items()}}


def write_run_file(path: str, value) -> None:
  """A run's file as the engine writes it: a list as JSON lines (metrics.jsonl), else one JSON
  document (config.json); its folders made."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    if isinstance(value, list):
      f.writelines(json.dumps(v) + '\n' for v in value)
    else:
      json.dump(value, f)


def differing_fields(config: dict, other: dict) -> set:
  """The fields of two flat configs (flat_config) whose values differ, or that only one has."""
  return {k for k in config.keys() | other.keys() if config.get(k) != other.get(k)}


def noise_per_server_lr_and_clip(config):
  """σ / (qN): the noise std a server step adds to each weight, per unit of server lr × C."""
  assert config['server_optimizer'] == 'sgd'  # no momentum to amplify it
  return config['dp.noise_multiplier'] / (config['sampling_rate'] * config['num_clients'])


def server_noise_per_weight(run):
  """The std of the noise one server step adds to each weight: server lr × σC / (qN)."""
  config = flat_config(os.path.join(run, 'config.json'))
  return config['server_lr'] * config['dp.clip_norm'] * noise_per_server_lr_and_clip(config)


@pytest.fixture
def config_factory():
  return tiny_config


class Killed(BaseException):
  """A kill mid-run. Not an Exception: like a signal, nothing in the library may swallow it."""


def train_killed_before_checkpoint(monkeypatch, config, workdir: str, kill_round: int,
                                   on_save=None) -> None:
  """Trains `config` in `workdir` and dies (Killed) just before round `kill_round`'s checkpoint is
  written, as a kill would; on_save(workdir, state) sees each save first. Patches are undone."""
  from dp2fedsam_jax import checkpoint, train  # pylint: disable=import-outside-toplevel
  real_save = checkpoint.save

  def save(wd, state, records, *window):
    if on_save is not None:
      on_save(wd, state)
    if int(state.round) == kill_round:
      raise Killed
    real_save(wd, state, records, *window)

  monkeypatch.setattr(checkpoint, 'save', save)
  with pytest.raises(Killed):
    train.train_and_evaluate(config, workdir)
  monkeypatch.undo()


# ---------------------------------------------------------------- the privacy mutants' table

# Node ids of the tests that passed in this session: tests/test_mutants.py counts a failure under a
# mutant as a kill only from a test that passes on the real code (it runs it unpatched otherwise).
PASSED_TESTS = set()
# mutant name -> the test that killed it (None: it survived), filled by tests/test_mutants.py.
MUTANT_TABLE = pytest.StashKey[dict]()
# The mutants that only change accuracy or add noise (tests/test_mutants.py, breaks_privacy=False).
MUTANT_NOT_BREAKS = pytest.StashKey[set]()


def pytest_runtest_logreport(report):
  if report.when == 'call' and report.passed:
    PASSED_TESTS.add(report.nodeid)


def pytest_terminal_summary(terminalreporter, config):
  table = config.stash.get(MUTANT_TABLE, None)
  if not table:
    return
  survived = [name for name, killer in table.items() if killer is None]
  harmless = config.stash.get(MUTANT_NOT_BREAKS, set()) & set(table)
  terminalreporter.section(f'privacy mutants: {len(table) - len(survived)} of {len(table)} killed '
                           f'({len(table) - len(harmless)} break privacy; {len(harmless)}, marked *, '
                           'only change accuracy or add noise)')
  width = max(len(name) for name in table) + 2
  for name, killer in table.items():
    label = name + (' *' if name in harmless else '')
    terminalreporter.write_line(f'{label:<{width}}  {killer or "SURVIVED"}')
