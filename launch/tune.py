r"""Hyperparameter tuning that counts its privacy cost: K random candidates, the best one released.

  python -m launch.tune --config=experiments/configs/tune_tiny.py --root=runs
  python -m launch.tune --config=experiments/configs/fmnist_paper_regime.py --study=dp2fedsam \
      --root=$HOME/tuning --plan      # K, the candidates, their status and the planned cost

The config declares `tuning_space()`: {study name: spec}, each spec a dict of
  args          the config arguments every trial runs with (its get_config(arg)), e.g. method, eps
  fixed         {config field: value} every trial sets (validation_fraction > 0 for private tuning)
  space         {config field: ('log_uniform', lo, hi) | ('uniform', lo, hi) | ('choice', [values])}
  trials        the law of K: {'name': 'poisson', 'mu': m} or {'name':
                'truncated_negative_binomial', 'eta': e, 'gamma': g} (or 'mean' for gamma)
  seed          the tuner's seed: K, the candidates and the score noise all come from it
  selected_by   'validation_accuracy' (each client's validation split; never a test metric)
  score_noise   s: the released score is (sum over clients of validation accuracy + N(0, s^2)) / n,
                n the evaluated clients (public); one client moves the sum by at most 1, so the
                score is a Gaussian mechanism of multiplier s, composed into each trial's event
  proxy         optional: {'kind': 'public_dataset' | 'disjoint_clients', 'description': ...,
                'args': {...}, 'fixed': {...}}: the trials run on that data instead (score_noise
                may then be 0); tuning.json says so, and the report says that only then the tuned
                values carry no cost on the private clients
  seconds_per_run  optional: a measured time of one trial, for the plan's cost

K and the candidates are drawn from `seed` alone (candidate k from its own stream, so it does not
depend on K); each trial is a sweep run (launch/sweep.py's execute: one workdir each,
<dir>/trial=<k>, resumable, one writer, skipped when finished) and a stopped tuner resumes to the
same K and candidates (tuning.json records them and a changed plan is refused). The best finished
trial by its noised score is selected; a failed trial counts as a trial and is never selected.
K = 0 (Poisson) trains nothing: the procedure outputs nothing, which tuning.json says.

Writes <root>/<config name>/tuning.json (with several studies: <root>/<config name>/<study>/).
The release the selection epsilon covers is the selected run and its score (`selected_values`,
`selected_score`, `selected_run`); the rest is the operator's record and is NOT covered: the
`trials` list (every candidate's status and score: publishing it is K releases, the naive
composition's cost) and K itself (`num_trials`, `plan`): the random-K bound needs K secret, and
with K known (a public seed) the bound that holds is `naive_epsilon`, the K drawn trials composed
(docs/privacy.md section 9, assumption 2).
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
from absl import app
from absl import flags

from dp2fedsam_jax import cli, metric_writers
from dp2fedsam_jax.privacy import selection
from launch import sweep

FLAGS = flags.FLAGS
TUNING_FILE = 'tuning.json'
PRIVATE_METRIC = 'validation_accuracy'
PROXY_KINDS = ('public_dataset', 'disjoint_clients')
_K_STREAM, _CANDIDATE_STREAM, _SCORE_STREAM = 0, 1, 2
_SPEC_KEYS = {'args', 'fixed', 'space', 'trials', 'seed', 'selected_by', 'score_noise', 'proxy',
              'seconds_per_run'}


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def load_study(config_path: str, study: str | None):
  """(module, study name, spec) of the config's tuning_space()."""
  module = sweep.load_config_module(config_path)
  if not hasattr(module, 'tuning_space'):
    raise ValueError(f'--config={config_path}: no tuning_space() (a function beside sweep_grid() '
                     'returning {study name: spec}); see launch/tune.py.')
  studies = module.tuning_space()
  if study is None:
    if len(studies) != 1:
      raise ValueError(f'--config={config_path} declares {len(studies)} studies: choose one with '
                       f'--study= ({", ".join(sorted(studies))}).')
    study = next(iter(studies))
  if study not in studies:
    raise ValueError(f'--study={study}: not in {config_path} (studies: {sorted(studies)}).')
  spec = dict(studies[study])
  unknown = set(spec) - _SPEC_KEYS
  if unknown:
    raise ValueError(f'study {study!r}: unknown keys {sorted(unknown)}; known: {sorted(_SPEC_KEYS)}')
  return module, study, len(studies), _check_spec(study, spec, _is_private(module, spec))


