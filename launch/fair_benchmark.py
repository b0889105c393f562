r"""The fair benchmark (docs/benchmark.md): every row of a block searched by launch.tune under one law,
then its selection at 3 seeds on the full training split, then the block's non-private ceiling.

  python3 -m launch.fair_benchmark --root=$HOME/fair --plan       # runs, CPU hours, GPU estimate
  python3 -m launch.fair_benchmark --root=$HOME/fair              # blocks a, d, c, b on the CPU
  python3 -m launch.fair_benchmark --root=$HOME/fair --blocks=d --rows=centaur --parallel=2
  python3 -m launch.fair_benchmark --root=$HOME/fair --blocks=a --publish=experiments/results
  python3 -m launch.fair_benchmark --root=$HOME/fair --blocks=d --smoke   # 2 rounds of every row
  bash benchmarks/device/fair_benchmark.sh OUT_DIR    # a whole block on a lent GPU

One sweep root; resumable: a row whose tuning.json is done is not tuned again (launch.tune resumes
its trials otherwise), a finished final run is skipped, a stopped one resumes from its checkpoint.
Per row: <root>/<block config>/<row>/trial=<k> (the search), <row>/tuning.json, <row>/final/seed=<s>
(the selection, validation_fraction 0), <row>/row.json (the row's entry). <root>/<block
config>/benchmark.json gathers the entries after each row: the block's law, eps and regime rule, and
every row with its tuner seed, selected values and the selection's epsilon beside it (what a table
row prints), and its final runs' status.

A row's new final seeds run through launch.sweep.execute_trials: as one compiled program where they
differ only in config.training_seed (Block.final_seed_field), else one process each (--one_program).

The plan counts E[K] trials a row (the law's mean, or E[max(K, P)] with a pool floor P: K is drawn
by launch.tune, secret where it must be) plus the final seeds, and times them from committed
measurements (COST_* below); it runs nothing.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging

from dp2fedsam_jax import cli, local, metric_writers
from dp2fedsam_jax.algorithms import METHODS, pieces
from dp2fedsam_jax.config import evaluates_at
from dp2fedsam_jax.local import LocalConfig
from dp2fedsam_jax.privacy import selection
from experiments import config_files, report
from experiments.config_files import config_name
from experiments.report import fair as fair_report
from experiments.report import workdirs
from launch import sweep, tune

FLAGS = flags.FLAGS
ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLISHED_ROOT = os.path.join(ROOT_DIR, 'experiments', 'results')  # --publish's home, --seed_from's default
BLOCK_CONFIGS = {
    'a': 'experiments/configs/fair_a_dp2fedsam.py',
    'b': 'experiments/configs/fair_b_topk.py',
    'c': 'experiments/configs/fair_c_pfeddsu.py',
    'd': 'experiments/configs/fair_d_shakespeare.py',
    'a5': 'experiments/configs/fair_a5_dp2fedsam.py',  # (a)'s declared next step if at its ceiling
    'e': 'experiments/configs/fair_e_design2.py',  # the second design's one block
}
CPU_ORDER = ('a', 'd', 'c', 'b')  # issue 58: (a) first, the Shakespeare block next on a CPU
SUMMARY_FILE, ROW_FILE = 'benchmark.json', 'row.json'
# A second-design block's searches as they run (carry_searches): beside runs/, which no report reads.
SEARCHES_DIR, CARRIED_RECORD = 'searches', 'operator_record.json'
CARRIED_NOTE = (  # in place of the operator file's DO_NOT_PUBLISH, in the carried copy only
    "Published on purpose by launch.fair_benchmark --publish (a second-design block), so that a "
    "fresh root resumes this draw. The design publishes the search's pool anyway: this search's "
    'selection_epsilon is the procedure\'s, for an operator who keeps this record; with K known only '
    'epsilon_bound holds (docs/benchmark.md, "A second-design block (e) loses no search").')
TRIAL_FILES = ('config.json', 'sweep.json', 'failure.json', metric_writers.EVAL_FILE,
               metric_writers.TRAIN_FILE, metric_writers.HOSTS_FILE)

# Cost model, from committed measurements (nothing runs for the plan).
# Fashion-MNIST, one run at a time on the 2 cores, quiet machine: the seconds of the 200 rounds
# (train_metrics.jsonl) of the committed tuning trials, SAM (DP2-FedSAM, its head phase included)
# and SGD (DP-FedAvg-FT); a row's optimizer (or DSU's weight mask) picks the anchor. Block (b)'s
# client does the same work (108 rows x 1 epoch against 54 x 2). A fine-tuning evaluation of the
# 1,000 clients took 133 s for the two passes (validation and test) of a trial
# (fmnist_paper_regime.tuning_space's docstring).
COST_ANCHORS = {'sam': 'experiments/results/fmnist_tuning/runs/dp2fedsam',
                'sgd': 'experiments/results/fmnist_tuning/runs/dp_fedavg_ft',
                # A weight-masked (DSU) row's forward pass re-makes its mask every local step: its
                # own anchor, block (c)'s first searched row (radix-select masks, ~1.5x 'sgd').
                'dsu': 'experiments/results/fair_c_pfeddsu/runs/dp_pfeddsu'}
FINETUNE_PASS_SECONDS = 66.5
# Shakespeare: experiments.studies.shakespeare_field's cost model (CPU hours a 1,000-round run, from
# its runs), plus the adaptation of every role at T: a whole-model fine-tune ~6 min a pass (its
# docstring; a row that may pick it is counted at it), a trial two passes, a final run one.
FULL_ADAPT_PASS_HOURS = 0.1
# GPU (one H200, benchmarks/README.md): a Fashion-MNIST round of DP2-FedSAM (cohort 50, 2 + 2
# epochs) 0.100 s vmapped: 20 s a run, plus GPU_START_SECONDS assumed for start-up, compilation and
# evaluation, GPU_SHARING_SLOWDOWN assumed when 10 share the chip (block (a)'s first call measures
# both). Shakespeare: 269-299 s a run with its adaptation, measured 6 at a time.
GPU_ROUND_SECONDS = 0.100
GPU_START_SECONDS = 60.0
GPU_SHARING_SLOWDOWN = 2.0
GPU_RUNS_AT_ONCE = 10
GPU_SHAKESPEARE_RUN_SECONDS, GPU_SHAKESPEARE_AT_ONCE = 290.0, 6


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


@functools.lru_cache(maxsize=None)
def load_block(letter: str):
  """(config path, module, BLOCK) of a block letter, loaded once per process: a sweep keeps the
  blocks it started with (re-executing a config edited meanwhile beside the helper modules it already
  holds stopped one at a row boundary)."""
  if letter not in BLOCK_CONFIGS:
    raise ValueError(f'--blocks: unknown block {letter!r}; choose from {sorted(BLOCK_CONFIGS)}')
  path = BLOCK_CONFIGS[letter]
  module = config_files.load_config_module(os.path.join(ROOT_DIR, path))
  return path, module, module.BLOCK


def row_dir(root: str, path: str, row) -> str:
  return os.path.join(root, config_name(path), row.name)


FINAL_RAN_AS = ("a final seed of one program with the row's other final seeds "
                '(launch.fair_benchmark)')  # a program's final run, in its sweep.json


def final_runs(root: str, path: str, module, block, row, selected: dict) -> list:
  """[(sweep.Run, config)] of the row's final seeds at the selected values, full training split;
  each seed in the config field block.final_seed_field names (its workdir final/seed=<s> either
  way)."""
  values = {**block.final_fixed_for(row), **block.tied_values(row, selected)}
  texts = tuple(f'--config.{f}={"None" if v is None else config_files.format_value(v)}'
                for f, v in sorted(values.items()))
  out = []
  for seed in block.final_seeds(row):
    if block.final_seed_field == 'seed':  # its own split
      args, overrides = {**block.study(row)['args'], 'seed': seed}, texts
    else:  # the block's split; the seed keys cohorts, noise, init and shuffles only
      args = dict(block.study(row)['args'])
      overrides = texts + (f'--config.training_seed={config_files.format_value(seed)}',)
    config = config_files.apply_overrides(module.get_config(config_files.arg_string(args)),
                                          list(overrides))
    run = sweep.Run(args, os.path.join(row_dir(root, path, row), 'final', f'seed={seed}'),
                    int(config.num_rounds), config.method, config_name(path), overrides,
                    sweep.missing_data(config))
    out.append((run, config))
  sweep.validate_runs([r for r, _ in out], [c for _, c in out])
  return out


# ------------------------------------------------------------------ the plan's cost


def _anchor_seconds(directory: str) -> float:
  """Mean over the committed trials under `directory` of their rounds' seconds."""
  totals = []
  for name in sorted(os.listdir(os.path.join(ROOT_DIR, directory))):
    path = os.path.join(ROOT_DIR, directory, name, metric_writers.TRAIN_FILE)
    if os.path.exists(path):
      totals.append(sum(r['seconds'] for r in metric_writers.read_jsonl(path)))
  if not totals:
    raise ValueError(f'no committed train_metrics.jsonl under {directory} to time a run by')
  return sum(totals) / len(totals)


