r"""Hyperparameter tuning that counts its privacy cost: K random candidates, the best one released.

  python -m launch.tune --config=experiments/configs/tune_tiny.py --root=runs
  python -m launch.tune --config=experiments/configs/fmnist_paper_regime.py --study=dp2fedsam \
      --root=$HOME/tuning --plan      # the law of K, the candidates' law and the planned cost
  python -m launch.tune --config=experiments/configs/default.py --root=runs/tune \
      --space=local.lr_shared=log_uniform:0.01:0.3 --space=dp.clip_norm=log_uniform:0.05:1 \
      --trials=logarithmic:16 --score_noise=10   # a study from the command line alone

The config declares `tuning_space()`: {study name: spec}, each spec a dict of
  args          the config arguments every trial runs with (its get_config(arg)), e.g. method, eps
  fixed         {config field: value} every trial sets (validation_fraction > 0 for private tuning)
  space         {config field: ('log_uniform', lo, hi) | ('uniform', lo, hi) | ('choice', [values])}
  trials        the law of K: {'name': 'poisson', 'mu': m} or {'name':
                'truncated_negative_binomial', 'eta': e, 'gamma': g} (or 'mean' for gamma)
  seed          the public seed the studies drawn before the secret draw used (draw_plan(spec)
                reproduces their K and candidates); a new study draws from the operator's secret
  selected_by   'validation_accuracy' (each client's validation split; never a test metric)
  score_noise   s: the released score is (sum over clients of validation accuracy + N(0, s^2)) / N,
                N the public client count (score_denominator); one client moves the sum by at most
                1, so the score is a Gaussian mechanism of multiplier s, composed into each
                trial's event
  proxy         optional: {'kind': 'public_dataset' | 'disjoint_clients', 'description': ...,
                'args': {...}, 'fixed': {...}}: the trials run on that data instead (score_noise
                may then be 0); tuning.json says so, and the report says that only then the tuned
                values carry no cost on the private clients
  seconds_per_run  optional: a measured time of one trial, for the plan's cost
  pool_floor    optional P: max(K, P) trials run and the selection is over the first K only; the
                others measure the search (its pool), outside the procedure and its epsilon
  tied          optional: {follower: leader}: the follower field takes the searched leader's value
                in every candidate (one knob that sets two fields, e.g. a head lr = the client lr)

Secret randomness (Papernot & Steinke's theorems need K secret and the score's noise unknown to
the reader): K, the K candidates (i.i.d. from `space`), the score noise and the trials' workdir
names all come from the study's secret seed: 128 bits from the OS (`secrets`) when the study
starts, or the operator's --secret_seed. It is written only to the operator file; with the public
spec seed instead (the studies committed before this), score - s z / N gives back every trial's
exact validation sum, and such a study is covered by no finite epsilon.

Two files, <root>/<config name>/ (with several studies: <root>/<config name>/<study>/):
  tuning.json                    the release: the public plan (no K, no candidates), the selected
                                 run (a workdir name that tells neither its index nor K), its
                                 values and noised score, score_denominator, selection_epsilon and
                                 epsilon_bound (search_epsilon_bound: with K only where K's naive
                                 composition is that bound)
  tuning_operator_private.json   NEVER TO BE PUBLISHED: the secret seed, K, every candidate and
                                 trial (status, un-noised metric, validation sum, noise draw, score,
                                 test accuracy) and the naive composition at the drawn K. A stopped
                                 tuner resumes from it (same secret, K, candidates; a changed plan
                                 is refused); it is written before any trial runs.
Publishing anything of the operator file voids selection_epsilon: a trial's un-noised metric is a
release without noise, and a study whose K is made public is covered only by the naive composition
of its K trials (naive_epsilon in the operator file; docs/privacy.md section 9, assumption 2). The
trials' workdirs also stay with the operator: publish the selected run's only, without its
validation_* metrics (un-noised, they give its score's noise back; experiments/report.py's copy
drops them).

Each trial has its own workdir (one writer; skipped when finished). With --one_program=auto (the
default) the unfinished trials that differ only in searched scalars (search_program.searched) and
their training seed run as one compiled program in the tuner's process (launch/trial_program.py),
each writing its workdir's files as a run alone; a program stopped mid-way resumes from its trials'
common last checkpoint. Every other trial (alone in its group, differing in a static field such as
epochs or a keep fraction or in its checkpoint's round, or all with --one_program=never) is a sweep
run (launch/sweep.py's execute: its own process, resumable). --plan shows which. The best
finished trial by its noised score is selected; a failed trial counts as a trial and is never
selected. K = 0 (Poisson) trains nothing: the procedure outputs
nothing, which tuning.json says without telling K = 0 from every trial failed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import sys

import numpy as np
from absl import app
from absl import flags

from dp2fedsam_jax import cli, metric_writers
from experiments import config_files
from dp2fedsam_jax.privacy import selection
from launch import sweep

FLAGS = flags.FLAGS
TUNING_FILE = 'tuning.json'  # the release
OPERATOR_FILE = 'tuning_operator_private.json'  # the operator's record: never published
DO_NOT_PUBLISH = (
    "NEVER PUBLISH THIS FILE. The tuning operator's private record: the secret seed, K, every "
    "candidate and every trial's un-noised metric, score noise draw and test accuracy. Any of it "
    'published voids selection_epsilon (the noise subtracts out of the score; K known leaves only '
    'naive_epsilon, the naive composition of the K trials). Publish tuning.json only.')
PRIVATE_METRIC = 'validation_accuracy'
PROGRAM_TRIAL = 'a trial of one program with other trials (launch.tune)'  # sweep.json's ran_as
PROXY_KINDS = ('public_dataset', 'disjoint_clients')
# Streams of the study's seed (the operator's secret; the public spec seed in older studies).
_K_STREAM, _SCORE_STREAM, _NAME_STREAM, _TRIAL_SEED_STREAM = 0, 2, 3, 4
_CANDIDATE_STREAM = selection.CANDIDATE_STREAM  # 1
SECRET_BITS = 64  # below this a --secret_seed can be guessed: warned
_SPEC_KEYS = {'args', 'fixed', 'space', 'trials', 'seed', 'selected_by', 'score_noise', 'proxy',
              'seconds_per_run', 'tied', 'pool_floor'}


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def load_study(config_path: str, study: str | None, search: dict | None = None):
  """(module, study name, number of studies, spec) of the config's tuning_space(), or of the
  command line's `search` (parse_search_flags: a space, a law of K, a score noise), which replaces
  those entries of the config's study or, for a config without tuning_space(), is the study."""
  module = config_files.load_config_module(config_path)
  studies = module.tuning_space() if hasattr(module, 'tuning_space') else {}
  if search:
    if not studies:
      missing = [f'--{k}' for k in ('space', 'trials', 'score_noise') if search.get(k) is None]
      if missing:
        raise ValueError(f'--config={config_path} has no tuning_space(): give the study on the '
                         f'command line ({", ".join(missing)} missing; see --helpfull).')
      studies = {COMMAND_LINE_STUDY: {'fixed': {'validation_fraction': 0.1}}}
    study = study or (COMMAND_LINE_STUDY if COMMAND_LINE_STUDY in studies else None)
    studies = {name: {**spec, **{k: v for k, v in search.items() if v is not None}}
               for name, spec in studies.items()}
  if not studies:
    raise ValueError(f'--config={config_path}: no tuning_space() (a function beside sweep_grid() '
                     'returning {study name: spec}; see launch/tune.py), and no --space.')
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