def _is_private(module, spec: dict) -> bool:
  """Whether the study's method is private (its trials' args, with the proxy's)."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  args = {**spec.get('args', {}), **(spec.get('proxy') or {}).get('args', {})}
  return METHODS[module.get_config(sweep.arg_string(args) or None).method].private


def _check_spec(study: str, spec: dict, private: bool = True) -> dict:
  spec.setdefault('args', {})
  spec.setdefault('fixed', {})
  spec.setdefault('selected_by', PRIVATE_METRIC)
  spec.setdefault('proxy', None)
  spec['distribution'] = selection.TrialDistribution.from_dict(spec['trials'])
  spec['private'] = private
  selected_by, proxy, noise = spec['selected_by'], spec['proxy'], spec.get('score_noise')
  if not selected_by.startswith('validation_'):
    raise ValueError(f'study {study!r}: selected_by={selected_by!r}; select by a metric of the '
                     "clients' validation split (validation_*), never the test split.")
  if proxy is not None:
    if proxy.get('kind') not in PROXY_KINDS or not proxy.get('description'):
      raise ValueError(f"study {study!r}: proxy needs 'kind' in {PROXY_KINDS} and a 'description' "
                       'of the data it tunes on.')
  elif private and (selected_by != PRIVATE_METRIC or not (noise and noise > 0)):
    raise ValueError(f'study {study!r}: tuning on the private clients releases the score, so it '
                     f"must be selected_by='{PRIVATE_METRIC}' with score_noise > 0 (the Gaussian "
                     'on the sum of per-client accuracies); or declare a proxy.')
  for field, law in spec['space'].items():
    if law[0] not in ('log_uniform', 'uniform', 'choice') or (law[0] != 'choice' and len(law) != 3):
      raise ValueError(f'study {study!r}: space[{field!r}]={law!r}; use (log_uniform|uniform, lo, '
                       'hi) or (choice, [values]).')
  return spec


def draw_plan(spec: dict) -> tuple[int, list[dict]]:
  """(K, the K candidates) from the spec's seed: what a resumed tuner must find again."""
  seed = int(spec['seed'])
  k = spec['distribution'].sample(np.random.default_rng([seed, _K_STREAM]))
  return k, [candidate(spec, seed, i) for i in range(k)]


def candidate(spec: dict, seed: int, index: int) -> dict:
  """Candidate `index`'s values (4 significant digits), from its own stream of the seed."""
  rng = np.random.default_rng([seed, _CANDIDATE_STREAM, index])
  values = {}
  for field in sorted(spec['space']):
    law = spec['space'][field]
    if law[0] == 'choice':
      values[field] = law[1][int(rng.integers(len(law[1])))]
    else:
      lo, hi = float(law[1]), float(law[2])
      x = math.exp(rng.uniform(math.log(lo), math.log(hi))) if law[0] == 'log_uniform' else (
          rng.uniform(lo, hi))
      values[field] = float(f'{x:.4g}')
  return values


def _override(field: str, value) -> str:
  return f'--config.{field}={"None" if value is None else sweep.format_value(value)}'


def tuning_dir(root: str, config_path: str, study: str, num_studies: int) -> str:
  name = os.path.splitext(os.path.basename(config_path))[0]
  return os.path.join(root, name, study) if num_studies > 1 else os.path.join(root, name)


def trial_runs(module, config_path: str, spec: dict, candidates: list[dict], directory: str,
               overrides: list[str]):
  """[(sweep.Run, resolved config)] of the candidates, each in <directory>/trial=<k>."""
  proxy = spec['proxy'] or {}
  args = {**spec['args'], **proxy.get('args', {})}
  fixed = {**spec['fixed'], **proxy.get('fixed', {})}
  config_name = os.path.splitext(os.path.basename(config_path))[0]
  out = []
  for index, values in enumerate(candidates):
    texts = [_override(f, v) for f, v in sorted({**fixed, **values}.items())] + list(overrides)
    config = sweep.apply_overrides(module.get_config(sweep.arg_string(args) or None), texts)
    if not config.get('validation_fraction'):
      raise ValueError(f'trial {index}: validation_fraction is 0, so there is no validation split to '
                       f"select by; set it in the study's fixed fields (e.g. 0.1).")
    run = sweep.Run(args, os.path.join(directory, f'trial={index}'), int(config.num_rounds),
                    config.method, config_name, tuple(texts), sweep.missing_data(config))
    out.append((run, config))
  sweep.validate_runs([r for r, _ in out], [c for _, c in out])
  return out


