"""launch/sweep.py on a tiny synthetic config: 2 methods x 2 seeds, skip finished, resume unfinished."""

import json
import os
import subprocess
import sys
import textwrap
import types
import warnings

import pytest

from dp2fedsam_jax import train
from experiments import config_files
from launch import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY_CONFIG = textwrap.dedent('''
    from dp2fedsam_jax.config import base_config

    def get_config(arg=None):
      args = dict(item.split('=', 1) for item in arg.split(',')) if arg else {}
      c = base_config()
      c.method = args.get('method', 'dp2fedsam')
      c.seed = int(args.get('seed', 0))
      c.dataset, c.model, c.partition = 'synthetic', 'mlp', 'iid'
      c.num_clients, c.sampling_rate = 6, 0.5
      c.num_rounds, c.eval_every = 2, 1
      c.local.personal_epochs = c.local.shared_epochs = 1
      c.local.batch_size = 16
      c.dp.clip_norm, c.dp.noise_multiplier = 1.0, 1.0
      return c

    def sweep_grid():
      return [dict(method=m, seed=s) for m in ('dp2fedsam', 'centaur') for s in (0, 1)]
''')


@pytest.fixture
def tiny_config_path(tmp_path):
  path = tmp_path / 'tiny.py'
  path.write_text(TINY_CONFIG)
  return str(path)


def _rounds(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line)['round'] for line in f]


def test_arg_string_and_grid_expansion():
  assert sweep.arg_string({'seed': 0, 'eps': 1.0, 'method': 'centaur', 'alpha': float('inf')}) == \
      'alpha=inf,eps=1,method=centaur,seed=0'
  base = [{'method': 'a', 'seed': 0}, {'method': 'b', 'seed': 0}]
  assert sweep.expand_grid(base, [('seed', [0, 1])]) == [
      {'method': 'a', 'seed': 0}, {'method': 'a', 'seed': 1},
      {'method': 'b', 'seed': 0}, {'method': 'b', 'seed': 1}]
  # Replacing the method in every entry collapses the duplicates.
  assert sweep.expand_grid(base, [('method', ['c'])]) == [{'method': 'c', 'seed': 0}]


def test_finished_runs_are_told_by_metrics_jsonl_and_a_torn_line_is_not_an_error(tmp_path):
  run = sweep.Run({}, str(tmp_path), num_rounds=4, method='dp2fedsam', config_name='tiny')
  assert run.status == 'new'
  (tmp_path / 'train_metrics.jsonl').write_text(
      ''.join(json.dumps({'round': r}) + '\n' for r in (1, 2, 3)))  # every round: not the test
  (tmp_path / 'metrics.jsonl').write_text('{"round": 2, "epsilon": 1.0}\n{"round": 4, "eps')
  assert run.rounds_done == 2 and run.status == 'new'  # no checkpoint: it starts over
  for step in (2, 3):
    (tmp_path / 'checkpoints' / str(step)).mkdir(parents=True)
  assert run.status == 'resume from round 3'  # the checkpoint it restarts from, not round 2
  (tmp_path / 'metrics.jsonl').write_text('{"round": 2}\n{"round": 4}\n')
  assert run.status == 'done'


def test_overrides_are_typed_like_the_field(tiny_config_path):
  module = sweep.load_config_module(tiny_config_path)
  c = sweep.apply_overrides(module.get_config(), ['--config.num_rounds=5', '--config.dp.clip_norm=0.2',
                                                  '--config.dp.target_epsilon=3',
                                                  '--config.method=p_fedsam'])
  assert (c.num_rounds, c.dp.clip_norm, c.dp.target_epsilon, c.method) == (5, 0.2, 3, 'p_fedsam')
  with pytest.raises(ValueError, match='no field'):
    sweep.apply_overrides(module.get_config(), ['--config.num_roundz=5'])