COMMAND_LINE_STUDY = 'cli'  # the study a config without tuning_space() gets from the flags
_LAWS = ('log_uniform', 'uniform', 'choice')


def _number(text: str):
  value = float(text)
  return int(value) if value.is_integer() and '.' not in text and 'e' not in text.lower() else value


def parse_space_flag(text: str) -> tuple[str, tuple]:
  """'local.lr_shared=log_uniform:0.01:0.3' | 'dp.clip_norm=uniform:0.1:1' |
  'local.personal_epochs=choice:1,2,5' -> (field, law), the law as a config's space holds it."""
  field, _, law = text.partition('=')
  kind, _, rest = law.partition(':')
  try:
    if kind == 'choice' and rest:
      return field, ('choice', [_number(v) for v in rest.split(',')])
    lo, hi = rest.split(':')
    if kind in _LAWS[:2] and field:
      return field, (kind, float(lo), float(hi))
  except ValueError:
    pass
  raise ValueError(f'--space={text!r}: write FIELD=log_uniform:LO:HI, FIELD=uniform:LO:HI or '
                   'FIELD=choice:V1,V2,...')


def parse_trials_flag(text: str) -> dict:
  """'poisson:MU' | 'logarithmic:MEAN' | 'geometric:MEAN' | 'tnb:ETA:MEAN' -> the law of K."""
  parts = text.split(':')
  try:
    if parts[0] == 'poisson' and len(parts) == 2:
      return {'name': 'poisson', 'mu': float(parts[1])}
    shapes = {'logarithmic': 0.0, 'geometric': 1.0}
    if parts[0] in shapes and len(parts) == 2:
      eta, mean = shapes[parts[0]], float(parts[1])
    elif parts[0] == 'tnb' and len(parts) == 3:
      eta, mean = float(parts[1]), float(parts[2])
    else:
      raise ValueError
  except ValueError:
    raise ValueError(f'--trials={text!r}: write poisson:MU, logarithmic:MEAN, geometric:MEAN or '
                     'tnb:ETA:MEAN (truncated negative binomial).') from None
  return {'name': 'truncated_negative_binomial', 'eta': eta, 'mean': mean}


def parse_search_flags(space: list[str], trials: str | None, score_noise: float | None) -> dict:
  """The command line's search: {'space', 'trials', 'score_noise'} (None where not given)."""
  return {'space': dict(parse_space_flag(t) for t in space) if space else None,
          'trials': parse_trials_flag(trials) if trials else None, 'score_noise': score_noise}


