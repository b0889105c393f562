"""The numbers of the READMEs' generated tables, recomputed from the committed runs' own files
(metrics.jsonl, evaluations.jsonl, tuning.json) without the report's code: the decision rule from
its definition, the means and stds with numpy. The tables are experiments.report's; the check
(tests/test_generated_docs.py) holds the committed READMEs to them."""

from __future__ import annotations

import glob
import json
import math
import os

import numpy as np
import pytest

from experiments.report import fair_pages, generated

ROOT = generated.REPO
RESULTS = os.path.join(ROOT, generated.RESULTS)
SF = os.path.join(RESULTS, 'shakespeare_field')
FMNIST = os.path.join(RESULTS, 'fmnist_paper_regime', 'runs')
SEEDS = (0, 1, 2)


def _records(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _rule(a, b):
  """The rule: d = mean over seeds of A - B, s = sqrt((s_A^2 + s_B^2) / 2); helps if
  d >= max(1 point, 2s), hurts if d <= -max(1 point, 2s), else level. d and s in points."""
  a, b = 100 * np.asarray(a, float), 100 * np.asarray(b, float)
  d = a.mean() - b.mean()
  s = math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
  bar = max(1.0, 2 * s)
  return ('helps' if d >= bar else 'hurts' if d <= -bar else 'level'), d, s


def _cells(lines):
  """{first cell: the other cells} of a Markdown table's body."""
  return {cells[0]: cells[1:] for cells in
          ([c.strip() for c in line.strip('|').split('|')] for line in lines[2:] if line.startswith('|'))}


@pytest.fixture(scope='module')
def results_blocks():
  return generated.blocks()[os.path.join(generated.RESULTS, 'README.md')]


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


# (row of the Shakespeare table) -> (method, setting, adapted part) per column; local_only plain.
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
LOCAL_ONLY = 'each role alone (local_only, nothing released)'


def test_the_shakespeare_table_is_pooled_and_mean_over_roles_of_the_committed_runs(results_blocks):
  table = results_blocks['hand-tuned-shakespeare']
  assert [c.strip() for c in table[0].strip('|').split('|')] == ['row', 'non-private', 'ε = 2', 'ε = 8']
  rows = _cells(table)
  assert set(rows) == {*SF_TABLE, LOCAL_ONLY}
  stds = []
  for row, specs in SF_TABLE.items():
    for cell, spec in zip(rows[row], specs):
      pooled, over_roles = _adapted(*spec), _adapted(*spec, key='test_accuracy')
      assert cell == f'{100 * np.mean(pooled):.2f} · {100 * np.mean(over_roles):.2f}', (row, spec)
      stds += [100 * np.std(pooled, ddof=1), 100 * np.std(over_roles, ddof=1)]
  local = _plain('local_only', 'default'), _plain('local_only', 'default', 'test_accuracy')
  assert rows[LOCAL_ONLY] == [f'{100 * np.mean(local[0]):.2f} · {100 * np.mean(local[1]):.2f}', '', '']
  stds += [100 * np.std(v, ddof=1) for v in local]
  assert f'≤ {max(stds):.2f} points' in table[-1]


# Fashion-MNIST (experiments/results/fmnist_paper_regime/runs).

def _fm(method, setting):
  finals = [_records(os.path.join(p, 'metrics.jsonl'))[-1]
            for p in sorted(glob.glob(os.path.join(FMNIST, method, setting, 'seed=*')))]
  assert all(r['round'] == 200 for r in finals)
  return [r['test_accuracy'] for r in finals]


def test_the_hand_tuned_fashion_mnist_table_is_the_final_rounds_and_bold_is_the_rule(results_blocks):
  table = results_blocks['hand-tuned-fmnist']
  columns = [c.strip().split('= ')[1] for c in table[0].strip('|').split('|')[1:]]
  names = {v: k for k, v in generated.PAPER_NAMES.items()}
  cells = {(names[row], eps): cell for row, values in _cells(table).items() if row in names
           for eps, cell in zip(columns, values) if cell}
  assert len(cells) == 18
  values = {key: _fm(key[0], f'eps={key[1]}') for key in cells}
  for (method, eps), cell in cells.items():
    accuracy = 100 * np.array(values[(method, eps)])
    text = f'{accuracy.mean():.2f} ± {accuracy.std(ddof=1):.2f}'
    others = [values[k] for k in values if k[1] == eps and k[0] != method]
    if all(_rule(values[(method, eps)], other)[0] == 'helps' for other in others):
      text = f'**{text}**'
    assert cell == text + (' ²' if len(accuracy) == 2 else ''), (method, eps)
  assert '**' in ''.join(cells.values())  # the rule puts one row above every other somewhere


# The fair blocks (experiments/results/fair_*/runs).

def _final_values(directory, row, metric):
  finals = sorted(glob.glob(os.path.join(directory, 'runs', row, 'final', 'seed=*')))
  return [_records(os.path.join(p, 'metrics.jsonl'))[-1][metric] for p in finals]


def test_every_claim_of_every_block_is_its_final_runs_by_the_rule(results_blocks):
  """Each line of each block's claims table: d and s in points and the verdict, from the final runs
  (the rule needs 3 seeds a side; every committed row has them)."""
  sections = '\n'.join(results_blocks['fair-blocks']).split('### Block (')[1:]
  verdict = {'helps': 'holds', 'level': 'level', 'hurts': 'contradicted'}
  published = {p.letter: p for p in fair_pages.published_blocks(RESULTS)}
  checked = 0
  for section in sections:
    block = published[section.split(')')[0]]
    for line in (line for line in section.splitlines() if ' vs ' in line):
      cells = [c.strip() for c in line.strip('|').split('|')]
      better, worse = (name.rstrip(' †') for name in cells[1].split(' vs '))
      label, d, s = _rule(_final_values(block.directory, better, block.block.metric),
                          _final_values(block.directory, worse, block.block.metric))
      assert cells[2:5] == [f'{d:+.2f}', f'{s:.2f}', verdict[label]], line
      checked += 1
  assert checked == 66  # every claim of the five blocks (11 + 11 + 29 + 12 + 3)


# The older searches: why no finite eps covers them.

TUNINGS = {  # study directory -> (K, tuner seed, n the score divides by)
    os.path.join(RESULTS, 'fmnist_tuning', 'runs', 'dp2fedsam'): (7, 0, 1000),
    os.path.join(RESULTS, 'fmnist_tuning', 'runs', 'dp_fedavg_ft'): (4, 1, 1000),
    os.path.join(SF, 'tuning', 'dp_fedavg_eps2'): (3, 0, 1063),
}


@pytest.mark.parametrize('directory', sorted(TUNINGS), ids=lambda d: os.path.basename(d))
def test_committed_tunings_release_their_exact_validation_sums(directory):
  """What makes their files say no finite eps covers them: the tuner seed is in tuning.json, so
  score * n - s * z gives back every trial's exact validation sum, and each trial's un-noised
  validation and test accuracy are listed beside it."""
  k, seed, n = TUNINGS[directory]
  tuning = json.load(open(os.path.join(directory, 'tuning.json')))
  assert tuning['private'] and tuning['plan']['seed'] == seed and len(tuning['trials']) == k
  assert tuning['selection_epsilon'] is None
  for index, trial in enumerate(tuning['trials']):
    record = _records(os.path.join(directory, trial['run'], 'metrics.jsonl'))[-1]
    z = np.random.default_rng([seed, 2, index]).standard_normal()
    recovered = trial['score'] * n - tuning['score_noise'] * z
    assert recovered == pytest.approx(record['validation_accuracy_sum'], abs=1e-6)
    assert trial['metric'] == record['validation_accuracy']
    assert trial['test_accuracy'] == record['test_accuracy']
