"""experiments/report (the package) on synthetic workdirs with known numbers: tables, labels, and PNGs."""

import csv
import glob
import json
import math
import os
import re

import numpy as np
import pytest
from conftest import markdown_tables

pytest.importorskip('matplotlib', reason='the [report] extra (matplotlib) is not installed')

from experiments import report  # noqa: E402
from experiments.report import plots, summary  # noqa: E402

ACC = {  # method -> final accuracy per seed (the best round is 0.05 higher, at round 2)
    'dp2fedsam': [0.70, 0.72, 0.74],
    'centaur': [0.60, 0.61, 0.65],
}


def make_workdir(root, config_name, method, seed, eps, final_acc, rounds=(1, 2, 3), num_rounds=3,
                 sweep=True, epsilon_reached=None, extra=None):
  args = {'eps': eps, **(extra or {})}
  setting = ','.join(f'{k}={v:g}' if isinstance(v, float) else f'{k}={v}'
                     for k, v in sorted(args.items()))
  workdir = os.path.join(root, config_name, method, setting, f'seed={seed}')
  os.makedirs(workdir)
  config = {'method': method, 'seed': seed, 'num_rounds': num_rounds, 'dataset': 'fashion_mnist',
            'num_clients': 100, 'partition': 'pathological', 'classes_per_client': 2,
            'dp': {'target_epsilon': eps}}
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(config, f)
  if sweep:
    with open(os.path.join(workdir, 'sweep.json'), 'w') as f:
      json.dump({'config_name': config_name, 'args': {'method': method, 'seed': seed, **args}}, f)
  accs = {1: 0.3, 2: final_acc + 0.05, 3: final_acc}
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    for r in rounds:
      f.write(json.dumps({'round': r, 'test_accuracy': accs[r], 'epsilon':
                          (epsilon_reached or eps) * r / num_rounds, 'seconds': 1.5,
                          'mean_update_norm': 1.0 / r + seed * 0.1, 'train_loss': 1.0,
                          'test_accuracy_participated': accs[r] + 0.1,
                          'participation': 0.2 * r}) + '\n')
  with open(os.path.join(workdir, 'hosts.jsonl'), 'w') as f:
    f.write(json.dumps({'from_round': 0, 'platform': 'cpu'}) + '\n')
  return workdir


@pytest.fixture
def root(tmp_path):
  root = str(tmp_path / 'runs')
  for method, accs in ACC.items():
    for seed, acc in enumerate(accs):
      make_workdir(root, 'default', method, seed, 2.0, acc)
  return root


def test_table_has_final_mean_std_and_separate_best_round(root, tmp_path):
  out = report.write_report(root, str(tmp_path / 'report'))
  with open(out['csv']) as f:
    rows = {r['method']: r for r in csv.DictReader(f)}
  for method, accs in ACC.items():
    row = rows[method]
    assert float(row['final_acc_mean']) == pytest.approx(np.mean(accs))
    assert float(row['final_acc_std']) == pytest.approx(np.std(accs, ddof=1))
    assert float(row['best_round_acc_mean']) == pytest.approx(np.mean(accs) + 0.05)
    assert int(row['num_seeds']) == 3 and int(row['final_round']) == 3
    assert float(row['epsilon']) == pytest.approx(2.0) and row['setting'] == 'eps=2'
    assert row['note'] == ''
    # The mean over the clients that took part, and their fraction, at the final round.
    assert float(row['participated_acc_mean']) == pytest.approx(np.mean(accs) + 0.1)
    assert float(row['participation']) == pytest.approx(0.6)
  cells = _run_rows(open(out['markdown']).read())
  assert {'participated acc', 'participation', 'best-round acc (optimistic)'} <= set(cells['centaur'])
  for method, accs in ACC.items():
    assert cells[method]['participation'] == '60 %'
    assert cells[method]['final-round acc'] == (f'{100 * np.mean(accs):.2f} ± '
                                                f'{100 * np.std(accs, ddof=1):.2f}')
  assert out['num_runs'] == 6


def _run_rows(markdown: str) -> dict:
  """The run table's rows of the one config in `markdown`, by method."""
  (table,) = markdown_tables(markdown, 'setting', 'method', 'final-round acc')
  return {row['method']: row for row in table}


def _picked(row: dict, expected: dict) -> dict:
  """`row`'s cells in `expected`'s columns (None where it has none): compared with `expected`
  whole, a mismatch shows every differing cell; columns the test does not read may come and go."""
  return {column: row.get(column) for column in expected}


def test_ordering_gives_each_gap_in_pooled_seed_stds(root, tmp_path):
  out = report.write_report(root, str(tmp_path / 'report'))
  hi, lo = ACC['dp2fedsam'], ACC['centaur']
  gap = np.mean(hi) - np.mean(lo)
  pooled = np.sqrt((np.var(hi, ddof=1) + np.var(lo, ddof=1)) / 2)
  (table,) = markdown_tables(open(out['markdown']).read(), 'higher', 'lower')
  assert [(r['setting'], r['higher'], r['lower']) for r in table] == [('eps=2', 'dp2fedsam', 'centaur')]
  assert table[0]['gap (points)'] == f'{100 * gap:.2f}'
  assert table[0]['gap / pooled std'] == f'{gap / pooled:.1f}' and table[0]['seeds'] == '3 v 3'
  # A method with one seed has no std: its gap is given in points only.
  one_seed = report.Row('default', 'eps=2', 'dp_fedavg', 2.0, 1, 3, (0.5, float('nan')),
                        (0.5, float('nan')), 1.0, '')
  pairs = report.ordering(report.summarize(report.load_runs(root)) + [one_seed])
  assert [(h.method, l.method) for h, l, *_ in pairs] == [('dp2fedsam', 'centaur'),
                                                          ('centaur', 'dp_fedavg')]
  assert pairs[1][2] == pytest.approx(np.mean(lo) - 0.5) and math.isnan(pairs[1][3])