def _is_private(module, spec: dict) -> bool:
  """Whether the study's method is private (its trials' args, with the proxy's)."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  args = {**spec.get('args', {}), **(spec.get('proxy') or {}).get('args', {})}
  return METHODS[module.get_config(config_files.arg_string(args) or None).method].private


def _check_spec(study: str, spec: dict, private: bool = True) -> dict:
  spec.setdefault('args', {})
  spec.setdefault('fixed', {})
  spec.setdefault('selected_by', PRIVATE_METRIC)
  spec.setdefault('proxy', None)
  spec.setdefault('tied', {})
  spec.setdefault('pool_floor', 0)
  if not isinstance(spec['pool_floor'], int) or spec['pool_floor'] < 0:
    raise ValueError(f"study {study!r}: pool_floor={spec['pool_floor']!r}; give a whole number of "
                     'trials >= 0 (0: the pool is the K trials of the selection).')
  for follower, leader in spec['tied'].items():
    if leader not in spec['space'] or follower in spec['space'] or follower in spec['fixed']:
      raise ValueError(f'study {study!r}: tied[{follower!r}] = {leader!r}: a tied field takes a '
                       'searched field\'s value, so the leader must be in the space and the '
                       'follower neither searched nor fixed.')
  spec['distribution'] = selection.TrialDistribution.from_dict(spec['trials'])
  if private and not spec['distribution'].private:
    raise ValueError(f"study {study!r}: trials={spec['trials']}: a private search draws its number "
                     'of trials at random (poisson or truncated_negative_binomial), so that the '
                     'selection is covered; a fixed K is for a non-private search.')
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


def new_secret() -> int:
  """A study's secret seed: 128 bits from the OS's cryptographic source, never derived from a
  public number (a seeded generator would make K and the score noise public)."""
  return secrets.randbits(128)


def draw_plan(spec: dict, secret: int | None = None) -> tuple[int, list[dict]]:
  """(K, the K candidates) from the study's `secret` seed: what a resumed tuner must find again.

  Without `secret`, from the spec's public seed: how the studies before the secret draw were drawn
  (their K and score noise are public; kept so that their committed files can be checked)."""
  seed = int(spec['seed']) if secret is None else int(secret)
  k = spec['distribution'].sample(np.random.default_rng([seed, _K_STREAM]))
  return k, [candidate(spec, seed, i) for i in range(k)]


def trial_name(secret: int, index: int) -> str:
  """Trial `index`'s workdir name, from the secret: a published selected_run tells neither its
  index nor a bound on K."""
  return 'trial=' + np.random.default_rng([int(secret), _NAME_STREAM, index]).bytes(6).hex()


def trial_seed(secret: int, index: int) -> int:
  """Trial `index`'s config.training_seed (its cohorts, noise and init), from the secret: in
  [2**32, 2**64), so no two trials share a stream (Papernot & Steinke's theorems need independent
  trials) and none is the key of a public seed below 2**32, which final runs use (keys.root_key)."""
  rng = np.random.default_rng([int(secret), _TRIAL_SEED_STREAM, index])
  return int(rng.integers(2**32, 2**64, dtype=np.uint64))


def score_noise_draw(secret: int, index: int) -> float:
  """z ~ N(0, 1) of trial `index`'s score, from the operator's secret seed (never a public one)."""
  return float(np.random.default_rng([int(secret), _SCORE_STREAM, index]).standard_normal())


def score_denominator(config) -> int:
  """N of the score (sum over clients of validation accuracy + s z) / N: the public client count
  (config.eval_clients, else num_clients), NOT the clients with validation rows. Clients without a
  validation row add 0 to the sum (Shakespeare: ~847 of the 1,063 roles have one, so the score is
  ~0.8 x the mean validation accuracy; the ranking is the same). A public constant is the DP choice
  for a sum query: dividing by it is post-processing, while the count of clients with validation
  rows depends on the data."""
  return int(config.get('eval_clients') or config.num_clients)


def candidate(spec: dict, seed: int, index: int) -> dict:
  """Candidate `index`'s values (4 significant digits), from its own stream of the seed; a tied
  field (spec['tied']: {follower: leader}) takes its leader's value (selection.draw_candidate)."""
  return selection.draw_candidate(spec['space'], seed, index, _CANDIDATE_STREAM, spec.get('tied'))


def _override(field: str, value) -> str:
  return f'--config.{field}={"None" if value is None else config_files.format_value(value)}'


def tuning_dir(root: str, config_path: str, study: str, num_studies: int) -> str:
  name = os.path.splitext(os.path.basename(config_path))[0]
  return os.path.join(root, name, study) if num_studies > 1 else os.path.join(root, name)


def trial_runs(module, config_path: str, spec: dict, candidates: list[dict], directory: str,
               overrides: list[str], names: list[str] | None = None,
               seeds: list[int] | None = None):
  """[(sweep.Run, resolved config)] of the candidates, candidate k in <directory>/<names[k]>
  (default trial=<k>, the older studies' names) at config.training_seed seeds[k] (default: none,
  every trial at the config's public seed, as the older studies ran)."""
  proxy = spec['proxy'] or {}
  args = {**spec['args'], **proxy.get('args', {})}
  fixed = {**spec['fixed'], **proxy.get('fixed', {})}
  config_name = os.path.splitext(os.path.basename(config_path))[0]
  out = []
  for index, values in enumerate(candidates):
    texts = [_override(f, v) for f, v in sorted({**fixed, **values}.items())] + list(overrides)
    if seeds is not None:
      texts.append(_override('training_seed', seeds[index]))
    config = config_files.apply_overrides(module.get_config(config_files.arg_string(args) or None), texts)
    if not config.get('validation_fraction'):
      raise ValueError(f'trial {index}: validation_fraction is 0, so there is no validation split to '
                       f"select by; set it in the study's fixed fields (e.g. 0.1).")
    name = names[index] if names is not None else f'trial={index}'
    run = sweep.Run(args, os.path.join(directory, name), int(config.num_rounds),
                    config.method, config_name, tuple(texts), sweep.missing_data(config))
    out.append((run, config))
  sweep.validate_runs([r for r, _ in out], [c for _, c in out])
  return out


