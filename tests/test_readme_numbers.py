"""The numbers README.md and experiments/results/README.md state about the committed runs, recomputed
from the runs' own files (metrics.jsonl, evaluations.jsonl, train_metrics.jsonl, config.json,
tuning.json), so that neither doc can drift from its runs. Each number is matched as the docs write
it (two decimals, a signed gap with a Unicode minus), in the doc's text with its line breaks
undone. The README's Fashion-MNIST table itself is held to results.csv in tests/test_report.py.

Nothing here imports the engine: the decision rule and the accounting are recomputed from their
definitions (README, "Results"; dp_accounting for the eps with the tuning)."""

from __future__ import annotations

import glob
import json
import math
import os
import re

import numpy as np
import pytest
from conftest import (HAND_TUNED_FMNIST, differing_fields, flat_config, noise_per_server_lr_and_clip,
                      readme_table, server_noise_per_weight)

from experiments.configs import fair_a5_dp2fedsam
from experiments.studies import fair as _fair
from experiments.report import fair as fair_report
from launch import fair_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, 'experiments', 'results')
SF = os.path.join(RESULTS, 'shakespeare_field')
FMNIST = os.path.join(RESULTS, 'fmnist_paper_regime', 'runs')
SEEDS = (0, 1, 2)


def _records(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _flat(text: str) -> str:
  return ' '.join(text.split())


@pytest.fixture(scope='module')
def readme():
  text = open(os.path.join(ROOT, 'README.md')).read()
  return _flat(text.split('\n## Results\n')[1].split('\n## ')[0])


@pytest.fixture(scope='module')
def results_readme():
  return _flat(open(os.path.join(RESULTS, 'README.md')).read())


def _signed(points: float) -> str:
  return f'{points:+.2f}'.replace('-', '−')


def _rule(a, b):
  """README's rule: d = mean over seeds of A - B, s = sqrt((s_A^2 + s_B^2) / 2); helps if
  d >= max(1 point, 2s), hurts if d <= -max(1 point, 2s), else level. d and s in points."""
  a, b = 100 * np.asarray(a, float), 100 * np.asarray(b, float)
  d = a.mean() - b.mean()
  s = math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
  bar = max(1.0, 2 * s)
  return ('helps' if d >= bar else 'hurts' if d <= -bar else 'level'), d, s


# Shakespeare (experiments/results/shakespeare_field/runs).

def _plain(method, setting, key='test_accuracy_pooled'):
  return [_records(os.path.join(SF, 'runs', method, setting, f'seed={s}', 'metrics.jsonl'))[-1][key]
          for s in SEEDS]


def _adapted(method, setting, part, key='test_accuracy_pooled'):
  """The run's 10-epoch re-evaluation at round 1,000 (the last line of that protocol)."""
  values = []
  for s in SEEDS:
    lines = [e for e in _records(os.path.join(SF, 'runs', method, setting, f'seed={s}',
                                              'evaluations.jsonl'))
             if e['round'] == 1000 and e['eval.adapt_epochs'] == 10 and e['eval.adapt_part'] == part]
    values.append(lines[-1][key])
  return values


def _curve(method, setting):
  """Plain pooled accuracy by evaluated round, mean over seeds, in points."""
  runs = [_records(os.path.join(SF, 'runs', method, setting, f'seed={s}', 'metrics.jsonl'))
          for s in SEEDS]
  rounds = [r['round'] for r in runs[0]]
  assert all([r['round'] for r in run] == rounds for run in runs)
  return rounds, 100 * np.mean([[r['test_accuracy_pooled'] for r in run] for run in runs], axis=0)


def _gain_per_100_rounds(method, setting):
  """Least-squares slope of the pooled accuracy over the last 200 rounds, points per 100 rounds,
  mean over seeds (the report's flatness column)."""
  slopes = []
  for s in SEEDS:
    records = [r for r in _records(os.path.join(SF, 'runs', method, setting, f'seed={s}',
                                                'metrics.jsonl')) if r['round'] >= 800]
    x = np.array([r['round'] for r in records], float)
    y = np.array([r['test_accuracy_pooled'] for r in records], float)
    slopes.append(np.polyfit(x, y, 1)[0] * 100 * 100)
  return float(np.mean(slopes))


# (row of README's Shakespeare table) -> (method, setting, adapted part) per column; local_only plain.
SF_TABLE = {
    'FedAvg / DP-FedAvg, head fine-tuned from the global one':
        [('fedavg', 'default', 'head'), ('dp_fedavg', 'eps=2', 'head'), ('dp_fedavg', 'eps=8', 'head')],
    'the same trained models, whole model fine-tuned (FedAvg-FT / DP-FedAvg-FT)':
        [('fedavg', 'default', 'full'), ('dp_fedavg_ft', 'eps=2', 'auto'),
         ('dp_fedavg_ft', 'eps=8', 'auto')],
    'personal head trained from scratch (P-FedSAM / DP²-FedSAM, 10 head epochs a visit)':
        [('p_fedsam', 'personal_epochs=10', 'auto'), ('dp2fedsam', 'eps=2', 'auto'),
         ('dp2fedsam', 'eps=8', 'auto')],
    'the same without SAM on the body (FedRep / CENTAUR)':
        [('fedrep', 'personal_epochs=10', 'auto'), ('centaur', 'eps=2', 'auto'),
         ('centaur', 'eps=8', 'auto')],
}


def test_readme_shakespeare_table_is_pooled_and_mean_over_roles_of_the_committed_runs():
  text = open(os.path.join(ROOT, 'README.md')).read().split('\n## Results\n')[1].split('\n## ')[0]
  table = next(b for b in text.split('\n\n') if b.startswith('| row')).splitlines()
  assert [c.strip() for c in table[0].strip('|').split('|')] == ['row', 'non-private', 'ε = 2', 'ε = 8']
  rows = {cells[0]: cells[1:] for cells in
          ([c.strip() for c in line.strip('|').split('|')] for line in table[2:])}
  assert set(rows) == {*SF_TABLE, 'each role alone (local_only, nothing released)'}
  stds = []
  for row, specs in SF_TABLE.items():
    for cell, spec in zip(rows[row], specs):
      pooled, over_roles = _adapted(*spec), _adapted(*spec, key='test_accuracy')
      assert cell == f'{100 * np.mean(pooled):.2f} · {100 * np.mean(over_roles):.2f}', (row, spec)
      stds += [100 * np.std(pooled, ddof=1), 100 * np.std(over_roles, ddof=1)]
  local = _plain('local_only', 'default'), _plain('local_only', 'default', 'test_accuracy')
  assert rows['each role alone (local_only, nothing released)'] == [
      f'{100 * np.mean(local[0]):.2f} · {100 * np.mean(local[1]):.2f}', '', '']
  readme = _flat(text)
  assert f'seed stds ≤ {max(stds):.2f} points, {100 * np.std(local[1], ddof=1):.2f} for local_only' in readme
  assert max(stds) >= 100 * np.std(local[0], ddof=1)


def test_readme_shakespeare_claims_are_the_committed_runs(results_readme):
  # A head fine-tuned from FedAvg's: level against plain FedAvg, with and without privacy.
  gains = []
  for method, setting in (('fedavg', 'default'), ('dp_fedavg', 'eps=2'), ('dp_fedavg', 'eps=8')):
    label, d, _ = _rule(_adapted(method, setting, 'head'), _plain(method, setting))
    assert label == 'level'
    gains.append(_signed(d))
  assert (f'head adds {gains[0]} points without privacy, {gains[1]} at ε = 2 and {gains[2]} at '
          'ε = 8: level every time') in results_readme
  # Heads trained from scratch: hurt against FedAvg + head fine-tune.
  reference = _adapted('fedavg', 'default', 'head')
  d = {}
  for method in ('fedrep', 'p_fedsam'):
    for epochs in (10, 1):
      label, d[method, epochs], _ = _rule(_adapted(method, f'personal_epochs={epochs}', 'auto'),
                                          reference)
      assert label == 'hurts'
  assert f'{-d["fedrep", 10]:.1f}' == f'{-d["p_fedsam", 10]:.1f}'
  assert f'heads end {-d["fedrep", 10]:.1f} points under FedAvg + head fine-tune' in results_readme
  assert f'(−{-d["fedrep", 1]:.1f} and −{-d["p_fedsam", 1]:.1f} with 1 head epoch' in results_readme
  # One baseline: DP-FedAvg and DP-FedAvg-FT train identically (every field but the wall clock).
  for eps in (2, 8):
    for s in SEEDS:
      a, b = (_records(os.path.join(SF, 'runs', m, f'eps={eps}', f'seed={s}', 'train_metrics.jsonl'))
              for m in ('dp_fedavg', 'dp_fedavg_ft'))
      strip = lambda records: [{k: v for k, v in r.items() if k != 'seconds'} for r in records]
      assert len(a) == 1000 and strip(a) == strip(b), (eps, s)
  assert 'agree in every field of every round in all 6 pairs' in results_readme
  assert 'agree in every field of every round in all 6 pairs' in results_readme
  # DP2-FedSAM against the baseline, head against head: pooled and mean over roles.
  pooled, over_roles = {}, {}
  for eps in (2, 8):
    label, pooled[eps], _ = _rule(_adapted('dp2fedsam', f'eps={eps}', 'auto'),
                                  _adapted('dp_fedavg', f'eps={eps}', 'head'))
    assert label == 'hurts'
    label, over_roles[eps], _ = _rule(
        _adapted('dp2fedsam', f'eps={eps}', 'auto', 'test_accuracy'),
        _adapted('dp_fedavg', f'eps={eps}', 'head', 'test_accuracy'))
    assert label == 'hurts'
  assert (f'{_signed(pooled[2])} points pooled at ε = 2 and {_signed(pooled[8])} at ε = 8 with the '
          f'head fine-tuned on both sides; on the mean over roles the gap is {_signed(over_roles[2])} '
          f'and {_signed(over_roles[8])}') in results_readme
  # The whole-model fine-tune's increment on the same model, against the margin past the bar.
  full = {eps: 100 * (np.mean(_adapted('dp_fedavg_ft', f'eps={eps}', 'auto'))
                      - np.mean(_adapted('dp_fedavg', f'eps={eps}', 'head'))) for eps in (2, 8)}
  margin = -pooled[2] - 1.0
  assert full[2] > margin > 0
  assert (f'adds {_signed(full[2])} points at ε = 2 ({_signed(full[8])} at ε = 8) over the head '
          f'fine-tune of the same model: more than the {margin:.2f} points') in results_readme
  # At T = 1,000: the plain curves cross.
  ends = {}
  for eps in (2, 8):
    rounds, dp2 = _curve('dp2fedsam', f'eps={eps}')
    _, base = _curve('dp_fedavg', f'eps={eps}')
    gap = dict(zip(rounds, dp2 - base))
    assert gap[200] > 0 and gap[300] > 0 and all(gap[r] < 0 for r in rounds if r >= 400), eps
    ends[eps] = gap
  assert f'(by {-ends[8][400]:.2f} at ε = 8 there)' in results_readme
  assert (f'to {_signed(ends[2][1000])} (ε = 2) and {_signed(ends[8][1000])} (ε = 8) at round 1,000'
          in results_readme)
  rows = [(m, f'eps={e}') for m in ('dp2fedsam', 'centaur', 'dp_fedavg', 'dp_fedavg_ft') for e in (2, 8)]
  slopes = [_gain_per_100_rounds(*row) for row in rows]
  assert f'no row is flat ({min(slopes):.2f}-{max(slopes):.2f} points per 100 rounds' in results_readme
  # SAM on the body: level, positive on every seed.
  for eps in (2, 8):
    a, b = _adapted('dp2fedsam', f'eps={eps}', 'auto'), _adapted('centaur', f'eps={eps}', 'auto')
    label, d_sam, _ = _rule(a, b)
    per_seed = [100 * (x - y) for x, y in zip(a, b)]
    assert label == 'level' and min(per_seed) > 0
    assert (f'{_signed(d_sam)} ({_signed(min(per_seed))} to {_signed(max(per_seed))} on the 3 seeds) '
            f'at ε = 2' if eps == 2 else
            f'{_signed(d_sam)} ({_signed(min(per_seed))} to {_signed(max(per_seed))}) at ε = 8'
            ) in results_readme
  # Every private row against each role alone.
  local = _plain('local_only', 'default')
  private = [(m, f'eps={e}', p) for m, p in (('dp2fedsam', 'auto'), ('centaur', 'auto'),
                                              ('dp_fedavg', 'head'), ('dp_fedavg_ft', 'auto'))
             for e in (2, 8)]
  against_local = [_rule(_adapted(*row), local) for row in private]
  assert all(label == 'helps' for label, _, _ in against_local)
  lo, hi = min(d for _, d, _ in against_local), max(d for _, d, _ in against_local)
  assert f'(+{lo:.1f} to +{hi:.1f} points)' in results_readme


def test_readme_eps_with_the_tuning_is_the_committed_trials_and_run_composed(results_readme):
  """4.59 and 9.39: the committed study's 3 trials (each run's recorded sigma, q, T with the score's
  Gaussian) and one privacy-block run composed by PLD at delta 1/N, recomputed with dp_accounting
  from the config.json files (independently of shakespeare_field.epsilon_with_tuning)."""
  dp_accounting = pytest.importorskip('dp_accounting')

  def rounds(config):
    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        config['sampling_rate'], dp_accounting.GaussianDpEvent(config['dp']['noise_multiplier'])),
        config['num_rounds'])

  directory = os.path.join(SF, 'tuning', 'dp_fedavg_eps2')
  tuning = json.load(open(os.path.join(directory, 'tuning.json')))
  trials = [dp_accounting.ComposedDpEvent([
      rounds(json.load(open(os.path.join(directory, t['run'], 'config.json')))),
      dp_accounting.GaussianDpEvent(tuning['score_noise'])]) for t in tuning['trials']]
  assert len(trials) == 3
  with_tuning = {}
  for eps in (2, 8):
    run = json.load(open(os.path.join(SF, 'runs', 'dp2fedsam', f'eps={eps}', 'seed=0', 'config.json')))
    assert run['dp']['clipping'] == 'fixed' and run['dp']['noise_mechanism'] == 'independent'
    accountant = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    for event in [*trials, rounds(run)]:
      accountant.compose(event)
    with_tuning[eps] = accountant.get_epsilon(1 / run['num_clients'])
  assert (f'compose to ε = {with_tuning[2]:.2f} (δ = 1/N), {with_tuning[8]:.2f} for an ε = 8 row'
          in results_readme)
  assert f'Neither {with_tuning[2]:.2f} nor {with_tuning[8]:.2f} counts the other choices' in results_readme