ANCHOR_ROUNDS = 200  # the anchors' runs


def row_config(module, block, row):
  """The row's config as its trials start from (the block's settings, before the search's values)."""
  return module.get_config(config_files.arg_string(block.study(row)['args']))


def _search_accounting(path: str, module, block, row) -> tuple:
  """(the study's spec, a trial's config as the search runs it) of the row."""
  _, _, _, spec = tune.load_study(os.path.join(ROOT_DIR, path), row.name)
  fixed = [f'--config.{f}={config_files.format_value(v)}' for f, v in sorted(spec['fixed'].items())]
  return spec, config_files.apply_overrides(row_config(module, block, row), fixed)


def selection_epsilons(path: str, module, block, row) -> tuple:
  """(selection eps, one trial's eps, eps of the selection and one final run composed) of the row's
  search (launch.tune's accounting: the law's E[K], K secret; RDP at the study's delta); Nones for
  a non-private row. The same for every private row of a block."""
  spec, config = _search_accounting(path, module, block, row)
  cost = tune.privacy_cost(spec, [config], naive_trials=1)
  if cost['selection_epsilon'] is None:
    return None, None, None
  event, relation, delta, _ = tune.trial_event(config)  # a final run: a trial's mechanism, no score
  with_run = selection.selection_then_run_epsilon(
      [tune.scored_event(event, spec['score_noise'])], spec['distribution'], event, delta, relation)
  return cost['selection_epsilon'], cost['per_trial_epsilon'], with_run


def row_epsilons(path: str, module, block, results: dict) -> dict:
  """{private row: (eps of its search, eps of search + one final run, K or None)}: the block's
  (K secret) unless the row's tuning.json publishes K because K's naive composition is the bound
  that holds once K is known (launch.tune.search_epsilon_bound); then that bound, and K's trials
  composed with the final run."""
  search, _, with_run = selection_epsilons(path, module, block, block.rows[0])
  out = {}
  for row in block.rows:
    tuning = results[row.name].tuning or {}
    k = tuning.get('num_trials')
    if k is None:
      out[row.name] = (search, with_run, None)
      continue
    spec, config = _search_accounting(path, module, block, row)
    event, relation, delta, _ = tune.trial_event(config)
    naive_with_run = selection.trials_then_run_epsilon(
        [tune.scored_event(event, spec['score_noise'])], k, event, delta, relation)
    out[row.name] = (tuning['epsilon_bound'], max(with_run, naive_with_run), k)
  return out