def test_plots_are_real_pngs(root, tmp_path):
  import matplotlib.image
  out = report.write_report(root, str(tmp_path / 'report'))
  names = sorted(os.path.basename(p) for p in out['plots'])
  assert names == ['eps=2_accuracy.png', 'eps=2_update_norm.png']  # one eps: no eps plot
  for path in out['plots']:
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 500
    assert image[..., :3].std() > 0.05  # not a blank canvas
    assert f'({os.path.relpath(path, tmp_path / "report")})' in open(out['markdown']).read()


def test_accuracy_vs_eps_plot_when_several_eps(root, tmp_path):
  for seed, acc in enumerate([0.5, 0.52, 0.55]):
    make_workdir(root, 'default', 'dp2fedsam', seed, 1.0, acc)
  out = report.write_report(root, str(tmp_path / 'report'))
  assert any(p.endswith('default_accuracy_vs_eps.png') for p in out['plots'])
  points = plots._group_final(report.load_runs(root))[('default', 'default', 'dp2fedsam')]
  assert sorted((round(e, 6), round(m, 6)) for e, m, *_ in points) == [
      (1.0, round(np.mean([0.5, 0.52, 0.55]), 6)), (2.0, round(np.mean(ACC['dp2fedsam']), 6))]


def test_unfinished_runs_are_flagged_and_plain_workdirs_are_read(tmp_path):
  root = str(tmp_path / 'runs')
  make_workdir(root, 'cfg', 'centaur', 0, 1.0, 0.6)
  make_workdir(root, 'cfg', 'centaur', 1, 1.0, 0.6, rounds=(1, 2))  # killed after round 2
  make_workdir(root, 'other', 'p_fedsam', 0, 1.0, 0.8, sweep=False, epsilon_reached=math.inf)
  rows = {(r.config_name, r.method): r for r in report.summarize(report.load_runs(root))}
  row = rows[('cfg', 'centaur')]
  assert 'unfinished seeds [1]' in row.note and row.final_round == 2
  plain = rows[('runs', 'p_fedsam')]  # a run not made by a sweep: under the root's name
  assert plain.setting == 'N=100,S=2,dataset=fashion_mnist,eps=1' and math.isinf(plain.epsilon)


def test_seeds_run_on_different_executors_are_noted_since_their_s_per_round_mixes_machines(
    tmp_path):
  root = str(tmp_path / 'runs')
  for seed, executor in enumerate(('sequential', 'sequential', 'vmap')):
    config_path = os.path.join(make_workdir(root, 'cfg', 'centaur', seed, 1.0, 0.6), 'config.json')
    with open(config_path) as f:
      config = json.load(f)
    with open(config_path, 'w') as f:
      json.dump({**config, 'executor': executor}, f)
  make_workdir(root, 'cfg', 'dp2fedsam', 0, 1.0, 0.6)  # one executor (none recorded): no note
  rows = {r.method: r for r in report.summarize(report.load_runs(root))}
  assert rows['centaur'].note == 's/round mixes executors (seeds: sequential [0, 1]; vmap [2])'
  assert rows['dp2fedsam'].note == ''


def test_finished_only_leaves_out_runs_under_way_and_keeps_failed_ones(tmp_path):
  root = str(tmp_path / 'runs')
  make_workdir(root, 'cfg', 'centaur', 0, 1.0, 0.6)
  make_workdir(root, 'cfg', 'centaur', 1, 1.0, 0.6, rounds=(1, 2))  # still running
  _fail(make_workdir(root, 'cfg', 'centaur', 2, 0.5, 0.6), keep_metrics=1)
  paths = report.write_report(root, str(tmp_path / 'out'), copy_runs=True, finished_only=True)
  copied = sorted(os.listdir(tmp_path / 'out' / 'runs' / 'cfg' / 'centaur' / 'eps=1'))
  assert copied == ['seed=0'] and paths['num_runs'] == 2, (copied, paths)
  assert len(paths['failures']) == 1 and 'accuracy_vs_eps' not in ' '.join(paths['plots'])


def test_empty_root_fails_clearly(tmp_path):
  with pytest.raises(ValueError, match='no workdir'):
    report.write_report(str(tmp_path), str(tmp_path / 'out'))