def trial_event(config):
  """(the trial's dp_event including its score's Gaussian, its neighbouring relation, delta)."""
  import dp_accounting  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.privacy.mechanism import DPMechanism  # pylint: disable=import-outside-toplevel
  spec = METHODS[config.method]
  if not spec.private:
    raise ValueError(f'method {config.method!r} is not private: its trials have no RDP curve and '
                     'their selection no epsilon; tune a private method.')
  mechanism = DPMechanism.from_config(config, config.num_clients, spec)
  event = mechanism.dp_event(int(config.num_rounds))
  relation = (dp_accounting.NeighboringRelation.REPLACE_ONE if mechanism.sampling == 'fixed'
              else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
  return event, relation, float(mechanism.delta), float(mechanism.noise_multiplier)


def scored_event(event, score_noise: float):
  """A trial's event with its released score's Gaussian (multiplier score_noise) composed in."""
  import dp_accounting  # pylint: disable=import-outside-toplevel
  if not score_noise:
    return event
  return dp_accounting.ComposedDpEvent([event, dp_accounting.GaussianDpEvent(score_noise)])


def privacy_cost(spec: dict, configs: list, naive_trials: int) -> dict:
  """The selection's epsilon over the trials' events (+ the score's Gaussian), and the comparison."""
  noise = spec.get('score_noise') or 0.0
  if not spec['private']:
    return non_private_cost(spec, configs, naive_trials, noise)
  items = [trial_event(c) for c in configs]
  relations, deltas = {i[1] for i in items}, {i[2] for i in items}
  if len(relations) > 1 or len(deltas) > 1:
    raise ValueError('the trials differ in their neighbouring relation or delta; tune one sampler '
                     'and one delta at a time.')
  events = [scored_event(i[0], noise) for i in items]
  cost = selection.selection_cost(events, spec['distribution'], deltas.pop(), naive_trials,
                                  relations.pop())
  at_mean = max(1, round(spec['distribution'].mean))
  naive_at_mean = selection.epsilon_of_rdp(
      at_mean * selection.rdp_curve(events, next(iter({i[1] for i in items}))), cost.delta)
  return {**cost.to_dict(), 'noise_multipliers': sorted({i[3] for i in items}),
          'score_noise': noise, 'naive_epsilon_at_mean_k': naive_at_mean,
          'naive_trials_at_mean_k': at_mean}


def non_private_cost(spec: dict, configs: list, naive_trials: int, noise: float) -> dict:
  """A non-private method's trials release unprotected models: no epsilon to spend or count."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  private = sorted({c.method for c in configs if METHODS[c.method].private})
  if private:
    raise ValueError(f'the study mixes non-private and private methods ({private}); tune one kind.')
  mean = spec['distribution'].mean
  return {'private': False, 'expected_trials': mean, 'delta': None, 'per_trial_epsilon': None,
          'selection_epsilon': None, 'naive_epsilon': None, 'naive_trials': naive_trials,
          'accountant': None, 'noise_multipliers': [], 'score_noise': noise,
          'naive_epsilon_at_mean_k': None, 'naive_trials_at_mean_k': max(1, round(mean))}


NON_PRIVATE_NOTE = ('a non-private method: its trials release unprotected models, so the '
                    'selection has no epsilon to count')


def _cost_text(cost: dict) -> str:
  """The privacy part of the log and plan lines."""
  if cost.get('private') is False:
    return f'privacy: none ({NON_PRIVATE_NOTE})'
  return (f'privacy at delta {cost["delta"]:.3g} (RDP): one trial eps {cost["per_trial_epsilon"]:.3f}, '
          f'selection eps {cost["selection_epsilon"]:.3f}, naive {cost["naive_trials"]}-fold '
          f'composition {cost["naive_epsilon"]:.3f} ({cost["naive_trials_at_mean_k"]}-fold at E[K]: '
          f'{cost["naive_epsilon_at_mean_k"]:.3f})')


def _trial_outcome(run: sweep.Run, config, spec: dict, index: int) -> dict:
  """{'status', 'score', 'metric'} of a trial from its workdir (score None: not selectable)."""
  failure = os.path.join(run.workdir, 'failure.json')
  if run.rounds_done < run.num_rounds or os.path.exists(failure):
    status = 'failed' if os.path.exists(failure) else 'not finished'
    return {'status': status, 'score': None}
  record = metric_writers.read_jsonl(os.path.join(run.workdir, metric_writers.EVAL_FILE))[-1]
  metric = record.get(spec['selected_by'])
  if metric is None or not math.isfinite(metric):
    return {'status': 'failed', 'score': None, 'why': f'no finite {spec["selected_by"]}'}
  noise = spec.get('score_noise') or 0.0
  if noise:
    n = config.get('eval_clients') or config.num_clients  # public: not who has validation rows
    z = np.random.default_rng([int(spec['seed']), _SCORE_STREAM, index]).standard_normal()
    score = (record['validation_accuracy_sum'] + noise * z) / n
  else:
    score = metric
  return {'status': 'finished', 'score': float(score), 'metric': float(metric),
          'test_accuracy': record.get('test_accuracy')}


def tune(config_path: str, root: str, study: str | None = None, overrides=(), plan_only=False,
         parallel: int = 1) -> dict:
  """Runs (or resumes, or with plan_only describes) a study; returns tuning.json's content."""
  from dp2fedsam_jax import run_files  # pylint: disable=import-outside-toplevel
  module, study, num_studies, spec = load_study(config_path, study)
  directory = tuning_dir(root, config_path, study, num_studies)
  k, candidates = draw_plan(spec)
  runs = trial_runs(module, config_path, spec, candidates, directory, list(overrides))
  configs = [c for _, c in runs] or [c for _, c in trial_runs(
      module, config_path, spec, [candidate(spec, int(spec['seed']), 0)], directory, list(overrides))]
  plan = json.loads(json.dumps({  # as tuning.json holds it, to compare on resume
      'study': study, 'config_name': os.path.splitext(os.path.basename(config_path))[0],
      'seed': int(spec['seed']), 'trial_distribution': spec['distribution'].to_dict(),
      'num_trials': k, 'candidates': candidates, 'overrides': list(overrides)}))
  cost = privacy_cost(spec, configs, naive_trials=k)
  path = os.path.join(directory, TUNING_FILE)
  if plan_only:
    return _print_plan(plan, cost, runs, spec, path)
  with run_files.hold(directory):
    previous = _read(path)
    if previous is not None and previous.get('plan') != plan:
      raise ValueError(f'{path} holds another plan (seed, K, candidates or overrides differ): the '
                       'tuner resumes only the same draw; use another --root.')
    run_files.write_json_atomic(path, {'status': 'running', 'plan': plan})
    results = sweep.execute(config_path, [r for r, _ in runs], parallel,
                            os.path.join(root, '.jax_cache')) if runs else {}
    outcomes = [_trial_outcome(r, c, spec, i) for i, (r, c) in enumerate(runs)]
    unfinished = [i for i, o in enumerate(outcomes) if o['status'] == 'not finished']
    if unfinished:
      why = [results.get(runs[i][0].workdir) for i in unfinished]
      raise RuntimeError(f'trials {unfinished} did not finish ({why}); rerun the same command to '
                         'resume them.')
    result = _result(plan, cost, spec, runs, outcomes, directory)
    run_files.write_json_atomic(path, result)
  _log(f'tuning: {path}: selected {result["selected_run"]} of {k} trials; {_cost_text(cost)}')
  return result


def _read(path: str):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _result(plan, cost, spec, runs, outcomes, directory) -> dict:
  scored = [(o['score'], -i) for i, o in enumerate(outcomes) if o['score'] is not None]
  best = -max(scored)[1] if scored else None
  failed = [i for i, o in enumerate(outcomes) if o['status'] == 'failed']
  proxy = spec['proxy']
  notes = []
  if plan['num_trials'] == 0:
    notes.append('K = 0 was drawn: the procedure trains nothing and outputs nothing (no model, no '
                 'score); the selection epsilon bounds this outcome as every other.')
  elif best is None:
    notes.append('every trial failed: nothing is selected; they all count as trials.')
  if cost.get('private') is False:
    notes.append(NON_PRIVATE_NOTE + '.')
  else:
    notes.append(f"selection_epsilon holds while K (num_trials, plan) is secret; with K known (a "
                 f"public seed) the bound is naive_epsilon, the K = {plan['num_trials']} trials "
                 'composed (docs/privacy.md section 9, assumption 2).')
  if failed:
    notes.append(f'{len(failed)} failed trial(s) {failed} count as trials (they ran on the data: '
                 'their cost is in the selection epsilon) and are never selected.')
  selected = runs[best][0].workdir if best is not None else None
  return {
      'status': 'done', 'study': plan['study'], 'plan': plan,
      'trial_distribution': plan['trial_distribution'], 'num_trials': plan['num_trials'],
      'expected_trials': cost['expected_trials'], 'delta': cost['delta'],
      'per_trial_epsilon': cost['per_trial_epsilon'], 'selection_epsilon': cost['selection_epsilon'],
      'naive_epsilon': cost['naive_epsilon'], 'naive_trials': cost['naive_trials'],
      'naive_trials_are': 'the drawn K', 'naive_epsilon_at_mean_k': cost['naive_epsilon_at_mean_k'],
      'naive_trials_at_mean_k': cost['naive_trials_at_mean_k'], 'accountant': cost['accountant'],
      'noise_multipliers': cost['noise_multipliers'], 'score_noise': cost['score_noise'],
      'selected_run': os.path.relpath(selected, directory) if selected else None,
      'selected_values': plan['candidates'][best] if best is not None else None,
      'selected_by': spec['selected_by'] + (' + N(0, score_noise^2) on the sum over clients, / n'
                                            if cost['score_noise'] else ''),
      'selected_score': outcomes[best]['score'] if best is not None else None,
      'failed_trials': failed,
      'proxy': proxy,
      'private': cost.get('private', True),
      'cost_on_private_clients': 0.0 if proxy else cost['selection_epsilon'],
      'notes': notes,
      'trials': [{'run': os.path.relpath(r.workdir, directory), 'values': v, **o}
                 for (r, _), v, o in zip(runs, plan['candidates'], outcomes)],
      'trials_are': 'the operator\'s record, NOT covered by selection_epsilon: publish only the '
                    'selected run and its score',
  }


def _print_plan(plan, cost, runs, spec, path) -> dict:
  k = plan['num_trials']
  print(f"study {plan['study']}: K = {k} trials drawn from {plan['trial_distribution']} "
        f"(E[K] = {cost['expected_trials']:.2f}, seed {plan['seed']}) -> {path}")
  for (run, _), values in zip(runs, plan['candidates']):
    print(f'{run.status:24s} {run.workdir}  ' + ', '.join(f'{f}={v}' for f, v in values.items())
          + (f'  [no data: {run.missing_data}]' if run.missing_data else ''))
  rounds = sum(r.num_rounds for r, _ in runs)
  seconds = spec.get('seconds_per_run')
  time_text = f', ~{k * seconds / 3600:.1f} h at {seconds / 60:.0f} min a run' if seconds else ''
  proxy = spec['proxy']
  print(f'cost: {k} runs, {rounds} rounds{time_text}; {_cost_text(cost)}'
        + (f'; proxy ({proxy["kind"]}): no cost on the private clients' if proxy else ''))
  if k == 0:
    print('K = 0: nothing to train; the procedure outputs nothing.')
  return {'plan': plan, **cost}


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  fv = {'flag_values': flag_values}
  flags.DEFINE_string('config', None, 'Config file with tuning_space().', **fv)
  flags.DEFINE_string('root', None, 'Root directory: <root>/<config name>[/<study>]/tuning.json '
                      'and the trials\' workdirs beside it.', **fv)
  flags.DEFINE_string('study', None, 'The study of tuning_space() (needed when it has several).',
                      **fv)
  flags.DEFINE_integer('parallel', 1, 'Trials at a time (as launch.sweep --parallel: one per core '
                       'for the char LSTMs on a CPU, else 1).', **fv)
  flags.DEFINE_bool('plan', False, 'Print K, the candidates, their status and the cost; run '
                    'nothing.', **fv)


_overrides: list[str] = []


def _parse_flags(argv: list[str]) -> list[str]:
  _overrides.extend(a for a in argv[1:] if a.startswith('--config.'))
  return FLAGS([a for a in argv if not a.startswith('--config.')])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  tune(FLAGS.config, FLAGS.root, FLAGS.study, _overrides, FLAGS.plan, FLAGS.parallel)


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['config', 'root'])
  cli.run(main, flags_parser=_parse_flags)