def cpu_hours(block, row, config, kind: str) -> float:
  """CPU hours of one trial (kind 'trial') or final run ('final') of the row (2 cores)."""
  spec = METHODS[row.method]
  if config.dataset == 'shakespeare':
    from experiments.studies import shakespeare_field as field  # pylint: disable=import-outside-toplevel
    hours = field.planned_hours({'method': row.method, 'personal_epochs': 10,
                                 'model': config.model})
    return hours + FULL_ADAPT_PASS_HOURS * (2 if kind == 'trial' else 1)
  if isinstance(spec.weight_mask, pieces.DSUWeightMask):
    anchor = 'dsu'
  else:
    anchor = 'sam' if isinstance(spec.shared_optimizer, local.SAM) else 'sgd'
  fixed = dict(block.trial_fixed if kind == 'trial' else block.final_fixed)
  rounds = int(fixed.get('num_rounds', config.num_rounds))  # a block's trials may be shorter
  seconds = _anchor_seconds(COST_ANCHORS[anchor]) * rounds / ANCHOR_ROUNDS
  if spec.evaluation.adaptation(LocalConfig.from_config(config)).trains:  # an -FT / -fb evaluation
    every, start = int(fixed['eval_every']), int(fixed.get('eval_from', 0))
    passes = 2 if kind == 'trial' else sum(evaluates_at(r, rounds, every, start)
                                           for r in range(1, rounds + 1))
    seconds += FINETUNE_PASS_SECONDS * passes
  return seconds / 3600


def gpu_seconds(config) -> float:
  """GPU seconds of a run, shared with the others running at once (see GPU_*)."""
  if config.dataset == 'shakespeare':
    return GPU_SHAKESPEARE_RUN_SECONDS / GPU_SHAKESPEARE_AT_ONCE
  alone = config.num_rounds * GPU_ROUND_SECONDS + GPU_START_SECONDS
  return alone * GPU_SHARING_SLOWDOWN / GPU_RUNS_AT_ONCE


def block_plan(letter: str, root: str, seed_from: str | None = None) -> dict:
  """{'rows': [(row, E[K], finals, cpu hours, status, (selection eps, one trial's eps))], 'runs',
  'cpu_hours', 'gpu_hours'} of a block, and 'runs_left' / 'cpu_hours_left' of what neither root
  nor `seed_from` (an out_root of --publish, as the sweep's flag) holds finished yet."""
  path, module, block = load_block(letter)
  published = os.path.join(published_dir(seed_from, letter), 'runs') if seed_from else None
  rows, out = [], {'runs': 0.0, 'cpu_hours': 0.0, 'runs_left': 0.0, 'cpu_hours_left': 0.0,
                   'gpu_hours': 0.0}
  for row in block.all_rows():
    base = subsumed_by(letter, root, row, published)
    if base is not None:
      rows.append((row, 0.0, 0, 0.0, fair_report.subsumed_text(row, base), (None, None, None)))
      continue
    mean_k = block.expected_trials(row)  # E[K], or E[max(K, P)] with a pool floor
    finals = len(block.final_seeds(row))
    config = row_config(module, block, row)
    trial_hours = cpu_hours(block, row, config, 'trial')
    final_hours = cpu_hours(block, row, config, 'final')
    tuned, finals_done = row_progress(row_dir(root, path, row))
    where = ''
    if published and (tuned, finals_done) != (True, finals):
      on_page = row_progress(os.path.join(published, row.name))
      if on_page[0] and (not tuned or on_page[1] > finals_done):  # the sweep would seed from it
        (tuned, finals_done), where = on_page, ' (published)'
    status = 'new' if tuned is None else 'tuning' if not tuned else (
        f'tuned; {finals_done} final run(s) finished{where}')
    pool = search_progress(letter, row, root, published) if block.design == 2 and not tuned else None
    if pool is not None:  # the second design publishes its pool, so the plan may read its size
      status = f'searching: {pool[0]} of {pool[1]} trials finished'
    rows.append((row, mean_k, finals, mean_k * trial_hours + finals * final_hours, status,
                 selection_epsilons(path, module, block, row)))
    out['runs'] += mean_k + finals
    out['cpu_hours'] += mean_k * trial_hours + finals * final_hours
    out['gpu_hours'] += (mean_k + finals) * gpu_seconds(config) / 3600
    # A search under way: E[K] still (its K is not read), but a second-design pool's own size.
    trials_left = 0.0 if tuned else mean_k if pool is None else pool[1] - pool[0]
    out['runs_left'] += trials_left + finals - finals_done
    out['cpu_hours_left'] += trials_left * trial_hours + (finals - finals_done) * final_hours
  return {'block': block, 'path': path, 'rows': rows, **out}


def row_places(root: str, path: str, row, published: str | None) -> list[str]:
  """Where a row's files may be: its row_dir under root, then its folder of `published` (a
  block's published runs/), if given."""
  return [row_dir(root, path, row)] + ([os.path.join(published, row.name)] if published else [])


def subsumed_by(letter: str, root: str, row, published: str | None = None):
  """The base row whose finished search (under root, else in `published`, a block's published
  runs/) selected every value the variant `row` pins, while `row` has no search of its own: `row` is
  then not searched (Block.is_subsumed). None otherwise."""
  path, _, block = load_block(letter)
  base = block.base_of(row)
  places = lambda r: row_places(root, path, r, published)
  if base is None or any(os.path.exists(os.path.join(d, tune.TUNING_FILE)) for d in places(row)):
    return None
  for directory in places(base):
    tuning = _read(os.path.join(directory, tune.TUNING_FILE)) or {}
    if tuning.get('status') == 'done':
      return base if block.is_subsumed(row, tuning.get('selected_values')) else None
  return None


