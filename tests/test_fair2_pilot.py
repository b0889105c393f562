"""experiments/studies/fair2_pilot.py: the regime rule and C by rule on runs written here."""

import json
import math
import os

import pytest

from experiments.studies import fair2_pilot as pilot


def _write_run(root, method, classes, eps, accuracies, norms, clip=0.05, rounds=200):
  """A run's three files as a run writes them: evaluations every 20 rounds up to `rounds`."""
  directory = os.path.join(root, method, f'S={classes},eps={eps:g}', 'seed=0')
  os.makedirs(directory)
  ends = range(rounds - 20 * (len(accuracies) - 1), rounds + 1, 20)
  with open(os.path.join(directory, 'metrics.jsonl'), 'w') as f:
    for end, accuracy in zip(ends, accuracies):
      f.write(json.dumps({'round': end, 'test_accuracy': accuracy}) + '\n')
  with open(os.path.join(directory, 'train_metrics.jsonl'), 'w') as f:
    for index, norm in enumerate(norms, 1):
      f.write(json.dumps({'round': index, 'mean_update_norm': norm}) + '\n')
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    json.dump({'dp': {'clip_norm': clip}}, f)


def _regime_runs(root, s5_private, s10_private=None, ceiling=0.80):
  for classes, private in ((5, s5_private), (10, s10_private)):
    if private is not None:
      _write_run(root, 'p_fedsam', classes, math.inf, [ceiling] * 3, [0.2])
      _write_run(root, 'dp2fedsam', classes, 0.25, [private] * 3, [0.1])


def test_a_final_accuracy_is_the_mean_of_the_last_three_evaluations_and_c_the_median_norm(tmp_path):
  _write_run(str(tmp_path), 'dp2fedsam', 5, 0.25, [0.1, 0.70, 0.72, 0.77], [0.3, 0.1, 0.2, 0.9, 0.05])
  (run,) = pilot.read_runs(str(tmp_path))
  assert run.final_accuracy == pytest.approx(73.0) and run.median_update_norm == pytest.approx(0.2)
  assert (run.classes, run.eps, run.rounds, run.clip_norm, run.finished) == (5, 0.25, 200, 0.05, True)


def test_the_first_regime_with_room_is_chosen_in_the_declared_order(tmp_path):
  root = str(tmp_path)
  _regime_runs(root, s5_private=0.79, s10_private=0.70)  # S = 5: 1 point of room; S = 10: 10
  chosen = pilot.regime(pilot.read_runs(root))
  assert (chosen.classes, chosen.eps) == (10, 0.25) and chosen.room == pytest.approx(10.0)


def test_an_earlier_regime_still_running_leaves_the_choice_open(tmp_path):
  root, running = str(tmp_path / 'finished'), str(tmp_path / 'running')
  _regime_runs(root, s5_private=0.79, s10_private=0.70)
  _write_run(running, 'dp2fedsam', 5, 0.25, [0.5], [0.1], rounds=120)
  unfinished = [r for r in pilot.read_runs(root) if not (r.method == 'dp2fedsam' and r.classes == 5)]
  unfinished += pilot.read_runs(running)  # S = 5's private run at round 120
  chosen = pilot.regime(unfinished)
  assert chosen.classes is None and 'S = 5' in chosen.open_because


def test_no_room_anywhere_chooses_nothing(tmp_path):
  root = str(tmp_path)
  _regime_runs(root, s5_private=0.795, s10_private=0.79)
  for classes in (5, 10):
    _write_run(root, 'dp2fedsam', classes, 1.0, [0.80] * 3, [0.1])
  chosen = pilot.regime(pilot.read_runs(root))
  assert chosen.classes is None and chosen.room is None


def test_c_by_rule_comes_from_each_familys_run_and_waits_for_it(tmp_path):
  root = str(tmp_path)
  _regime_runs(root, s5_private=0.70)
  runs = pilot.read_runs(root)
  chosen = pilot.regime(runs)
  assert pilot.clip_norms(runs, chosen) == {'personal_head': pytest.approx(0.1), 'global_model': None}
  _write_run(root, 'dp_fedavg', 5, 0.25, [0.6] * 3, [0.4, 0.5, 0.6])
  runs = pilot.read_runs(root)
  assert pilot.clip_norms(runs, chosen)['global_model'] == pytest.approx(0.5)


def _ladder_run(root, method, knob, value, accuracy, rounds=20, failed=False):
  directory = os.path.join(root, method, f'knob={knob},value={value:g}', 'seed=0')
  os.makedirs(directory)
  with open(os.path.join(directory, 'metrics.jsonl'), 'w') as f:
    for end in range(10, rounds + 1, 10):
      f.write(json.dumps({'round': end, 'test_accuracy': accuracy}) + '\n')
  if failed:
    with open(os.path.join(directory, 'failure.json'), 'w') as f:
      json.dump({'error': 'FloatingPointError'}, f)


LADDER = (0.01, 0.0316, 0.1, 0.316, 1.0)


