"""launch/tune.py end to end on experiments/configs/tune_tiny.py (2 trials of 2 tiny rounds): the
selection's epsilon against an independent computation from the selected run's config.json, the
selection by the noised validation score, resume to the same draw, K = 0, failed trials, the report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import dp_accounting
import jax
import numpy as np
import pytest
from dp_accounting import dp_event as dp_events
from dp_accounting.rdp import RdpAccountant
from conftest import markdown_tables, numbers_in

from dp2fedsam_jax import checkpoint, keys, metric_writers, stopping, train
from experiments import config_files, report
from launch import sweep, trial_program, tune

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, 'experiments', 'configs', 'tune_tiny.py')


def _independent_epsilon(config: dict, mean: float, score_noise: float, shape=np.inf) -> float:
  """dp_accounting's own repeat-and-select event over the run's recorded sigma, q, T and delta
  (shape inf: K ~ Poisson, 0: logarithmic)."""
  dp = config['dp']
  rounds = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
      config['sampling_rate'], dp_accounting.GaussianDpEvent(dp['noise_multiplier'])),
      config['num_rounds'])
  trial = dp_accounting.ComposedDpEvent([rounds, dp_accounting.GaussianDpEvent(score_noise)])
  event = dp_events.RepeatAndSelectDpEvent(trial, mean, shape)
  return RdpAccountant().compose(event).get_epsilon(dp['delta'])


# Secret seeds (the operator's --secret_seed) that draw K = 2 from Poisson(2) and K = 0 from
# Poisson(1); not the public spec seeds (1 and 2), so a draw from those would differ.
SECRET_K2, SECRET_K0 = 6, 3
SECRET_LARGE_K2 = 2 ** 40 + 7  # K = 2 too, and no number a published file holds otherwise
SECRET_LARGE_K1 = 2 ** 40 + 9  # K = 1 of Poisson(2): below the selection epsilon, K stays secret


def _operator(directory) -> dict:
  return json.load(open(os.path.join(directory, tune.OPERATOR_FILE)))


COST = 'cost on the private clients'


def _tuning_rows(text) -> dict:
  """The report's tuning table (launch/tune.py's studies), its rows by tuning directory."""
  (table,) = markdown_tables(text, 'tuning', 'selection ε', COST)
  return {row['tuning']: row for row in table}


def test_tune_end_to_end_selects_by_the_noised_validation_score_and_resumes(tmp_path):
  root = str(tmp_path)
  out = subprocess.run([sys.executable, '-m', 'launch.tune', f'--config={CONFIG}', '--study=tiny',
                        f'--root={root}', f'--secret_seed={SECRET_K2}'], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  directory = os.path.join(root, 'tune_tiny', 'tiny')
  result = json.load(open(os.path.join(directory, 'tuning.json')))
  operator = _operator(directory)
  assert result['status'] == 'done' and operator['num_trials'] == 2 and operator['failed_trials'] == []
  assert result['trial_distribution'] == {'name': 'poisson', 'mu': 2.0}
  assert operator['secret_seed'] == SECRET_K2 and 'never publish' in operator['DO_NOT_PUBLISH'].lower()
  selected = os.path.join(directory, result['selected_run'])
  config = json.load(open(os.path.join(selected, 'config.json')))
  assert config['validation_fraction'] == 0.25 and config['dp']['delta'] == pytest.approx(1 / 6)
  assert result['selection_epsilon'] == pytest.approx(
      _independent_epsilon(config, 2.0, 0.5), rel=1e-9)
  assert result['per_trial_epsilon'] < result['selection_epsilon'] < operator['naive_epsilon']
  assert result['delta'] == config['dp']['delta'] and operator['naive_trials'] == 2
  assert result['score_denominator'] == 6
  # The score: each trial's final validation accuracy sum + N(0, 0.5^2) from the secret's score
  # stream, / 6; the best one is selected, and its values are the ones its run trained with.
  scores = []
  for index, trial in enumerate(operator['trials']):
    record = [json.loads(l) for l in open(os.path.join(directory, trial['run'], 'metrics.jsonl'))][-1]
    z = np.random.default_rng([SECRET_K2, 2, index]).standard_normal()
    scores.append((record['validation_accuracy_sum'] + 0.5 * z) / 6)
    assert trial['score'] == pytest.approx(scores[-1]) and trial['noise_draw'] == pytest.approx(z)
    assert record['validation_clients'] == 6
  assert result['selected_run'] == operator['trials'][int(np.argmax(scores))]['run']
  ran_at = [json.load(open(os.path.join(directory, run, 'config.json')))['training_seed']
            for run in operator['runs']]
  assert ran_at == operator['training_seeds'] == [tune.trial_seed(SECRET_K2, i) for i in range(2)]
  assert config['local']['lr_shared'] == result['selected_values']['local.lr_shared']
  assert config['dp']['clip_norm'] == result['selected_values']['dp.clip_norm']

  # The report: the selection's epsilon next to the selected run's test accuracy; trials are no
  # seeds; only the selected run is copied, never the operator's file.
  paths = report.write_report(root, str(tmp_path / 'out'), copy_runs=True)
  text = open(paths['markdown']).read()
  accuracy = [json.loads(l) for l in open(os.path.join(selected, 'metrics.jsonl'))][-1]['test_accuracy']
  row = _tuning_rows(text)['tune_tiny/tiny']
  assert [row['selected run'], row['test acc'], row['selection ε']] == [
      result['selected_run'], f'{100 * accuracy:.2f}', f"{result['selection_epsilon']:.3f}"]
  # K = 2 of Poisson(2): its naive composition exceeds the selection epsilon, so it is the bound
  # that holds once K is known (a search's wall time tells it), and K is published with it.
  assert result['epsilon_bound'] == operator['naive_epsilon'] and result['num_trials'] == 2
  assert row['K (law)'] == '2 (poisson mu=2)' and not markdown_tables(text, 'trial', 'score')
  assert numbers_in(row[COST]) == [f"{result['epsilon_bound']:.3f}", '2']  # the bound and its K
  assert paths['num_runs'] == 0
  copied = tmp_path / 'out' / 'runs' / 'tune_tiny' / 'tiny'
  assert sorted(os.listdir(copied)) == sorted(['tuning.json', result['selected_run']])
  records = [json.loads(l) for l in open(copied / result['selected_run'] / 'metrics.jsonl')]
  assert records and not [k for r in records for k in r if k.startswith('validation_')]
  assert records[-1]['test_accuracy'] == accuracy
  for name in ('config.json', 'sweep.json'):  # the selected trial's noise seed stays the operator's
    text = (copied / result['selected_run'] / name).read_text()
    assert 'training_seed' not in text and str(config['training_seed']) not in text, name

  # Stopped before the second trial: the tuner resumes from the operator file to the same secret,
  # K and candidates, reruns only that trial (the first is skipped: finished) and selects the same.
  shutil.rmtree(os.path.join(directory, operator['runs'][1]))
  json.dump({'status': 'running', 'plan': result['plan']}, open(os.path.join(directory, 'tuning.json'), 'w'))
  again = tune.tune(CONFIG, root, 'tiny')
  for key in ('plan', 'selected_run', 'selection_epsilon', 'selected_values', 'selected_score'):
    assert again[key] == result[key], key
  assert _operator(directory)['trials'][1]['score'] == pytest.approx(operator['trials'][1]['score'])

  # Another draw in the same root is refused before anything runs.
  with pytest.raises(ValueError, match='--secret_seed differs'):
    tune.tune(CONFIG, root, 'tiny', secret_seed=SECRET_K2 + 1)
  changed = {**operator, 'plan': {**operator['plan'], 'score_noise': 5.0}}
  json.dump(changed, open(os.path.join(directory, tune.OPERATOR_FILE), 'w'))
  with pytest.raises(ValueError, match='holds another plan'):
    tune.tune(CONFIG, root, 'tiny')


def test_plan_shows_the_laws_before_the_start_and_k_and_the_candidates_to_the_operator(tmp_path,
                                                                                       capsys):
  cost = tune.tune(CONFIG, str(tmp_path), 'tiny', plan_only=True)
  out = capsys.readouterr().out
  assert 'E[K] = 2.00' in out and 'fresh secret' in out and 'K = 2 trials' not in out
  assert 'execution: the trials as one compiled program' in out
  # The costs the plan returns are the ones it prints: the selection's ε and the naive one at E[K].
  assert cost['naive_trials_at_mean_k'] == 2
  assert all(f'{cost[k]:.3f}' in out for k in ('selection_epsilon', 'naive_epsilon_at_mean_k'))
  cost = tune.tune(CONFIG, str(tmp_path), 'tiny', plan_only=True, secret_seed=SECRET_K2)
  out = capsys.readouterr().out
  assert 'K = 2 trials' in out and sum(l.startswith('new ') for l in out.splitlines()) == 2
  assert sum(' program 1 ' in l for l in out.splitlines()) == 2  # the two trials: one program
  k, candidates = tune.draw_plan(tune.load_study(CONFIG, 'tiny')[3], SECRET_K2)
  assert k == 2 and all(f'local.lr_shared={c["local.lr_shared"]}' in out for c in candidates)
  cost_line = next(l for l in out.splitlines() if l.startswith('cost:'))
  assert numbers_in(cost_line)[:2] == ['2', '4']  # 2 runs of 2 rounds
  assert f"{cost['selection_epsilon']:.3f}" in cost_line
  assert not os.path.exists(tmp_path / 'tune_tiny')  # a plan writes nothing


def test_candidates_do_not_depend_on_k_and_stay_in_their_ranges():
  spec = tune.load_study(CONFIG, 'tiny')[3]
  first = [tune.candidate(spec, 1, i) for i in range(50)]
  assert first[:2] == tune.draw_plan(spec)[1]
  for values in first:
    assert 0.01 <= values['local.lr_shared'] <= 0.3 and 0.3 <= values['dp.clip_norm'] <= 3.0
  assert len({v['local.lr_shared'] for v in first}) == 50


def test_k_zero_trains_nothing_and_says_so(tmp_path):
  result = tune.tune(CONFIG, str(tmp_path), 'k0', secret_seed=SECRET_K0)
  directory = tmp_path / 'tune_tiny' / 'k0'
  operator = _operator(directory)
  assert operator['num_trials'] == 0 and operator['trials'] == [] and result['selected_run'] is None
  assert 'outputs nothing' in operator['notes'][0]
  # The release does not tell K = 0 from every trial failed: it holds no K, and a study whose two
  # trials both failed publishes the same file.
  assert result.get('num_trials') is None and any('K = 0' in n for n in result['notes'])
  assert tune.published_record({**operator, 'num_trials': 2, 'failed_trials': [0, 1]}) == result
  config = sweep.apply_overrides(sweep.load_config_module(CONFIG).get_config(None), [])
  expected = _independent_epsilon({'dp': {'noise_multiplier': 1.0, 'delta': 1 / 6},
                                   'sampling_rate': config.sampling_rate,
                                   'num_rounds': config.num_rounds}, 1.0, 0.5)
  assert result['selection_epsilon'] == pytest.approx(expected, rel=1e-9)
  assert operator['naive_epsilon'] == 0.0
  assert sorted(os.listdir(directory)) == ['tuning.json', tune.OPERATOR_FILE, 'writer.lock']


def test_a_failed_trial_counts_as_a_trial_and_is_never_selected(tmp_path):
  spec = tune.load_study(CONFIG, 'tiny')[3]
  module = sweep.load_config_module(CONFIG)
  candidates = tune.draw_plan(spec, SECRET_K2)[1]
  runs = tune.trial_runs(module, CONFIG, spec, candidates, str(tmp_path), [])
  for index, (run, _) in enumerate(runs):
    os.makedirs(run.workdir)
    if index == 0:  # the better score, but failed
      json.dump({'error': 'FloatingPointError'}, open(os.path.join(run.workdir, 'failure.json'), 'w'))
    with open(os.path.join(run.workdir, 'metrics.jsonl'), 'w') as f:
      f.write(json.dumps({'round': 2, 'validation_accuracy': 0.5 - 0.4 * index,
                          'validation_accuracy_sum': 6 * (0.5 - 0.4 * index)}) + '\n')
  outcomes = [tune._trial_outcome(r, c, spec, i, SECRET_K2) for i, (r, c) in enumerate(runs)]
  assert [o['status'] for o in outcomes] == ['failed', 'finished']
  plan = {'study': 'tiny', 'trial_distribution': spec['distribution'].to_dict(),
          'selected_by': 'validation_accuracy'}
  cost = {'expected_trials': 2.0, 'delta': 0.1, 'per_trial_epsilon': 1.0, 'selection_epsilon': 2.0,
          'naive_epsilon': 2.5, 'naive_trials': 2, 'accountant': 'rdp', 'noise_multipliers': [1.0],
          'score_noise': 0.5, 'naive_epsilon_at_mean_k': 2.5, 'naive_trials_at_mean_k': 2}
  record = tune._result(plan, cost, spec, runs, candidates, outcomes, str(tmp_path), SECRET_K2,
                        'test', [c for _, c in runs], len(runs))
  assert record['selected_run'] == 'trial=1' and record['failed_trials'] == [0]
  assert any('count as trials' in n for n in record['notes'])
  assert any('with K known' in n and 'naive_epsilon' in n for n in record['notes'])
  result = tune.published_record(record)
  assert result['selected_run'] == 'trial=1' and 'failed_trials' not in result
  assert any('K is made public' in n and 'naive composition' in n for n in result['notes'])


@pytest.mark.parametrize('change,match', [
    ({'selected_by': 'test_accuracy'}, 'never the test split'),
    ({'score_noise': 0.0}, 'score_noise > 0'),
    ({'selected_by': 'validation_loss'}, "selected_by='validation_accuracy'"),
    ({'proxy': {'kind': 'the internet'}}, "proxy needs 'kind'"),
])
def test_a_study_that_would_leak_its_score_is_refused(change, match):
  spec = {**sweep.load_config_module(CONFIG).tuning_space()['tiny'], **change}
  with pytest.raises(ValueError, match=match):
    tune._check_spec('tiny', dict(spec))


def test_a_proxy_study_records_that_it_costs_the_private_clients_nothing(tmp_path):
  spec = {**sweep.load_config_module(CONFIG).tuning_space()['tiny'], 'score_noise': 0.0,
          'proxy': {'kind': 'public_dataset', 'description': 'synthetic data, seed 7',
                    'fixed': {'seed': 7}}}
  spec = tune._check_spec('tiny', spec)
  runs = tune.trial_runs(sweep.load_config_module(CONFIG), CONFIG, spec, tune.draw_plan(spec)[1],
                         str(tmp_path), [])
  assert all('--config.seed=7' in run.overrides for run, _ in runs)
  assert all(config.seed == 7 for _, config in runs)


def test_the_report_says_a_proxy_tuning_costs_the_private_clients_nothing_and_k0_selects_none():
  base = {'trial_distribution': {'name': 'poisson', 'mu': 2.0}, 'selection_epsilon': 3.0,
          'per_trial_epsilon': 1.0, 'naive_epsilon': 4.0, 'naive_trials': 2, 'delta': 1e-3}
  proxy = {**base, 'num_trials': 2, 'selected_run': None,
           'proxy': {'kind': 'public_dataset', 'description': 'EMNIST digits'}}
  empty = {**base, 'num_trials': 0, 'selected_run': None, 'proxy': None,
           'notes': ['K = 0 was drawn: ... outputs nothing']}
  lines = report.tuning_lines([('/r/a', proxy), ('/r/b', empty)], '/r')
  rows = _tuning_rows(lines)
  proxy_cost = rows['a'][COST]  # the proxy named, no ε
  assert proxy_cost.split(':')[0] == 'none' and 'EMNIST digits' in proxy_cost
  assert not numbers_in(proxy_cost)
  assert [rows['b'][c] for c in ('K (law)', 'selected run', 'test acc', 'selection ε')] == [
      '0 (poisson mu=2)', 'none (K = 0)', '–', '3.000']
  assert numbers_in(rows['b'][COST]) == ['3.000']  # the selection ε: no K published
  assert f"- {empty['notes'][0]}" in lines


def test_the_report_lists_every_trial_as_the_operators_record_and_a_tuning_alone_has_no_run_table(
    tmp_path):
  tuning = {'status': 'done', 'trial_distribution': {'name': 'poisson', 'mu': 2.0},
            'selection_epsilon': 3.0, 'per_trial_epsilon': 1.0, 'naive_epsilon': 2.0,
            'naive_trials': 2, 'delta': 1e-3, 'num_trials': 2, 'selected_run': 'trial=1',
            'proxy': None, 'selected_by': 'validation_accuracy + N(0, score_noise^2) ...',
            'trials': [{'run': 'trial=0', 'status': 'failed', 'score': None,
                        'values': {'dp.clip_norm': 0.5}},
                       {'run': 'trial=1', 'status': 'finished', 'score': 0.9, 'metric': 0.8,
                        'test_accuracy': 0.75, 'values': {'dp.clip_norm': 0.25}}]}
  directory = tmp_path / 'cfg' / 'study'
  directory.mkdir(parents=True)
  (directory / 'tuning.json').write_text(json.dumps(tuning))
  out = tmp_path / 'out'
  paths = report.write_report(str(tmp_path), str(out))
  text = (out / 'results.md').read_text()
  assert any(line.startswith('### ') and 'cfg/study' in line for line in text.splitlines())
  (trials,) = markdown_tables(text, 'trial', 'score')
  columns = ('trial', 'dp.clip_norm', 'status', 'metric', 'score', 'test acc')
  assert [[row[c] for c in columns] for row in trials] == [
      ['trial=0', '0.5', 'failed', '–', '–', '–'],
      ['trial=1 (selected)', '0.25', 'finished', '80.00', '90.00', '75.00']]
  assert paths['csv'] is None and not (out / 'results.csv').exists()
  assert '## Plots' not in text and not markdown_tables(text, 'final-round acc')  # no run table


COMMITTED = os.path.join(ROOT, 'experiments', 'results', 'fmnist_tuning', 'runs')


@pytest.mark.parametrize('study', ['dp2fedsam', 'dp_fedavg_ft'])
def test_the_committed_fashion_mnist_tuning_is_what_its_files_say(study):
  """The README's tuned numbers: selection eps from dp_accounting over the selected run's recorded
  sigma, q, T, delta; the selected run the best noised score (recomputed from its seed); its test
  accuracy the run's last record. These studies predate the secret draw: that anyone can recompute
  their score noise from the public seed is why they are covered by no finite epsilon."""
  directory = os.path.join(COMMITTED, study)
  result = json.load(open(os.path.join(directory, 'tuning.json')))
  assert result['status'] == 'done' and result['trial_distribution']['eta'] == 0.0
  config = json.load(open(os.path.join(directory, result['selected_run'], 'config.json')))
  assert config['validation_fraction'] == 0.1 and config['dp']['target_epsilon'] == 1.0
  # The file itself says what covers it: no finite epsilon, no selection epsilon left standing.
  assert result['selection_epsilon'] is None and result['covered_by'] == 'no finite epsilon'
  assert result['expected_trials'] == pytest.approx(10.0)
  scores = []
  for index, trial in enumerate(result['trials']):
    record = [json.loads(l) for l in open(os.path.join(directory, trial['run'], 'metrics.jsonl'))][-1]
    assert record['round'] == 200 and trial['test_accuracy'] == record['test_accuracy']
    z = np.random.default_rng([result['plan']['seed'], 2, index]).standard_normal()
    scores.append((record['validation_accuracy_sum'] + result['score_noise'] * z) / 1000)
    assert trial['score'] == pytest.approx(scores[-1], rel=1e-9)
  assert result['selected_run'] == result['trials'][int(np.argmax(scores))]['run']
  assert len(result['trials']) == result['num_trials'] == len(result['plan']['candidates'])


def test_a_study_without_a_validation_split_is_refused():
  spec = tune._check_spec('tiny', {**sweep.load_config_module(CONFIG).tuning_space()['tiny'],
                                   'fixed': {}})
  with pytest.raises(ValueError, match='no validation split'):
    tune.trial_runs(sweep.load_config_module(CONFIG), CONFIG, spec, tune.draw_plan(spec)[1], '/x', [])


def test_a_non_private_study_is_tuned_without_score_noise_and_records_no_epsilon(tmp_path):
  """FedAvg's trials release unprotected models: no noise on the score, no epsilon anywhere."""
  spec = tune.load_study(CONFIG, 'fedavg')[3]
  assert spec['private'] is False and spec['score_noise'] == 0.0
  with pytest.raises(ValueError, match='score_noise > 0'):  # the private study still needs it
    tune._check_spec('tiny', {**sweep.load_config_module(CONFIG).tuning_space()['tiny'],
                              'score_noise': 0.0})
  fixed = {'name': 'fixed', 'k': 2}  # a fixed K: the non-private study's, never a private one's
  assert tune._check_spec('fedavg', {**spec, 'trials': fixed}, private=False)['distribution'].k == 2
  with pytest.raises(ValueError, match='a fixed K is for a non-private search'):
    tune._check_spec('tiny', {**sweep.load_config_module(CONFIG).tuning_space()['tiny'],
                              'trials': fixed})
  result = tune.tune(CONFIG, str(tmp_path), 'fedavg', secret_seed=SECRET_K2)
  assert result['private'] is False and result['selection_epsilon'] is None
  directory = os.path.join(str(tmp_path), 'tune_tiny', 'fedavg')
  operator = _operator(directory)
  assert operator['num_trials'] == 2 and operator['failed_trials'] == []
  metrics = [[json.loads(l) for l in open(os.path.join(directory, t['run'], 'metrics.jsonl'))][-1]
             for t in operator['trials']]
  assert [t['score'] for t in operator['trials']] == [m['validation_accuracy'] for m in metrics]
  best = int(np.argmax([m['validation_accuracy'] for m in metrics]))
  assert result['selected_run'] == operator['runs'][best]
  assert any('non-private' in n for n in result['notes'])
  (row,) = _tuning_rows(report.tuning_lines([(directory, result)], str(tmp_path))).values()
  assert row['selected run'] == result['selected_run']
  assert [row[c] for c in ('selection ε', 'one trial ε', 'naive ε (K)', 'δ')] == ['–'] * 4
  assert row[COST].split(':')[0] == 'none'