def row_progress(directory: str) -> tuple:
  """(None: no search yet | False: searching | True: selected, final runs finished) of the row
  whose files are under `directory` (its row_dir, or its folder of a published runs/)."""
  tuning = _read(os.path.join(directory, tune.TUNING_FILE))
  if tuning is None or tuning.get('status') != 'done':
    return (None if tuning is None else False), 0
  finals = os.path.join(directory, 'final')
  done = 0
  for name in sorted(os.listdir(finals)) if os.path.isdir(finals) else ():
    run = os.path.join(finals, name)
    done += _reached_last_round(run) or workdirs.diverged_at(run) is not None  # final there
  return True, done


def _reached_last_round(workdir: str) -> bool:
  config = _read(os.path.join(workdir, 'config.json'))
  records = metric_writers.read_jsonl(os.path.join(workdir, metric_writers.EVAL_FILE))
  return bool(config and records and records[-1]['round'] >= config['num_rounds'])


def print_plan(letters, root: str, seed_from: str | None = None) -> dict:
  totals = {'runs': 0.0, 'cpu_hours': 0.0, 'gpu_hours': 0.0, 'runs_left': 0.0, 'cpu_hours_left': 0.0}
  for letter in letters:
    plan = block_plan(letter, root, seed_from)
    block = plan['block']
    print(f"block ({letter}) {block.paper}: {plan['path']}; law {fair_report.law_text(block.trials)}, "
          f'eps {block.eps} per trial; ceiling: {block.ceiling_reference}'
          + (f'; law {fair_report.law_text(block.ceiling_trials)}' if block.ceiling_trials else ''))
    print(f'  regime rule: {block.regime_rule}')
    for reason in block.pending:
      print(f'  pending (the block runs nothing until it is decided): {reason}')
    for row, mean_k, finals, hours, status, (eps, one, with_run) in plan['rows']:
      mark = f'  [{row.mark}]' if row.mark else ''
      if not finals and not mean_k:  # a subsumed variant: nothing runs
        print(f'  {row.name:24s} {status}{mark}')
        continue
      privacy = (f'selection eps {eps:.3f} (one trial {one:.3f}; with a final run {with_run:.3f})'
                 if eps is not None else 'non-private: no eps')
      floor = block.study(row).get('pool_floor')
      trials = f'E[max(K, {floor})]' if floor else 'E[K]'
      print(f'  {row.name:24s} tuner seed {row.seed:4d}: {trials} {mean_k:.1f} trials + {finals} '
            f'final, ~{hours:.1f} CPU h; {privacy}; {status}{mark}')
    print(f"  block ({letter}): ~{plan['runs']:.0f} runs, ~{plan['cpu_hours']:.1f} CPU h (2 cores), "
          f"~{plan['gpu_hours'] * 60:.0f} GPU min; left here: ~{plan['runs_left']:.0f} runs, "
          f"~{plan['cpu_hours_left']:.1f} CPU h")
    for key in totals:
      totals[key] += plan[key]
  print(f"total: ~{totals['runs']:.0f} runs (the expected trials a row), ~{totals['cpu_hours']:.1f} CPU h "
        f"on the 2 cores, ~{totals['gpu_hours'] * 60:.0f} min of one GPU ({GPU_RUNS_AT_ONCE} "
        'Fashion-MNIST runs at a time; GPU_* assumptions in launch/fair_benchmark.py); left under '
        f"{root}{' and ' + seed_from if seed_from else ''}: ~{totals['runs_left']:.0f} runs, "
        f"~{totals['cpu_hours_left']:.1f} CPU h")
  return totals


# ------------------------------------------------------------------ running


def _read(path: str):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def run_row(letter: str, row_name: str, root: str, parallel: int, seed_from: str | None = None,
            one_program: str = 'auto') -> dict:
  """Tunes the row (launch.tune resumes or finds its finished search), then its final seeds; writes
  and returns its entry of the block's summary (<row>/row.json). `seed_from` (the block's published
  runs/): a search published there is not run again and its finished final runs count as done.
  A variant whose base row already selected its pins runs nothing (subsumed_by). `one_program`
  (launch.tune's): the trials, and the new final seeds, that share one program's key run as one."""
  path, module, block = load_block(letter)
  if block.pending:
    raise ValueError(f'block ({letter}) is pending, so none of its trials may run yet: '
                     + '; '.join(block.pending))
  if seed_from:
    resume_search(letter, row_name, root, os.path.dirname(seed_from))
    seed_search(letter, row_name, root, seed_from)
  row = block.row(row_name)
  base = subsumed_by(letter, root, row, seed_from)
  if base is not None:
    entry = {'method': row.method, 'mark': row.mark, 'paper_row': row.paper_row,
             'pinned': dict(row.pinned), 'subsumed_by': base.name,
             'note': fair_report.subsumed_text(row, base), 'final_runs': {}}
    _log(f'skip    row {row.name}: {entry["note"]}')
    _write_json(os.path.join(row_dir(root, path, row), ROW_FILE), entry)
    return entry
  tuning = searched_elsewhere(path, root, row)
  if tuning is None:
    # Through the tuner, also for a finished search: it skips the finished trials and refuses a
    # plan that changed since (another seed, law or candidates), so no selection outlives its space.
    tuning = tune.tune(path, root, row.name, parallel=parallel, one_program=one_program)
  selected = tuning.get('selected_values')
  entry = {'method': row.method, 'mark': row.mark, 'paper_row': row.paper_row,
           'tuner_seed': row.seed, 'pinned': dict(row.pinned), 'space': block.study(row)['space'],
           'selection_epsilon': tuning.get('selection_epsilon'),
           'per_trial_epsilon': tuning.get('per_trial_epsilon'), 'selected_values': selected,
           'final_runs': {}}
  if block.design == 2:
    # Its pool publishes K: the bound that holds with K known (launch.tune.search_epsilon_bound).
    entry.update(selected_score=tuning.get('selected_score'),
                 epsilon_bound=tuning.get('epsilon_bound'),
                 selection_trials=selection_trials(row_dir(root, path, row), seed_from, row),
                 search=search_of(block, row, row_dir(root, path, row), seed_from))
  if selected is None:
    entry['note'] = 'nothing selected (K = 0 or every trial failed): the row has no final runs'
  else:
    runs = final_runs(root, path, module, block, row, selected)
    if seed_from and os.path.isdir(seed_from):  # (a block with only searches/ carried has none)
      for workdir, source in sweep.seed_from([r for r, _ in runs], root, seed_from):
        _log(f'seeded  {workdir} from {source}')
    results = sweep.execute_trials(path, runs, parallel, os.path.join(root, '.jax_cache'),
                                  one_program, ran_as=FINAL_RAN_AS)
    for run, _ in runs:
      # What the run is, not what this invocation did with it: a restart rewrites the same record.
      status = results.get(run.workdir)
      entry['final_runs'][os.path.relpath(run.workdir, root)] = (
          'finished' if status in ('ran', 'skipped (done)') else status)
  _write_json(os.path.join(row_dir(root, path, row), ROW_FILE), entry)
  return entry