def test_sweep_runs_skips_finished_and_resumes_unfinished(tiny_config_path, tmp_path):
  root = str(tmp_path / 'runs')
  runs = sweep.plan(tiny_config_path, root, [], [])
  workdirs = [r.workdir for r in runs]
  assert [os.path.relpath(w, root) for w in workdirs] == [
      'tiny/dp2fedsam/default/seed=0', 'tiny/dp2fedsam/default/seed=1',
      'tiny/centaur/default/seed=0', 'tiny/centaur/default/seed=1']
  # A run killed after round 1 (same config, it was asked for 1 round).
  half = workdirs[3]
  config = sweep.load_config_module(tiny_config_path).get_config('method=centaur,seed=1')
  config.num_rounds = 1
  train.train_and_evaluate(config, half)
  assert [r.status for r in sweep.plan(tiny_config_path, root, [], [])] == [
      'new', 'new', 'new', 'resume from round 1']

  cache = str(tmp_path / 'jax_cache')  # seeds share compiled programs: half the time per run
  with warnings.catch_warnings(record=True) as caught:  # this process has JAX's threads running
    warnings.simplefilter('always')
    results = sweep.run_sweep(tiny_config_path, root, [], [], parallel=2, cache_dir=cache)
  assert results == {w: 'ran' for w in workdirs}
  assert not [w for w in caught if 'os.fork()' in str(w.message)]  # no Python between fork and exec
  for w in workdirs:
    assert _rounds(w) == [1, 2]
    assert json.load(open(os.path.join(w, 'sweep.json')))['config_name'] == 'tiny'
  with open(os.path.join(half, 'train.log')) as f:
    assert 'Resuming' in f.read()
  with open(os.path.join(workdirs[0], 'train.log')) as f:
    assert 'Resuming' not in f.read()

  sizes = [os.path.getsize(os.path.join(w, 'train.log')) for w in workdirs]
  again = sweep.run_sweep(tiny_config_path, root, [], [], parallel=2, cache_dir=cache)
  assert again == {w: 'skipped (done)' for w in workdirs}
  assert [os.path.getsize(os.path.join(w, 'train.log')) for w in workdirs] == sizes

  # More rounds through an override: every finished run becomes a resume, nothing restarts.
  longer = sweep.plan(tiny_config_path, root, [], ['--config.num_rounds=3'])
  assert [r.status for r in longer] == ['resume from round 2'] * 4
  # Another run in the same workdirs is refused, not skipped as if it were done.
  other = sweep.run_sweep(tiny_config_path, root, [], ['--config.dp.clip_norm=0.5'])
  assert all(s.startswith('failed (conflict (overrides differ') for s in other.values())


def test_binary_plan_passes_overrides_and_axes(tiny_config_path, tmp_path):
  out = subprocess.run(
      [sys.executable, '-m', 'launch.sweep', f'--config={tiny_config_path}', f'--root={tmp_path}',
       '--methods=p_fedsam', '--seeds=3,4', '--grid=eps=1,2', '--config.num_rounds=7', '--plan'],
      cwd=ROOT, capture_output=True, text=True, check=True, timeout=300)
  *lines, total = out.stdout.strip().splitlines()
  assert [l.split()[-1] for l in lines] == [
      os.path.join(str(tmp_path), 'tiny', 'p_fedsam', f'eps={e}', f'seed={s}')
      for s in (3, 4) for e in (1, 2)]
  assert all(l.startswith('new') for l in lines)
  assert total == 'plan: 4 runs: 0 finished, 4 to run (4 new, 0 to resume)'


def test_plan_totals_flags_missing_data_and_rejects_unknown_methods(tiny_config_path, tmp_path):
  root = str(tmp_path / 'runs')
  sweep.run_sweep(tiny_config_path, root, [('method', ['centaur']), ('seed', [0])], [])
  runs = sweep.plan(tiny_config_path, root, [('method', ['centaur', 'fedrep']), ('seed', [0, 1])], [])
  assert sweep.plan_summary(runs) == '4 runs: 1 finished, 3 to run (3 new, 0 to resume)'
  assert all(r.missing_data is None for r in runs)  # synthetic data: always there
  # Fashion-MNIST pointed at an empty directory: every run is flagged, before anything runs.
  empty = tmp_path / 'empty'
  empty.mkdir()
  runs = sweep.plan(tiny_config_path, str(tmp_path / 'other'), [('method', ['centaur']),
                                                                 ('seed', [0, 1])],
                    ['--config.dataset=fashion_mnist', '--config.model=mlp',
                     f'--config.data_dir={empty}'])
  assert all(r.missing_data.startswith(f'fashion_mnist: no IDX files in {empty}') for r in runs)
  assert sweep.plan_summary(runs).endswith(
      f'; 2 without their data here: fashion_mnist: no IDX files in {empty} (sudo apt-get install '
      'dataset-fashion-mnist, or --config.data_dir=DIR)')
  # An unknown method (or any invalid field) fails at plan time, naming the run.
  with pytest.raises(ValueError, match=r"tiny run method=dp_fedsma,seed=0: config.method='dp_fedsma'"):
    sweep.plan(tiny_config_path, root, [('method', ['dp_fedsma'])], [])
  with pytest.raises(ValueError, match=r"--methods: unknown method 'dp_fedsma'; did you mean dp_fedsam\?"):
    sweep._check_methods(['centaur', 'dp_fedsma'])
  with pytest.raises(ValueError, match=r"the config has no field 'dp.clip_nrom'; did you mean "
                                       r"--config.dp.clip_norm\?"):
    sweep.plan(tiny_config_path, root, [], ['--config.dp.clip_nrom=1'])


