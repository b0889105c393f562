"""Every paper config loads, and every entry of its sweep grid is a valid config, without loading data."""

import glob
import importlib
import json
import math
import os
import re

import pytest
from conftest import numbers_in

from dp2fedsam_jax import config as config_lib
from dp2fedsam_jax.algorithms import METHODS
from experiments import studies
from experiments.configs import _common
from experiments.studies import shakespeare_field as field_study
from launch import fair_benchmark, sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_CONFIG_NAMES = sorted(os.path.basename(p)[:-3]
                          for p in glob.glob(os.path.join(ROOT, 'experiments', 'configs', '*.py'))
                          if not os.path.basename(p).startswith('_'))
# Configs of other binaries than experiments.train: no sweep grid (each tested with its binary).
OTHER_BINARIES = {'audit': 'experiments.audit (tests/test_audit.py)',
                  'audit_default': 'experiments.audit (tests/test_audit.py)',
                  'tune_tiny': 'launch.tune (tests/test_tune.py)',
                  **{fair_benchmark.config_name(path): 'launch.fair_benchmark '
                     '(tests/test_benchmark_blocks.py)' for path in fair_benchmark.BLOCK_CONFIGS.values()}}
CONFIG_NAMES = [n for n in ALL_CONFIG_NAMES if n not in OTHER_BINARIES]

KNOWN_DATASETS = {'fashion_mnist', 'synthetic', 'cifar10', 'cifar100', 'femnist', _common.EMNIST_62,
                  'shakespeare'}
KNOWN_MODELS = {'emnist_cnn', 'cifar_cnn', 'mlp', 'resnet18_gn', 'resnet20', 'char_lstm_small',
                'char_lstm'}

# Runs per table, as each config's docstring states them.
GRID_SIZES = {'default': 12, 'dp2fedsam_table2': 72, 'dp2fedsam_table3': 72, 'dp2fedsam_fig1': 12,
              'dp2fedsam_fig5': 6, 'dp2fedsam_fig6': 12, 'dp2fedsam_fig7': 15, 'topk_table1': 189,
              'topk_table2': 168, 'topk_table3': 36, 'topk_fig5': 45, 'pfeddsu_table2': 120,
              'pfeddsu_table3': 45, 'pfeddsu_table4': 27, 'pfeddsu_table5': 21,
              'pfeddsu_table6': 24, 'pfeddsu_table7': 21, 'fashion_mnist_methods': 31,
              'fmnist_paper_regime': 93, 'shakespeare': 30, 'fmnist_bandmf_regime': 12,
              'shakespeare_field': 42, 'fair2_pilot': 7, 'fair2_edge': 30, 'fair2_rank': 10}


def _module(name):
  return importlib.import_module(f'experiments.configs.{name}')


@pytest.fixture(autouse=True)
def _shakespeare_field_protocol_decided(monkeypatch):
  """The whole shakespeare_field grid (its privacy block waits for PROTOCOL_DECIDED and
  PRIVATE_POINT in the file)."""
  monkeypatch.setattr(_module('shakespeare_field'), 'PROTOCOL_DECIDED', True)
  monkeypatch.setattr(_module('shakespeare_field'), 'PRIVATE_POINT',
                      {'server_lr': 0.3, 'local.lr_shared': 1.5})


def test_shakespeare_field_privacy_block_waits_for_the_protocol_decision(monkeypatch):
  module = _module('shakespeare_field')
  monkeypatch.setattr(module, 'PROTOCOL_DECIDED', False)
  grid = module.sweep_grid()
  assert grid == module.protocol_grid() and len(grid) == 18
  with pytest.raises(ValueError, match='PROTOCOL_DECIDED'):
    module.get_config('method=dp2fedsam,eps=2')
  assert module.get_config('method=fedrep,personal_epochs=10').method == 'fedrep'
  monkeypatch.setattr(module, 'PROTOCOL_DECIDED', True)
  monkeypatch.setattr(module, 'PRIVATE_POINT', None)  # no lrs for the private runs yet
  assert module.sweep_grid() == module.protocol_grid()
  with pytest.raises(ValueError, match='PRIVATE_POINT'):
    module.get_config('method=dp_fedavg,eps=8')
  # The private tuning's trials are built: each sets both lrs itself (tests of the study below).
  assert module.get_config('method=dp_fedavg,eps=2,tuning=true').dp.target_epsilon == 2


def _validate(config):
  config_lib.validate_config(config, set(METHODS))
  assert config.dataset in KNOWN_DATASETS, config.dataset
  assert config.model in KNOWN_MODELS, config.model


def test_every_config_file_is_listed():
  assert set(ALL_CONFIG_NAMES) == set(GRID_SIZES) | set(OTHER_BINARIES)
  assert not set(GRID_SIZES) & set(OTHER_BINARIES)