def search_of(block, row, directory: str, seed_from: str | None = None) -> dict | None:
  """The second design's record of a row's search (search_spread.search_record: its pool, the
  pool's tuning curve, the private search's SD, the pool's best) from the operator's file of its
  trials; where this root holds no such file (a search seeded from a published one), the published
  row's record under `seed_from`, else None."""
  from experiments.studies import search_spread  # pylint: disable=import-outside-toplevel
  operator = _read(os.path.join(directory, tune.OPERATOR_FILE))
  if operator is None:
    published = _read(os.path.join(seed_from, row.name, ROW_FILE)) if seed_from else None
    return (published or {}).get('search')
  spec = block.study(row)
  noise_on_mean = spec['score_noise'] / operator['score_denominator']
  return search_spread.search_record(
      operator['trials'], selection.TrialDistribution.from_dict(block.trials_of(row)),
      noise_on_mean, seed=row.seed)


def selection_trials(directory: str, seed_from: str | None, row) -> int | None:
  """The K of the row's selection (its pool, with a floor, may hold more trials): the operator's
  record here, else the published row's."""
  operator = _read(os.path.join(directory, tune.OPERATOR_FILE))
  if operator is not None:
    return operator.get('num_trials')
  published = _read(os.path.join(seed_from, row.name, ROW_FILE)) if seed_from else None
  return (published or {}).get('selection_trials')


def search_progress(letter: str, row, root: str, published: str | None) -> tuple | None:
  """(finished trials, the pool's size) of a second-design row's search under way, here or carried
  beside `published` (a block's runs/); None where none is drawn or it is done."""
  path, _, _ = load_block(letter)
  places = [row_dir(root, path, row)] + (
      [os.path.join(os.path.dirname(published), SEARCHES_DIR, row.name)] if published else [])
  for directory, name in zip(places, (tune.OPERATOR_FILE, CARRIED_RECORD)):
    record = _read(os.path.join(directory, name))
    if record is not None and record.get('status') == 'running':
      done = [n for n in record['runs'] if any(
          _trial_finished(os.path.join(d, n)) for d in places)]
      return len(done), len(record['runs'])
  return None


def search_under_way(letter: str, row_name: str, root: str, seed_from: str | None) -> bool:
  """Whether the row's search is drawn but not done: its operator's record under root, else its
  carried one (carry_searches) beside `seed_from`, says 'running'."""
  path, _, block = load_block(letter)
  record = _read(os.path.join(row_dir(root, path, block.row(row_name)), tune.OPERATOR_FILE))
  if record is None and seed_from:
    record = _read(os.path.join(os.path.dirname(seed_from), SEARCHES_DIR, row_name, CARRIED_RECORD))
  return (record or {}).get('status') == 'running'


def finals_begun(letter: str, row_name: str, root: str, seed_from: str | None) -> bool:
  """Whether the row's final runs have begun (under root, or published in `seed_from`) and neither
  place holds its row.json: the row nearest its end."""
  path, _, block = load_block(letter)
  places = row_places(root, path, block.row(row_name), seed_from)
  if any(os.path.exists(os.path.join(d, ROW_FILE)) for d in places):
    return False
  return any(os.path.isdir(os.path.join(d, 'final')) and os.listdir(os.path.join(d, 'final'))
             for d in places)


def seed_search(letter: str, row_name: str, root: str, source: str) -> bool:
  """Copies the row's published tuning.json (finished) from `source` into its empty directory under
  root: the search then counts as done (searched_elsewhere). Returns whether it copied."""
  path, _, block = load_block(letter)
  directory = row_dir(root, path, block.row(row_name))
  published = os.path.join(source, row_name, tune.TUNING_FILE)
  if os.path.exists(os.path.join(directory, tune.TUNING_FILE)) or not os.path.exists(published):
    return False
  if (_read(published) or {}).get('status') != 'done':
    return False
  _copy_if_there(published, os.path.join(directory, tune.TUNING_FILE))
  _log(f'seeded  {directory} from {published} (its search is not run again)')
  return True