def trial_event(config):
  """(the trial's dp_event including its score's Gaussian, its neighbouring relation, delta)."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.privacy.mechanism import DPMechanism  # pylint: disable=import-outside-toplevel
  spec = METHODS[config.method]
  if not spec.private:
    raise ValueError(f'method {config.method!r} is not private: its trials have no RDP curve and '
                     'their selection no epsilon; tune a private method.')
  mechanism = DPMechanism.from_config(config, config.num_clients, spec)
  return (mechanism.dp_event(int(config.num_rounds)), mechanism.neighboring_relation,
          float(mechanism.delta), float(mechanism.noise_multiplier))


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


def _cost_text(cost: dict, public: bool = False) -> str:
  """The privacy part of the log and plan lines (`public`: without the naive cost at the drawn K,
  which tells K)."""
  if cost.get('private') is False:
    return f'privacy: none ({NON_PRIVATE_NOTE})'
  drawn = '' if public else (f'naive {cost["naive_trials"]}-fold composition '
                             f'{cost["naive_epsilon"]:.3f} (if K is published), ')
  return (f'privacy at delta {cost["delta"]:.3g} (RDP): one trial eps {cost["per_trial_epsilon"]:.3f}, '
          f'selection eps {cost["selection_epsilon"]:.3f}, {drawn}naive '
          f'{cost["naive_trials_at_mean_k"]}-fold at E[K]: {cost["naive_epsilon_at_mean_k"]:.3f}')


def _trial_outcome(run: sweep.Run, config, spec: dict, index: int, secret: int) -> dict:
  """A trial's entry of the operator's record from its workdir: {'status', 'score', and for a
  finished trial the un-noised 'metric', 'validation_accuracy_sum', the score's 'noise_draw' z and
  'score_denominator', 'test_accuracy'} (score None: not selectable)."""
  failure = os.path.join(run.workdir, 'failure.json')
  if run.rounds_done < run.num_rounds or os.path.exists(failure):
    status = 'failed' if os.path.exists(failure) else 'not finished'
    return {'status': status, 'score': None}
  record = metric_writers.read_jsonl(os.path.join(run.workdir, metric_writers.EVAL_FILE))[-1]
  metric = record.get(spec['selected_by'])
  if metric is None or not math.isfinite(metric):
    return {'status': 'failed', 'score': None, 'why': f'no finite {spec["selected_by"]}'}
  noise = spec.get('score_noise') or 0.0
  z, n = None, score_denominator(config)
  if noise:
    z = score_noise_draw(secret, index)
    score = (record['validation_accuracy_sum'] + noise * z) / n
  else:
    score = metric
  return {'status': 'finished', 'score': float(score), 'metric': float(metric),
          'validation_accuracy_sum': record.get('validation_accuracy_sum'), 'noise_draw': z,
          'score_denominator': n, 'test_accuracy': record.get('test_accuracy')}


def public_plan(spec: dict, study: str, config_path: str, overrides) -> dict:
  """What tuning.json may say of the study before any draw: the laws of K and of the candidates,
  the fixed fields, the score's noise and the overrides (never K or a candidate)."""
  return json.loads(json.dumps({  # as the files hold it, to compare on resume
      'study': study, 'config_name': os.path.splitext(os.path.basename(config_path))[0],
      'trial_distribution': spec['distribution'].to_dict(), 'space': spec['space'],
      'args': spec['args'], 'fixed': spec['fixed'], 'proxy': spec['proxy'],
      'selected_by': spec['selected_by'], 'score_noise': spec.get('score_noise') or 0.0,
      'overrides': list(overrides),
      **({'tied': spec['tied']} if spec.get('tied') else {}),  # (older plans have no ties)
      **({'pool_floor': spec['pool_floor']} if spec.get('pool_floor') else {})}))