@pytest.mark.parametrize('name', CONFIG_NAMES)
def test_config_loads_with_default_arg_and_its_grid_validates(name):
  module = _module(name)
  _validate(module.get_config(None))
  assert module.__doc__ and 'Grid' in module.__doc__ or name == 'default'
  entries = module.sweep_grid()
  assert len(entries) == GRID_SIZES[name]
  assert len({sweep.arg_string(e) for e in entries}) == len(entries), 'duplicate grid entries'
  for entry in entries:
    config = module.get_config(sweep.arg_string(entry))  # the exact text the sweep passes
    _validate(config)
    assert config.method == entry['method'] and config.seed == entry['seed']
    if 'eps' in entry and math.isfinite(entry['eps']):
      assert config.dp.target_epsilon == entry['eps'] and config.dp.noise_multiplier is None
    if config.method in METHODS and METHODS[config.method].private:
      assert config.dp.noise_multiplier is not None or config.dp.target_epsilon is not None


def test_grid_methods_are_registered_or_pending():
  for name in CONFIG_NAMES:
    for entry in _module(name).sweep_grid():
      assert entry['method'] in set(METHODS), (name, entry)


# One-seed surveys: every method at seed 0 (fmnist_paper_regime: seeds 1 and 2 for its SEEDED ones).
SURVEYS = ('fashion_mnist_methods', 'fmnist_paper_regime', 'fair2_pilot', 'fair2_edge',
           'fair2_rank')


def _seeds_per_setting(name):
  settings = {}
  for entry in _module(name).sweep_grid():
    rest = sweep.arg_string({k: v for k, v in entry.items() if k != 'seed'})
    settings.setdefault(rest, set()).add(entry['seed'])
  return settings


def test_grids_have_three_seeds_per_setting():
  for name in set(CONFIG_NAMES) - set(SURVEYS):
    assert all(seeds == {0, 1, 2} for seeds in _seeds_per_setting(name).values()), name


def test_paper_regime_has_three_seeds_per_private_method_and_eps():
  module = _module('fmnist_paper_regime')
  for setting, seeds in _seeds_per_setting('fmnist_paper_regime').items():
    method = re.search(r'method=(\w+)', setting).group(1)
    eps = float(re.search(r'eps=([\w.]+)', setting).group(1))
    assert seeds == ({0} if math.isinf(eps) else {0, 1, 2}), setting
    if 'noise=banded' in setting:
      assert method in module.BANDED and eps in module.BANDED_EPS and 'bands=2' in setting, setting
    elif eps != 1 and not math.isinf(eps):
      assert method in module.CURVE and eps in module.CURVE_EPS, setting
  curve = {(e['method'], e['eps']) for e in module.sweep_grid() if math.isfinite(e['eps'])}
  assert curve >= {(m, e) for m in module.CURVE for e in (0.25, 0.5, 1.0, 2.0)}


# The paper-regime runs committed first, in the order they ran: their workdirs hold committed runs.
ISSUE14 = ([f'eps=1,method={m},seed=0' for m in ('dp2fedsam', 'centaur', 'dp_fedavg', 'dp_fedsam',
                                                 'dp_fedavg_ft', 'dp_fedsam_ft')]
           + ['eps=inf,method=p_fedsam,seed=0', 'eps=inf,method=fedavg,seed=0']
           + [f'eps=1,method={m},seed={s}' for s in (1, 2)
              for m in ('dp2fedsam', 'centaur', 'dp_fedsam_ft')]
           + ['eps=inf,method=dp_fedavg,seed=0'])


def test_paper_regime_grid_keeps_its_first_runs_then_issues_26_and_24_in_priority_order():
  grid = _module('fmnist_paper_regime').sweep_grid()
  names = [sweep.arg_string(e) for e in grid]
  assert names[:15] == ISSUE14
  # (a) the missing eps = 1 seeds; then the curve's eps at seed 0, 1, 2 ((b), (c), (d)).
  assert names[15:21] == [f'eps=1,method={m},seed={s}' for s in (1, 2)
                          for m in ('dp_fedavg', 'dp_fedsam', 'dp_fedavg_ft')]
  # (e) BandMF against independent noise: eps = 1's three seeds first (their
  # independent-noise runs are done), then eps = 0.5 seed by seed, banded beside independent.
  banded = grid[21:39]
  assert [(e['eps'], e['seed']) for e in banded[:6]] == [(1.0, s) for s in (0, 0, 1, 1, 2, 2)]
  assert [(e['eps'], e['seed'], e.get('noise')) for e in banded[6:]] == [
      (0.5, s, noise) for s in (0, 1, 2) for noise in ('banded',) * 2 + (None,) * 2]
  assert all(e['noise'] == 'banded' and e['bands'] == 2 for e in banded if 'noise' in e)
  assert {e['method'] for e in banded} == {'dp2fedsam', 'dp_fedavg_ft'}
  independent = {(e['method'], e['eps'], e['seed']) for e in grid if 'noise' not in e}
  assert {(e['method'], e['eps'], e['seed']) for e in banded} <= independent
  # (b), (c), (d): the curve at seed 0, 1, 2, less the runs (e) made; no run twice.
  rest = grid[39:69]
  assert [e['seed'] for e in rest] == [0] * 10 + [1] * 10 + [2] * 10
  assert len({sweep.arg_string(e) for e in grid}) == len(grid) == 93
  assert all(e['eps'] in (0.25, 0.5, 2.0) for e in rest)
  # (f) adaptive clipping and server momentum, seed by seed, each beside a fixed-C,
  # server-SGD run of the same method, eps and seed among (a)-(d)'s.
  toolkit = grid[69:]
  assert [e['seed'] for e in toolkit] == [0] * 8 + [1] * 8 + [2] * 8
  assert all(('clip' in e) != ('server' in e) for e in toolkit)
  plain = {(e['method'], e['eps'], e['seed']) for e in grid[:69] if 'noise' not in e}
  assert {(e['method'], e['eps'], e['seed']) for e in toolkit} <= plain