def carry_searches(letter: str, root: str, out: str) -> list[str]:
  """A second-design block's searches, finished or under way, to <out>/searches/<row>/: the
  operator's record (its secret, K, every candidate) and each finished trial's small files, so
  that a fresh root resumes a search (resume_search) instead of drawing it again. The design
  publishes every trial of a search (its pool, row.json) anyway; carrying makes K and the trials
  public while the search runs. Returns the rows carried."""
  path, _, block = load_block(letter)
  if block.design != 2:
    return []
  carried = []
  for row in block.all_rows():
    directory = row_dir(root, path, row)
    record = _read(os.path.join(directory, tune.OPERATOR_FILE))
    if record is None:
      continue
    target = os.path.join(published_dir(out, letter), SEARCHES_DIR, row.name)
    for name in record['runs']:
      if _trial_finished(os.path.join(directory, name)):
        for file in TRIAL_FILES:
          _copy_if_there(os.path.join(directory, name, file), os.path.join(target, name, file))
    carried_record = {k: v for k, v in record.items() if k != 'DO_NOT_PUBLISH'}
    _write_json(os.path.join(target, CARRIED_RECORD), {'published_on_purpose': CARRIED_NOTE,
                                                       **carried_record})
    carried.append(row.name)
  return carried


def _trial_finished(workdir: str) -> bool:
  """A trial that reached its last round or failed: either way its files are final."""
  return _reached_last_round(workdir) or os.path.exists(os.path.join(workdir, 'failure.json'))


def resume_search(letter: str, row_name: str, root: str, published: str) -> bool:
  """Copies the row's carried search (carry_searches; `published` is the block's published_dir)
  into its directory under root when that holds no operator's record: launch.tune then resumes the
  same draw, its finished trials skipped, the others run from their start. Returns whether it
  copied."""
  path, _, block = load_block(letter)
  directory = row_dir(root, path, block.row(row_name))
  source = os.path.join(published, SEARCHES_DIR, row_name)
  record = _read(os.path.join(source, CARRIED_RECORD))
  if record is None or os.path.exists(os.path.join(directory, tune.OPERATOR_FILE)):
    return False
  for name in record['runs']:
    for file in TRIAL_FILES:
      _copy_if_there(os.path.join(source, name, file), os.path.join(directory, name, file))
  operator = {k: v for k, v in record.items() if k != 'published_on_purpose'}
  _write_json(os.path.join(directory, tune.OPERATOR_FILE),
              {'DO_NOT_PUBLISH': tune.DO_NOT_PUBLISH, **operator})  # the operator's file again
  _log(f'resumed {directory} from {source} (its draw; '
       f"{sum(_trial_finished(os.path.join(directory, n)) for n in record['runs'])} trial(s) "
       'finished)')
  return True


def searched_elsewhere(path: str, root: str, row) -> dict | None:
  """The row's finished tuning.json when its search ran elsewhere (seeded from its published files:
  no operator file here, so launch.tune could neither resume nor repeat it; searching again would
  spend the privacy a second time). It must be the plan the block declares now."""
  directory = os.path.join(root, config_name(path), row.name)
  tuning = _read(os.path.join(directory, tune.TUNING_FILE))
  if (tuning is None or tuning.get('status') != 'done'
      or os.path.exists(os.path.join(directory, tune.OPERATOR_FILE))):
    return None
  _, study, _, spec = tune.load_study(os.path.join(ROOT_DIR, path), row.name)
  if tuning.get('plan') != tune.public_plan(spec, study, path, []):
    raise ValueError(f'{directory}: its tuning.json holds another plan than block {row.name!r} '
                     'declares now; the benchmark runs only the declared plans (use another --root).')
  return tuning


def _write_json(path: str, value) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f'{path}.{os.getpid()}.tmp'  # rows of a block may finish in several processes at once
  with open(tmp, 'w') as f:
    json.dump(value, f, indent=2)
  os.replace(tmp, path)


def write_summary(letter: str, root: str) -> dict:
  """<root>/<block config>/benchmark.json from the rows' row.json: the block's law, eps and rule,
  and every finished row with its selection epsilon beside it."""
  path, _, block = load_block(letter)
  rows = {r.name: _read(os.path.join(row_dir(root, path, r), ROW_FILE)) for r in block.all_rows()}
  summary = {'block': block.name, 'paper': block.paper, 'trial_law': block.trials,
             **({'ceiling_trial_law': block.ceiling_trials} if block.ceiling_trials else {}),
             'eps_per_trial': block.eps, 'score_noise': block.score_noise,
             'regime_rule': block.regime_rule, 'ceiling': block.ceiling_reference,
             'metric': block.metric, 'design': block.design,
             **({'final_seed_field': block.final_seed_field, 'final_seeds': block.final_seed_values}
                if block.design == 2 else {}),
             'rows': {n: e for n, e in rows.items() if e is not None}}
  if block.design == 2:  # the regime rule as it stands; the ceiling (its row, seeds, final runs)
    from experiments.report import fair2  # pylint: disable=import-outside-toplevel
    block_dir = os.path.join(root, config_name(path))
    summary['regime'] = fair2.regime(block, fair_report.read_block(block_dir, block),
                                     fair2.row_entries(block_dir, block))
    summary['ceiling'] = {'reference': block.ceiling_reference, 'row': block.ceiling.name,
                          'seeds': block.ceiling_seed_values,
                          'final_runs': (rows.get(block.ceiling.name) or {}).get('final_runs', {})}
  _write_json(os.path.join(root, config_name(path), SUMMARY_FILE), summary)
  return summary