def test_only_filters_the_config_grid(tmp_path):
  config = os.path.join(ROOT, 'experiments', 'configs', 'dp2fedsam_table2.py')
  runs = sweep.plan(config, str(tmp_path), [('method', ['centaur']), ('seed', [0])], [],
                    only=['dataset=cifar10', 'N=1000'])
  assert sorted(sweep.arg_string(r.args) for r in runs) == [
      'N=1000,S=2,dataset=cifar10,eps=1,method=centaur,seed=0',
      'N=1000,S=5,dataset=cifar10,eps=1,method=centaur,seed=0']
  with pytest.raises(ValueError, match='no grid entry'):
    sweep.plan(config, str(tmp_path), [], [], only=['dataset=mnist'])
  # Several values of one key keep each (a grid's methods without the product of --methods).
  runs = sweep.plan(config, str(tmp_path), [('seed', [0])], [],
                    only=['dataset=cifar10', 'N=1000', 'S=2', 'method=centaur,dp2fedsam'])
  assert sorted(r.args['method'] for r in runs) == ['centaur', 'dp2fedsam']


class _FinishedProcess:
  """A run that finishes at once: writes the metrics of its last round into its workdir."""

  def __init__(self, command, **_):
    workdir = next(a for a in command if a.startswith('--workdir='))[len('--workdir='):]
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write(json.dumps({'round': 2}) + '\n')
    self.returncode = 0

  def poll(self):
    return 0


def test_runs_start_in_grid_order(tiny_config_path, tmp_path, monkeypatch):
  """A config lists its most wanted runs first: an interrupted sweep must have done those."""
  root = str(tmp_path / 'runs')
  started = []
  monkeypatch.setattr(sweep.subprocess, 'Popen',
                      lambda command, **kw: (started.append(command[-1]),
                                             _FinishedProcess(command))[1])
  monkeypatch.setattr(sweep.time, 'sleep', lambda _: None)
  order = [r.workdir for r in sweep.plan(tiny_config_path, root, [], [])]
  results = sweep.run_sweep(tiny_config_path, root, [], [], parallel=2)
  assert started == [f'--workdir={w}' for w in order] and set(results.values()) == {'ran'}


def test_a_diverged_run_is_final_and_a_run_failed_otherwise_runs_again(tiny_config_path, tmp_path,
                                                                        monkeypatch):
  """A run whose release turned NaN/Inf is not rerun by a later sweep (a rerun repeats it; one that
  did not would be a retry until success); a run that failed for another reason is."""
  root = str(tmp_path / 'runs')
  order = [r.workdir for r in sweep.plan(tiny_config_path, root, [], [])]
  for workdir, error in ((order[0], 'FloatingPointError'), (order[1], 'OSError')):
    os.makedirs(workdir)
    with open(os.path.join(workdir, 'failure.json'), 'w') as f:
      json.dump({'error': error, 'message': '...', 'round': 7}, f)
  assert [r.status for r in sweep.plan(tiny_config_path, root, [], [])][:2] == [sweep.DIVERGED, 'new']
  started = []
  monkeypatch.setattr(sweep.subprocess, 'Popen',
                      lambda command, **kw: (started.append(command[-1]),
                                             _FinishedProcess(command))[1])
  monkeypatch.setattr(sweep.time, 'sleep', lambda _: None)
  results = sweep.run_sweep(tiny_config_path, root, [], [], parallel=1)
  assert started == [f'--workdir={w}' for w in order[1:]]
  assert results[order[0]] == 'failed (diverged at round 7; not run again)'
  after = sweep.plan(tiny_config_path, root, [], [])
  assert after[0].status == sweep.DIVERGED  # still final, and counted as finished
  finished = sum(r.status == 'done' for r in after) + 1
  assert sweep.plan_summary(after).startswith(f'{len(order)} runs: {finished} finished')