def _secret_for(directory: str, plan: dict, secret_seed, plan_only: bool):
  """(secret, where it came from) of the study in `directory`: the operator file's on resume, else
  the operator's --secret_seed or a fresh one; (None, None) for a plan of a study not started."""
  operator = _read(os.path.join(directory, OPERATOR_FILE))
  published = _read(os.path.join(directory, TUNING_FILE))
  if operator is None and published is not None and 'candidates' in published.get('plan', {}):
    raise ValueError(f'{directory} holds a study drawn from its public seed (before the secret '
                     'draw): its K and score noise are public, and it cannot be resumed as a '
                     'covered study; use another --root.')
  if operator is not None:
    if operator.get('plan') != plan:
      raise ValueError(f'{os.path.join(directory, OPERATOR_FILE)} holds another plan (K law, '
                       'space, fixed fields, score noise or overrides differ): the tuner resumes '
                       'only the same draw; use another --root.')
    if secret_seed is not None and int(secret_seed) != operator['secret_seed']:
      raise ValueError(f'--secret_seed differs from the one {OPERATOR_FILE} holds: the study '
                       'resumes its own draw; drop the flag or use another --root.')
    if 'training_seeds' not in operator:
      raise ValueError(f'{directory} holds a study whose trials ran at the public config.seed '
                       '(before each trial drew its training seed from the secret): its trials '
                       'share cohorts and noise, so no selection epsilon covers it; use another '
                       '--root.')
    return int(operator['secret_seed']), operator['secret_source']
  if secret_seed is not None:
    if int(secret_seed).bit_length() < SECRET_BITS:
      _log(f'warning: --secret_seed has {int(secret_seed).bit_length()} bits (< {SECRET_BITS}): a '
           'guessable secret is a public seed, which voids selection_epsilon; omit the flag for '
           '128 fresh bits.')
    return int(secret_seed), 'supplied by the operator (--secret_seed)'
  if plan_only:
    return None, None
  if os.path.isdir(directory) and any(n.startswith('trial=') for n in os.listdir(directory)):
    raise ValueError(f'{directory} holds trials but no {OPERATOR_FILE}: the secret they were '
                     'drawn from is lost, and they ran on the data; use another --root.')
  return new_secret(), 'secrets.randbits(128) when the study started'


def tune(config_path: str, root: str, study: str | None = None, overrides=(), plan_only=False,
         parallel: int = 1, secret_seed: int | None = None, search: dict | None = None,
         one_program: str = 'auto') -> dict:
  """Runs (or resumes, or with plan_only describes) a study; returns tuning.json's content (the
  operator's record is in OPERATOR_FILE beside it). `search`: parse_search_flags's command-line
  space, law of K and score noise. `one_program`: 'auto' runs the trials that sweep.execution_plan
  groups as one program each, 'never' every trial in its own process."""
  if one_program not in ONE_PROGRAM_MODES:
    raise ValueError(f'--one_program={one_program}: choose one of {ONE_PROGRAM_MODES}.')
  with _accountant_warnings_counted() as excluded:
    result = _tune(config_path, root, study, overrides, plan_only, parallel, secret_seed, search,
                   one_program)
  if excluded:
    _log(f'dp_accounting: {len(excluded)} RDP orders did not converge and were left out of the '
         'epsilon (it is computed over the others, an upper bound still).')
  return result


class _CountAccountantWarnings(logging.Filter):
  """Drops dp_accounting's warnings (one per RDP order that did not converge), counting them."""

  def __init__(self):
    super().__init__()
    self.dropped = []

  def filter(self, record: logging.LogRecord) -> bool:
    if 'dp_accounting' in record.pathname and record.levelno == logging.WARNING:
      self.dropped.append(record.getMessage())
      return False
    return True


@contextlib.contextmanager
def _accountant_warnings_counted():
  counter = _CountAccountantWarnings()
  logger = logging.getLogger('absl')
  logger.addFilter(counter)
  try:
    yield counter.dropped
  finally:
    logger.removeFilter(counter)


def _tune(config_path, root, study, overrides, plan_only, parallel, secret_seed, search,
          one_program) -> dict:
  from dp2fedsam_jax import run_files  # pylint: disable=import-outside-toplevel
  module, study, num_studies, spec = load_study(config_path, study, search)
  directory = tuning_dir(root, config_path, study, num_studies)
  plan = public_plan(spec, study, config_path, overrides)
  path = os.path.join(directory, TUNING_FILE)
  overrides = list(overrides)
  if plan_only:
    secret, _ = _secret_for(directory, plan, secret_seed, plan_only=True)
    if secret is None:  # before the study starts: K and the candidates are not drawn yet
      configs = [c for _, c in trial_runs(module, config_path, spec, [candidate(spec, 0, 0)],
                                          directory, overrides)]
      printed = _print_plan(plan, privacy_cost(spec, configs, 1), [], spec, path, None,
                            int(configs[0].num_rounds))
      print(expected_execution(spec, configs[0], one_program))
      return printed
    k, candidates, runs, configs, cost = _draw(module, config_path, spec, directory, overrides,
                                               secret)
    return _print_plan(plan, cost, list(zip(runs, candidates)), spec, path, k,
                       int(configs[0].num_rounds), sweep.execution_plan(runs, one_program))
  operator_path = os.path.join(directory, OPERATOR_FILE)
  with run_files.hold(directory):  # one writer: the secret is read or drawn under the lock
    secret, source = _secret_for(directory, plan, secret_seed, plan_only=False)
    k, candidates, runs, configs, cost = _draw(module, config_path, spec, directory, overrides,
                                               secret)
    names = [os.path.basename(r.workdir) for r, _ in runs]
    # The secret is on disk before any trial touches the data: a crash never loses it.
    run_files.write_json_atomic(operator_path, {
        'DO_NOT_PUBLISH': DO_NOT_PUBLISH, 'status': 'running', 'plan': plan,
        'secret_seed': secret, 'secret_source': source, 'num_trials': k,
        'candidates': candidates, 'runs': names, 'training_seeds': _training_seeds(runs)})
    run_files.write_json_atomic(path, {'status': 'running', 'plan': plan})
    results = sweep.execute_trials(config_path, runs, parallel, os.path.join(root, '.jax_cache'),
                                   one_program, ran_as=PROGRAM_TRIAL) if runs else {}
    outcomes = [_trial_outcome(r, c, spec, i, secret) for i, (r, c) in enumerate(runs)]
    unfinished = [i for i, o in enumerate(outcomes) if o['status'] == 'not finished']
    if unfinished:
      why = [results.get(runs[i][0].workdir) for i in unfinished]
      raise RuntimeError(f'trials {[names[i] for i in unfinished]} did not finish ({why}); rerun '
                         'the same command to resume them.')
    record = _result(plan, cost, spec, runs, candidates, outcomes, directory, secret, source,
                     configs, k)
    run_files.write_json_atomic(operator_path, record)
    result = published_record(record)
    run_files.write_json_atomic(path, result)
  _log(f'tuning: {path}; {_cost_text(cost, public=True)}; K and every trial in {operator_path} '
       '(never publish it)')
  print(selection_text(result), flush=True)
  return result