def test_spread_over_clients_is_a_section_and_columns_where_the_runs_record_it(root, tmp_path):
  plain = report.write_report(root, str(tmp_path / 'plain'))
  assert not markdown_tables(open(plain['markdown']).read(), 'worst 10 %')
  assert 'test_accuracy_p10_mean' not in open(plain['csv']).read()  # runs that predate the fields
  worst = {}  # method -> the final records' worst-10 % accuracy per seed
  for path in glob.glob(os.path.join(root, 'default', '*', '*', 'seed=*', 'metrics.jsonl')):
    records = [json.loads(line) for line in open(path)]
    for r in records:
      acc = r['test_accuracy']
      r.update(test_accuracy_std=0.1, test_accuracy_worst10=acc - 0.3, test_accuracy_p10=acc - 0.2,
               test_accuracy_p50=acc, test_accuracy_p90=acc + 0.1)
    worst.setdefault(path.split(os.sep)[-4], []).append(records[-1]['test_accuracy_worst10'])
    with open(path, 'w') as f:
      f.write(''.join(json.dumps(r) + '\n' for r in records))
  out = report.write_report(root, str(tmp_path / 'spread'))
  with open(out['csv']) as f:
    rows = {r['method']: r for r in csv.DictReader(f)}
  for method, values in worst.items():
    assert float(rows[method]['test_accuracy_worst10_mean']) == pytest.approx(np.mean(values))
    assert float(rows[method]['test_accuracy_worst10_std']) == pytest.approx(np.std(values, ddof=1))
    assert float(rows[method]['test_accuracy_std_mean']) == pytest.approx(0.1)
  (table,) = markdown_tables(open(out['markdown']).read(), 'worst 10 %')
  assert {'setting', 'method', 'std over clients', 'p10', 'p50', 'p90'} <= set(table[0])
  row = next(r for r in table if r['method'] == 'dp2fedsam')
  assert row['setting'] == 'eps=2' and row['std over clients'] == '10.00 ± 0.00'
  assert row['worst 10 %'] == (f'{100 * np.mean(worst["dp2fedsam"]):.2f} ± '
                               f'{100 * np.std(worst["dp2fedsam"], ddof=1):.2f}')


def test_copied_runs_rebuild_the_same_table(root, tmp_path):
  first = report.write_report(root, str(tmp_path / 'report'), copy_runs=True)
  copied = str(tmp_path / 'report' / 'runs')
  assert not any('checkpoints' in d for d, _, _ in os.walk(copied))
  workdirs = {d for d, _, files in os.walk(root) if 'hosts.jsonl' in files}
  assert workdirs and all(os.path.exists(os.path.join(copied, os.path.relpath(d, root), 'hosts.jsonl'))
                          for d in workdirs)
  again = report.write_report(copied, str(tmp_path / 'again'))
  assert open(again['csv']).read() == open(first['csv']).read()


def _fail(workdir, error='FloatingPointError', round_index=1, keep_metrics=0):
  """What experiments.train leaves when a run fails: failure.json, metrics up to the checkpoint."""
  with open(os.path.join(workdir, 'failure.json'), 'w') as f:
    json.dump({'error': error, 'message': f'round {round_index}: NaN', 'round': round_index}, f)
  path = os.path.join(workdir, 'metrics.jsonl')
  lines = open(path).read().splitlines()[:keep_metrics]
  with open(path, 'w') as f:
    f.write(''.join(l + '\n' for l in lines))