TUNINGS = {  # study directory -> (K, tuner seed, n the score divides by)
    os.path.join(RESULTS, 'fmnist_tuning', 'runs', 'dp2fedsam'): (7, 0, 1000),
    os.path.join(RESULTS, 'fmnist_tuning', 'runs', 'dp_fedavg_ft'): (4, 1, 1000),
    os.path.join(SF, 'tuning', 'dp_fedavg_eps2'): (3, 0, 1063),
}


@pytest.mark.parametrize('directory', sorted(TUNINGS), ids=lambda d: os.path.basename(d))
def test_committed_tunings_release_their_exact_validation_sums(directory):
  """What makes the docs say no finite eps covers the committed tunings: the tuner seed is in
  tuning.json, so score * n - s * z gives back every trial's exact validation sum, and each trial's
  un-noised validation and test accuracy are listed beside it."""
  k, seed, n = TUNINGS[directory]
  tuning = json.load(open(os.path.join(directory, 'tuning.json')))
  assert tuning['private'] and tuning['plan']['seed'] == seed and len(tuning['trials']) == k
  for index, trial in enumerate(tuning['trials']):
    record = _records(os.path.join(directory, trial['run'], 'metrics.jsonl'))[-1]
    z = np.random.default_rng([seed, 2, index]).standard_normal()
    recovered = trial['score'] * n - tuning['score_noise'] * z
    assert recovered == pytest.approx(record['validation_accuracy_sum'], abs=1e-6)
    assert trial['metric'] == record['validation_accuracy']
    assert trial['test_accuracy'] == record['test_accuracy']


def test_docs_say_the_committed_tunings_are_covered_by_no_finite_epsilon(readme, results_readme):
  privacy = _flat(open(os.path.join(ROOT, 'docs', 'privacy.md')).read())
  assert 'No finite ε covers these committed searches' in results_readme
  assert 'the committed searches on this data are covered by no finite ε' in readme
  assert 'The committed search is covered by no finite ε' in results_readme
  assert 'all 7 and all 4 trials' in results_readme and '(all 3 trials' in results_readme
  assert "What the committed studies are covered by: no finite ε." in privacy
  assert 'gives back every trial\'s exact validation sum (all 14;' in privacy
  for text in (readme, results_readme, privacy):  # the sentences this replaced
    assert 'is the bound that holds' not in text
    assert 'the bound that holds for these committed studies' not in text
    assert "the papers' 5-value grid" not in text
  fm = {s: json.load(open(os.path.join(RESULTS, 'fmnist_tuning', 'runs', s, 'tuning.json')))
        for s in ('dp2fedsam', 'dp_fedavg_ft')}
  sf = json.load(open(os.path.join(SF, 'tuning', 'dp_fedavg_eps2', 'tuning.json')))
  assert fm['dp2fedsam']['selection_epsilon'] == fm['dp_fedavg_ft']['selection_epsilon']
  assert f"selection ε ({fm['dp2fedsam']['selection_epsilon']:.2f} for this trial law" in results_readme
  assert (f"selection ε ({fm['dp2fedsam']['selection_epsilon']:.3f} for this trial law, δ = 10⁻³); "
          f"with K published too, by the composition of the K trials "
          f"({fm['dp2fedsam']['naive_epsilon']:.3f} for K = {fm['dp2fedsam']['naive_trials']}, "
          f"{fm['dp_fedavg_ft']['naive_epsilon']:.3f} for K = {fm['dp_fedavg_ft']['naive_trials']})"
          in results_readme)
  assert (f"one trial with its score is ε {sf['per_trial_epsilon']:.3f}; Papernot & Steinke's bound "
          f"for the selection is {sf['selection_epsilon']:.3f} with K secret too; with K public, the "
          f"{sf['naive_trials']} trials composed: {sf['naive_epsilon']:.3f}") in results_readme