def selection_text(result: dict) -> str:
  """What the study selected, in one line: the run, its values and noised score."""
  if result.get('selected_run') is None:
    return 'selected: nothing (the procedure outputs nothing)'
  values = ', '.join(f'{f}={v}' for f, v in sorted(result['selected_values'].items()))
  epsilon = result.get('selection_epsilon')
  cost = f', selection eps {epsilon:.3f}' if epsilon is not None else ''
  return f"selected: {result['selected_run']}: {values} (score {result['selected_score']:.4f}{cost})"


def pool_size(spec: dict, k: int) -> int:
  """The trials that run: the K of the selection, at least the spec's pool_floor."""
  return max(k, spec.get('pool_floor') or 0)


def _draw(module, config_path: str, spec: dict, directory: str, overrides: list[str], secret: int):
  """(K, candidates, [(run, config)], the configs the cost is over, the cost) of the secret's draw;
  with a pool_floor the candidates and runs go on past K to the pool's size (the first K are the
  selection's: candidate i never depends on K)."""
  k, candidates = draw_plan(spec, secret)
  n = pool_size(spec, k)
  candidates = candidates + [candidate(spec, secret, i) for i in range(k, n)]
  names = [trial_name(secret, i) for i in range(n)]
  if len(set(names)) < n:
    raise ValueError('two trials drew the same workdir name; start the study again in another '
                     '--root (a new secret).')
  seeds = [trial_seed(secret, i) for i in range(n)]
  if len(set(seeds)) < n:
    raise ValueError('two trials drew the same training seed; start the study again in another '
                     '--root (a new secret).')
  runs = trial_runs(module, config_path, spec, candidates, directory, overrides, names, seeds)
  configs = [c for _, c in runs] or [c for _, c in trial_runs(
      module, config_path, spec, [candidate(spec, secret, 0)], directory, overrides)]
  return k, candidates, runs, configs, privacy_cost(spec, configs, naive_trials=k)


ONE_PROGRAM_MODES = sweep.ONE_PROGRAM_MODES


def expected_execution(spec: dict, config, one_program: str = 'auto') -> str:
  """How the study's trials will run, said before K and the candidates are drawn."""
  from dp2fedsam_jax import search_program  # pylint: disable=import-outside-toplevel
  if one_program == 'never' or not sweep.runs_in_a_program(config):
    return 'execution: every trial in its own process'
  static = sorted(set(spec['space']) - set(search_program.searched(config)))
  if not static:
    return 'execution: the trials as one compiled program (a single trial: its own process)'
  return (f'execution: one compiled program per value of {", ".join(static)} (not searched '
          'scalars: they change the program) with >= 2 trials; the others each in their own process')