def test_a_study_mixing_private_and_non_private_trials_is_refused():
  spec = tune.load_study(CONFIG, 'fedavg')[3]
  config = sweep.load_config_module(CONFIG).get_config('method=dp2fedsam')
  with pytest.raises(ValueError, match='mixes non-private and private'):
    tune.non_private_cost(spec, [config], 1, 0.0)


# -- The secret draw and the two files, on fake trials (no training: the harness's killers) --------

def _fake_execute(monkeypatch):
  """sweep.execute and the one-program runner writing each run a finished metrics.jsonl with
  distinct, many-digit metrics."""
  def finish(workdirs, rounds):
    for index, (workdir, num_rounds) in enumerate(zip(workdirs, rounds)):
      os.makedirs(workdir, exist_ok=True)
      accuracy = 0.31234567 + 0.1 * index
      with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
        f.write(json.dumps({'round': num_rounds, 'validation_accuracy': accuracy,
                            'validation_accuracy_sum': 6 * accuracy, 'validation_clients': 6,
                            'test_accuracy': accuracy - 0.0123}) + '\n')
    return {}
  monkeypatch.setattr(sweep, 'execute', lambda config_path, runs, parallel, cache: finish(
      [r.workdir for r in runs], [r.num_rounds for r in runs]))
  monkeypatch.setattr(trial_program, 'run_trials', lambda configs, workdirs: finish(
      workdirs, [c.num_rounds for c in configs]))