# Fashion-MNIST.

def _finals(setting_dir):
  return {int(p.rsplit('=', 1)[1]): _records(os.path.join(p, 'metrics.jsonl'))[-1]
          for p in sorted(glob.glob(os.path.join(setting_dir, 'seed=*')))}


def _fm(method, setting):
  finals = _finals(os.path.join(FMNIST, method, setting))
  assert all(r['round'] == 200 for r in finals.values())
  return [r['test_accuracy'] for r in finals.values()]


FM_NAMES = {'DP²-FedSAM': 'dp2fedsam', 'CENTAUR': 'centaur', 'DP-FedSAM-FT': 'dp_fedsam_ft',
            'DP-FedAvg-FT': 'dp_fedavg_ft', 'DP-FedSAM': 'dp_fedsam', 'DP-FedAvg': 'dp_fedavg'}


def test_readme_fashion_mnist_bold_is_where_the_rule_says_helps_against_every_row():
  table = readme_table(HAND_TUNED_FMNIST)
  columns = [c.strip().split('= ')[1] for c in table[0].strip('|').split('|')[1:]]
  bold, cells = set(), {}
  for line in table[2:]:
    row = [c.strip() for c in line.strip('|').split('|')]
    for eps, cell in zip(columns, row[1:]):
      if cell:
        cells[row[0], eps] = cell
        if cell.startswith('**'):
          bold.add((row[0], eps))
  winners = set()
  for eps in columns:
    present = [name for name, e in cells if e == eps]
    for name in present:
      if all(_rule(_fm(FM_NAMES[name], f'eps={eps}'), _fm(FM_NAMES[other], f'eps={eps}'))[0] == 'helps'
             for other in present if other != name):
        winners.add((name, eps))
  assert bold == winners == {('DP²-FedSAM', '0.25')}


def test_readme_fashion_mnist_claims_are_the_committed_runs(results_readme):
  def against(b, eps):
    return _rule(_fm('dp2fedsam', f'eps={eps}'), _fm(b, f'eps={eps}'))
  label, d, _ = against('centaur', '0.25')
  assert label == 'helps' and f'({_signed(d)} over CENTAUR, the nearest)' in results_readme
  label, d, _ = against('dp_fedsam_ft', '0.5')
  assert label == 'level' and (f'level with DP-FedSAM-FT ({_signed(d)}) and helps against the '
                              'others') in results_readme
  assert all(against(b, '0.5')[0] == 'helps' for b in ('centaur', 'dp_fedavg_ft'))
  level = {b: [against(b, e) for e in ('1', '2')] for b in ('centaur', 'dp_fedsam_ft')}
  helps = [against('dp_fedavg_ft', e) for e in ('1', '2')]
  assert all(l == 'level' for v in level.values() for l, _, _ in v)
  assert all(l == 'helps' for l, _, _ in helps)
  pair = lambda v: f'({_signed(v[0][1])}, {_signed(v[1][1])})'
  assert (f'level with CENTAUR {pair(level["centaur"])} and DP-FedSAM-FT {pair(level["dp_fedsam_ft"])} '
          f'and helps against DP-FedAvg-FT {pair(helps)}') in results_readme
  globals_ = [against(b, '1') for b in ('dp_fedsam', 'dp_fedavg')]
  assert all(l == 'helps' for l, _, _ in globals_)
  assert (f'({_signed(globals_[0][1])} over DP-FedSAM, {_signed(globals_[1][1])} over DP-FedAvg)'
          in results_readme)
  assert f'P-FedSAM reaches {100 * _fm("p_fedsam", "eps=inf")[0]:.2f} % (1 seed)' in results_readme
  # The collapses.
  fedavg = _finals(os.path.join(FMNIST, 'fedavg', 'eps=inf'))
  assert len(fedavg) == 1 and fedavg[0]['round'] == 200
  assert f'ends at {100 * fedavg[0]["test_accuracy"]:.2f} % (chance)' in results_readme
  assert f'(σ = 0, clipped) reaches {100 * _fm("dp_fedavg", "eps=inf")[0]:.2f} %' in results_readme
  bandmf = os.path.join(RESULTS, 'fmnist_bandmf_regime', 'runs')
  independent = _finals(os.path.join(bandmf, 'dp_fedavg_ft', 'default'))
  banded = _finals(os.path.join(bandmf, 'dp_fedavg_ft', 'bands=10,noise=banded'))
  assert all(r['round'] == 1000 for r in [*independent.values(), *banded.values()])
  assert (f'ends at {100 * independent[0]["test_accuracy"]:.2f} and '
          f'{100 * independent[1]["test_accuracy"]:.2f} % (2 seeds), '
          f'{100 * np.mean([r["test_accuracy"] for r in banded.values()]):.2f} % under BandMF'
          ) in results_readme
  dp2 = {m: np.mean([r['test_accuracy'] for r in _finals(os.path.join(bandmf, 'dp2fedsam', m)).values()])
         for m in ('default', 'bands=10,noise=banded')}
  assert (f'DP²-FedSAM gains {100 * (dp2["bands=10,noise=banded"] - dp2["default"]):.2f} points from '
          'BandMF there') in results_readme
  assert (f'({100 * np.mean(_fm("dp_fedavg_ft", "clip=adaptive,eps=1")):.2f} % at ε = 1, '
          f'{100 * np.mean(_fm("dp_fedavg_ft", "clip=adaptive,eps=0.25")):.2f} % at ε = 0.25)'
          ) in results_readme
  # The tuned runs against the hand-tuned ones.
  tuned = {}
  for study in ('dp2fedsam', 'dp_fedavg_ft'):
    tuning = json.load(open(os.path.join(RESULTS, 'fmnist_tuning', 'runs', study, 'tuning.json')))
    tuned[study] = next(t for t in tuning['trials'] if t['run'] == tuning['selected_run'])['test_accuracy']
  gaps = {s: 100 * (np.mean(_fm(s, 'eps=1')) - tuned[s]) for s in tuned}
  assert (f'reaches {100 * tuned["dp2fedsam"]:.2f} % (DP²-FedSAM) and {100 * tuned["dp_fedavg_ft"]:.2f} % '
          f'(DP-FedAvg-FT), one seed each, within {gaps["dp2fedsam"]:.2f} and '
          f'{gaps["dp_fedavg_ft"]:.2f} points') in results_readme