def test_a_run_finished_elsewhere_after_the_plan_is_not_started_again(tiny_config_path, tmp_path,
                                                                      monkeypatch):
  """A run whose finished metrics arrive while the sweep works through its list (copied in from
  another machine, or run by another sweep) is skipped: it has no checkpoint, and train.py would
  train it again from scratch over its metrics."""
  root = str(tmp_path / 'runs')
  order = [r.workdir for r in sweep.plan(tiny_config_path, root, [], [])]
  started = []

  def popen(command, **kw):
    started.append(command[-1])
    if len(started) == 1:  # while the first run trains, the third one's results are copied in
      os.makedirs(order[2])
      with open(os.path.join(order[2], 'metrics.jsonl'), 'w') as f:
        f.write(json.dumps({'round': 2, 'from': 'elsewhere'}) + '\n')
    return _FinishedProcess(command)

  monkeypatch.setattr(sweep.subprocess, 'Popen', popen)
  monkeypatch.setattr(sweep.time, 'sleep', lambda _: None)
  results = sweep.run_sweep(tiny_config_path, root, [], [], parallel=1)
  assert started == [f'--workdir={w}' for w in order if w != order[2]]
  assert results[order[2]] == 'skipped (done)'
  with open(os.path.join(order[2], 'metrics.jsonl')) as f:
    assert json.loads(f.read())['from'] == 'elsewhere'


def test_seed_from_copies_finished_committed_runs_into_empty_workdirs_only(tiny_config_path,
                                                                           tmp_path):
  committed, root = tmp_path / 'committed', str(tmp_path / 'root')
  runs = sweep.plan(tiny_config_path, root, [], [])  # dp2fedsam seeds 0, 1; centaur seeds 0, 1

  def commit(run, rounds, args=None, failed=False):
    path = committed / os.path.relpath(run.workdir, os.path.join(root, 'tiny'))
    path.mkdir(parents=True)
    (path / 'sweep.json').write_text(json.dumps({'args': args or run.args, 'overrides': []}))
    (path / 'config.json').write_text('{}')
    (path / 'metrics.jsonl').write_text(''.join(json.dumps({'round': r}) + '\n' for r in rounds))
    if failed:
      (path / 'failure.json').write_text('{}')

  commit(runs[0], [1, 2])                                  # finished: copied
  commit(runs[1], [1])                                     # unfinished (no checkpoint): not
  commit(runs[2], [1, 2], args={**runs[2].args, 'seed': 9})  # another run's files: not
  commit(runs[3], [1, 2])                                  # finished, but its workdir is in use
  os.makedirs(os.path.join(runs[3].workdir, 'checkpoints'))
  seeded = sweep.seed_from(runs, root, str(committed))
  assert [w for w, _ in seeded] == [runs[0].workdir]
  assert sorted(os.listdir(runs[0].workdir)) == ['config.json', 'metrics.jsonl', 'sweep.json']
  assert [r.status for r in sweep.plan(tiny_config_path, root, [], [])] == [
      'done', 'new', 'new', 'new']
  # The binary: --seed_from with --plan reports the copies, and the seeded run as finished.
  out = subprocess.run(
      [sys.executable, '-m', 'launch.sweep', f'--config={tiny_config_path}',
       f'--root={tmp_path / "fresh"}', f'--seed_from={committed}', '--plan'],
      cwd=ROOT, capture_output=True, text=True, check=True, timeout=300)
  assert out.stderr.count('seeded  ') == 2  # runs[0] and runs[3] (its fresh workdir is empty)
  assert out.stdout.strip().splitlines()[-1] == 'plan: 4 runs: 2 finished, 2 to run (2 new, 0 to resume)'
  with pytest.raises(ValueError, match='no such directory'):
    sweep.seed_from(runs, root, str(tmp_path / 'nowhere'))


def test_seed_from_copies_a_committed_diverged_run_which_stays_final(tiny_config_path, tmp_path):
  """A committed run whose release turned NaN/Inf is finished (Run.diverged_at): seeded with its
  failure.json, so a fresh root never runs it again; a run that failed otherwise is not seeded."""
  committed, root = tmp_path / 'committed', str(tmp_path / 'root')
  runs = sweep.plan(tiny_config_path, root, [], [])
  for run, error in ((runs[0], 'FloatingPointError'), (runs[1], 'OSError')):
    path = committed / os.path.relpath(run.workdir, os.path.join(root, 'tiny'))
    path.mkdir(parents=True)
    (path / 'sweep.json').write_text(json.dumps({'args': run.args, 'overrides': []}))
    (path / 'config.json').write_text('{}')
    (path / 'failure.json').write_text(json.dumps({'error': error, 'round': 1}))
  assert [w for w, _ in sweep.seed_from(runs, root, str(committed))] == [runs[0].workdir]
  assert [r.status for r in sweep.plan(tiny_config_path, root, [], [])][:2] == [sweep.DIVERGED, 'new']
  assert sweep.seed_from(runs, root, str(committed)) == []  # never copied twice