def test_the_score_noise_k_and_candidates_come_from_the_operators_secret_not_the_public_seed(
    tmp_path, monkeypatch):
  """score - s z / N must not give the validation sum back to anyone who knows the public plan: z
  is the secret's draw, not the public seed's; K and the candidates are the secret's draw too; a
  study started without --secret_seed gets a fresh secret that no published file holds."""
  _fake_execute(monkeypatch)
  tune.tune(CONFIG, str(tmp_path), 'tiny', secret_seed=SECRET_K2)
  spec = tune.load_study(CONFIG, 'tiny')[3]
  operator = _operator(tmp_path / 'tune_tiny' / 'tiny')
  assert operator['trials']
  for index, trial in enumerate(operator['trials']):
    z = (trial['score'] * trial['score_denominator'] - trial['validation_accuracy_sum']) / 0.5
    assert z == pytest.approx(np.random.default_rng([SECRET_K2, 2, index]).standard_normal())
    assert abs(z - np.random.default_rng([spec['seed'], 2, index]).standard_normal()) > 1e-6
  assert [operator['num_trials'], operator['candidates']] == list(tune.draw_plan(spec, SECRET_K2))
  assert operator['candidates'] != tune.draw_plan(spec)[1]  # not the public seed's candidates
  fresh = []
  for name in ('b', 'c'):
    tune.tune(CONFIG, str(tmp_path / name), 'tiny')
    directory = tmp_path / name / 'tune_tiny' / 'tiny'
    fresh.append(_operator(directory)['secret_seed'])
    assert _operator(directory)['secret_source'].startswith('secrets.randbits(128)')
    assert str(fresh[-1]) not in (directory / 'tuning.json').read_text()
  assert fresh[0] != fresh[1] and spec['seed'] not in fresh