def test_results_readme_shakespeare_verdicts_are_the_committed_runs(results_readme):
  text = results_readme
  local = _plain('local_only', 'default')
  assert f'local_only** ({100 * np.mean(local):.2f} %)' in text
  for eps in (2, 8):
    dp2 = _adapted('dp2fedsam', f'eps={eps}', 'auto')
    dp2_roles = _adapted('dp2fedsam', f'eps={eps}', 'auto', 'test_accuracy')
    head, full = _adapted('dp_fedavg', f'eps={eps}', 'head'), _adapted('dp_fedavg_ft', f'eps={eps}', 'auto')
    d_head, d_full = _rule(dp2, head)[1], _rule(dp2, full)[1]
    roles = [_rule(dp2_roles, _adapted(m, f'eps={eps}', p, 'test_accuracy'))
             for m, p in (('dp_fedavg', 'head'), ('dp_fedavg_ft', 'auto'))]
    assert all(label == 'hurts' for label, _, _ in roles)
    if eps == 2:
      assert (f'd = {_signed(d_head)} points pooled with the head fine-tuned on both sides, '
              f'{_signed(d_full)} against its whole-model fine-tune. On the mean over roles the gaps '
              f'are {_signed(roles[0][1])} and {_signed(roles[1][1])} (both *hurts*)') in text
    else:
      assert (f'd = {_signed(d_head)} points pooled head against head, {_signed(d_full)} against its '
              f'whole-model fine-tune; {_signed(roles[0][1])} and {_signed(roles[1][1])} on the mean '
              'over roles') in text
      per_head = [100 * (y - x) for x, y in zip(dp2, head)]
      per_full = [100 * (y - x) for x, y in zip(dp2, full)]
      assert f'by {min(per_head):.2f}-{max(per_head):.2f} points head against head' in text
      assert f'and {min(per_full):.2f}-{max(per_full):.2f} against the whole-model fine-tune' in text
    centaur = _adapted('centaur', f'eps={eps}', 'auto')
    seeds = ', '.join(_signed(100 * (x - y)) for x, y in zip(dp2, centaur))
    assert f'positive on every seed ({seeds}' in text
    rounds, a = _curve('dp2fedsam', f'eps={eps}')
    gap = dict(zip(rounds, a - _curve('dp_fedavg', f'eps={eps}')[1]))
    if eps == 2:
      assert (f'DP-FedAvg leads at round 100 ({_signed(-gap[100])}), DP²-FedSAM at rounds 200 and 300 '
              f'({_signed(gap[200])}, {_signed(gap[300])}), DP-FedAvg again from round 400 '
              f'({_signed(gap[400])}) to 1,000 ({_signed(gap[1000])})') in text
      slopes = [_gain_per_100_rounds(m, 'eps=2') for m in ('dp_fedavg', 'dp_fedavg_ft', 'dp2fedsam')]
      assert (f'DP-FedAvg gains {slopes[0]:.2f}, DP-FedAvg-FT {slopes[1]:.2f} and DP²-FedSAM '
              f'{slopes[2]:.2f} points per 100 rounds') in text
    else:
      assert (f'leads at rounds 200 and 300 ({_signed(gap[200])}, {_signed(gap[300])}), is level at 400 '
              f'({_signed(gap[400])}) and trails from 500 to 1,000 ({_signed(gap[1000])})') in text
      slopes = [_gain_per_100_rounds(m, 'eps=8') for m in ('dp_fedavg', 'dp_fedavg_ft', 'dp2fedsam',
                                                          'centaur')]
      assert f'{slopes[2]:.2f}' == f'{slopes[3]:.2f}'
      assert (f'({slopes[0]:.2f} and {slopes[1]:.2f} points per 100 rounds, against {slopes[2]:.2f} for '
              'both personal-head rows)') in text
  increments = [100 * (np.mean(_adapted('dp_fedavg_ft', f'eps={e}', 'auto'))
                       - np.mean(_adapted('dp_fedavg', f'eps={e}', 'head'))) for e in (2, 8)]
  assert (f'which adds {_signed(increments[0])} points pooled at ε = 2 ({_signed(increments[1])} at '
          'ε = 8) over the head fine-tune of the same models') in text
  pooled = [-_rule(_adapted('dp2fedsam', f'eps={e}', 'auto'), _adapted('dp_fedavg', f'eps={e}', 'head'))[1]
            for e in (2, 8)]
  roles = [-_rule(_adapted('dp2fedsam', f'eps={e}', 'auto', 'test_accuracy'),
                  _adapted('dp_fedavg', f'eps={e}', 'head', 'test_accuracy'))[1] for e in (2, 8)]
  no_privacy = -_rule(_adapted('p_fedsam', 'personal_epochs=10', 'auto', 'test_accuracy'),
                      _adapted('fedavg', 'default', 'head', 'test_accuracy'))[1]
  assert (f'to {pooled[0]:.2f}-{pooled[1]:.2f}; on the mean over roles it stays at '
          f'{roles[0]:.1f}-{roles[1]:.1f} ({no_privacy:.1f} without privacy)') in text
  head_gain = _rule(_adapted('fedavg', 'default', 'head'), _plain('fedavg', 'default'))
  assert head_gain[0] == 'level'
  assert (f'(FedAvg + head fine-tune against plain FedAvg: {_signed(head_gain[1])}, '
          f's = {head_gain[2]:.2f}) is *level*') in text


def test_results_readme_states_the_shakespeare_score_denominator(results_readme):
  """The score divides by N = 1,063 while fewer roles have validation rows."""
  directory = os.path.join(SF, 'tuning', 'dp_fedavg_eps2')
  tuning = json.load(open(os.path.join(directory, 'tuning.json')))
  records = [_records(os.path.join(directory, t['run'], 'metrics.jsonl'))[-1] for t in tuning['trials']]
  clients = {int(r['validation_clients']) for r in records}
  assert len(clients) == 1
  (n_val,) = clients
  ratios = [t['score'] / r['validation_accuracy'] for t, r in zip(tuning['trials'], records)]
  assert (f'while {n_val} roles have validation rows: the un-noised score is {n_val}/1,063 = '
          f'{n_val / 1063:.2f} × their mean validation accuracy (the noised scores above are '
          f'{min(ratios):.2f}-{max(ratios):.2f} × it)') in results_readme


def test_readme_heads_trained_from_scratch_over_fit(results_readme):
  """FedRep's and P-FedSAM's (10 head epochs) train loss over the last 50 rounds and test loss at
  round 1,000, over methods and seeds."""
  train, test = [], []
  for method in ('fedrep', 'p_fedsam'):
    for s in SEEDS:
      run = os.path.join(SF, 'runs', method, 'personal_epochs=10', f'seed={s}')
      losses = [r['train_loss'] for r in _records(os.path.join(run, 'train_metrics.jsonl'))]
      train.append(np.mean(losses[-50:]))
      test.append(_records(os.path.join(run, 'metrics.jsonl'))[-1]['test_loss'])
  assert (f'(train loss {min(train):.2f}-{max(train):.2f} over the last 50 rounds, test '
          f'{min(test):.2f}-{max(test):.2f})') in results_readme


def _decimals(text: str) -> set[str]:
  """The decimal numbers a text states, as written (the sign a Unicode minus or +)."""
  return set(re.findall(r'[+−]?\d+\.\d+', text))


def _prose_numbers(text: str) -> set[str]:
  """The decimal numbers a text states outside its tables."""
  return _decimals(' '.join(line for line in text.split('\n') if not line.startswith('|')))


def test_every_number_the_readme_results_state_is_one_of_the_full_sections(results_readme):
  """README.md's Results section shortens experiments/results/README.md's first section: each
  number its prose states (the tables are held by the tests above and tests/test_report.py) must
  be one the full section states, itself held to the runs here."""
  text = open(os.path.join(ROOT, 'README.md')).read().split('\n## Results\n')[1].split('\n## ')[0]
  full = open(os.path.join(RESULTS, 'README.md')).read()
  full = full.split("## The README's results in full")[1].split('\n## ')[0]
  missing = _prose_numbers(text) - _decimals(full)
  assert not missing, f'README numbers the full section does not state: {sorted(missing)}'


def test_the_committed_searches_spread_is_what_the_docs_say(readme, results_readme):
  """max − min of the trials' test accuracy in each committed tuning.json that lists its trials."""
  spreads = {}
  for path in sorted(glob.glob(os.path.join(RESULTS, '**', 'tuning.json'), recursive=True)):
    trials = json.load(open(path)).get('trials', [])
    accuracy = [t['test_accuracy'] for t in trials if t.get('test_accuracy') is not None]
    if accuracy:  # a search drawn from a secret publishes no trial (the fair benchmark's)
      spreads[os.path.relpath(os.path.dirname(path), RESULTS)] = (
          len(accuracy), 100 * (max(accuracy) - min(accuracy)))
  lo, hi = min(s for _, s in spreads.values()), max(s for _, s in spreads.values())
  assert f'move a method\'s accuracy by {lo:.2f}–{hi:.2f} points' in readme
  assert f"move a method's accuracy by {lo:.2f}–{hi:.2f} points" in results_readme
  for name, label in (('fmnist_tuning/runs/dp2fedsam', 'DP²-FedSAM'),
                      ('fmnist_tuning/runs/dp_fedavg_ft', 'DP-FedAvg-FT'),
                      ('shakespeare_field/tuning/fedavg', 'FedAvg'),
                      ('shakespeare_field/tuning/dp_fedavg_eps2', 'DP-FedAvg')):
    count, spread = spreads[name]
    assert f'{label} {spread:.2f} over {count}' in results_readme, name


A5 = os.path.join(RESULTS, 'fair_a5_dp2fedsam')


def _a5_accuracies(method, adapt=None):
  """Test accuracy (%) of the (a5) row's 3 final seeds: as run, or re-evaluated with
  adapt = (head epochs, lr) by experiments.evaluate."""
  finals = os.path.join(A5, 'runs', method, 'final')
  if adapt is None:
    return 100 * np.asarray([r['test_accuracy'] for r in _finals(finals).values()])
  out = []
  for s in SEEDS:
    run = os.path.join(finals, f'seed={s}')
    [record] = [r for r in _records(os.path.join(run, 'evaluations.jsonl'))
                if r['eval.adapt_part'] == 'head' and r['eval.head_init'] == 'own'
                and (r['eval.adapt_epochs'], r['eval.adapt_lr']) == adapt]
    out.append(record['test_accuracy'])
  return 100 * np.asarray(out)


def _mean_std(accuracies) -> str:
  return f'{accuracies.mean():.2f} ± {accuracies.std(ddof=1):.2f}'