def run_block(letter: str, root: str, parallel: int, rows=None, seed_from: str | None = None,
              one_program: str = 'auto') -> dict:
  """The block's rows (all, or `rows`) in order, a row under way first (its final runs begun, then
  its draw made; a new draw waits), the summary rewritten after each; `seed_from`: an out_root of
  --publish (e.g. experiments/results), whose finished pieces count as done; `one_program`:
  run_row's."""
  _, _, block = load_block(letter)
  source = None
  if seed_from:
    if not os.path.isdir(seed_from):
      raise ValueError(f'--seed_from={seed_from}: no such directory (where --publish committed the '
                       'blocks, e.g. experiments/results)')
    block_dir = published_dir(seed_from, letter)
    # runs/ (finished searches and final runs) and searches/ (carry_searches) beside it
    source = os.path.join(block_dir, 'runs') if os.path.isdir(block_dir) else None
  names = rows or [r.name for r in block.all_rows()]
  for name in sorted(names, key=lambda n: (not finals_begun(letter, n, root, source),
                                            not search_under_way(letter, n, root, source))):
    run_row(letter, name, root, parallel, source, one_program)
    write_summary(letter, root)
    _log(f'block ({letter}): row {name} done')
  return write_summary(letter, root)


# ------------------------------------------------------------------ publishing


def published_dir(out_root: str, letter: str) -> str:
  """Where a block's small files are committed: <out_root>/<block config>/ (its runs under runs/)."""
  return os.path.join(out_root, config_name(BLOCK_CONFIGS[letter]))


def ceiling_accuracy(letter: str, out_root: str) -> float | None:
  """The block's ceiling in points, from the published files: its own ceiling row's seed, another
  block's (Block.ceiling_of_block) or a committed reference (Block.ceiling_accuracy)."""
  _, _, block = load_block(letter)
  if block.ceiling is None and not block.ceiling_of_block:
    return block.ceiling_accuracy
  owner = block.ceiling_of_block or letter
  _, _, owner_block = load_block(owner)
  result = fair_report.read_row(os.path.join(published_dir(out_root, owner), 'runs'),
                                owner_block.ceiling, owner_block.metric)
  mean, _, seeds = result.stats
  return 100 * mean if seeds else None


def publish(letter: str, root: str, out_root: str) -> str:
  """Copies what the block has finished under root to published_dir: each row's tuning.json and its
  selected trial as launch.tune publishes them (of a first-design block never the operator's file,
  nor another trial; a second-design block's searches go to searches/: carry_searches), the
  finished final runs' small files (a diverged one is finished: fair_report.read_row), row.json
  and benchmark.json; then writes results.md there from the copy (the table, the regime rule and
  the verdicts). Returns results.md's path."""
  path, module, block = load_block(letter)
  source, out = os.path.join(root, config_name(path)), published_dir(out_root, letter)
  report.copy_tuning_files(report.load_tunings(source), source, out)
  for row in block.all_rows():
    finals = os.path.join(row_dir(root, path, row), 'final')
    if os.path.isdir(finals):
      report.copy_run_files([r for r in report.load_runs(finals) if r.finished or r.diverged],
                            source, out)
    _copy_if_there(os.path.join(row_dir(root, path, row), ROW_FILE),
                   os.path.join(out, 'runs', row.name, ROW_FILE))
  _copy_if_there(os.path.join(source, SUMMARY_FILE), os.path.join(out, 'runs', SUMMARY_FILE))
  carry_searches(letter, root, out_root)
  os.makedirs(out, exist_ok=True)
  results_path = os.path.join(out, 'results.md')
  with open(results_path, 'w') as f:
    f.write(results_text(letter, out_root))
  return results_path


def _copy_if_there(source: str, target: str) -> None:
  if os.path.exists(source):
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(source, target)


def results_text(letter: str, out_root: str) -> str:
  """The block's results.md, from its published files alone (experiments.report writes the same)."""
  from experiments.report import fair_pages  # pylint: disable=import-outside-toplevel
  path, _, block = load_block(letter)
  directory = published_dir(out_root, letter)
  this = fair_pages.Published(letter, config_name(path), block,
                              fair_report.read_block(os.path.join(directory, 'runs'), block), directory)
  return fair_pages.page_text(this, (this, *fair_pages.published_blocks(out_root)))


# ------------------------------------------------------------------ the smoke run

# A smoke run: every config a block will run, cut to two rounds and a small evaluation, so that a
# failure (a shape, a piece's combination with the block's model, the evaluation at T) shows in
# minutes, not after a block's hours. Nothing is kept; the accuracy printed after 2 rounds only says
# that the evaluation ran (it is no result, and no search or selection reads it).
SMOKE_ROUNDS, SMOKE_EVAL_CLIENTS = 2, 12


def smoke_values(space: dict) -> list[dict]:
  """The values a smoke run tries: each knob's first choice or the middle of its range, then each
  other choice of each 'choice' knob once (a choice can select a code path: the adaptation's part,
  DSU's masked layers)."""
  def middle(law):
    if law[0] == 'choice':
      return law[1][0]
    lo, hi = float(law[1]), float(law[2])
    return float(f'{math.sqrt(lo * hi) if law[0] == "log_uniform" else (lo + hi) / 2:.4g}')
  base = {field: middle(law) for field, law in sorted(space.items())}
  return [base] + [{**base, field: value} for field, law in sorted(space.items())
                   if law[0] == 'choice' for value in law[1][1:]]


def _cut_to_smoke(config):
  config.num_rounds = config.eval_every = SMOKE_ROUNDS
  config.eval_clients = SMOKE_EVAL_CLIENTS
  config.local.finetune_epochs = min(config.local.finetune_epochs, 1)
  config.eval.adapt_epochs = min(config.eval.adapt_epochs, 1)
  return config