def _numbers(tree):
  """Every number in a JSON tree."""
  if isinstance(tree, dict):
    return [x for v in tree.values() for x in _numbers(v)]
  if isinstance(tree, list):
    return [x for v in tree for x in _numbers(v)]
  return [tree] if isinstance(tree, (int, float)) and not isinstance(tree, bool) else []


def _keys(tree):
  if isinstance(tree, dict):
    return set(tree) | {k for v in tree.values() for k in _keys(v)}
  if isinstance(tree, list):
    return {k for v in tree for k in _keys(v)}
  return set()


@pytest.mark.parametrize('secret', [SECRET_LARGE_K2, SECRET_LARGE_K1])
def test_the_published_file_holds_no_per_trial_record_and_the_operator_file_holds_it(
    tmp_path, monkeypatch, secret):
  """tuning.json: the selected run, its values and noised score, the public plan and the costs.
  No un-noised metric, validation sum, test accuracy or noise draw of any trial, no other trial's
  name or score, no secret: those are the operator file's, marked never to be published. K only
  where its naive composition is the bound (K = 2 of Poisson(2)), never below it (K = 1)."""
  _fake_execute(monkeypatch)
  result = tune.tune(CONFIG, str(tmp_path), 'tiny', secret_seed=secret)
  directory = tmp_path / 'tune_tiny' / 'tiny'
  published = json.loads((directory / 'tuning.json').read_text())
  operator = _operator(directory)
  assert published == result and operator['DO_NOT_PUBLISH'].startswith('NEVER PUBLISH THIS FILE')
  assert published['selected_run'] in operator['runs'] and published['selected_score'] is not None
  k_sets_the_bound = operator['naive_epsilon'] > operator['selection_epsilon']
  assert k_sets_the_bound == (secret == SECRET_LARGE_K2)
  assert published['epsilon_bound'] == max(operator['naive_epsilon'], operator['selection_epsilon'])
  assert published.get('num_trials') == (operator['num_trials'] if k_sets_the_bound else None)
  assert not _keys(published) & {'trials', 'candidates', 'runs', 'naive_epsilon',
                                 'naive_trials', 'failed_trials', 'selected_index', 'secret_seed',
                                 'metric', 'validation_accuracy_sum', 'noise_draw', 'test_accuracy'}
  hidden = [operator['secret_seed']] + [
      trial[k] for trial in operator['trials'] for k in
      ('metric', 'validation_accuracy_sum', 'noise_draw', 'test_accuracy')]
  hidden += [t['score'] for t in operator['trials'] if t['run'] != published['selected_run']]
  for number in _numbers(published):
    assert all(number != pytest.approx(h, rel=1e-12, abs=0) for h in hidden), number
  text = (directory / 'tuning.json').read_text()
  assert not [r for r in operator['runs'] if r != published['selected_run'] and r in text]
  assert 'selection_epsilon holds while K is secret' in ' '.join(published['notes'])
  assert published['score_denominator'] == 6 and operator['naive_epsilon'] > 0