def test_results_readme_a5_stale_heads_are_the_committed_runs_and_reevaluations(results_readme):
  """Block (a5)'s DP²-FedSAM seed 0: its replay is the same training, its curve, and the head
  re-fits on the final extractor (experiments.evaluate) of both personal-head rows."""
  replay = os.path.join(A5, 'diagnostics', 'dp2fedsam_seed0_eval_every5')
  run = os.path.join(A5, 'runs', 'dp2fedsam', 'final', 'seed=0')
  strip = lambda rs: [{k: v for k, v in r.items() if k != 'seconds'} for r in rs]
  train = _records(os.path.join(replay, 'train_metrics.jsonl'))
  assert len(train) == 200
  assert strip(train) == strip(_records(os.path.join(run, 'train_metrics.jsonl')))
  curve = _records(os.path.join(replay, 'metrics.jsonl'))
  peak = max(curve, key=lambda r: r['test_accuracy'])
  lowest = min(curve, key=lambda r: r['test_loss'])
  assert (f'is highest at round {peak["round"]} ({100 * peak["test_accuracy"]:.2f} %), then falls '
          f'gradually to {100 * curve[-1]["test_accuracy"]:.2f} % at round 200, its test loss '
          f'rising from {lowest["test_loss"]:.3f} (round {lowest["round"]}) to '
          f'{curve[-1]["test_loss"]:.3f} while its train loss keeps falling '
          f'({np.mean([r["train_loss"] for r in train[-50:]]):.3f} over the last 50 rounds)'
          ) in results_readme
  ours, theirs = _a5_accuracies('dp2fedsam'), _a5_accuracies('centaur')
  assert (f'DP²-FedSAM ends at {_mean_std(ours)} % (seeds {ours[0]:.2f}, {ours[1]:.2f} and '
          f'{ours[2]:.2f}), CENTAUR at {_mean_std(theirs)}') in results_readme
  heads = {}  # each row's head phase (epochs, lr) and that lr decayed to the last round
  for m in ('dp2fedsam', 'centaur'):
    with open(os.path.join(A5, 'runs', m, 'final', 'seed=0', 'config.json')) as f:
      config = json.load(f)
    local = config['local']
    assert (local['lr_decay'], config['num_rounds']) == (0.99, 200)  # "lr × 0.99^200"
    decayed = float(f"{local['lr_personal'] * local['lr_decay'] ** config['num_rounds']:.4g}")
    heads[m] = (local['personal_epochs'], local['lr_personal'], decayed)
  refit = {m: _a5_accuracies(m, (epochs, decayed)) for m, (epochs, _, decayed) in heads.items()}
  _, d_run, s_run = _rule(ours / 100, theirs / 100)
  _, d_refit, s_refit = _rule(refit['dp2fedsam'] / 100, refit['centaur'] / 100)
  a, b = refit['dp2fedsam'], refit['centaur']
  assert (f'gives DP²-FedSAM {a[0]:.2f} / {a[1]:.2f} / {a[2]:.2f} ({_mean_std(a)}; seed 0 '
          f'{_signed(a[0] - ours[0])}) and CENTAUR {b[0]:.2f} / {b[1]:.2f} / {b[2]:.2f} '
          f'({_mean_std(b)}): the gap stays, {_signed(d_refit)} points (s = {s_refit:.2f}) against '
          f'{_signed(d_run)} (s = {s_run:.2f}) as run') in results_readme
  undecayed = [_a5_accuracies(m, (epochs, lr)) for m, (epochs, lr, _) in heads.items()]
  long = [_a5_accuracies(m, (10, 0.01)) for m in ('dp2fedsam', 'centaur')]
  assert (f'without its round decay ({_mean_std(undecayed[0])} and {_mean_std(undecayed[1])}) '
          f'and 10 epochs at lr 0.01 ({_mean_std(long[0])} and {_mean_std(long[1])})'
          ) in results_readme
  for i, method in enumerate(('dp2fedsam', 'centaur')):  # "do worse than this one"
    assert max(undecayed[i].mean(), long[i].mean()) < refit[method].mean()


def _finals_curves(method):
  """{round: test accuracy} of each final seed of an (a5) row."""
  finals = os.path.join(A5, 'runs', method, 'final')
  return [{r['round']: r['test_accuracy']
           for r in _records(os.path.join(finals, f'seed={s}', 'metrics.jsonl'))} for s in SEEDS]


def _finals_train(method):
  """The train_metrics.jsonl records of each final seed of an (a5) row."""
  finals = os.path.join(A5, 'runs', method, 'final')
  return [_records(os.path.join(finals, f'seed={s}', 'train_metrics.jsonl')) for s in SEEDS]


SWAPS = {  # diagnostic folder: (its method, the row whose selected values it runs at)
    'dp_fedsam_ft_at_dp_fedavg_ft_values_seed0': ('dp_fedsam_ft', 'dp_fedavg_ft'),
    'dp_fedavg_ft_at_dp_fedsam_ft_values_seed0': ('dp_fedavg_ft', 'dp_fedsam_ft'),
}


def test_results_readme_a5_fine_tuned_rows_gap_is_the_committed_runs_and_swaps(results_readme):
  """Block (a5)'s DP-FedAvg-FT row (its early divergence, its published K) and the seed-0 runs of
  each -FT row at the other's selected values (diagnostics/)."""
  finals = os.path.join(A5, 'runs', 'dp_fedavg_ft', 'final')
  fedavg, fedsam = _a5_accuracies('dp_fedavg_ft'), _a5_accuracies('dp_fedsam_ft')
  assert (f'DP-FedAvg-FT ends at {_mean_std(fedavg)} % (seeds {fedavg[0]:.2f}, {fedavg[1]:.2f} and '
          f'{fedavg[2]:.2f}), {_signed(fedavg.mean() - fedsam.mean())} points over DP-FedSAM-FT '
          f'({_mean_std(fedsam)})') in results_readme
  with open(os.path.join(A5, 'runs', 'dp_fedavg_ft', 'tuning.json')) as f:
    tuning = json.load(f)
  assert (f'drew K = {tuning["num_trials"]}, above E[K] = {tuning["expected_trials"]:g}: the tuner '
          f'publishes it because it sets the bound (ε {tuning["epsilon_bound"]:.3f} for the search,'
          ) in results_readme
  early, tested = [], []
  for s, train in zip(SEEDS, _finals_train('dp_fedavg_ft')):
    evals = {r['round']: r for r in _records(os.path.join(finals, f'seed={s}', 'metrics.jsonl'))}
    early.append(sum(r['nonfinite_clients'] for r in train if r['round'] <= 50))
    tested.append(int(evals[50]['test_nonfinite_clients']))
    assert all(r['nonfinite_clients'] == 0 for r in train if r['round'] >= 150)  # "none from 150 on"
    assert evals[150]['test_nonfinite_clients'] == evals[200]['test_nonfinite_clients'] == 0
  assert (f'{early[0]} / {early[1]} / {early[2]} client updates non-finite in rounds 1-50'
          ) in results_readme
  assert f'{tested[0]} / {tested[1]} / {tested[2]} clients\' test-time fine-tunes' in results_readme
  own = {'dp_fedavg_ft': fedavg[0], 'dp_fedsam_ft': fedsam[0]}
  swapped = {}
  for folder, (method, values_of) in SWAPS.items():
    swap = os.path.join(A5, 'diagnostics', folder)
    ran, partner = (flat_config(os.path.join(p, 'config.json')) for p in
                    (swap, os.path.join(A5, 'runs', values_of, 'final', 'seed=0')))
    differ = differing_fields(ran, partner)
    assert ran['method'] == method and differ <= {'method', 'local.sam_rho'}, differ
    [last] = _records(os.path.join(swap, 'metrics.jsonl'))[-1:]
    assert last['round'] == 200
    name = {code: shown for shown, code in FM_NAMES.items()}
    assert (f'{name[method]} at {name[values_of]}\'s values ends at '
            f'{100 * last["test_accuracy"]:.2f} % (as selected: {own[method]:.2f})'
            ) in results_readme
    swapped[method] = 100 * last['test_accuracy']
  avg, sam_ft = 'dp_fedavg_ft', 'dp_fedsam_ft'
  values = sorted([own[avg] - swapped[avg], swapped[sam_ft] - own[sam_ft]])  # same method
  sam = sorted([own[avg] - swapped[sam_ft], swapped[avg] - own[sam_ft]])  # same values
  assert (f'Of seed 0\'s {own["dp_fedavg_ft"] - own["dp_fedsam_ft"]:.2f} points, the values account for '
          f'{values[0]:.2f}-{values[1]:.2f} and SAM (ρ 0.1747) for {sam[0]:.2f}-{sam[1]:.2f}'
          ) in results_readme
  gains = []  # over the last 50 rounds, every seed of both rows
  for method in ('dp_fedavg_ft', 'dp_fedsam_ft'):
    for r in _finals_curves(method):
      gains.append(100 * (r[200] - r[150]))
  assert f'all six runs still gain {min(gains):.2f}-{max(gains):.2f} points' in results_readme