def test_a_failed_seed_is_shown_in_the_table_and_on_stdout_not_averaged(tmp_path, capsys):
  root = str(tmp_path / 'runs')
  make_workdir(root, 'cfg', 'dp2fedsam', 0, 1.0, 0.6)
  _fail(make_workdir(root, 'cfg', 'dp2fedsam', 1, 1.0, 0.9))  # NaN in round 1: no metrics
  _fail(make_workdir(root, 'cfg', 'centaur', 0, 1.0, 0.5), 'OutOfMemoryError', 3, keep_metrics=2)
  make_workdir(root, 'cfg', 'centaur', 1, 1.0, 0.7)
  # A failed run without config.json (it stopped before writing one): sweep.json + failure.json.
  only_sweep = make_workdir(root, 'cfg', 'fedrep', 0, 1.0, 0.5)
  os.remove(os.path.join(only_sweep, 'config.json'))
  _fail(only_sweep, 'DatasetNotFoundError', None)
  out = report.write_report(root, str(tmp_path / 'report'))
  with open(out['csv']) as f:
    rows = {r['method']: r for r in csv.DictReader(f)}
  row = rows['dp2fedsam']
  assert row['note'] == '1/2 seeds; seed=1 failed (FloatingPointError at round 1)'
  assert float(row['final_acc_mean']) == pytest.approx(0.6) and int(row['num_seeds']) == 1
  assert int(row['num_runs']) == 2
  assert rows['centaur']['note'] == '1/2 seeds; seed=0 failed (OutOfMemoryError at round 3)'
  assert float(rows['centaur']['final_acc_mean']) == pytest.approx(0.7)
  assert rows['fedrep']['note'] == '0/1 seeds; seed=0 failed (DatasetNotFoundError)'
  cells = _run_rows(open(out['markdown']).read())
  # The table's note is the CSV's; the failed seeds count in 'seeds' (averaged / found).
  expected = {'setting': 'eps=1', 'ε': '1', 'seeds': '1/2', 'round': '3', 'final-round acc': '60.00',
              'participated acc': '70.00', 'participation': '60 %',
              'best-round acc (optimistic)': '65.00', 's/round': '1.50', 'note': row['note']}
  assert _picked(cells['dp2fedsam'], expected) == expected
  expected = {'setting': 'eps=1', 'ε': '–', 'seeds': '0/1', 'round': '0', 'final-round acc': '–',
              'participated acc': '–', 'participation': '–', 'best-round acc (optimistic)': '–',
              's/round': '–', 'note': rows['fedrep']['note']}
  assert _picked(cells['fedrep'], expected) == expected
  assert out['failures'] == [
      'cfg / eps=1 / centaur: 1/2 seeds; seed=0 failed (OutOfMemoryError at round 3)',
      'cfg / eps=1 / dp2fedsam: 1/2 seeds; seed=1 failed (FloatingPointError at round 1)',
      'cfg / eps=1 / fedrep: 0/1 seeds; seed=0 failed (DatasetNotFoundError)']
  # The binary prints them on stdout too.
  import subprocess
  import sys
  done = subprocess.run([sys.executable, '-m', 'experiments.report', f'--root={root}',
                         f'--out={tmp_path / "again"}'], capture_output=True, text=True,
                        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.splitlines()[:3] == out['failures']


def test_accuracy_plots_label_whole_rounds(tmp_path, monkeypatch):
  root = str(tmp_path / 'runs')
  make_workdir(root, 'cfg', 'dp2fedsam', 0, 1.0, 0.6, rounds=(1, 2), num_rounds=2)
  axes = []
  save = plots._save
  monkeypatch.setattr(plots, '_save', lambda fig, ax, *a: (axes.append(ax), save(fig, ax, *a)))
  report.write_report(root, str(tmp_path / 'report'))
  for ax in axes:
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks  # not 1.2, 1.4, ...


def test_update_norm_plot_is_per_round_when_every_run_has_train_metrics(tmp_path, monkeypatch):
  root = str(tmp_path / 'runs')
  for seed in (0, 1):  # evaluated at round 3 only, trained rounds 1-3
    workdir = make_workdir(root, 'cfg', 'dp2fedsam', seed, 1.0, 0.6, rounds=(3,))
    with open(os.path.join(workdir, 'train_metrics.jsonl'), 'w') as f:
      for r in (1, 2, 3):
        f.write(json.dumps({'round': r, 'mean_update_norm': r + seed, 'train_loss': 1.0}) + '\n')
  make_workdir(root, 'old', 'dp2fedsam', 0, 1.0, 0.6, rounds=(3,))  # predates train_metrics.jsonl
  axes = []
  save = plots._save
  monkeypatch.setattr(plots, '_save', lambda fig, ax, *a: (axes.append(ax), save(fig, ax, *a)))
  report.write_report(root, str(tmp_path / 'report'), copy_runs=True)
  norms = {ax.get_title().split(':')[0]: ax.lines[0] for ax in axes
           if 'update norm' in ax.get_ylabel()}
  assert list(norms['cfg'].get_xdata()) == [1, 2, 3]
  assert list(norms['cfg'].get_ydata()) == [1.5, 2.5, 3.5]  # the mean over the two seeds
  assert list(norms['old'].get_xdata()) == [3]  # the evaluated rounds only
  copied = tmp_path / 'report' / 'runs' / 'cfg' / 'dp2fedsam' / 'eps=1' / 'seed=0'
  assert (copied / 'train_metrics.jsonl').exists()


def test_adaptive_runs_get_a_clip_norm_plot_per_round_and_fixed_ones_none(tmp_path, monkeypatch):
  root = str(tmp_path / 'runs')
  for seed in (0, 1):
    for clip in ('adaptive', 'fixed'):
      workdir = make_workdir(root, 'cfg', 'dp2fedsam', seed, 1.0, 0.6, rounds=(3,),
                             extra={'clip': clip})
      with open(os.path.join(workdir, 'train_metrics.jsonl'), 'w') as f:
        for r in (1, 2, 3):
          extra = {'clip_norm': 0.5 * r + seed} if clip == 'adaptive' else {}
          f.write(json.dumps({'round': r, 'mean_update_norm': 1.0, **extra}) + '\n')
  axes = []
  save = plots._save
  monkeypatch.setattr(plots, '_save', lambda fig, ax, *a: (axes.append(ax), save(fig, ax, *a)))
  report.write_report(root, str(tmp_path / 'report'))
  clip_axes = [ax for ax in axes if ax.get_ylabel().startswith('clip norm')]
  assert len(clip_axes) == 1 and 'clip=adaptive' in clip_axes[0].get_title()
  assert list(clip_axes[0].lines[0].get_xdata()) == [1, 2, 3]
  assert list(clip_axes[0].lines[0].get_ydata()) == [1.0, 1.5, 2.0]  # the mean over the seeds
  assert sorted(os.listdir(tmp_path / 'report' / 'cfg')) == [
      'clip=adaptive,eps=1_accuracy.png', 'clip=adaptive,eps=1_clip_norm.png',
      'clip=adaptive,eps=1_update_norm.png', 'clip=fixed,eps=1_accuracy.png',
      'clip=fixed,eps=1_update_norm.png']


def test_the_clipping_table_says_whether_the_clip_binds_over_the_last_50_rounds(tmp_path):
  """Each private run's mean over its last 50 rounds, then mean and std over seeds; 'binds' at a
  clipped fraction of 0.05 or more; non-private rows and rows with a seed lacking train metrics get
  no line."""
  root = str(tmp_path / 'runs')
  clipped = {('adaptive', 0): 0.6, ('adaptive', 1): 0.4, ('fixed', 0): 0.02, ('fixed', 1): 0.04}
  for (clip, seed), late in clipped.items():
    workdir = make_workdir(root, 'cfg', 'dp2fedsam', seed, 2.0, 0.6, extra={'clip': clip})
    with open(os.path.join(workdir, 'train_metrics.jsonl'), 'w') as f:
      for r in range(1, 101):  # rounds 1-50 clip everything: outside the window
        extra = {'clip_norm': 0.1 * (seed + 1)} if clip == 'adaptive' else {}
        f.write(json.dumps({'round': r, 'mean_update_norm': 0.5, 'clipped_fraction':
                            1.0 if r <= 50 else late, **extra}) + '\n')
  for seed in (0, 1):  # non-private: clipped_fraction 0 every round, no line
    workdir = make_workdir(root, 'cfg', 'fedavg', seed, math.inf, 0.6, extra={'clip': 'fixed'})
    with open(os.path.join(workdir, 'train_metrics.jsonl'), 'w') as f:
      f.write(json.dumps({'round': 1, 'mean_update_norm': 0.5, 'clipped_fraction': 0.0}) + '\n')
  out = report.write_report(root, str(tmp_path / 'report'))
  (table,) = markdown_tables(open(out['markdown']).read(), 'clip binds')
  assert [(r['setting'], r['method']) for r in table] == [('clip=adaptive,eps=2', 'dp2fedsam'),
                                                          ('clip=fixed,eps=2', 'dp2fedsam')]
  numbers = ('clipped fraction', 'clip norm C_t', 'pre-clip update norm')
  assert [[r[c] for c in numbers] for r in table] == [['0.5 ± 0.14', '0.15 ± 0.071', '0.5 ± 0'],
                                                      ['0.03 ± 0.014', '–', '0.5 ± 0']]
  # The verdict and, where the clip does not bind, the threshold it falls under.
  verdicts = [re.findall(r'[a-z]+|\d+(?:\.\d+)?', r['clip binds']) for r in table]
  assert verdicts == [['yes'], ['no', '0.05']]
  with open(out['csv']) as f:
    rows = {(r['setting'], r['method']): r for r in csv.DictReader(f)}
  assert float(rows['clip=adaptive,eps=2', 'dp2fedsam']['clipped_fraction_last50_mean']) == (
      pytest.approx(0.5))
  assert rows['clip=fixed,eps=inf', 'fedavg']['clipped_fraction_last50_mean'] == 'nan'


def test_an_update_norm_blow_up_is_drawn_off_scale_and_labelled(tmp_path, monkeypatch):
  """One round at 1e19 (DP-FedAvg's first rounds in the paper regime) must not flatten the other
  curves: the axis stops at 3x the rest and the blow-up is a labelled marker at the top edge."""
  root = str(tmp_path / 'runs')
  for method, blow_up in (('dp_fedavg', 5e19), ('dp2fedsam', None)):
    workdir = make_workdir(root, 'cfg', method, 0, 1.0, 0.6)
    with open(os.path.join(workdir, 'train_metrics.jsonl'), 'w') as f:
      for r in range(1, 21):
        norm = blow_up if (blow_up and r == 2) else (2.0 if method == 'dp_fedavg' else 1.0) / r
        f.write(json.dumps({'round': r, 'mean_update_norm': norm, 'train_loss': 1.0}) + '\n')
  axes = []
  save = plots._save
  monkeypatch.setattr(plots, '_save', lambda fig, ax, *a: (axes.append(ax), save(fig, ax, *a)))
  report.write_report(root, str(tmp_path / 'report'))
  norm_ax = next(ax for ax in axes if 'update norm' in ax.get_ylabel())
  assert norm_ax.get_yscale() == 'linear'  # the rest spans 0.05 .. 2: no log axis needed
  assert norm_ax.get_ylim()[1] == pytest.approx(3 * 2.0)
  assert [t.get_text() for t in norm_ax.texts] == ['off scale: 5.0e+19']
  accuracy_ax = next(ax for ax in axes if 'accuracy' in ax.get_ylabel())
  assert not accuracy_ax.texts  # only the norm plot marks values off scale


# The paper regime's privacy-utility curve in miniature: final accuracy per (method, eps) and seed.
CURVE = {
    'dp2fedsam': {0.5: [0.80, 0.82, 0.84], 1.0: [0.90, 0.91, 0.92], 2.0: [0.93, 0.93, 0.94]},
    'centaur': {0.5: [0.70, 0.72], 1.0: [0.88, 0.89, 0.90], 2.0: [0.93, 0.94, 0.95]},
    'dp_fedavg': {1.0: [0.85]},
}
CEILINGS = {'p_fedsam': 0.96, 'fedavg': 0.10}  # eps = inf; fedavg collapsed


@pytest.fixture
def curve_root(tmp_path):
  root = str(tmp_path / 'runs')
  for method, by_eps in CURVE.items():
    for eps, accs in by_eps.items():
      for seed, acc in enumerate(accs):
        make_workdir(root, 'cfg', method, seed, eps, acc)
  for method, acc in CEILINGS.items():
    make_workdir(root, 'cfg', method, 0, math.inf, acc)
  return root


def _cell(ref, other):
  gap = np.mean(ref) - np.mean(other)
  if len(ref) > 1 and len(other) > 1:
    units = f'{gap / np.sqrt((np.var(ref, ddof=1) + np.var(other, ddof=1)) / 2):+.1f} sd'
  else:
    units = '–'
  return f'{100 * gap:+.2f} / {units} ({len(ref)} v {len(other)})'


def test_reference_method_gap_to_every_other_method_at_each_eps(curve_root, tmp_path):
  """One row per other method, one column per eps: the gap in points and in pooled seed stds,
  with the seeds on each side; empty where a method did not run at that eps."""
  out = report.write_report(curve_root, str(tmp_path / 'report'))
  table = _gap_rows(open(out['markdown']).read())
  ref = CURVE['dp2fedsam']
  assert [float(column.split('=')[1]) for column in list(table['centaur'])[1:]] == [0.5, 1, 2]
  assert [table['centaur'][f'ε = {e:g}'] for e in (0.5, 1.0, 2.0)] == [
      _cell(ref[e], CURVE['centaur'][e]) for e in (0.5, 1.0, 2.0)]
  assert [table['dp_fedavg'][f'ε = {e:g}'] for e in (0.5, 1.0, 2.0)] == [
      '', _cell(ref[1.0], CURVE['dp_fedavg'][1.0]), '']
  assert set(table) == {'centaur', 'dp_fedavg'}  # no p_fedsam: no dp2fedsam at eps = inf
  # Another reference method: its own table.
  again = report.write_report(curve_root, str(tmp_path / 'again'), reference='centaur')
  assert _gap_rows(open(again['markdown']).read())['dp2fedsam']['ε = 0.5'] == _cell(
      CURVE['centaur'][0.5], ref[0.5])


def _gap_rows(markdown: str) -> dict:
  """The reference method's gap table (one column per ε), its rows by method."""
  (table,) = markdown_tables(markdown, 'method', 'ε = 0.5')
  return {row['method']: row for row in table}


def test_a_setting_with_extra_arguments_is_compared_with_the_same_method_without_them(
    curve_root, tmp_path):
  """noise=banded runs against the independent-noise runs of the same method and eps (and only
  those): one row per variant, the gap in points and pooled seed stds."""
  banded = {1.0: [0.93, 0.92, 0.94], 0.5: [0.81]}
  for eps, accs in banded.items():
    for seed, acc in enumerate(accs):
      make_workdir(curve_root, 'cfg', 'dp2fedsam', seed, eps, acc,
                   extra={'noise': 'banded', 'bands': 2})
  md = open(report.write_report(curve_root, str(tmp_path / 'report'))['markdown']).read()
  (table,) = markdown_tables(md, 'variant', 'baseline')
  ref = CURVE['dp2fedsam']
  gap = 'gap (points) / pooled std (seeds)'
  assert sorted([r['method'], r['variant'], r['baseline'], r['variant acc'], r['baseline acc'], r[gap]]
                for r in table) == [
      ['dp2fedsam', 'bands=2,eps=0.5,noise=banded', 'eps=0.5', '81.00', '82.00 ± 2.00',
       _cell(banded[0.5], ref[0.5])],
      ['dp2fedsam', 'bands=2,eps=1,noise=banded', 'eps=1', '93.00 ± 1.00', '91.00 ± 1.00',
       _cell(banded[1.0], ref[1.0])]]


def test_accuracy_vs_eps_plot_has_log_eps_error_bars_ceilings_and_off_scale_note(
    curve_root, tmp_path, monkeypatch):
  axes = []
  save = plots._save
  monkeypatch.setattr(plots, '_save', lambda fig, ax, *a: (axes.append(ax), save(fig, ax, *a)))
  out = report.write_report(curve_root, str(tmp_path / 'report'))
  assert any(p.endswith('cfg/default_accuracy_vs_eps.png') for p in out['plots'])
  ax = next(ax for ax in axes if ax.get_xlabel().startswith('ε'))
  assert ax.get_xscale() == 'log' and list(ax.get_xticks()) == [0.5, 1.0, 2.0]
  bars = {c.get_label(): c for c in ax.containers}  # errorbar containers, one per method
  assert set(bars) == {'dp2fedsam (3 seeds)', 'centaur (2–3 seeds)', 'dp_fedavg (1 seed)'}
  line, _, (yerr,) = bars['dp2fedsam (3 seeds)']
  assert list(line.get_ydata()) == pytest.approx([100 * np.mean(CURVE['dp2fedsam'][e])
                                                  for e in (0.5, 1.0, 2.0)])
  heights = [seg[1, 1] - seg[0, 1] for seg in yerr.get_segments()]  # 2 std each
  assert heights == pytest.approx([200 * np.std(CURVE['dp2fedsam'][e], ddof=1)
                                   for e in (0.5, 1.0, 2.0)])
  ceilings = {l.get_label(): l.get_ydata()[0] for l in ax.lines if l.get_label().endswith('∞)')}
  assert ceilings == {'p_fedsam (ε = ∞)': pytest.approx(96.0)}
  # The collapsed ceiling (10 %) would flatten the curves: a note, not a line.
  assert [t.get_text() for t in ax.texts] == ['off scale: fedavg 10.0 % at ε = ∞']
  assert ax.get_ylim()[0] > 60


def test_committed_paper_regime_results_are_what_the_report_makes_of_its_runs(tmp_path):
  """experiments/results/fmnist_paper_regime: its results.md and results.csv are the report of its
  runs/ (the command in WORKSPACE.md, run on the committed small files): tables that README's
  numbers come from cannot drift from the runs or from the report's code."""
  committed = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           'experiments', 'results', 'fmnist_paper_regime')
  out = report.write_report(os.path.join(committed, 'runs'), str(tmp_path / 'out'),
                            finished_only=True)
  for name in ('results.md', 'results.csv'):
    with open(os.path.join(committed, name)) as f:
      assert open(out['markdown' if name.endswith('md') else 'csv']).read() == f.read(), name
  assert all(os.path.exists(os.path.join(committed, os.path.relpath(p, tmp_path / 'out')))
             for p in out['plots']), 'a plot of results.md is not committed'