def test_a_committed_sweep_json_with_renamed_override_fields_is_the_same_run(tiny_config_path,
                                                                            tmp_path):
  root = str(tmp_path / 'root')
  run = sweep.plan(tiny_config_path, root, [], ['--config.local.lr_shared=0.1'])[0]
  os.makedirs(run.workdir)
  path = os.path.join(run.workdir, 'sweep.json')
  with open(path, 'w') as f:
    json.dump({'args': run.args, 'overrides': ['--config.local.lr_body=0.1']}, f)
  assert run.conflict() is None
  with open(path, 'w') as f:
    json.dump({'args': run.args, 'overrides': ['--config.local.lr_body=0.2']}, f)
  assert 'overrides differ' in run.conflict()


def test_plan_sums_the_studys_planned_hours_over_the_runs_left(tiny_config_path, tmp_path,
                                                                monkeypatch):
  """The cost model is the config's study's (experiments/studies/<config name>.py), not the
  config's: a config declares, its study estimates."""
  runs = sweep.plan(tiny_config_path, str(tmp_path), [('method', ['centaur', 'fedrep'])], [])
  assert sweep.planned_cost(tiny_config_path, runs) is None  # no study: nothing printed
  study = types.ModuleType('tiny_study')
  study.PLANNED_ON = 'test hours'
  study.planned_hours = lambda args: {'centaur': 1.5, 'fedrep': 0.5}[args['method']]
  name = config_files.config_name(tiny_config_path)
  monkeypatch.setitem(sys.modules, f'experiments.studies.{name}', study)
  assert sweep.planned_cost(tiny_config_path, runs) == (
      'planned cost: ~4.0 h for the 4 runs left (test hours)')  # 2 seeds each


LADDER_CONFIG = TINY_CONFIG.replace(
    "c.method = args.get('method', 'dp2fedsam')",
    "c.method = args.get('method', 'dp2fedsam')\n  c.local.lr_shared = float(args.get('lr', 0.1))"
).replace("for m in ('dp2fedsam', 'centaur') for s in (0, 1)]",
          "for m in ('dp2fedsam',) for s in (0,)] + [dict(lr=0.3), dict(lr=0.03), dict(method='centaur')]")


def test_a_ladder_of_searched_scalars_runs_as_one_program_and_each_run_is_its_run_alone(tmp_path):
  path = tmp_path / 'ladder.py'
  path.write_text(LADDER_CONFIG)
  root = str(tmp_path / 'runs')
  results = sweep.run_sweep(str(path), root, [], [], one_program='auto')
  assert set(results.values()) == {'ran'} and len(results) == 4
  ran_as = {}
  for workdir in results:
    with open(os.path.join(workdir, 'sweep.json')) as f:
      ran_as[os.path.relpath(workdir, root)] = json.load(f).get('ran_as')
  # The three lrs of dp2fedsam in one program; centaur (another method) in its own process.
  assert sorted(k for k, v in ran_as.items() if v == sweep.ONE_PROGRAM_RUN) == [
      'ladder/dp2fedsam/default/seed=0', 'ladder/dp2fedsam/lr=0.03/seed=0',
      'ladder/dp2fedsam/lr=0.3/seed=0']
  assert ran_as['ladder/centaur/default/seed=0'] is None
  alone = str(tmp_path / 'alone')
  module = sweep.load_config_module(str(path))
  train.train_and_evaluate(module.get_config('lr=0.3'), alone)
  in_program = os.path.join(root, 'ladder/dp2fedsam/lr=0.3/seed=0')
  for name in ('metrics.jsonl',):
    with open(os.path.join(alone, name)) as a, open(os.path.join(in_program, name)) as b:
      for x, y in zip(map(json.loads, a), map(json.loads, b), strict=True):
        assert x['round'] == y['round']
        assert y['test_accuracy'] == pytest.approx(x['test_accuracy'], rel=1e-4, abs=1e-4)
  again = sweep.run_sweep(str(path), root, [], [], one_program='auto')
  assert set(again.values()) == {'skipped (done)'}