def test_results_readme_a5_global_model_searches_found_nothing_that_trains(results_readme):
  """Block (a5)'s DP-FedSAM and DP-FedAvg rows: their searches' best noised scores, their seeds,
  their train losses, and the noise their selected values put into each weight against block (a)'s
  selections and the declared ranges."""
  rows, scores, finals = ('dp_fedsam', 'dp_fedavg'), [], []
  for row in rows:
    with open(os.path.join(A5, 'runs', row, 'tuning.json')) as f:
      tuning = json.load(f)
    assert tuning['score_noise'] / tuning['score_denominator'] == 0.01  # "std is 1 point"
    scores.append(100 * tuning['selected_score'])
    finals.append(_a5_accuracies(row))
  text = results_readme
  assert (f"DP-FedSAM's best noised validation score is {scores[0]:.2f} % and DP-FedAvg's "
          f'{scores[1]:.2f} %') in text
  assert (f'Their selections end at {_mean_std(finals[0])} % (seeds ' + ', '.join(
      f'{a:.2f}' for a in finals[0][:2]) + f' and {finals[0][2]:.2f}) and {_mean_std(finals[1])} % '
          '(seeds ' + ', '.join(f'{a:.2f}' for a in finals[1][:2]) + f' and {finals[1][2]:.2f})'
          ) in text
  curves = {row: _finals_curves(row) for row in rows}
  highest = max(100 * a for row in rows for c in curves[row] for a in c.values())
  assert f'no evaluation of either above {highest:.2f} %' in text
  assert all(max(c, key=c.get) in (50, 100) for c in curves['dp_fedsam'])  # "peak by round 100"
  assert ('(' + ' / '.join(f'{100 * c[50]:.2f}' for c in curves['dp_fedsam']) + ' % at round 50)'
          ) in text
  above, losses, snr = [], {}, []
  for row in rows:
    losses[row] = []
    for train in _finals_train(row):
      above.append(next(r['round'] for r in train if r['train_loss'] > np.log(10)))
      losses[row].append(max(r['train_loss'] for r in train))
      snr += [r['signal_to_noise'] for r in train]
  assert f"passes chance's ln 10 by round {max(above)}" in text
  assert ('(highest: DP-FedSAM ' + ' / '.join(f'{h:.2f}' for h in losses['dp_fedsam'])
          + ', DP-FedAvg ' + ' / '.join(f'{h:.2f}' for h in losses['dp_fedavg']) + ')') in text
  assert f'stays {min(snr):.4f}-{max(snr):.4f}' in text
  ours, theirs = ([server_noise_per_weight(os.path.join(RESULTS, block, 'runs', row, 'final', 'seed=0'))
                   for row in rows] for block in ('fair_a5_dp2fedsam', 'fair_a_dp2fedsam'))
  assert (f'noise of std {ours[0]:.4f} and {ours[1]:.4f} into every weight each round (server lr × '
          f'σC/(qN), no momentum), {ours[0] / theirs[0]:.2f} and {ours[1] / theirs[1]:.2f} times what '
          f"block (a)'s DP-FedSAM and DP-FedAvg selections trained at ({theirs[0]:.4f} and "
          f'{theirs[1]:.4f})') in text
  config = flat_config(os.path.join(A5, 'runs', 'dp_fedavg', 'final', 'seed=0', 'config.json'))
  z = noise_per_server_lr_and_clip(config)
  ranges = fair_a5_dp2fedsam.BLOCK.ranges
  share = _fair.product_at_most(ranges['server_lr'], ranges['dp.clip_norm'], max(theirs) / z)
  assert (f'{100 * share:.1f} % of the draws from the declared ranges of server lr and C give at '
          f'most {max(theirs):.4f}') in text
  sam, ft, ours_row, avg = (_a5_accuracies(m).mean()
                            for m in ('dp_fedsam', 'dp_fedsam_ft', 'dp2fedsam', 'dp_fedavg'))
  assert (f'DP²-FedSAM {_signed(ours_row - sam)} and DP-FedSAM-FT {_signed(ft - sam)} over DP-FedSAM '
          f'hold, and DP-FedSAM > DP-FedAvg is contradicted ({_signed(sam - avg)})') in _flat(text)


def _section(text: str, start: str) -> str:
  """The bullet of a flattened text that starts with `start`, up to the next bullet."""
  return text.split(start, 1)[1].split(' - **', 1)[0]


def test_results_readme_a5_verdict_bullets_are_the_committed_page_and_runs(results_readme):
  """Block (a5)'s verdict, convergence and clipping bullets: the tally and every d from the
  committed page's claims table, the ceiling from its page, the gains and clip rates from the runs."""
  with open(os.path.join(A5, 'results.md')) as f:
    page = f.read()
  assert "Applied: **the ceiling's search failed" in page
  table = page.split("### The paper's claims")[1].split("### The README's table")[0]
  claims = [line.split(' | ') for line in table.split('\n') if ' > ' in line.split(' | ')[0]]
  verdicts = [c[4] for c in claims]
  bullet = _section(results_readme, "- **The ceiling's search failed: no verdict on the paper's order.** ")
  assert (f'As measurements, {verdicts.count("holds")} of the paper\'s {len(claims)} claims hold, '
          f'{verdicts.count("level")} are level, {verdicts.count("contradicted")} contradicted.'
          ) in bullet
  for c in claims:  # every claim's d, as the page gives it
    assert c[2].replace('-', '−') in bullet, c
  ceiling_dir = os.path.join(A5, 'runs', 'ceiling_p_fedsam')
  [trial] = glob.glob(os.path.join(ceiling_dir, 'trial=*'))  # the selected one, as published
  train = _records(os.path.join(trial, 'train_metrics.jsonl'))
  assert f'diverged in round 1 (train loss {train[0]["train_loss"]:,.0f}' in bullet
  assert [r['round'] for r in train if r['mean_update_norm'] == 0][0] == 3
  assert all(r['mean_update_norm'] == 0 for r in train[2:])  # "0 from round 3 on"
  final = _records(os.path.join(ceiling_dir, 'final', 'seed=0', 'train_metrics.jsonl'))
  assert 1.05e10 <= final[0]['train_loss'] < 1.15e10
  assert '(round-1 train loss 1.1 × 10¹⁰)' in bullet
  ceiling = float(page.split('Non-private ceiling ')[1].split(' %')[0])
  best = max(_a5_accuracies(m).mean() for m in FM_NAMES.values())
  assert best == _a5_accuracies('centaur').mean() > ceiling
  assert (f'ends at {ceiling:.2f} %, under the best private row (CENTAUR, {best:.2f} %)') in bullet
  _, d, s = _rule(_a5_accuracies('dp2fedsam') / 100, _a5_accuracies('centaur') / 100)
  assert f'(−{-d:.2f}, s = {s:.2f}: {max(1, 2 * s) + d:.2f} short of "hurts")' in bullet
  a5_text = results_readme.split('**Fashion-MNIST (1000, 5), each method tuned under one budget**')[1]
  convergence = _section(a5_text, '- **Convergence and clipping at T = 200** ')
  names = {code: shown for shown, code in FM_NAMES.items()}
  gains = {}
  for method in FM_NAMES.values():
    curves = _finals_curves(method)
    gains[method] = 100 * (np.mean([c[200] for c in curves]) - np.mean([c[150] for c in curves]))
  order = sorted(gains, key=gains.get, reverse=True)
  assert (', '.join(f'{names[m]} {_signed(gains[m])}' for m in order[:-1])
          + f' and {names[order[-1]]} {_signed(gains[order[-1]])}') in convergence
  low = {}
  for method in FM_NAMES.values():
    rates = [r['clipped_fraction'] for train in _finals_train(method) for r in train[-50:]]
    low[method] = min(rates)
    assert max(rates) == 1.0
  training = ('dp2fedsam', 'centaur', 'dp_fedsam_ft', 'dp_fedavg_ft')
  assert f'at least {100 * min(low[m] for m in training):.1f} % of the clients' in convergence
  assert (f'on {100 * low["dp_fedsam"]:.0f}-100 % for DP-FedSAM and {100 * low["dp_fedavg"]:.0f}-100 % '
          'for DP-FedAvg') in convergence