def test_a_study_is_resumed_only_with_its_operator_file(tmp_path, monkeypatch):
  _fake_execute(monkeypatch)
  tune.tune(CONFIG, str(tmp_path), 'tiny', secret_seed=SECRET_K2)
  directory = tmp_path / 'tune_tiny' / 'tiny'
  os.remove(directory / tune.OPERATOR_FILE)
  with pytest.raises(ValueError, match='the secret they were drawn from is lost'):
    tune.tune(CONFIG, str(tmp_path), 'tiny')
  legacy = tmp_path / 'legacy' / 'tune_tiny' / 'tiny'
  legacy.mkdir(parents=True)
  (legacy / 'tuning.json').write_text(json.dumps({'status': 'done', 'plan': {'seed': 1,
                                                                            'candidates': []}}))
  with pytest.raises(ValueError, match='drawn from its public seed'):
    tune.tune(CONFIG, str(tmp_path / 'legacy'), 'tiny')


def test_each_trial_draws_its_own_secret_training_seed_and_shares_no_stream_with_another(
    tmp_path, monkeypatch):
  """Papernot & Steinke's bound assumes independent trials: two trials (or a trial and a final run
  at a public seed) on one key stream would release updates whose difference cancels the noise.
  Each trial runs at config.training_seed drawn from the secret; the round keys of the trials and of
  the final runs' public seeds 0-4 give pairwise different cohorts' and noise draws in every round."""
  _fake_execute(monkeypatch)
  tune.tune(CONFIG, str(tmp_path), 'tiny', secret_seed=SECRET_LARGE_K2)
  directory = tmp_path / 'tune_tiny' / 'tiny'
  operator = _operator(directory)
  seeds = operator['training_seeds']
  assert operator['num_trials'] == len(seeds) == 2 and len(set(seeds)) == 2
  assert all(2**32 <= s < 2**64 for s in seeds)
  module, _, _, spec = tune.load_study(CONFIG, 'tiny')
  runs = tune.trial_runs(module, CONFIG, spec, operator['candidates'], str(directory), [],
                         operator['runs'], seeds)
  assert [c.training_seed for _, c in runs] == seeds and len({c.seed for _, c in runs}) == 1
  roots = [keys.root_key(c.seed, c.training_seed) for _, c in runs] + [
      keys.root_key(s) for s in range(5)]
  for r in range(3):
    for stream in ('sample', 'noise'):
      draws = [np.asarray(jax.random.normal(getattr(keys.round_keys(root, r), stream), (4,)))
               for root in roots]
      for i in range(len(draws)):
        for j in range(i):
          assert not np.allclose(draws[i], draws[j]), (r, stream, i, j)
  assert str(seeds[0]) not in (directory / 'tuning.json').read_text()