def test_paper_regime_toolkit_variants():
  module = _module('fmnist_paper_regime')
  adaptive = module.get_config('method=dp2fedsam,eps=0.25,clip=adaptive')
  assert (adaptive.dp.clipping, adaptive.dp.initial_clip_norm) == ('adaptive', 1.0)
  assert adaptive.dp.count_noise_multiplier == pytest.approx(1.2 * 5.924, abs=1e-3)
  momentum = module.get_config('method=dp_fedavg_ft,eps=1,server=momentum')
  assert (momentum.server_optimizer, momentum.server_lr, momentum.dp.clipping) == ('momentum', 0.1,
                                                                                   'fixed')
  with pytest.raises(ValueError, match='clip is fixed | adaptive'):
    module.get_config('clip=quantile')


@pytest.mark.parametrize('eps', [1.0, 0.25])
def test_paper_regime_fixed_clip_sigmas_are_the_accountants(eps):
  from dp2fedsam_jax.privacy import accounting
  module = _module('fmnist_paper_regime')
  c = module.get_config(f'eps={eps}')
  sigma = accounting.calibrate_noise_multiplier(eps, c.sampling_rate, c.num_rounds, 1 / c.num_clients,
                                                accountant='pld')
  assert sigma == pytest.approx(module.FIXED_CLIP_SIGMA[eps], abs=2e-3)


def test_paper_regime_committed_runs_seed_a_fresh_root(tmp_path):
  """The committed runs' workdirs are grid workdirs: --seed_from makes them count as finished."""
  config = os.path.join(ROOT, 'experiments', 'configs', 'fmnist_paper_regime.py')
  committed = os.path.join(ROOT, 'experiments', 'results', 'fmnist_paper_regime', 'runs')
  found = sorted(os.path.relpath(d, committed) for d, _, files in os.walk(committed)
                 if 'metrics.jsonl' in files)
  root = str(tmp_path)
  runs = sweep.plan(config, root, [], [])
  seeded = sweep.seed_from(runs, root, committed)
  assert sorted(os.path.relpath(w, os.path.join(root, 'fmnist_paper_regime'))
                for w, _ in seeded) == found and len(found) >= 14
  runs = sweep.plan(config, root, [], [])
  assert sweep.plan_summary(runs).startswith(f'93 runs: {len(found)} finished')
  assert sweep.seed_from(runs, root, committed) == []  # never twice, never over a workdir


def test_paper_regime_ceilings_have_no_noise_and_its_private_one_keeps_clipping():
  module = _module('fmnist_paper_regime')
  clip_only = module.get_config('method=dp_fedavg,eps=inf')
  assert clip_only.dp.noise_multiplier == 0.0 and clip_only.dp.target_epsilon is None
  assert clip_only.dp.clip_norm == module.get_config('method=dp_fedavg').dp.clip_norm
  fedavg = module.get_config('method=fedavg,eps=inf')  # non-private: its dp fields stay unset
  assert fedavg.dp.noise_multiplier is None and fedavg.dp.target_epsilon is None


def test_paper_values_dp2fedsam():
  from experiments.configs import dp2fedsam_table2
  c = dp2fedsam_table2.get_config('method=centaur,dataset=cifar10,N=500,S=5,eps=1,seed=2')
  assert (c.num_clients, c.classes_per_client, c.partition, c.model) == (500, 5, 'pathological',
                                                                        'cifar_cnn')
  assert (c.num_rounds, c.sampling_rate, c.dp.clip_norm, c.local.sam_rho) == (200, 0.05, 0.1, 0.1)
  assert (c.local.lr_shared, c.local.lr_personal, c.local.lr_decay, c.local.momentum) == (0.1, 0.005,
                                                                                    0.99, 0.7)
  assert (c.local.personal_epochs, c.local.shared_epochs, c.seed, c.dp.delta) == (2, 2, 2, None)
  f = dp2fedsam_table2.get_config('dataset=femnist')
  assert (f.dataset, f.partition, f.model, f.num_clients) == ('femnist', 'natural', 'resnet18_gn', 500)
  assert (f.local.momentum, f.dp.clip_norm, f.local.sam_rho) == (0.3, 0.2, 0.5)