def test_results_readme_a5_ceiling_diagnostic_is_block_a_values_on_a5(readme, results_readme):
  """The (a5) ceiling diagnostic: (a5)'s ceiling final run with block (a)'s ceiling's selected
  values, nothing else changed; its final accuracy as both READMEs state it."""
  diag = os.path.join(A5, 'diagnostics', 'ceiling_p_fedsam_at_block_a_values_seed0')
  ran = flat_config(os.path.join(diag, 'config.json'))
  final = flat_config(os.path.join(A5, 'runs', 'ceiling_p_fedsam', 'final', 'seed=0', 'config.json'))
  with open(os.path.join(RESULTS, 'fair_a_dp2fedsam', 'runs', 'ceiling_p_fedsam', 'tuning.json')) as f:
    block_a_values = json.load(f)['selected_values']
  differ = differing_fields(ran, final)
  assert differ == set(block_a_values), differ
  assert all(ran[k] == v for k, v in block_a_values.items())
  [last] = _records(os.path.join(diag, 'metrics.jsonl'))[-1:]
  assert last['round'] == 200
  reached, best = 100 * last['test_accuracy'], _a5_accuracies('centaur').mean()
  assert (f"non-private P-FedSAM at block (a)'s ceiling's selected values (seed 0) reaches "
          f'{reached:.2f} % on this split, {reached - best:.2f} points above CENTAUR') in results_readme
  assert f'P-FedSAM reaches {reached:.2f} %' in readme


# Block (d): experiments/results/fair_d_shakespeare, against the hand-tuned rows of shakespeare_field.
D = os.path.join(RESULTS, 'fair_d_shakespeare')
D_NAMES = {'dp2fedsam': 'DP²-FedSAM', 'centaur': 'CENTAUR', 'dp_fedavg': 'DP-FedAvg'}
# Each searched row's hand-tuned twin at eps = 2: (method, the adaptation of the README's table).
D_HAND_TUNED = {'dp2fedsam': ('dp2fedsam', 'auto'), 'centaur': ('centaur', 'auto'),
                'dp_fedavg': ('dp_fedavg', 'head')}


def _block(letter: str):
  """(block, {row: RowResult}, {row: (search eps, with a run, published K)}) of a block's
  committed files."""
  path, module, block = fair_benchmark.load_block(letter)
  results = fair_report.read_block(
      os.path.join(fair_benchmark.published_dir(RESULTS, letter), 'runs'), block)
  return block, results, fair_benchmark.row_epsilons(path, module, block, results)


def _block_that_tests(letter: str, names: dict, results_readme: str, heading: str):
  """A complete block whose regime rule says "test", and its section of experiments/results/
  README.md (from `heading` on): every row at 3 seeds, and the section's first bullet naming the
  best private row's distance to the ceiling, the tally of the paper's claims and each claim's d, s
  and verdict. Returns (block, results, epsilons, means in points, the section, the verdicts)."""
  block, results, epsilons = _block(letter)
  means = {n: 100 * results[n].stats[0] for n in names}
  assert all(results[n].stats[2] == 3 for n in names)
  ceiling = fair_benchmark.ceiling_accuracy(letter, RESULTS)
  assert fair_report.regime(block, results, ceiling) == 'test'
  text = results_readme.split(heading)[1]
  best = max(means, key=means.get)
  rule = _section(text, '- **The regime rule says test.** ')
  assert (f'the best private row ({names[best]}, {means[best]:.2f} %) is '
          f'{ceiling - means[best]:.2f} points under') in rule
  entries = fair_report.verdicts(block, results)
  verdicts = [e['verdict'] for e in entries]
  assert (f"Of the paper's {len(entries)} claims here {verdicts.count('holds')} hold, "
          f"{verdicts.count('level')} level, {verdicts.count('contradicted')} contradicted") in rule
  for e in entries:
    assert (f"{names[e['better'].name]} over {names[e['worse'].name]} {_signed(e['d'])} "
            f"(s = {e['s']:.2f}, {e['verdict']})") in rule, e
  return block, results, epsilons, means, text, entries


def test_results_readme_block_d_bullets_are_its_committed_runs(results_readme):
  """Block (d)'s bullets: the rule's outcome and every claim's d and s, the drop from each row's
  hand-tuned twin and the selected lr products, the last rounds' loss and clip, and each search's K
  and eps, all recomputed from the committed runs and searches."""
  block, results, epsilons, means, text, _ = _block_that_tests(
      'd', D_NAMES, results_readme, '**Shakespeare, each method tuned under one budget**')
  hand = _section(text, '- **Under the hand-tuned rows.** ')
  for name, (method, part) in D_HAND_TUNED.items():
    twin = 100 * np.mean(_adapted(method, 'eps=2', part))
    assert f'{D_NAMES[name]} {twin:.2f} → {means[name]:.2f}' in hand, name
    selected = results[name].selected
    assert f"{D_NAMES[name]} {selected['local.lr_shared'] * selected['server_lr']:.3f}" in hand
  ends = _section(text, '- **Convergence and clipping at T = 1,000** ')
  for name in D_NAMES:
    end = fair_report.run_ends(results[name], block.metric)
    assert end['loss_last'] < end['loss_before']  # "still falling"
    assert f"{D_NAMES[name]} {end['loss_before']:.4f} → {end['loss_last']:.4f}" in ends, name
    assert f"{D_NAMES[name]} {end['clipped_fraction']:.2f}" in ends, name
  draws = _section(text, '- **The same law, different draws.** ')
  for name in D_NAMES:
    _, with_run, k = epsilons[name]
    knobs = len(block.space(block.row(name)))
    assert f'{D_NAMES[name]} K = {k} ({knobs} knobs, ε {with_run:.2f} with a run)' in draws, name


C_NAMES = {'dp_pfeddsu': 'DP-pFedDSU', 'dp_pfeddsu_safe': 'DP-pFedDSU (covered)', 'centaur': 'CENTAUR',
           'ppsgd': 'PPSGD', 'pmtl_ft': 'PMTL-FT', 'dp_fedavg_fb': 'DP-FedAvg-fb'}


def _c_final_runs(row):
  return [os.path.join(fair_benchmark.published_dir(RESULTS, 'c'), 'runs', row, 'final', f'seed={s}')
          for s in SEEDS]


def test_results_readme_block_c_bullets_are_its_committed_runs(readme, results_readme):
  """Block (c)'s bullets: the rule's outcome and every claim's d and s, the covered form's cost, the
  same CENTAUR study's two searches, DP-FedAvg-fb's divergence, the last rounds' loss, gain and clip,
  and the searches' eps and edges, all recomputed from the committed runs and searches; the
  README's bullets give the same tally."""
  block, results, epsilons, means, text, entries = _block_that_tests(
      'c', C_NAMES, results_readme,
      "**Fashion-MNIST (1000, 5), DP-pFedDSU's rows tuned under one budget**")
  verdicts = [e['verdict'] for e in entries]
  ceiling = {r['round']: r['test_accuracy'] for r in _records(os.path.join(
      A5, 'diagnostics', 'ceiling_p_fedsam_at_block_a_values_seed0', 'metrics.jsonl'))}
  assert 100 * ceiling[200] == pytest.approx(block.ceiling_accuracy, abs=0.005)
  assert ceiling[200] > ceiling[150]
  assert 'still rising at T = 200' in _section(text, '- **The regime rule says test.** ')
  covered = _section(text, '- **The covered form costs ')
  assert covered.startswith(f"{_signed(means['dp_pfeddsu_safe'] - means['dp_pfeddsu'])[1:]} points")
  assert (f"{_mean_std(100 * np.asarray(list(results['dp_pfeddsu_safe'].accuracy.values())))} % "
          f"against {_mean_std(100 * np.asarray(list(results['dp_pfeddsu'].accuracy.values())))}"
          ) in covered
  twice = _section(text, '- **One search a row: the same CENTAUR study twice.** ')
  ours, a5 = (100 * np.asarray(list(results['centaur'].accuracy.values())), _a5_accuracies('centaur'))
  gap = _signed(_rule(ours / 100, a5 / 100)[1])
  assert f"ends at {_mean_std(ours)} % against (a5)'s {_mean_std(a5)} (d = {gap}" in twice
  dsu = np.asarray(list(results['dp_pfeddsu'].accuracy.values()))
  label, d, s = _rule(dsu, a5 / 100)
  assert label == 'level' and f'level ({_signed(d)}, s = {s:.2f})' in twice
  fb = _section(text, "- **DP-FedAvg-fb's global model diverges.** ")
  noise = {n: server_noise_per_weight(_c_final_runs(n)[0]) for n in C_NAMES}
  assert all(server_noise_per_weight(run) == noise[n] for n in C_NAMES for run in _c_final_runs(n))
  others = [noise[n] for n in C_NAMES if n != 'dp_fedavg_fb']
  assert f"C = {results['dp_fedavg_fb'].selected['dp.clip_norm']}, at the top" in fb
  assert (f"noise of std {noise['dp_fedavg_fb']:.4f} on every weight a round (server lr × σC/(qN); "
          f'the other rows {min(others):.4f}-{max(others):.4f})') in fb
  curves = [{r['round']: r for r in _records(os.path.join(run, 'metrics.jsonl'))}
            for run in _c_final_runs('dp_fedavg_fb')]
  loss, acc = ({t: np.mean([c[t][key] for c in curves]) for t in (50, 200)}
               for key in ('train_loss', 'test_accuracy'))
  assert loss[200] > loss[50] > math.log(10) and f'ln 10 = {math.log(10):.2f}' in fb
  assert f'rises from {loss[50]:.2f} at round 50 to {loss[200]:.2f} at round 200' in fb
  assert f'falls from {100 * acc[50]:.2f} to {means["dp_fedavg_fb"]:.2f} %' in fb
  assert abs(acc[200] * 100 - means['dp_fedavg_fb']) < 1e-9
  assert sum(e['worse'].name == 'dp_fedavg_fb' for e in entries) == 4  # "the four claims over it"
  assert f"ends {means['pmtl_ft'] - means['dp_fedavg_fb']:.2f} points under PMTL-FT" in fb
  ends = _section(text, '- **Convergence and clipping at T = 200** ')
  for name in C_NAMES:
    end = fair_report.run_ends(results[name], block.metric)
    assert f"{C_NAMES[name]} {end['loss_before']:.4f} → {end['loss_last']:.4f}" in ends, name
    assert f"{C_NAMES[name]} {_signed(100 * end['metric_gain'])}" in ends, name
    assert f"{C_NAMES[name]} {end['clipped_fraction']:.2f}" in ends, name
  draws = _section(text, '- **The same law, different draws.** ')
  knobs = [len(block.space(block.row(n))) for n in C_NAMES]
  assert f'spaces of {min(knobs)} to {max(knobs)} knobs' in draws
  assert all(epsilons[n][2] is None for n in C_NAMES)  # "no row's K is published"
  [(search, with_run)] = {(round(epsilons[n][0], 3), round(epsilons[n][1], 3)) for n in C_NAMES}
  assert f'selection ε {search:.3f} ({with_run:.3f} with a run)' in draws
  edges = {(n, knob) for n in C_NAMES for knob, value in results[n].selected.items()
           if fair_report.at_edge(block.space(block.row(n))[knob], value)}
  assert edges == {('dp_pfeddsu', 'local.lr_personal'), ('centaur', 'local.lr_personal'),
                   ('ppsgd', 'local.lr_personal'), ('ppsgd', 'dp.clip_norm'),
                   ('dp_fedavg_fb', 'dp.clip_norm')}
  top = {n: (n, k) for n, k in edges if results[n].selected[k] > block.space(block.row(n))[k][2] / 2}
  assert set(top.values()) == {('dp_pfeddsu', 'local.lr_personal'), ('dp_fedavg_fb', 'dp.clip_norm')}
  assert ("DP-pFedDSU's head lr (top), CENTAUR's and PPSGD's head lr and PPSGD's C (bottom), "
          "DP-FedAvg-fb's C (top)") in draws
  short = readme.split("### Tuned under one budget: DP-pFedDSU's Table II rows")[1].split(' ### ')[0]
  assert f"{verdicts.count('holds')} claims hold, {verdicts.count('level')} are level, " \
         f"{verdicts.count('contradicted')} is contradicted" in short