def _read(path: str):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _result(plan, cost, spec, runs, candidates, outcomes, directory, secret, source,
            configs, k: int) -> dict:
  """The operator's record of a finished study (OPERATOR_FILE): everything, K and every trial. The
  selection is over the first K trials; a pool_floor's further trials are in 'trials' only."""
  scored = [(o['score'], -i) for i, o in enumerate(outcomes[:k]) if o['score'] is not None]
  best = -max(scored)[1] if scored else None
  failed = [i for i, o in enumerate(outcomes[:k]) if o['status'] == 'failed']
  notes = []
  if k == 0:
    notes.append('K = 0 was drawn: the procedure trains nothing and outputs nothing (no model, no '
                 'score); the selection epsilon bounds this outcome as every other.')
  elif best is None:
    notes.append('every trial failed: nothing is selected; they all count as trials.')
  if failed:
    notes.append(f'{len(failed)} failed trial(s) {failed} count as trials (they ran on the data: '
                 'their cost is in the selection epsilon) and are never selected.')
  if len(runs) > k:
    notes.append(f'pool_floor: {len(runs) - k} trial(s) beyond the K = {k} of the selection ran to '
                 'measure the search (in_selection false); the selection never saw them.')
  if cost.get('private') is not False:
    notes.append(f'with K known (this file published) the bound is naive_epsilon, the K = {k} '
                 'trials composed, not selection_epsilon (docs/privacy.md section 9, assumption 2).')
  denominators = sorted({score_denominator(c) for c in configs})
  return {
      'DO_NOT_PUBLISH': DO_NOT_PUBLISH, 'status': 'done', 'study': plan['study'], 'plan': plan,
      'secret_seed': secret, 'secret_source': source, 'num_trials': k,
      'candidates': candidates,
      'runs': [os.path.relpath(r.workdir, directory) for r, _ in runs],
      'training_seeds': _training_seeds(runs),
      **{key: cost[key] for key in (
          'trial_distribution', 'expected_trials', 'delta', 'per_trial_epsilon',
          'selection_epsilon', 'naive_epsilon', 'naive_trials', 'naive_epsilon_at_mean_k',
          'naive_trials_at_mean_k', 'accountant', 'noise_multipliers', 'score_noise')
         if key in cost},
      'trial_distribution': plan['trial_distribution'], 'naive_trials_are': 'the drawn K',
      'score_denominator': denominators[0] if len(denominators) == 1 else denominators,
      'selected_index': best,
      'selected_run': os.path.relpath(runs[best][0].workdir, directory) if best is not None else None,
      'selected_values': candidates[best] if best is not None else None,
      'selected_score': outcomes[best]['score'] if best is not None else None,
      'selected_by': spec['selected_by'] + (
          ' + N(0, score_noise^2) on the sum over clients, / score_denominator'
          if cost['score_noise'] else ''),
      'failed_trials': failed, 'proxy': spec['proxy'], 'private': cost.get('private', True),
      'cost_on_private_clients': 0.0 if spec['proxy'] else cost['selection_epsilon'],
      'notes': notes,
      'trials': [{'run': os.path.relpath(r.workdir, directory), 'values': v, **o,
                  **({'in_selection': i < k} if len(runs) > k else {})}
                 for i, ((r, _), v, o) in enumerate(zip(runs, candidates, outcomes))],
  }


def _training_seeds(runs) -> list:
  """Each trial's config.training_seed (the operator's: a published one gives its noise back)."""
  return [c.get('training_seed') for _, c in runs]


def search_epsilon_bound(record: dict) -> tuple[float | None, int | None]:
  """(the search's epsilon whether or not K stays secret, K where that bound is K's naive
  composition) from the operator's record; (None, None) for a non-private study.

  A search's wall time, or the times at which a benchmark publishes its files, tell K roughly, and
  a known K leaves only the naive composition of the K trials (docs/privacy.md section 9). The
  bound is max(selection_epsilon, naive_epsilon of the K drawn): while naive_epsilon is the
  smaller, every best-of-k with k up to K is within it, so the selection epsilon holds whatever is
  learnt of K; beyond, the naive composition is the bound, and K itself is published with it (it
  then costs nothing more)."""
  if record.get('private') is False or record.get('selection_epsilon') is None:
    return None, None
  if record['naive_epsilon'] > record['selection_epsilon']:
    return record['naive_epsilon'], record['num_trials']
  return record['selection_epsilon'], None


def published_record(record: dict) -> dict:
  """tuning.json from the operator's record: what selection_epsilon covers (the selected run, its
  values and noised score) with the public plan and costs. The only path from the operator's
  record to the published file: no K, no candidate, no per-trial metric, noise draw or secret."""
  selected = record['selected_run']
  notes = []
  if selected is None:
    notes.append('nothing was selected (K = 0 was drawn or every trial failed; which one is the '
                 "operator's record): the procedure outputs nothing, an outcome the selection "
                 'epsilon bounds as every other.')
  if record['private'] is False:
    notes.append(NON_PRIVATE_NOTE + '.')
  else:
    notes.append('selection_epsilon holds while K is secret: K, the candidates and the score noise '
                 "come from the operator's secret seed, which no published file holds. A study "
                 'whose K is made public is covered by the naive composition of its K trials '
                 '(docs/privacy.md section 9, assumption 2), not by selection_epsilon.')
  if record['private'] and len(record.get('noise_multipliers') or []) > 1:
    notes.append('the drawn trials differ in sigma: the epsilons are over their maximum RDP curve, '
                 'which depends on the secret draw; account a space over fields that change sigma '
                 'by its worst case.')
  if record['score_noise']:
    notes.append(f"selected_score = (sum over clients of {record['plan']['selected_by']} + "
                 f"N(0, {record['score_noise']:g}^2)) / {record['score_denominator']}, the public "
                 'client count (clients without validation rows add 0): a public constant keeps '
                 'the score post-processing of the Gaussian sum query.')
  public = ('status', 'study', 'plan', 'trial_distribution', 'expected_trials', 'delta',
            'per_trial_epsilon', 'selection_epsilon', 'naive_epsilon_at_mean_k',
            'naive_trials_at_mean_k', 'accountant', 'noise_multipliers', 'score_noise',
            'score_denominator', 'selected_run', 'selected_values', 'selected_by', 'selected_score',
            'proxy', 'private', 'cost_on_private_clients')
  bound, k_published = search_epsilon_bound(record)
  if record['private'] is not False:
    notes.append('epsilon_bound = max(selection_epsilon, the naive composition of the K drawn): it '
                 'holds also once K is known (a search\'s wall time tells it roughly); K is '
                 'published only where it sets the bound (num_trials).')
  k_fields = ({'k_is': 'published: its naive composition sets epsilon_bound',
               'num_trials': k_published} if k_published is not None else
              {'k_is': 'secret (not in this file)'})
  return {**{key: record.get(key) for key in public}, 'epsilon_bound': bound, **k_fields,
          'notes': notes,
          'operator_file': f'{OPERATOR_FILE}: every trial and K, the operator\'s; never published'}


