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
import numpy as np
import pytest
from dp_accounting import dp_event as dp_events
from dp_accounting.rdp import RdpAccountant

from experiments import report
from launch import sweep, tune

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


def test_tune_end_to_end_selects_by_the_noised_validation_score_and_resumes(tmp_path):
  root = str(tmp_path)
  out = subprocess.run([sys.executable, '-m', 'launch.tune', f'--config={CONFIG}', '--study=tiny',
                        f'--root={root}'], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  directory = os.path.join(root, 'tune_tiny', 'tiny')
  result = json.load(open(os.path.join(directory, 'tuning.json')))
  assert result['status'] == 'done' and result['num_trials'] == 2 and result['failed_trials'] == []
  assert result['trial_distribution'] == {'name': 'poisson', 'mu': 2.0}
  selected = os.path.join(directory, result['selected_run'])
  config = json.load(open(os.path.join(selected, 'config.json')))
  assert config['validation_fraction'] == 0.25 and config['dp']['delta'] == pytest.approx(1 / 6)
  assert result['selection_epsilon'] == pytest.approx(
      _independent_epsilon(config, 2.0, 0.5), rel=1e-9)
  assert result['per_trial_epsilon'] < result['selection_epsilon'] < result['naive_epsilon']
  assert result['delta'] == config['dp']['delta'] and result['naive_trials'] == 2
  # The score: each trial's final validation accuracy sum + N(0, 0.5^2) from the tuner's seed, / 6;
  # the best one is selected, and its values are the ones its run trained with.
  scores = []
  for index, trial in enumerate(result['trials']):
    record = [json.loads(l) for l in open(os.path.join(directory, trial['run'], 'metrics.jsonl'))][-1]
    z = np.random.default_rng([1, 2, index]).standard_normal()
    scores.append((record['validation_accuracy_sum'] + 0.5 * z) / 6)
    assert trial['score'] == pytest.approx(scores[-1])
    assert record['validation_clients'] == 6
  assert result['selected_run'] == f'trial={int(np.argmax(scores))}'
  assert config['local']['lr_shared'] == result['selected_values']['local.lr_shared']
  assert config['dp']['clip_norm'] == result['selected_values']['dp.clip_norm']

  # The report: the selection's epsilon next to the selected run's test accuracy; trials are no seeds.
  paths = report.write_report(root, str(tmp_path / 'out'), copy_runs=True)
  text = open(paths['markdown']).read()
  accuracy = [json.loads(l) for l in open(os.path.join(selected, 'metrics.jsonl'))][-1]['test_accuracy']
  assert (f"| {result['selected_run']} | {100 * accuracy:.2f} | {result['selection_epsilon']:.3f} |"
          in text)
  assert paths['num_runs'] == 0
  assert os.path.exists(tmp_path / 'out' / 'runs' / 'tune_tiny' / 'tiny' / 'tuning.json')

  # Stopped before the second trial: the tuner resumes to the same K and candidates, reruns only
  # that trial (the first is skipped: finished) and selects the same run.
  shutil.rmtree(os.path.join(directory, 'trial=1'))
  json.dump({'status': 'running', 'plan': result['plan']}, open(os.path.join(directory, 'tuning.json'), 'w'))
  again = tune.tune(CONFIG, root, 'tiny')
  for key in ('plan', 'selected_run', 'selection_epsilon', 'selected_values', 'selected_score'):
    assert again[key] == result[key], key
  assert again['trials'][1]['score'] == pytest.approx(result['trials'][1]['score'])

  # Another draw in the same root is refused before anything runs.
  plan = {**result['plan'], 'seed': 5}
  json.dump({'status': 'running', 'plan': plan}, open(os.path.join(directory, 'tuning.json'), 'w'))
  with pytest.raises(ValueError, match='holds another plan'):
    tune.tune(CONFIG, root, 'tiny')


def test_plan_shows_k_the_candidates_and_the_cost(tmp_path, capsys):
  tune.tune(CONFIG, str(tmp_path), 'tiny', plan_only=True)
  out = capsys.readouterr().out
  assert 'K = 2 trials' in out and sum(l.startswith('new ') for l in out.splitlines()) == 2
  k, candidates = tune.draw_plan(tune.load_study(CONFIG, 'tiny')[3])
  assert k == 2 and all(f'local.lr_shared={c["local.lr_shared"]}' in out for c in candidates)
  assert 'cost: 2 runs, 4 rounds' in out and 'selection eps' in out
  assert not os.path.exists(tmp_path / 'tune_tiny')  # a plan writes nothing


def test_candidates_do_not_depend_on_k_and_stay_in_their_ranges():
  spec = tune.load_study(CONFIG, 'tiny')[3]
  first = [tune.candidate(spec, 1, i) for i in range(50)]
  assert first[:2] == tune.draw_plan(spec)[1]
  for values in first:
    assert 0.01 <= values['local.lr_shared'] <= 0.3 and 0.3 <= values['dp.clip_norm'] <= 3.0
  assert len({v['local.lr_shared'] for v in first}) == 50


def test_k_zero_trains_nothing_and_says_so(tmp_path):
  result = tune.tune(CONFIG, str(tmp_path), 'k0')
  assert result['num_trials'] == 0 and result['selected_run'] is None and result['trials'] == []
  assert 'outputs nothing' in result['notes'][0]
  config = sweep.apply_overrides(sweep.load_config_module(CONFIG).get_config(None), [])
  expected = _independent_epsilon({'dp': {'noise_multiplier': 1.0, 'delta': 1 / 6},
                                   'sampling_rate': config.sampling_rate,
                                   'num_rounds': config.num_rounds}, 1.0, 0.5)
  assert result['selection_epsilon'] == pytest.approx(expected, rel=1e-9)
  assert result['naive_epsilon'] == 0.0
  assert sorted(os.listdir(tmp_path / 'tune_tiny' / 'k0')) == ['tuning.json', 'writer.lock']


def test_a_failed_trial_counts_as_a_trial_and_is_never_selected(tmp_path):
  spec = tune.load_study(CONFIG, 'tiny')[3]
  module = sweep.load_config_module(CONFIG)
  runs = tune.trial_runs(module, CONFIG, spec, tune.draw_plan(spec)[1], str(tmp_path), [])
  for index, (run, _) in enumerate(runs):
    os.makedirs(run.workdir)
    if index == 0:  # the better score, but failed
      json.dump({'error': 'FloatingPointError'}, open(os.path.join(run.workdir, 'failure.json'), 'w'))
    with open(os.path.join(run.workdir, 'metrics.jsonl'), 'w') as f:
      f.write(json.dumps({'round': 2, 'validation_accuracy': 0.5 - 0.4 * index,
                          'validation_accuracy_sum': 6 * (0.5 - 0.4 * index)}) + '\n')
  outcomes = [tune._trial_outcome(r, c, spec, i) for i, (r, c) in enumerate(runs)]
  assert [o['status'] for o in outcomes] == ['failed', 'finished']
  plan = {'study': 'tiny', 'num_trials': 2, 'candidates': tune.draw_plan(spec)[1],
          'trial_distribution': spec['distribution'].to_dict()}
  cost = {'expected_trials': 2.0, 'delta': 0.1, 'per_trial_epsilon': 1.0, 'selection_epsilon': 2.0,
          'naive_epsilon': 2.5, 'naive_trials': 2, 'accountant': 'rdp', 'noise_multipliers': [1.0],
          'score_noise': 0.5, 'naive_epsilon_at_mean_k': 2.5, 'naive_trials_at_mean_k': 2}
  result = tune._result(plan, cost, spec, runs, outcomes, str(tmp_path))
  assert result['selected_run'] == 'trial=1' and result['failed_trials'] == [0]
  assert any('count as trials' in n for n in result['notes'])
  assert any('with K known' in n and 'naive_epsilon' in n for n in result['notes'])


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
  text = '\n'.join(report.tuning_lines([('/r/a', proxy), ('/r/b', empty)], '/r'))
  assert ('none: tuned on a public dataset (EMNIST digits), the only case in which the tuned values '
          'carry no cost on the private clients') in text
  assert '| b | 0 (poisson mu=2) | none (K = 0) | – | 3.000 |' in text and '3.000 (the selection ε)' in text
  assert '- K = 0 was drawn' in text


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
  assert "### Trials of cfg/study: the operator's record" in text and 'Not covered by' in text
  assert '| trial=0 | 0.5 | failed | – | – | – |' in text
  assert '| trial=1 (selected) | 0.25 | finished | 80.00 | 90.00 | 75.00 |' in text
  assert paths['csv'] is None and not (out / 'results.csv').exists()
  assert '## Plots' not in text and 'mean ± sample std over seeds' not in text


COMMITTED = os.path.join(ROOT, 'experiments', 'results', 'fmnist_tuning', 'runs')


@pytest.mark.parametrize('study', ['dp2fedsam', 'dp_fedavg_ft'])
def test_the_committed_fashion_mnist_tuning_is_what_its_files_say(study):
  """The README's tuned numbers: selection eps from dp_accounting over the selected run's recorded
  sigma, q, T, delta; the selected run the best noised score (recomputed from its seed); its test
  accuracy the run's last record."""
  directory = os.path.join(COMMITTED, study)
  result = json.load(open(os.path.join(directory, 'tuning.json')))
  assert result['status'] == 'done' and result['trial_distribution']['eta'] == 0.0
  config = json.load(open(os.path.join(directory, result['selected_run'], 'config.json')))
  assert config['validation_fraction'] == 0.1 and config['dp']['target_epsilon'] == 1.0
  assert result['selection_epsilon'] == pytest.approx(_independent_epsilon(
      config, result['expected_trials'], result['score_noise'], shape=0.0), rel=1e-6)
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
  result = tune.tune(CONFIG, str(tmp_path), 'fedavg')
  assert result['private'] is False and result['selection_epsilon'] is None
  assert result['num_trials'] == 2 and result['failed_trials'] == []
  directory = os.path.join(str(tmp_path), 'tune_tiny', 'fedavg')
  metrics = [[json.loads(l) for l in open(os.path.join(directory, t['run'], 'metrics.jsonl'))][-1]
             for t in result['trials']]
  assert [t['score'] for t in result['trials']] == [m['validation_accuracy'] for m in metrics]
  assert result['selected_run'] == f"trial={int(np.argmax([m['validation_accuracy'] for m in metrics]))}"
  assert any('non-private' in n for n in result['notes'])
  text = '\n'.join(report.tuning_lines([(directory, result)], str(tmp_path)))
  assert 'none: a non-private method' in text


def test_a_study_mixing_private_and_non_private_trials_is_refused():
  spec = tune.load_study(CONFIG, 'fedavg')[3]
  config = sweep.load_config_module(CONFIG).get_config('method=dp2fedsam')
  with pytest.raises(ValueError, match='mixes non-private and private'):
    tune.non_private_cost(spec, [config], 1, 0.0)