B_NAMES = {'dp_fedsam_topk': 'DP-FedSAM-topk', 'dp_fedsam_topk_server': 'DP-FedSAM-topk (covered)',
           'dp_fedsam': 'DP-FedSAM', 'dp_fedavg': 'DP-FedAvg', 'fed_smp_topk': 'Fed-SMP-topk',
           'fed_smp_topk_safe': 'Fed-SMP-topk (covered)', 'fed_smp_randk': 'Fed-SMP-randk',
           'dp_fedavg_blur': 'DP-FedAvg-blur', 'dp_fedavg_blurs': 'DP-FedAvg-blurs'}


def test_results_readme_block_b_bullets_are_its_committed_runs(readme, results_readme):
  """Block (b)'s bullets: the rule's outcome and every claim's d and s, the covered forms' cost,
  DP-FedAvg-blur's noise and the claims over it, the last rounds' loss, gain and clip, and the
  searches' K, eps and edges, all recomputed from the committed runs and searches; the README's
  bullet gives the same tally."""
  block, results, epsilons, means, text, entries = _block_that_tests(
      'b', B_NAMES, results_readme, "**Fashion-MNIST Dirichlet 0.3, DP-FedSAM-topk's Table 1 rows")
  accuracy = {n: 100 * np.asarray(list(results[n].accuracy.values())) for n in B_NAMES}
  ceiling = fair_report.run_ends(results[block.ceiling.name], block.metric)
  assert (f"{100 * results[block.ceiling.name].stats[0]:.2f} %, 1 seed; its train loss flat over the "
          f"last 40 rounds, {ceiling['loss_before']:.4f} → {ceiling['loss_last']:.4f}, and its test "
          f"accuracy {_signed(100 * ceiling['metric_gain'])} points over the last 50"
          ) in _section(text, '- **The regime rule says test.** ')
  covered = _section(text, '- **The covered forms cost ')
  for paper, safe in (('dp_fedsam_topk', 'dp_fedsam_topk_server'), ('fed_smp_topk', 'fed_smp_topk_safe')):
    assert f'{means[paper] - means[safe]:.2f}' in covered.split(' points')[0], paper
    assert f'{_mean_std(accuracy[safe])} % against {_mean_std(accuracy[paper])}' in covered, paper
  sam = _section(text, '- **DP-FedAvg over DP-FedSAM is the searches\' draws, not SAM.** ')
  assert (f"DP-FedAvg ends at {_mean_std(accuracy['dp_fedavg'])} %, "
          f"{means['dp_fedavg'] - means['dp_fedsam']:.2f} points over DP-FedSAM "
          f"({_mean_std(accuracy['dp_fedsam'])}, level)") in sam
  blur = _section(text, "- **DP-FedAvg-blur's global model diverges.** ")
  noise = {n: server_noise_per_weight(os.path.join(
      fair_benchmark.published_dir(RESULTS, 'b'), 'runs', n, 'final', 'seed=0')) for n in B_NAMES}
  others = [noise[n] for n in B_NAMES if n != 'dp_fedavg_blur']
  assert (f"noise of std {noise['dp_fedavg_blur']:.4f} on every weight a round (server lr × σC/(qN); "
          f'the other rows {min(others):.4f}-{max(others):.4f})') in blur
  assert f"the selection ends at {_mean_std(accuracy['dp_fedavg_blur'])} %" in blur
  doc = _flat(open(os.path.join(ROOT, 'docs', 'benchmark.md')).read())
  assert (f"(b)'s DP-FedAvg-blur {noise['dp_fedavg_blur']:.4f} against its other rows' "
          f'{min(others):.4f}-{max(others):.4f}') in doc
  over = sum(e['worse'].name == 'dp_fedavg_blur' for e in entries)
  assert f'The {over} claims over it measure a diverged model' in blur
  score = 100 * results['dp_fedavg_blur'].tuning['selected_score']
  assert f'best noised validation score is {score:.2f} %' in blur
  ends = _section(text, '- **Convergence and clipping at T = 200** ')
  for name in B_NAMES:
    end = fair_report.run_ends(results[name], block.metric)
    loss = f"{fair_report.loss_text(end['loss_before'])} → {fair_report.loss_text(end['loss_last'])}"
    loss += ' (diverged)' if name == 'dp_fedavg_blur' else ''
    assert f'{B_NAMES[name]} {loss}' in ends, name
    assert f"{B_NAMES[name]} {_signed(100 * end['metric_gain'])}" in ends, name
  clipped = {n: fair_report.run_ends(results[n], block.metric)['clipped_fraction'] for n in B_NAMES}
  assert f'every row {max(clipped.values()):.2f} (DP-FedAvg-blur {clipped["dp_fedavg_blur"]:.2f})' in ends
  draws = _section(text, '- **The same law, different draws.** ')
  knobs = [len(block.space(block.row(n))) for n in B_NAMES]
  assert f'spaces of {min(knobs)} to {max(knobs)} knobs' in draws
  for name in B_NAMES:
    search, with_run, k = epsilons[name]
    if k is None:
      assert f'their selection ε {search:.3f} ({with_run:.3f} with a run)' in draws, name
    else:
      assert f'{B_NAMES[name]} K = {k} (' in draws and f'{search:.3f}' in draws, name
      assert f'{with_run:.3f}' in draws, name
  edges = {(n, knob) for n in B_NAMES for knob, value in results[n].selected.items()
           if fair_report.at_edge(block.space(block.row(n))[knob], value)}
  assert edges == {('dp_fedsam', 'local.sam_rho'), ('dp_fedavg_blurs', 'local.lr_shared'),
                   ('dp_fedavg', 'server_lr')}
  assert ("DP-FedSAM's SAM ρ and DP-FedAvg-blurs' client lr (bottom), DP-FedAvg's server lr (top)"
          ) in draws
  verdicts = [e['verdict'] for e in entries]
  short = readme.split("### Tuned under one budget: DP-FedSAM-topk's Table 1 rows")[1].split(' ### ')[0]
  assert f"{verdicts.count('holds')} claims hold, {verdicts.count('level')} are level, " \
         f"{verdicts.count('contradicted')} are contradicted" in short