def test_paper_values_topk_and_pfeddsu():
  from experiments.configs import pfeddsu_table2, topk_table1, topk_table2
  c = topk_table1.get_config('method=dp_fedavg,dataset=emnist,alpha=0.3')
  assert (c.dataset, c.model, c.local.batch_size, c.num_rounds) == (_common.EMNIST_62, 'emnist_cnn',
                                                                    32, 200)
  assert (c.partition, c.dirichlet_alpha, c.num_clients, c.sampling_rate) == ('dirichlet', 0.3, 500, 0.1)
  assert (c.dp.noise_multiplier, c.dp.target_epsilon, c.dp.clip_norm) == (0.95, None, 0.2)
  assert (c.local.shared_epochs, c.local.momentum, c.local.sam_rho) == (30, 0.5, 0.5)
  assert topk_table1.get_config('alpha=inf').partition == 'iid'
  t2 = topk_table2.get_config('dataset=cifar100,eps=8')
  assert (t2.model, t2.num_rounds, t2.dp.target_epsilon, t2.dp.noise_multiplier) == (
      'resnet18_gn', 300, 8.0, None)
  p = pfeddsu_table2.get_config('dataset=cifar100,s=3,method=ppsgd')
  assert (p.model, p.num_clients, p.num_rounds, p.classes_per_client) == ('resnet20', 100, 100, 3)
  assert (p.dp.clip_norm, p.local.personal_epochs, p.local.shared_epochs, p.local.lr_shared) == (
      0.01, 15, 5, 0.01)


def test_unknown_config_argument_fails():
  from experiments.configs import dp2fedsam_table2
  with pytest.raises(ValueError, match='unknown config argument'):
    dp2fedsam_table2.get_config('epsilon=1')


@pytest.mark.parametrize('name', ALL_CONFIG_NAMES)
def test_every_config_file_parses_its_argument_strictly(name):
  # default.py and fashion_mnist_methods.py once ignored unknown keys: 'eps2=1' ran eps=2.
  module = _module(name)
  for bad in ('eps2=1', 'seed=1,seed=2', 'seed', 'seed=one'):
    with pytest.raises(ValueError, match='config argument'):
      module.get_config(bad)


def test_default_config_arguments_are_typed():
  from experiments.configs import default, fashion_mnist_methods
  c = default.get_config('eps=1,seed=3,method=centaur')
  assert (c.dp.target_epsilon, c.seed, c.method) == (1.0, 3, 'centaur')
  assert isinstance(c.dp.target_epsilon, float) and isinstance(c.seed, int)
  f = fashion_mnist_methods.get_config('q=0.02,rounds=4,eps=1')
  assert (f.sampling_rate, f.num_rounds, f.dp.target_epsilon) == (0.02, 4, 1.0)


def test_parse_args_is_strict():
  defaults = dict(flag=False, n=1, x=0.5, name='a')
  assert _common.parse_args(None, **defaults) == defaults
  assert _common.parse_args('flag=yes,n=3,x=inf,name=b,', **defaults) == dict(
      flag=True, n=3, x=float('inf'), name='b')
  assert _common.parse_args('flag=False', **defaults)['flag'] is False
  for bad, message in (('flag=maybe', 'is a bool'), ('n=1.5', "is 'int'"), ('x=big', "is 'float'"),
                       ('n=1,n=2', 'given twice'), ('m=1', 'unknown config argument'),
                       ('n', 'not key=value')):
    with pytest.raises(ValueError, match=message):
      _common.parse_args(bad, **defaults)


def test_choice_lists_are_defined_once_by_their_implementations():
  import jax
  import numpy as np

  from dp2fedsam_jax import executors
  from dp2fedsam_jax.data import partition as partition_fn
  from dp2fedsam_jax.data.partition import PARTITIONS
  from dp2fedsam_jax.models import layers
  from dp2fedsam_jax.privacy import accounting, noise, sampling
  allowed = config_lib.choices()
  assert allowed['executor'] is executors.NAMES
  assert allowed['dp.sampling'] is sampling.SAMPLINGS
  assert allowed['dp.accountant'] is accounting.ACCOUNTANTS
  assert allowed['dp.noise_placement'] is noise.NOISE_PLACEMENTS
  assert allowed['conv_impl'] is layers.CONV_IMPLS
  assert allowed['partition'] == tuple(PARTITIONS.names())
  assert set(allowed['method']) == set(METHODS)
  # Every value the config accepts is one its implementation runs (config.py once kept
  # its own copies; its PARTITIONS already disagreed with data/partition.py's).
  for executor in allowed['executor']:
    assert executors.from_name(executor).name in allowed['executor']
  for kind in allowed['dp.sampling']:
    assert sampling.sample_cohort(jax.random.key(0), kind, 0.5, 4).shape == (4,)
  for accountant in allowed['dp.accountant']:
    assert accounting.compute_epsilon(1.0, 0.5, 1, 1e-3, accountant=accountant, num_clients=4) > 0
  for impl in allowed['conv_impl']:
    assert layers.resolve_conv_impl(impl) in ('xla', 'im2col')
  labels = np.repeat(np.arange(4, dtype=np.int32), 8)
  for kind in PARTITIONS:
    if PARTITIONS[kind].needs_writers:  # 'natural' splits by writer: tests/test_femnist.py
      continue
    parts = partition_fn(labels, 4, kind, rng=np.random.default_rng(0))
    assert sum(len(p) for p in parts) == len(labels)