def test_local_only_is_the_zero_epsilon_point_and_pooled_accuracy_gets_its_table(curve_root,
                                                                                  tmp_path):
  """local_only (nothing released) reads ε = 0 in the table and is a line in the plot against ε;
  runs that record the pooled accuracy get a table of it (older runs: none, tables unchanged)."""
  before = open(report.write_report(curve_root, str(tmp_path / 'before'))['markdown']).read()
  assert not markdown_tables(before, 'pooled')
  workdir = make_workdir(curve_root, 'cfg', 'local_only', 0, math.inf, 0.5, rounds=(3,))
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.write(json.dumps({'round': 3, 'epsilon': 0.0, 'released': 'nothing', 'seconds': 1.0,
                        'test_accuracy': 0.5, 'test_accuracy_pooled': 0.625,
                        'test_accuracy_pooled_participated': 0.625,
                        'test_accuracy_never_sampled': None,
                        'test_accuracy_pooled_never_sampled': None}) + '\n')
  out = report.write_report(curve_root, str(tmp_path / 'report'))
  md = open(out['markdown']).read()
  local = _run_rows(md)['local_only']
  assert local['ε'].split()[0] == '0'  # nothing released: ε = 0, not the setting's inf
  expected = {'setting': 'eps=inf', 'seeds': '1', 'round': '3', 'final-round acc': '50.00'}
  assert _picked(local, expected) == expected
  (pooled,) = markdown_tables(md, 'pooled')
  pooled_local = next(r for r in pooled if r['method'] == 'local_only')
  expected = {'setting': 'eps=inf', 'pooled': '62.50', 'pooled, sampled clients': '62.50',
              'never sampled (mean)': '–', 'never sampled (pooled)': '–'}
  assert _picked(pooled_local, expected) == expected
  assert any(p.endswith('_accuracy_vs_eps.png') for p in out['plots'])
  rows = list(csv.DictReader(open(out['csv'])))
  assert next(r for r in rows if r['method'] == 'local_only')['test_accuracy_pooled_mean'] == '0.625'