def _print_plan(plan, cost, runs, spec, path, k, rounds_per_run: int, programs=()) -> dict:
  """The plan: with the secret (the operator's view) K and the candidates; before the study starts
  the laws only (K and the candidates are drawn when it starts)."""
  law = plan['trial_distribution']
  if k is None:
    print(f"study {plan['study']}: K ~ {law} (E[K] = {cost['expected_trials']:.2f}), drawn with the "
          f'candidates from a fresh secret when the study starts -> {path}')
    for field, values in sorted(plan['space'].items()):
      print(f'  {field}: {values}')
  else:
    print(f"study {plan['study']}: K = {k} trials drawn from {law} (E[K] = "
          f"{cost['expected_trials']:.2f}; the operator's view: K and the candidates are secret) "
          f'-> {path}')
    if len(runs) > k:
      print(f'pool_floor {spec["pool_floor"]}: {len(runs) - k} further trial(s) measure the search '
            '(the selection never sees them)')
    how = {i: f'program {g}' for g, group in enumerate(programs, 1) for i in group}
    for i, ((run, _), values) in enumerate(runs):
      where = how.get(i, 'own process' if run.status != 'done' else '-')
      print(f'{run.status:24s} {where:14s} {run.workdir}  '
            + ', '.join(f'{f}={v}' for f, v in values.items())
            + (f'  [no data: {run.missing_data}]' if run.missing_data else ''))
    if programs:
      print(f'execution: {len(programs)} program(s) of {sum(len(g) for g in programs)} trials '
            '(they differ only in searched scalars: search_program.searched); the others each in '
            'its own process')
  count = len(runs) if k is not None else max(cost['naive_trials_at_mean_k'],
                                               spec.get('pool_floor') or 0)
  rounds = count * rounds_per_run
  seconds = spec.get('seconds_per_run')
  time_text = f', ~{count * seconds / 3600:.1f} h at {seconds / 60:.0f} min a run' if seconds else ''
  proxy = spec['proxy']
  what = f'{count} runs, {rounds} rounds' if k is not None else f'~{count} runs (E[K])'
  print(f'cost: {what}{time_text}; {_cost_text(cost, public=k is None)}'
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
  flags.DEFINE_bool('plan', False, 'Print the plan and its cost; run nothing (K and the '
                    'candidates too once the study has started: the operator\'s view).', **fv)
  flags.DEFINE_integer('secret_seed', None, 'The study\'s secret seed (K, candidates, score '
                       'noise), if the operator keeps one; default: drawn from the OS when the '
                       'study starts. Written only to ' + OPERATOR_FILE + '; never publish it.',
                       **fv)
  flags.DEFINE_multi_string('space', [], 'A searched field and its law, FIELD=log_uniform:LO:HI | '
                            'FIELD=uniform:LO:HI | FIELD=choice:V1,V2 (repeat per field): replaces '
                            "the study's space.", **fv)
  flags.DEFINE_string('trials', None, "The law of K: poisson:MU | logarithmic:MEAN | "
                      "geometric:MEAN | tnb:ETA:MEAN; replaces the study's.", **fv)
  flags.DEFINE_float('score_noise', None, "The score's noise s on the sum over clients (private "
                     "methods: > 0); replaces the study's.", **fv)
  flags.DEFINE_enum('one_program', 'auto', ONE_PROGRAM_MODES, 'auto: the new trials that differ only '
                    'in searched scalars (search_program.searched: lrs, rho, server lr, C, lam) and their '
                    'training seed run as one compiled program in this process, the others each in '
                    'its own process; never: every trial in its own process (launch.sweep).', **fv)


_overrides: list[str] = []


def _parse_flags(argv: list[str]) -> list[str]:
  _overrides.extend(a for a in argv[1:] if a.startswith('--config.'))
  return FLAGS([a for a in argv if not a.startswith('--config.')])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  search = parse_search_flags(FLAGS.space, FLAGS.trials, FLAGS.score_noise)
  if FLAGS.one_program != 'never' and not FLAGS.plan:
    sweep.enable_program_cache(FLAGS.root)
  tune(FLAGS.config, FLAGS.root, FLAGS.study, _overrides, FLAGS.plan, FLAGS.parallel,
       FLAGS.secret_seed, search if any(v is not None for v in search.values()) else None,
       FLAGS.one_program)


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['config', 'root'])
  cli.run(main, flags_parser=_parse_flags)