def test_shakespeare_config_matches_its_dataset_and_plan():
  from dp2fedsam_jax.data import shakespeare
  from experiments.configs import shakespeare as config_module
  c = config_module.get_config('method=dp_fedavg,eps=8,seed=1')
  assert (c.dataset, c.model, c.partition, c.num_clients) == ('shakespeare', 'char_lstm_small', 'natural',
                                                              1063)
  assert c.dp.target_epsilon == 8.0 and c.dp.noise_multiplier is None
  assert round(c.sampling_rate * c.num_clients) == 20
  fedavg = config_module.get_config('method=fedavg,eps=inf')
  assert fedavg.dp.target_epsilon is None and fedavg.dp.noise_multiplier is None
  assert (shakespeare.NUM_CLASSES, shakespeare.SEQUENCE_LENGTH) == (90, 80)
  grid = config_module.sweep_grid()
  assert [e['seed'] for e in grid] == [0] * 10 + [1] * 10 + [2] * 10
  assert {(e['method'], e['eps']) for e in grid} == (
      {(m, e) for m in config_module.PRIVATE for e in (2.0, 8.0)}
      | {(m, math.inf) for m in config_module.CEILINGS})


def test_bandmf_regime_pairs_each_banded_run_with_an_independent_one_under_momentum():
  module = _module('fmnist_bandmf_regime')
  grid = module.sweep_grid()
  assert [e['seed'] for e in grid] == [0] * 4 + [1] * 4 + [2] * 4
  banded = [e for e in grid if e.get('noise') == 'banded']
  assert {(e['method'], e['seed']) for e in banded} == {
      (e['method'], e['seed']) for e in grid if 'noise' not in e}
  c = module.get_config('method=dp_fedavg_ft,noise=banded')
  assert (c.num_rounds, c.sampling_rate, c.dp.noise_mechanism, c.dp.num_bands) == (
      1000, 0.01, 'banded', 10)
  assert (c.server_optimizer, c.server_momentum, c.server_lr) == ('momentum', 0.9, 0.1)
  # The paper regime's lr decay over 200 rounds, spread over 1000; everything else is the paper's.
  assert c.local.lr_decay ** 1000 == pytest.approx(0.99 ** 200)
  paper = _module('fmnist_paper_regime').get_config('method=dp_fedavg_ft')
  assert (c.dp.clip_norm, c.local.lr_shared, c.model, c.num_clients) == (
      paper.dp.clip_norm, paper.local.lr_shared, paper.model, paper.num_clients)
  with pytest.raises(ValueError, match='independent | banded'):
    module.get_config('noise=tree')


def test_shakespeare_field_protocol_is_what_its_rule_makes_of_the_committed_runs(monkeypatch):
  """PROTOCOL, PROTOCOL_DECIDED and the verdict in the study module's docstring follow from the
  committed protocol runs by its rule (b): a hand edit that disagrees with the runs fails here."""
  module = _module('shakespeare_field')
  monkeypatch.undo()  # the file's own PROTOCOL_DECIDED, not the fixture's
  decision = field_study.protocol_decision(
      os.path.join(ROOT, 'experiments', 'results', 'shakespeare_field', 'runs'))
  label, d, s = decision['rows']['fedrep', 10]
  assert (label, decision['verdict']) == ('hurts', 'hurts')
  assert {f'{100 * d:.2f}', f'{100 * s:.2f}'} <= set(numbers_in(field_study.__doc__))
  assert '*hurts*' in field_study.__doc__
  assert module.PROTOCOL_DECIDED == (decision['personal_epochs'] is not None)
  if module.PROTOCOL_DECIDED:
    assert module.PROTOCOL['personal_epochs'] == decision['personal_epochs']