def test_re_evaluations_under_other_protocols_are_rows_of_their_own(curve_root, tmp_path):
  """experiments.evaluate's lines at a finished run's final round, one row per protocol (the last
  line of each); the run's own protocol and earlier rounds are not repeated; no plot, no copy."""
  workdir = os.path.join(curve_root, 'cfg', 'dp2fedsam', 'eps=1', 'seed=0')
  protocol = {'eval.adapt_epochs': 10, 'eval.adapt_lr': 0.1, 'eval.adapt_part': 'head',
              'eval.head_init': 'own', 'eval_clients': None}
  lines = [{'round': 3, **protocol, 'test_accuracy': 0.5, 'epsilon': 1.0},
           {'round': 3, **protocol, 'test_accuracy': 0.95, 'epsilon': 1.0},  # the last one counts
           {'round': 3, **protocol, 'eval.adapt_epochs': 0, 'test_accuracy': 0.1, 'epsilon': 1.0},
           {'round': 2, **protocol, 'eval.head_init': 'random', 'test_accuracy': 0.2, 'epsilon': 1.0},
           {'round': 3, **protocol, 'eval.head_init': 'random', 'test_accuracy': 0.97,
            'epsilon': 1.0, 'test_accuracy_pooled': 0.96}]
  with open(os.path.join(workdir, 'evaluations.jsonl'), 'w') as f:
    f.write(''.join(json.dumps(l) + '\n' for l in lines))
  runs = report.load_runs(curve_root)
  extra = sorted((r.method, r.records[-1]['test_accuracy']) for r in runs if r.protocol)
  assert extra == [('dp2fedsam [adapt head 10 ep lr 0.1, head random]', 0.97),
                   ('dp2fedsam [adapt head 10 ep lr 0.1]', 0.95)]
  out = report.write_report(curve_root, str(tmp_path / 'report'), copy_runs=True)
  row = _run_rows(open(out['markdown']).read())[extra[1][0]]  # the label load_runs gives
  expected = {'setting': 'eps=1', 'ε': '1', 'seeds': '1', 'round': '3', 'final-round acc': '95.00'}
  assert _picked(row, expected) == expected
  assert not any('adapt' in p for p in out['plots'])
  assert sorted(os.listdir(os.path.join(tmp_path, 'report', 'runs', 'cfg', 'dp2fedsam', 'eps=1',
                                        'seed=0'))) == ['config.json', 'evaluations.jsonl',
                                                        'hosts.jsonl', 'metrics.jsonl', 'sweep.json']