def _edge(tmp_path, accuracies, failed=(), rounds=None):
  for value, accuracy in zip(LADDER, accuracies):
    _ladder_run(str(tmp_path), 'dp2fedsam', 'client_lr', value, accuracy,
                rounds=(rounds or {}).get(value, 20), failed=value in failed)
  runs = pilot.read_ladder_runs(str(tmp_path))
  return pilot.edge(runs, 'dp2fedsam', 'client_lr', LADDER, 20)


def test_the_edge_is_the_first_value_above_the_best_that_fails_or_drops_ten_points(tmp_path):
  found = _edge(tmp_path, [0.40, 0.60, 0.70, 0.61, 0.30])
  assert (found.edge, found.top) == (1.0, 0.316)  # 61 is within 10 points of 70; 30 is not
  assert found.range == (pytest.approx(0.316 / 10 ** 1.5, rel=1e-3), 0.316)


def test_a_failed_run_is_an_edge_and_below_the_best_nothing_is(tmp_path):
  found = _edge(tmp_path, [0.10, 0.60, 0.70, 0.70, 0.70], failed=(0.316,))
  assert (found.edge, found.top) == (0.316, 0.1)  # the 10 % at 0.01 is under the best, not above
  assert found.accuracies[3] == (0.316, None)


def test_a_ladder_that_never_fails_tops_out_and_an_unfinished_one_is_open(tmp_path):
  found = _edge(tmp_path / 'a', [0.40, 0.50, 0.60, 0.65, 0.66])
  assert (found.edge, found.top) == (None, 1.0)
  found = _edge(tmp_path / 'b', [0.40, 0.50, 0.60, 0.65, 0.66], rounds={0.1: 10})
  assert found.range is None and found.unfinished == (0.1,) and 'unfinished' in found.open_because


def _ranked(finals, at, rounds=200):
  """A configuration's validation accuracy by round: `at` at each candidate, `final` at the end."""
  return {**{t: at for t in pilot.TRIAL_LENGTHS}, rounds - 40: at, rounds - 20: at, rounds: finals}


def test_t_trial_is_the_shortest_candidate_whose_ranks_follow_the_full_runs():
  finals = [0.5 + 0.03 * i for i in range(10)]
  same_order = [{**_ranked(f, 0.3 + 0.01 * i), 160: f, 180: f} for i, f in enumerate(finals)]
  found = pilot.trial_length_of(same_order)
  assert found.rounds == 40 and found.spearman[0] == (40, pytest.approx(1.0))
  # Shuffled at 40 and 60 rounds, in order from 100: T_trial is 100.
  shuffled = [dict(r) for r in same_order]
  for i, r in enumerate(shuffled):
    r[40] = r[60] = 0.3 + 0.01 * ((i * 7) % 10)
  found = pilot.trial_length_of(shuffled)
  assert found.rounds == 100 and found.spearman[0][1] < 0.8
  for r in shuffled:
    r[100] = r[40]
  assert pilot.trial_length_of(shuffled).rounds == 200  # no candidate holds the ranks: T


def test_t_trial_is_open_until_ten_configurations_finished():
  runs = [{40: 0.5, 60: 0.5, 100: 0.5, 160: 0.5, 180: 0.5, 200: 0.5}] * 9 + [{40: 0.5}]
  found = pilot.trial_length_of(runs)
  assert found.rounds is None and found.configurations == 9


def _rank_run(repo, index, validation, failed_at=None):
  """Rank run `index` validated every 20 rounds (`validation`: {round: accuracy}) and, if
  failed_at, its failure.json as experiments.train writes it."""
  directory = os.path.join(repo, pilot.RANK_RUNS, 'dp2fedsam', f'index={index}', 'seed=0')
  os.makedirs(directory)
  with open(os.path.join(directory, 'metrics.jsonl'), 'w') as f:
    for end, accuracy in sorted(validation.items()):
      f.write(json.dumps({'round': end, 'validation_accuracy': accuracy}) + '\n')
  if failed_at is not None:
    with open(os.path.join(directory, 'failure.json'), 'w') as f:
      json.dump({'error': 'FloatingPointError', 'round': failed_at}, f)


def test_a_diverged_rank_run_is_finished_keeps_its_early_scores_and_ranks_last_after(tmp_path):
  every = range(pilot.RANK_EVAL_EVERY, pilot.NUM_ROUNDS + 1, pilot.RANK_EVAL_EVERY)
  for i in range(9):  # in one order at every round
    _rank_run(str(tmp_path), i, {r: 0.5 + 0.02 * i for r in every})
  # The best of all at 40 and 60, then NaN at round 90: at 100 and at T it ranks last.
  _rank_run(str(tmp_path), 9, {20: 0.6, 40: 0.9, 60: 0.9, 80: 0.9}, failed_at=90)
  found = pilot.trial_length(str(tmp_path))
  assert found.configurations == 10  # not left open by the run that stopped at 90
  rhos = dict(found.spearman)
  assert rhos[100] == pytest.approx(1.0) and rhos[40] < pilot.MIN_SPEARMAN
  assert found.rounds == 100