def test_shakespeare_field_privacy_verdict_is_what_its_rule_makes_of_the_committed_runs():
  """The verdict at each eps that the study module's docstring, README and experiments/results state
  follows from the committed privacy runs by its rule (c)."""
  verdict = field_study.privacy_decision(
      os.path.join(ROOT, 'experiments', 'results', 'shakespeare_field', 'runs'))
  for eps in (2.0, 8.0):
    at = verdict[eps]
    assert at['order'] == 'contradicted' and all(at['binds'].values())
    assert {m: v[0] for m, v in at['against'].items()} == {
        'centaur': 'level', 'dp_fedavg': 'hurts', 'dp_fedavg_ft': 'hurts'}
    for _, d, _ in at['against'].values():
      assert f'{100 * d:.2f}' in numbers_in(field_study.__doc__)
    assert all(v[0] == 'helps' for v in at['against_local_only'].values())
    assert f'Verdict at eps {eps:g}' in field_study.__doc__


def _privacy_runs(root, pooled: dict, clipped: dict):
  """Synthetic shakespeare_field workdirs, 3 seeds each: pooled[(method, eps)] the plain run's pooled
  accuracy (its ADAPT re-evaluation: 1 point more), clipped[(method, eps)] its clipped fraction."""
  from experiments.configs import shakespeare_field as sf
  for (method, eps), accuracy in pooled.items():
    for seed, jitter in enumerate((-0.001, 0.0, 0.001)):
      args = {'method': method, 'seed': seed, **({} if eps is None else {'eps': eps})}
      workdir = os.path.join(root, 'shakespeare_field', method,
                             'default' if eps is None else f'eps={eps:g}', f'seed={seed}')
      os.makedirs(workdir)
      epsilon = 0.0 if eps is None else eps
      files = {
          'config.json': [{'method': method, 'seed': seed, 'num_rounds': 2}],
          'sweep.json': [{'config_name': 'shakespeare_field', 'args': args}],
          'metrics.jsonl': [{'round': 2, 'test_accuracy': accuracy + jitter, 'epsilon': epsilon,
                             'test_accuracy_pooled': accuracy + jitter, 'seconds': 1.0}],
          'train_metrics.jsonl': [{'round': r, 'clipped_fraction': clipped.get((method, eps), 0.0),
                                   'mean_update_norm': 1.0} for r in (1, 2)]}
      if method in sf.REEVALUATIONS:
        files['evaluations.jsonl'] = [{
            'round': 2, **sf.ADAPT, 'eval.adapt_part': sf.REEVALUATIONS[method][0],
            'eval.head_init': 'own', 'eval_clients': None, 'epsilon': epsilon,
            'test_accuracy': accuracy + jitter + 0.01,
            'test_accuracy_pooled': accuracy + jitter + 0.01}]
      for name, lines in files.items():
        with open(os.path.join(workdir, name), 'w') as f:
          f.write('\n'.join(json.dumps(x) for x in lines) + '\n')


def test_shakespeare_field_privacy_verdict_follows_its_declared_rule(tmp_path):
  """Docstring (c): DP2-FedSAM against each other private method at each eps by rule_label on the
  re-evaluated rows; a side whose clip does not bind voids its pair; every private row against
  local_only."""
  accuracy = {('local_only', None): 0.32,
              ('dp2fedsam', 2.0): 0.40, ('centaur', 2.0): 0.395, ('dp_fedavg_ft', 2.0): 0.45,
              ('dp_fedavg', 2.0): 0.25,
              ('dp2fedsam', 8.0): 0.50, ('centaur', 8.0): 0.45, ('dp_fedavg_ft', 8.0): 0.44,
              ('dp_fedavg', 8.0): 0.40}
  binding = {k: 0.6 for k in accuracy if k[0] != 'local_only'}
  _privacy_runs(str(tmp_path / 'a'), accuracy, binding)
  got = field_study.privacy_decision(str(tmp_path / 'a'))
  labels = lambda eps, key: {m: v[0] for m, v in got[eps][key].items()}
  assert labels(2.0, 'against') == {'centaur': 'level', 'dp_fedavg_ft': 'hurts', 'dp_fedavg': 'helps'}
  assert got[2.0]['order'] == 'contradicted'
  assert got[2.0]['against']['dp_fedavg_ft'][1] == pytest.approx(-0.05)
  assert labels(2.0, 'against_local_only') == {'dp2fedsam': 'helps', 'centaur': 'helps',
                                                'dp_fedavg_ft': 'helps', 'dp_fedavg': 'hurts'}
  assert got[8.0]['order'] == 'holds' and all(got[8.0]['binds'].values())
  _privacy_runs(str(tmp_path / 'b'), accuracy, {**binding, ('dp_fedavg_ft', 8.0): 0.04})
  got = field_study.privacy_decision(str(tmp_path / 'b'))
  assert got[8.0]['against']['dp_fedavg_ft'][0] == 'void' and got[8.0]['order'] == 'void'
  assert not got[8.0]['binds']['dp_fedavg_ft'] and got[2.0]['order'] == 'contradicted'
  only_local = field_study.privacy_decision(str(tmp_path / 'a' / 'shakespeare_field' / 'local_only'))
  assert only_local[2.0]['order'] == 'undecided'