def test_pooled_gain_is_the_slope_over_the_last_200_rounds_per_100_rounds():
  """The operating point's flatness: a run rising 0.5 points per 100 rounds from round 800 on (and
  faster before, which the window leaves out) reads 0.5; fewer than 2 pooled records read nan."""
  def accuracy(r):
    return 0.0005 * r if r < 800 else 0.4 + 0.00005 * (r - 800)
  records = [{'round': r, 'test_accuracy_pooled': accuracy(r)} for r in range(50, 1001, 50)]
  assert report.pooled_gain_per_100_rounds(records) == pytest.approx(0.005)
  assert math.isnan(report.pooled_gain_per_100_rounds([{'round': 1000, 'test_accuracy_pooled': 0.5}]))
  assert math.isnan(report.pooled_gain_per_100_rounds([{'round': 900}, {'round': 1000}]))
  # A run shorter than the window has no rate: 2 rounds say nothing of the next 100.
  assert math.isnan(report.pooled_gain_per_100_rounds(
      [{'round': 1, 'test_accuracy_pooled': 0.1}, {'round': 2, 'test_accuracy_pooled': 0.2}]))


def _hand_started(root, method, seed=0, rounds=2, pooled=(0.1, 0.3)):
  """runs/<method>: a run started by hand with experiments.train (no sweep.json)."""
  workdir = os.path.join(root, method if not seed else f'{method}_{seed}')
  os.makedirs(workdir)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump({'method': method, 'seed': seed, 'num_rounds': rounds, 'dataset': 'fashion_mnist',
               'num_clients': 100, 'partition': 'pathological', 'classes_per_client': 2,
               'dp': {'target_epsilon': 2.0}}, f)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    for r, value in zip(range(1, rounds + 1), pooled):
      f.write(json.dumps({'round': r, 'test_accuracy': value, 'test_accuracy_pooled': value,
                          'epsilon': r, 'seconds': 1.0, 'mean_update_norm': 1.0}) + '\n')