def test_a_secret_seed_under_64_bits_is_warned(tmp_path, monkeypatch, capsys):
  _fake_execute(monkeypatch)
  tune.tune(CONFIG, str(tmp_path / 'low'), 'tiny', secret_seed=SECRET_K2)
  assert 'bits (< 64)' in capsys.readouterr().err
  tune.tune(CONFIG, str(tmp_path / 'high'), 'tiny', secret_seed=2**64 + SECRET_K2)
  assert 'bits (< 64)' not in capsys.readouterr().err


def test_a_search_space_from_the_command_line_replaces_the_studys_and_prints_a_clean_plan(tmp_path):
  """--space / --trials / --score_noise: a study without editing a config (default.py has no
  tuning_space()); the plan prints the laws, and dp_accounting's per-order warnings are counted in
  one line, not printed one by one."""
  out = subprocess.run([sys.executable, '-m', 'launch.tune', f'--config={CONFIG}', '--study=tiny',
                        f'--root={tmp_path}', '--plan', '--space=local.lr_shared=uniform:0.02:0.04',
                        '--space=local.personal_epochs=choice:1,2', '--trials=logarithmic:16'],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "local.lr_shared: ['uniform', 0.02, 0.04]" in out.stdout
  assert "local.personal_epochs: ['choice', [1, 2]]" in out.stdout
  assert 'one compiled program per value of local.personal_epochs' in out.stdout
  assert 'dp.clip_norm' not in out.stdout and '(E[K] = 16.00)' in out.stdout
  assert 'failed to converge' not in out.stdout + out.stderr
  default = os.path.join(ROOT, 'experiments', 'configs', 'default.py')
  _, study, _, spec = tune.load_study(default, None, tune.parse_search_flags(
      ['local.lr_shared=log_uniform:0.01:0.3'], 'poisson:4', 10.0))
  assert study == tune.COMMAND_LINE_STUDY and spec['fixed'] == {'validation_fraction': 0.1}
  assert spec['space'] == {'local.lr_shared': ('log_uniform', 0.01, 0.3)}
  assert spec['distribution'].mean == 4.0 and spec['score_noise'] == 10.0
  with pytest.raises(ValueError, match='--score_noise missing'):
    tune.load_study(default, None, tune.parse_search_flags(['local.lr_shared=uniform:0.1:1'],
                                                           'poisson:4', None))


@pytest.mark.parametrize('flag,parse', [('lr=log_uniform:0.1', tune.parse_space_flag),
                                        ('lr=normal:0:1', tune.parse_space_flag),
                                        ('poisson', tune.parse_trials_flag),
                                        ('tnb:1', tune.parse_trials_flag)])
def test_a_malformed_search_flag_names_the_form_to_write(flag, parse):
  with pytest.raises(ValueError, match='write'):
    parse(flag)


def test_the_tuner_prints_the_selected_values(tmp_path, monkeypatch, capsys):
  _fake_execute(monkeypatch)
  result = tune.tune(CONFIG, str(tmp_path), 'tiny', secret_seed=SECRET_LARGE_K2)
  line = [l for l in capsys.readouterr().out.splitlines() if l.startswith('selected: ')]
  assert line == [tune.selection_text(result)]
  for field, value in result['selected_values'].items():
    assert f'{field}={value}' in line[0]


# -- A study as one compiled program (launch/trial_program.py) ---------------------------------------

def _trial_files(directory, run):
  path = os.path.join(directory, run)
  return (json.load(open(os.path.join(path, 'config.json'))),
          [json.loads(l) for l in open(os.path.join(path, 'metrics.jsonl'))])


def test_a_study_run_as_one_program_selects_and_scores_as_one_process_per_trial(tmp_path,
                                                                                monkeypatch):
  """The K = 2 trials of tiny as one program (in this process) against each in its own process
  (experiments.train): the same selection, per-trial scores and test accuracies (relative 1e-4:
  the searched scalars are traced in the program), the same config.json and evaluation records;
  a rerun skips the finished trials; a program stopped mid-way runs its trials again."""
  calls = []
  run_trials = trial_program.run_trials
  monkeypatch.setattr(trial_program, 'run_trials',
                      lambda configs, workdirs: calls.append(workdirs) or run_trials(configs, workdirs))
  results = {mode: tune.tune(CONFIG, str(tmp_path / mode), 'tiny', secret_seed=SECRET_LARGE_K2,
                             one_program=mode) for mode in ('auto', 'never')}
  assert len(calls) == 1 and len(calls[0]) == 2  # auto: one program of both trials; never: none
  directories = {mode: tmp_path / mode / 'tune_tiny' / 'tiny' for mode in results}
  operators = {mode: _operator(d) for mode, d in directories.items()}
  assert results['auto']['selected_run'] == results['never']['selected_run'] is not None
  assert operators['auto']['runs'] == operators['never']['runs']
  for program, alone in zip(operators['auto']['trials'], operators['never']['trials']):
    assert program['status'] == alone['status'] == 'finished'
    for key in ('score', 'metric', 'test_accuracy'):
      assert program[key] == pytest.approx(alone[key], rel=1e-4), key
  for run in operators['auto']['runs']:
    config, records = _trial_files(directories['auto'], run)
    config_alone, records_alone = _trial_files(directories['never'], run)
    assert config == config_alone  # its own values and training_seed, sigma and delta resolved
    assert [r['round'] for r in records] == [r['round'] for r in records_alone] == [2]
    assert set(records[-1]) == set(records_alone[-1])
    assert records[-1]['epsilon'] == records_alone[-1]['epsilon']
    # The checkpoint of its last round, as a finished run alone leaves (experiments.train: done).
    assert checkpoint.latest_round(str(directories['auto'] / run)) == 2

  # A rerun skips the finished trials: nothing runs, nothing is rewritten.
  directory = directories['auto']
  metrics = [directory / run / 'metrics.jsonl' for run in operators['auto']['runs']]
  written = [p.stat().st_mtime_ns for p in metrics]
  (directory / 'tuning.json').write_text(json.dumps({'status': 'running',
                                                     'plan': results['auto']['plan']}))
  assert tune.tune(CONFIG, str(tmp_path / 'auto'), 'tiny')['selected_run'] == \
      results['auto']['selected_run']
  assert len(calls) == 1 and [p.stat().st_mtime_ns for p in metrics] == written

  # Stopped before its evaluation (no record, no checkpoint): both trials run again as one program.
  for path in metrics:
    path.write_text('')
    shutil.rmtree(path.parent / 'checkpoints')
  (directory / 'tuning.json').write_text(json.dumps({'status': 'running',
                                                     'plan': results['auto']['plan']}))
  again = tune.tune(CONFIG, str(tmp_path / 'auto'), 'tiny')
  assert len(calls) == 2 and again['selected_score'] == results['auto']['selected_score']


def test_trials_that_differ_in_a_static_field_or_are_finished_run_outside_the_program(
    tmp_path, monkeypatch):
  """execution_plan: one program per group of new trials that share one_program_key; a trial whose
  epochs differ, one that finished, or every trial with --one_program=never runs through
  launch.sweep (its own process)."""
  spec = tune.load_study(CONFIG, 'tiny')[3]
  candidates = [{'local.lr_shared': 0.05, 'local.personal_epochs': 1},
                {'local.lr_shared': 0.1, 'local.personal_epochs': 2},
                {'local.lr_shared': 0.2, 'local.personal_epochs': 1}]
  runs = tune.trial_runs(sweep.load_config_module(CONFIG), CONFIG, spec, candidates, str(tmp_path),
                         [], seeds=[tune.trial_seed(SECRET_K2, i) for i in range(3)])
  assert sweep.execution_plan(runs) == [[0, 2]]
  assert sweep.execution_plan(runs, 'never') == []
  ran = {}

  def program(configs, workdirs):
    ran['program'] = workdirs
    return {}

  def alone(config_path, runs, parallel, cache):
    ran['alone'] = [r.workdir for r in runs]
    return {}
  monkeypatch.setattr(trial_program, 'run_trials', program)
  monkeypatch.setattr(sweep, 'execute', alone)
  sweep.execute_trials(CONFIG, runs, 1, str(tmp_path / 'cache'))
  workdirs = [r.workdir for r, _ in runs]
  assert ran == {'program': [workdirs[0], workdirs[2]], 'alone': [workdirs[1]]}
  # The program's trials record their arguments and overrides as a sweep run does.
  assert runs[0][0].conflict() is None and os.path.exists(os.path.join(workdirs[2], 'sweep.json'))
  with open(os.path.join(workdirs[0], 'metrics.jsonl'), 'w') as f:  # trial 0 finished
    f.write(json.dumps({'round': 2, 'validation_accuracy_sum': 3.0}) + '\n')
  assert sweep.execution_plan(runs) == []  # trial 2 is alone in its group now


def test_a_trial_of_the_program_whose_release_turns_inf_fails_alone(tmp_path):
  """A trial whose release is not finite ends with failure.json (as a run alone); the other trial of
  its program finishes, with its records and the checkpoint of its last round."""
  module = sweep.load_config_module(CONFIG)
  configs = [config_files.apply_overrides(module.get_config(None), [
      '--config.validation_fraction=0.25', f'--config.server_lr={lr}',
      f'--config.training_seed={2**40 + i}']) for i, lr in enumerate([1.0, 1e38])]
  workdirs = [str(tmp_path / f'trial={i}') for i in range(2)]
  assert trial_program.run_trials(configs, workdirs) == {
      workdirs[0]: 'ran', workdirs[1]: 'failed (FloatingPointError: see failure.json)'}
  failure = json.load(open(os.path.join(workdirs[1], 'failure.json')))
  assert failure['error'] == 'FloatingPointError' and failure['round'] == 1
  assert not os.path.exists(os.path.join(workdirs[0], 'failure.json'))
  assert [r['round'] for r in metric_writers.read_jsonl(os.path.join(workdirs[0], 'metrics.jsonl'))] == [2]
  assert checkpoint.latest_round(workdirs[0]) == 2 and not checkpoint.exists(workdirs[1])


def _two_trials(*overrides: str) -> list:
  """Two trials of the tiny study (lrs 0.05 and 0.2, their own training seeds) with `overrides`."""
  module = sweep.load_config_module(CONFIG)
  return [config_files.apply_overrides(module.get_config(None), [
      '--config.validation_fraction=0.25', *overrides, f'--config.local.lr_shared={lr}',
      f'--config.training_seed={2**40 + i}']) for i, lr in enumerate([0.05, 0.2])]


def _whole_and_stopped_in_round_2(configs, tmp_path, monkeypatch) -> tuple[list, list]:
  """The trials' workdirs run as one program never stopped, and as one stopped in round 2."""
  whole = [str(tmp_path / 'whole' / f'trial={i}') for i in range(2)]
  stopped = [str(tmp_path / 'stopped' / f'trial={i}') for i in range(2)]
  trial_program.run_trials(configs, whole)
  asked = iter([False, True])  # a stop request arrives before round 2's lines are written
  monkeypatch.setattr(stopping, 'stop_requested', lambda: next(asked, False))
  with pytest.raises(KeyboardInterrupt):
    trial_program.run_trials(configs, stopped)
  monkeypatch.undo()
  return whole, stopped


def _strip(records):
  return [{k: v for k, v in r.items() if k != 'seconds'} for r in records]


def test_a_program_stopped_mid_way_resumes_from_its_trials_checkpoints_to_the_same_result(
    tmp_path, monkeypatch):
  """Checkpoints at every evaluation: a program stopped in round 2 resumes from round 1's and ends
  with the same states, records and per-round lines as a program never stopped."""
  configs = _two_trials('--config.num_rounds=3', '--config.eval_every=1')
  whole, stopped = _whole_and_stopped_in_round_2(configs, tmp_path, monkeypatch)
  assert [checkpoint.latest_round(w) for w in stopped] == [1, 1]
  assert sweep.execution_plan([(sweep.Run({}, w, 3, 'dp2fedsam', 'tiny'), c)
                              for w, c in zip(stopped, configs)]) == [[0, 1]]
  assert trial_program.run_trials(configs, stopped) == {w: 'ran' for w in stopped}
  for a, b in zip(whole, stopped):
    for name in ('metrics.jsonl', 'train_metrics.jsonl'):
      lines = [metric_writers.read_jsonl(os.path.join(w, name)) for w in (a, b)]
      assert _strip(lines[0]) == _strip(lines[1]), name
    assert checkpoint.latest_round(b) == 3


def test_a_programs_trials_evaluate_from_eval_from_and_resume_from_a_checkpoint_before_it(
    tmp_path, monkeypatch):
  """eval_from = 3 of 4, every round: the trials evaluate at rounds 3 and 4 only, as a run alone
  does; a program stopped in round 2 resumes from round 1's checkpoint (no evaluation there) to
  the same lines as a program never stopped."""
  configs = _two_trials('--config.num_rounds=4', '--config.eval_every=1', '--config.eval_from=3')
  whole, stopped = _whole_and_stopped_in_round_2(configs, tmp_path, monkeypatch)
  assert [checkpoint.latest_round(w) for w in stopped] == [1, 1]
  trial_program.run_trials(configs, stopped)
  for a, b in zip(whole, stopped):
    records = metric_writers.read_jsonl(os.path.join(a, 'metrics.jsonl'))
    assert [r['round'] for r in records] == [3, 4]
    for name in ('metrics.jsonl', 'train_metrics.jsonl'):
      lines = [metric_writers.read_jsonl(os.path.join(w, name)) for w in (a, b)]
      assert _strip(lines[0]) == _strip(lines[1]), name
  alone = str(tmp_path / 'alone')
  train.train_and_evaluate(configs[0], alone)
  assert [r['round'] for r in metric_writers.read_jsonl(os.path.join(alone, 'metrics.jsonl'))] == [3, 4]


def test_a_tied_field_takes_its_leaders_value_and_a_bad_tie_is_refused():
  spec = dict(tune.load_study(CONFIG, 'tiny')[3])
  spec['tied'] = {'local.lr_personal': 'local.lr_shared'}
  for index in range(5):
    values = tune.candidate(spec, 1, index)
    assert values['local.lr_personal'] == values['local.lr_shared']
  plan = tune.public_plan(spec, 'tiny', CONFIG, [])
  assert plan['tied'] == spec['tied'] and 'tied' not in tune.public_plan(
      {**spec, 'tied': {}}, 'tiny', CONFIG, [])  # a plan without ties reads as the older ones did
  del spec['distribution']
  with pytest.raises(ValueError, match='leader must be in the space'):
    tune._check_spec('tiny', {**spec, 'tied': {'local.lr_personal': 'local.momentum'}})


def test_a_pool_floor_runs_more_trials_but_the_selection_sees_only_its_k(tmp_path, monkeypatch):
  """pool_floor P: max(K, P) trials run (the first K the draw without a floor gives), the selection
  is over those K alone even when a later trial scores higher, and the published file says
  nothing of the further trials."""
  _fake_execute(monkeypatch)  # trial i scores 0.31 + 0.1 i: the best trial is the last
  tune.tune(CONFIG, str(tmp_path), 'floor', secret_seed=SECRET_K2)
  directory = tmp_path / 'tune_tiny' / 'floor'
  operator = _operator(directory)
  spec = tune.load_study(CONFIG, 'floor')[3]
  k, candidates = tune.draw_plan(spec, SECRET_K2)
  assert operator['num_trials'] == k == 2 and len(operator['trials']) == 4
  assert operator['candidates'][:k] == candidates
  assert [t['in_selection'] for t in operator['trials']] == [True, True, False, False]
  assert operator['selected_index'] in (0, 1) and operator['naive_trials'] == k
  published = (directory / 'tuning.json').read_text()
  assert json.loads(published)['plan']['pool_floor'] == 4
  assert not any(t['run'] in published for t in operator['trials'][k:])
  with pytest.raises(ValueError, match='pool_floor'):
    tune._check_spec('x', {**spec, 'pool_floor': -1, 'trials': {'name': 'poisson', 'mu': 2.0}})