def smoke_configs(letter: str, rows=None) -> list[tuple[str, object]]:
  """(label, config) of a smoke run of the block's rows (all, or `rows`): each row's trials at
  smoke_values (with their validation split) and its first final seed (the full split), built as the
  block builds them, then cut to SMOKE_ROUNDS rounds, SMOKE_EVAL_CLIENTS clients evaluated and one
  epoch of any fine-tune or adaptation."""
  path, module, block = load_block(letter)
  names = os.path.join(tempfile.gettempdir(), 'fair_smoke')  # workdir names only: nothing written
  out = []
  for row in block.all_rows():
    if rows and row.name not in rows:
      continue
    spec = tune.load_study(path, row.name)[3]  # as the tuner reads it (its defaults filled in)
    candidates = smoke_values(spec['space'])
    trials = tune.trial_runs(module, path, spec, candidates, names, [])
    final = final_runs(names, path, module, block, row, candidates[0])[0]
    out += [(f'{letter}:{row.name} trial {k} {candidates[k]}', _cut_to_smoke(config))
            for k, (_, config) in enumerate(trials)]
    out.append((f'{letter}:{row.name} final seed {block.final_seeds(row)[0]}',
                _cut_to_smoke(final[1])))
  return out


def smoke(letters, rows=None) -> list[str]:
  """Runs every smoke config in this process, each in a temporary workdir, and prints a line each;
  returns the labels of those that failed."""
  from dp2fedsam_jax import train  # pylint: disable=import-outside-toplevel  (JAX: not for --plan)
  import jax  # pylint: disable=import-outside-toplevel
  failed = []
  for letter in letters:
    metric = load_block(letter)[2].metric
    for label, config in smoke_configs(letter, rows):
      start = time.time()
      try:
        with tempfile.TemporaryDirectory() as workdir:
          record = train.train_and_evaluate(config, workdir)
        _log(f'ok      {label} ({time.time() - start:.0f} s; {metric} {record.get(metric)})')
      except Exception as e:  # pylint: disable=broad-except  (every failure listed, then the exit)
        failed.append(label)
        _log(f'FAILED  {label} ({time.time() - start:.0f} s): {type(e).__name__}: {e}')
      jax.clear_caches()  # a block's configs compile dozens of programs: keep memory bounded
  return failed


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  fv = {'flag_values': flag_values}
  flags.DEFINE_string('root', None, 'The one sweep root of the benchmark.', **fv)
  flags.DEFINE_list('blocks', list(CPU_ORDER), 'Blocks in the order they run.', **fv)
  flags.DEFINE_integer('parallel', 1, 'Runs at a time within a row (trials, then final seeds).',
                       **fv)
  flags.DEFINE_list('rows', None, 'Only these rows of the one block --blocks names (a GPU runs '
                    'several rows at once, one process each: benchmarks/device/fair_benchmark.sh).', **fv)
  flags.DEFINE_string('publish', None, 'Run nothing: copy what the blocks finished under --root '
                      '(each row\'s published search, its finished final runs) to '
                      '<publish>/<block config>/runs and write results.md there, for committing.',
                      **fv)
  flags.DEFINE_string('seed_from', PUBLISHED_ROOT, 'Where --publish committed the blocks: a search '
                      'published there is not run again (its secret stayed with the root it ran '
                      'in; a second search would spend the privacy again) and its finished final '
                      'runs count as done; how a sweep continues in a fresh root, e.g. on a new '
                      "machine (with --plan: what is left counts them as done). '' for none: a "
                      'reproduction from scratch.', **fv)
  flags.DEFINE_bool('plan', False, 'Print the rows, runs, CPU hours and GPU estimate; run nothing.',
                    **fv)
  flags.DEFINE_enum('one_program', 'auto', tune.ONE_PROGRAM_MODES, "auto: a row's new trials, and "
                    'its new final seeds, that differ only in searched scalars and training seed '
                    'run as one compiled program in this process (launch.tune); never: every run in '
                    'its own process.', **fv)
  flags.DEFINE_bool('smoke', False, f'Run every config of the blocks (--rows: of those rows) for '
                    f'{SMOKE_ROUNDS} rounds with a small evaluation, in temporary workdirs (nothing '
                    'under --root): a failure shows before the hours are spent. Exit 1 if any fails.',
                    **fv)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  for letter in FLAGS.blocks:
    load_block(letter)  # an unknown block or row fails before anything runs
  if FLAGS.rows:
    if len(FLAGS.blocks) != 1:
      raise app.UsageError('--rows: name one block with --blocks')
    for name in FLAGS.rows:
      load_block(FLAGS.blocks[0])[2].row(name)
  seed_from = FLAGS.seed_from or None
  if FLAGS.plan:
    print_plan(FLAGS.blocks, FLAGS.root, seed_from)
    return
  if FLAGS.smoke:
    # A line a config, not each run's INFO log; set here, not in smoke(): the process's setting.
    logging.set_verbosity(logging.WARNING)
    failed = smoke(FLAGS.blocks, FLAGS.rows)
    if failed:
      sys.exit(f'{len(failed)} smoke run(s) failed: ' + '; '.join(failed))
    return
  if FLAGS.publish:
    for letter in FLAGS.blocks:
      print(publish(letter, FLAGS.root, FLAGS.publish))
    return
  if FLAGS.one_program != 'never':
    sweep.enable_program_cache(FLAGS.root)  # the rows' programs (searches, final seeds) compile here
  for letter in FLAGS.blocks:
    run_block(letter, FLAGS.root, FLAGS.parallel, FLAGS.rows, seed_from,
              one_program=FLAGS.one_program)


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['root'])
  cli.run(main)