def test_hand_started_runs_are_compared_side_by_side_without_a_rate_after_two_rounds(tmp_path):
  root = str(tmp_path / 'runs')
  _hand_started(root, 'dp2fedsam')
  _hand_started(root, 'centaur', pooled=(0.1, 0.2))
  _hand_started(root, 'centaur', seed=1, pooled=(0.1, 0.4))
  out = report.write_report(root, str(tmp_path / 'report'))
  text = open(out['markdown']).read()
  assert text.count('\n## ') == 2  # one section for the runs (and the plots'), not one per directory
  (runs,) = markdown_tables(text, 'final-round acc')
  assert [r['method'] for r in runs] == ['centaur', 'dp2fedsam']
  assert runs[0]['seeds'] == '2'  # centaur's two workdirs are its two seeds
  accuracy_plots = [p for p in out['plots'] if p.endswith('_accuracy.png')]
  assert len(accuracy_plots) == 1
  (pooled,) = markdown_tables(text, summary.POOLED[summary.POOLED_GAIN])
  assert [(r['method'], r[summary.POOLED[summary.POOLED_GAIN]]) for r in pooled] == [
      ('centaur', '–'), ('dp2fedsam', '–')]


def _row_with_pooled(values):
  mean, std = summary.mean_std(values)
  return report.Row('c', 's', 'm', epsilon=math.inf, num_seeds=len(values), final_round=1,
                    final_acc=(mean, std), best_acc=(mean, std), seconds_per_round=1.0, note='',
                    pooled={'test_accuracy_pooled': (mean, std)})


@pytest.mark.parametrize('candidate, reference, label', [
    ([0.4479, 0.4477, 0.4480], [0.5197, 0.5198, 0.5203], 'hurts'),  # the field study's scale
    ([0.530, 0.531, 0.532], [0.519, 0.520, 0.521], 'helps'),        # +1.1 points, s = 0.1
    ([0.526, 0.527, 0.528], [0.519, 0.520, 0.521], 'level'),        # +0.7 points: under 1 point
    ([0.60, 0.40, 0.62], [0.50, 0.51, 0.52], 'level'),              # +3 points, s ~ 8 points
    ([0.45, 0.45], [0.52, 0.52, 0.52], 'undecided'),                # 2 seeds: no verdict yet
])
def test_the_decision_rule_labels_by_one_point_and_two_pooled_stds(candidate, reference, label):
  got, d, s = report.rule_label(_row_with_pooled(candidate), _row_with_pooled(reference))
  assert got == label
  assert d == pytest.approx(np.mean(candidate) - np.mean(reference))
  if len(candidate) > 1:
    assert s == pytest.approx(math.sqrt((np.var(candidate, ddof=1) + np.var(reference, ddof=1)) / 2))


def test_every_method_of_the_registry_gets_its_own_colour_and_marker():
  """The all-methods plot draws every registered method: no colour is used twice, and no two
  methods share a (colour, marker) pair even past the palette."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  styles = plots.method_styles(sorted(METHODS))
  assert len({s['color'] for s in styles.values()}) == len(METHODS) <= 24
  many = plots.method_styles([f'm{i}' for i in range(200)])
  assert len({(s['color'], s['marker']) for s in many.values()}) == 200