def test_shakespeare_field_reads_one_operating_point(monkeypatch):
  """Every federated run of the grid takes OPERATING_POINT's values; a change there reaches them all."""
  module = _module('shakespeare_field')
  monkeypatch.setattr(module, 'OPERATING_POINT', {**module.OPERATING_POINT, 'num_rounds': 7,
                                                  'local.lr_shared': 0.25, 'cohort': 50})
  for entry in module.sweep_grid():
    c = module.get_config(sweep.arg_string(entry))
    if c.method == 'local_only':
      assert c.num_rounds == module.LOCAL_ONLY_VISITS and c.eval.adapt_epochs == 0
      continue
    lrs = ((module.PRIVATE_POINT['server_lr'], module.PRIVATE_POINT['local.lr_shared'])
           if METHODS[c.method].private else (1.0, 0.25))
    assert (c.num_rounds, c.server_lr, c.local.lr_shared, round(c.sampling_rate * c.num_clients)) == (
        7, *lrs, 50)
    assert c.validation_fraction == 0 and c.model == 'char_lstm_small'
    assert c.local.personal_epochs == entry.get('personal_epochs', module.PROTOCOL['personal_epochs'])


def test_shakespeare_field_privacy_block_clips_every_method_at_one_fixed_c():
  module = _module('shakespeare_field')
  grid = module.sweep_grid()
  protocol, private = grid[:18], grid[18:]
  assert {e['method'] for e in protocol} == set(module.PROTOCOL_METHODS)
  heads = {(e['method'], e.get('personal_epochs')) for e in protocol
           if e['method'] in ('p_fedsam', 'fedrep')}
  assert heads == {(m, h) for m in ('p_fedsam', 'fedrep') for h in (1, 10)}
  assert len({sweep.arg_string(e) for e in protocol}) == 18  # each run once
  # The decision rule's primary pair runs first, at every seed.
  assert [(e['method'], e.get('personal_epochs'), e['seed']) for e in protocol[:6]] == [
      (m, h, s) for s in (0, 1, 2) for m, h in (('fedavg', None), ('fedrep', 10))]
  assert [e['seed'] for e in private] == [0] * 8 + [1] * 8 + [2] * 8
  for entry in private[:8]:
    c = module.get_config(sweep.arg_string(entry))
    # The adaptive clip ran away on Shakespeare (docstring (c)): a fixed C, below the non-private
    # update norms of every method, and no count noise.
    assert (c.dp.clipping, c.dp.clip_norm) == ('fixed', module.PRIVATE_CLIP_NORM) == ('fixed', 0.5)
    assert c.dp.target_epsilon == entry['eps'] and c.dp.count_noise_multiplier is None
    assert c.eval_every == module.PRIVATE_EVAL_EVERY and c.num_rounds % c.eval_every == 0
  assert field_study.fixed_clip_sigma(2.0, round(20 / 1063, 5), 1000) == pytest.approx(1.117, abs=2e-3)
  assert module.get_config('model=char_lstm').model == 'char_lstm'
  with pytest.raises(ValueError, match='model='):
    module.get_config('model=gru')
  for method, parts in module.REEVALUATIONS.items():
    assert method in METHODS and parts


def test_shakespeare_field_plan_costs_come_from_its_study_with_the_configs_defaults(tmp_path):
  """launch.sweep's plan finds the cost model in the study module named like the config (the config
  imports no study: tests/test_layers.py), missing arguments at the config's defaults."""
  assert studies.of_config('shakespeare_field') is field_study
  assert studies.of_config('dp2fedsam_table2') is None
  assert field_study.planned_hours({'method': 'p_fedsam', 'seed': 0}) == pytest.approx(
      field_study.RUN_HOURS['p_fedsam'] + field_study.TEN_HEAD_EPOCHS_HOURS)  # 10 head epochs
  assert field_study.planned_hours({'method': 'fedrep', 'personal_epochs': 1, 'model': 'char_lstm'}) == (
      pytest.approx(field_study.RUN_HOURS['fedrep'] * field_study.LARGE_MODEL_FACTOR))
  path = os.path.join(ROOT, 'experiments', 'configs', 'shakespeare_field.py')
  runs = sweep.plan(path, str(tmp_path), [], [])
  hours = sum(field_study.planned_hours(r.args) for r in runs)
  assert sweep.planned_cost(path, runs) == (
      f'planned cost: ~{hours:.1f} h for the {len(runs)} runs left ({field_study.PLANNED_ON})')


def test_shakespeare_field_tunes_non_private_fedavg_on_a_validation_split(tmp_path):
  from launch import tune
  path = os.path.join(ROOT, 'experiments', 'configs', 'shakespeare_field.py')
  for study in ('fedavg', 'fedavg_char_lstm'):
    module, _, _, spec = tune.load_study(path, study)
    assert spec['private'] is False and spec['selected_by'] == 'validation_accuracy'
    k, candidates = tune.draw_plan(spec)
    assert k >= 8  # the seed draws at least E[K] (K does not depend on the data)
    runs = tune.trial_runs(module, path, spec, candidates, str(tmp_path), [])
    for _, config in runs:
      assert config.method == 'fedavg' and config.validation_fraction == 0.1
      assert config.model == ('char_lstm' if study.endswith('char_lstm') else 'char_lstm_small')


def test_shakespeare_field_tunes_the_private_lrs_on_private_trials_and_counts_it(tmp_path):
  """The privacy block's lrs come from DP-FedAvg trials at eps 2 under the block's clip: each trial
  takes its candidate's lrs (not PRIVATE_POINT's), selects by a noised validation score, and the
  selection's epsilon is counted (launch/tune.py)."""
  from launch import tune
  path = os.path.join(ROOT, 'experiments', 'configs', 'shakespeare_field.py')
  module, _, _, spec = tune.load_study(path, 'dp_fedavg_eps2')
  assert spec['private'] and spec['score_noise'] > 0 and spec['selected_by'] == 'validation_accuracy'
  assert set(spec['space']) == {'server_lr', 'local.lr_shared'}  # PRIVATE_POINT's fields
  k, candidates = tune.draw_plan(spec)
  runs = tune.trial_runs(module, path, spec, candidates, str(tmp_path), [])
  assert len(runs) == k >= 1
  for (_, config), values in zip(runs, candidates):
    assert config.method == 'dp_fedavg' and config.dp.target_epsilon == 2.0
    assert config.dp.clip_norm == module.PRIVATE_CLIP_NORM and config.validation_fraction == 0.1
    assert (config.server_lr, config.local.lr_shared) == (values['server_lr'],
                                                          values['local.lr_shared'])
  cost = tune.privacy_cost(spec, [c for _, c in runs], naive_trials=k)
  assert cost['per_trial_epsilon'] > 2.0 and cost['selection_epsilon'] > cost['per_trial_epsilon']


def test_shakespeare_field_lists_the_reevaluations_a_finished_run_still_needs(tmp_path):
  """pending_reevaluations: a finished run with its state and without its ADAPT record, once per
  part of REEVALUATIONS; never a run still training or one whose state is gone."""
  module = _module('shakespeare_field')

  def run(name, method, last_round, evaluated_parts=(), state=True):
    workdir = tmp_path / name
    (workdir / 'checkpoints').mkdir(parents=True) if state else workdir.mkdir(parents=True)
    (workdir / 'config.json').write_text(json.dumps({'method': method, 'num_rounds': 1000}))
    (workdir / 'metrics.jsonl').write_text(json.dumps({'round': last_round}) + '\n')
    (workdir / 'evaluations.jsonl').write_text(''.join(
        json.dumps({**module.ADAPT, 'eval.adapt_part': p, 'round': 1000}) + '\n'
        for p in evaluated_parts))
    return str(workdir)

  fedavg = run('fedavg', 'fedavg', 1000, evaluated_parts=('head',))
  dp2fedsam = run('dp2fedsam', 'dp2fedsam', 1000)
  run('training', 'centaur', 900)
  run('evaluated', 'dp_fedavg', 1000, evaluated_parts=('head',))
  run('state_gone', 'centaur', 1000, state=False)
  flags = lambda part: [f'--config.eval.adapt_epochs={module.ADAPT["eval.adapt_epochs"]}',
                        f'--config.eval.adapt_lr={module.ADAPT["eval.adapt_lr"]}',
                        f'--config.eval.adapt_part={part}']
  assert field_study.pending_reevaluations(str(tmp_path)) == [(dp2fedsam, flags('auto')),
                                                         (fedavg, flags('full'))]


def test_shakespeare_field_counts_the_private_tuning_in_each_rows_epsilon():
  """A privacy-block row's eps with the tuning that chose its lrs: above the run's own eps, below
  the run and the K trials each counted at its own (PLD) eps."""
  with_tuning = field_study.epsilon_with_tuning(2.0)
  assert 2.0 < with_tuning < 2.0 * (1 + 3)  # K = 3 trials at eps 2 (+ their scores), seed 0
  assert abs(with_tuning - 4.593) < 0.01  # the value README and experiments/results cite


def test_shakespeare_field_private_point_is_the_committed_private_tunings_selection():
  from launch import tune
  path = os.path.join(ROOT, 'experiments', 'configs', 'shakespeare_field.py')
  module, _, _, spec = tune.load_study(path, 'dp_fedavg_eps2')  # the file's own PRIVATE_POINT
  with open(os.path.join(ROOT, 'experiments', 'results', 'shakespeare_field', 'tuning',
                         'dp_fedavg_eps2', 'tuning.json')) as f:
    tuning = json.load(f)
  assert tuning['status'] == 'done' and tuning['private'] is True
  assert tuning['plan']['candidates'] == tune.draw_plan(spec)[1]  # the declared study, as drawn
  assert module.PRIVATE_POINT == tuning['selected_values']
