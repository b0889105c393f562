"""The fair benchmark's tables (docs/benchmark.md): a block's rows with their tuned accuracy over the
final seeds and the privacy of a run and of its search, the block's regime rule applied, and the
verdict on each order its paper claims (seed_rule: holds / level / contradicted).

Reads a block's directory as launch/fair_benchmark.py lays it out (a sweep root's, or its published
copy under experiments/results/fair_*/runs): <row>/tuning.json (the search, as published),
<row>/<selected trial>/config.json and <row>/final/seed=<s>/{config.json, metrics.jsonl} (the
selection at each seed). A final run counts once it reached its num_rounds; a row's accuracy is the
block's metric at that last round. The eps of a search is recomputed from these files
(search_epsilons), so a page needs nothing but them.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

import ml_collections

from dp2fedsam_jax import metric_writers
from dp2fedsam_jax.privacy import selection
from experiments.report.rules import seed_rule
from experiments.report.summary import CLIP_WINDOW, CLIPPING, mean_std
from experiments.report.workdirs import (TUNING_FILE, diverged_at, format_value, read_json,
                                         scored_to_the_end)

# A claim's verdict from the candidate's (the paper's better row) label against the other row.
VERDICT = {'helps': 'holds', 'level': 'level', 'hurts': 'contradicted', 'undecided': 'undecided'}
MIN_GAP, MIN_SEEDS = 0.01, 3  # the rule's one point and three seeds (experiments/results/README.md)


@dataclasses.dataclass(frozen=True)
class RowResult:
  """One row of a block as its files say: the search's outcome and the final seeds' accuracy."""
  row: object                 # experiments.studies.fair.Row
  tuning: dict | None         # the published tuning.json (None before the search finished)
  accuracy: dict              # {seed: the block's metric at the final round}, finished runs only
  #                             (a diverged run is finished: `diverged` below)
  # {seed: (metrics.jsonl, train_metrics.jsonl)} of the same finished runs (run_ends reads them)
  records: dict = dataclasses.field(default_factory=dict)
  server_lr: dict = dataclasses.field(default_factory=dict)  # {seed: its config's server lr}
  configs: dict = dataclasses.field(default_factory=dict)  # {seed: its config.json}
  # The final runs' epsilon_caveat ('' when eps covers the release; a paper form's leak otherwise).
  caveat: str = ''
  # The selected trial ran at a seed a final run reuses: the search shared its public seed (the
  # first design of the committed blocks), so trials and final runs share cohorts and noise.
  shared_seed: bool = False
  # {seed: the round its release turned NaN/Inf}: a final run that diverged is finished, scored 0
  # in the metric at each evaluation from there (workdirs.scored_to_the_end); a rerun repeats it.
  diverged: dict = dataclasses.field(default_factory=dict)

  @property
  def stats(self) -> tuple:
    """(mean, std over seeds, seeds) of the accuracy (fractions; nan without a finished seed)."""
    values = [self.accuracy[s] for s in sorted(self.accuracy)]
    mean, std = mean_std(values) if values else (math.nan, math.nan)
    return mean, std, len(values)

  @property
  def selected(self) -> dict | None:
    return (self.tuning or {}).get('selected_values')


def law_text(trials: dict) -> str:
  """A trial law as the pages print it: 'truncated_negative_binomial (eta 0, mean 16)'."""
  return trials['name'] + ' (' + ', '.join(
      f'{k} {format_value(v)}' for k, v in trials.items() if k != 'name') + ')'


def read_row(block_dir: str, row, metric: str) -> RowResult:
  """The row's RowResult from <block_dir>/<row name>/ (nothing there: no search, no seed)."""
  directory = os.path.join(block_dir, row.name)
  path = os.path.join(directory, TUNING_FILE)
  tuning = read_json(path) if os.path.exists(path) else None
  if tuning is not None and tuning.get('status') != 'done':
    tuning = None
  accuracy, records, server_lr, configs, caveat, diverged = {}, {}, {}, {}, '', {}
  finals = os.path.join(directory, 'final')
  for name in sorted(os.listdir(finals)) if os.path.isdir(finals) else ():
    run = os.path.join(finals, name)
    if not (name.startswith('seed=') and os.path.exists(os.path.join(run, 'config.json'))):
      continue
    evaluations = metric_writers.read_jsonl(os.path.join(run, metric_writers.EVAL_FILE))
    config = read_json(os.path.join(run, 'config.json'))
    seed, failed_at = int(name[len('seed='):]), diverged_at(run)
    if failed_at is not None:
      evaluations = scored_to_the_end(evaluations, config, failed_at, (metric,))
      diverged[seed] = failed_at
    if evaluations and evaluations[-1]['round'] >= config['num_rounds']:
      accuracy[seed] = float(evaluations[-1][metric])
      records[seed] = (evaluations,
                       metric_writers.read_jsonl(os.path.join(run, metric_writers.TRAIN_FILE)))
      server_lr[seed] = float(config.get('server_lr', math.nan))  # '–' where a config lacks it
      configs[seed] = config
      caveat = caveat or evaluations[-1].get('epsilon_caveat', '')
  return RowResult(row, tuning, accuracy, records, server_lr, configs, caveat,
                   _shared_seed(directory, tuning, configs), diverged)


def _shared_seed(directory: str, tuning: dict | None, configs: dict) -> bool:
  """Whether the selected trial ran at the public config.seed of a final run: runs from before
  config.training_seed existed (their config.json lacks the field; a tuner's trials now each draw
  theirs from the study's secret, and the published copy drops its value)."""
  path = os.path.join(directory, (tuning or {}).get('selected_run') or '', 'config.json')
  if not (tuning and tuning.get('selected_run') and os.path.exists(path)):
    return False
  return (read_json(path).get('seed') in configs
          and not any('training_seed' in c for c in configs.values()))


def _run_event(config: dict) -> tuple:
  """(dp_event, neighbouring relation, delta) of a run from its config.json, its sigma as resolved."""
  from dp2fedsam_jax.algorithms import METHODS  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.privacy.mechanism import DPMechanism  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict(config)
  config.dp.target_epsilon = None  # the resolved sigma is in the file: no calibration, no warning
  mechanism = DPMechanism.from_config(config, config.num_clients, METHODS[config.method])
  return (mechanism.dp_event(int(config.num_rounds)), mechanism.neighboring_relation,
          float(mechanism.delta))


def search_epsilons(result: RowResult) -> tuple | None:
  """(eps of the search, eps of the search and one final run composed, K or None) from the row's
  tuning.json and a final run's config.json (RDP; launch.tune's accounting): K secret, the
  selection's eps; K published (its naive composition is the bound once K is known), that bound and
  K trials composed with the run. None for a row without a private search or a finished seed."""
  import dp_accounting  # pylint: disable=import-outside-toplevel
  tuning = result.tuning
  if not tuning or tuning.get('selection_epsilon') is None or not result.configs:
    return None
  event, relation, delta = _run_event(result.configs[min(result.configs)])
  scored = (dp_accounting.ComposedDpEvent([event, dp_accounting.GaussianDpEvent(tuning['score_noise'])])
            if tuning.get('score_noise') else event)
  law = selection.TrialDistribution.from_dict(tuning['trial_distribution'])
  with_run = selection.selection_then_run_epsilon([scored], law, event, delta, relation)
  k = tuning.get('num_trials')
  if k is None:
    return tuning['selection_epsilon'], with_run, None
  naive = selection.trials_then_run_epsilon([scored], k, event, delta, relation)
  return tuning['epsilon_bound'], max(with_run, naive), k


def block_epsilons(block, results: dict) -> dict:
  """{private row: search_epsilons} of the block's rows that have one."""
  out = {r.name: search_epsilons(results[r.name]) for r in block.rows}
  return {name: value for name, value in out.items() if value is not None}


def read_block(block_dir: str, block) -> dict:
  """{row name: RowResult} of every row of the block, its ceiling row included."""
  return {r.name: read_row(block_dir, r, block.metric) for r in block.all_rows()}


def subsumed(block, results: dict) -> dict:
  """{variant row: its base row} for each variant with no search of its own whose base row's search
  selected every value it pins (Block.is_subsumed): the base row is it, and only the base is judged."""
  out = {}
  for r in block.rows:
    base = block.base_of(r)
    if (base is not None and results[r.name].tuning is None
        and block.is_subsumed(r, results[base.name].selected)):
      out[r.name] = base
  return out


def subsumed_text(row, base) -> str:
  pins = ', '.join(f'{k} {format_value(v)}' for k, v in row.pinned)
  return (f"not searched: {base.name}'s search selected {pins}, what this variant pins "
          f"({base.name}'s row stands for it)")


def verdicts(block, results: dict) -> list[dict]:
  """One entry per claim and pair of rows: the paper's better row against its worse one by the seed
  rule, d and s in points, and the verdict (holds / level / contradicted / undecided). A subsumed
  variant meets no one (its base row's entries are its)."""
  out, skipped = [], subsumed(block, results)
  for claim, better, worse in block.claim_pairs():
    if better.name in skipped or worse.name in skipped:
      continue
    label, d, s = seed_rule(results[better.name].stats, results[worse.name].stats, MIN_GAP,
                            MIN_SEEDS)
    out.append({'claim': claim, 'better': better, 'worse': worse, 'label': label,
                'verdict': VERDICT[label], 'd': 100 * d, 's': 100 * s})
  return out


def regime(block, results: dict, ceiling: float | None) -> str:
  """The block's regime rule once it can be applied (the ceiling known, every private row at its 3
  seeds): 'test' or _fair.AT_CEILING; else 'pending' and what is missing."""
  skipped = subsumed(block, results)
  private = {r.name: results[r.name].stats for r in block.rows if r.name not in skipped}
  short = sorted(n for n, (_, _, seeds) in private.items() if seeds < MIN_SEEDS)
  if ceiling is None or short:
    missing = (['the ceiling'] if ceiling is None else []) + (
        [f"{', '.join(short)} ({MIN_SEEDS} seeds)"] if short else [])
    return f"pending: {' and '.join(missing)}"
  return block.regime(ceiling, {n: 100 * m for n, (m, _, _) in private.items()})


# A row's last rounds, to say whether it had stopped learning at T (the block compares rows at T):
# the train loss over the last T / LOSS_WINDOWS rounds against the same number before them, the
# block's metric over the last METRIC_LOOKBACK rounds (where it was evaluated there), and how the
# clip binds over the last CLIP_WINDOW rounds (private rows).
LOSS_WINDOWS, METRIC_LOOKBACK = 10, 50


def _loss_width(last: int) -> int:
  """The length of each train-loss window of a run that ends at round `last`."""
  return max(1, last // LOSS_WINDOWS)


def _mean_of(records: list[dict], key: str) -> float:
  values = [r[key] for r in records if r.get(key) is not None]
  return float(np.mean(values)) if values else math.nan


def _seed_end(evaluations: list[dict], rounds: list[dict], metric: str,
              server_lr: float = math.nan) -> dict:
  """One run's last rounds: loss_before, loss_last, metric_gain (fraction), the CLIPPING keys,
  signal_to_noise (the released mean's, as the round logs it) and step_noise, the noise the server's
  step puts on each weight (server lr × the logged noise_std of the mean); nan for a non-private
  run."""
  last = evaluations[-1]['round']
  width = _loss_width(last)
  window = lambda lo, hi: [r for r in rounds if lo < r['round'] <= hi]
  earlier = {e['round']: e.get(metric) for e in evaluations}.get(last - METRIC_LOOKBACK)
  end = {'loss_before': _mean_of(window(last - 2 * width, last - width), 'train_loss'),
         'loss_last': _mean_of(window(last - width, last), 'train_loss'),
         'metric_gain': (math.nan if earlier is None
                         else float(evaluations[-1][metric]) - float(earlier))}
  epsilon = evaluations[-1].get('epsilon') or math.inf
  tail = window(last - CLIP_WINDOW, last) if 0 < epsilon < math.inf else []  # no clip without DP
  return end | {key: _mean_of(tail, key) for key in CLIPPING} | {
      'signal_to_noise': _mean_of(tail, 'signal_to_noise'),
      'step_noise': server_lr * _mean_of(tail, 'noise_std')}


def run_ends(result: RowResult, metric: str) -> dict:
  """_seed_end's keys, each the mean over the row's finished seeds (nan where a seed lacks it), and
  'width': the loss windows' length in rounds."""
  ends = [_seed_end(*result.records[s], metric, result.server_lr.get(s, math.nan))
          for s in sorted(result.records)]
  if not ends:
    return {}
  out = {k: float(np.mean([e[k] for e in ends])) for k in ends[0]}
  last = result.records[min(result.records)][0][-1]['round']
  return out | {'width': _loss_width(last), 'last': last}


def loss_text(loss: float) -> str:
  """A train loss as the pages print it: 4 decimals, or e-notation for a diverged run's."""
  return format(loss, '.4f' if abs(loss) < 1e4 else '.4g')


def end_lines(block, results: dict) -> list[str]:
  """'The final seeds' last rounds' table: a row per row with finished seeds (the ceiling too)."""
  ends = {r.name: run_ends(results[r.name], block.metric) for r in block.all_rows()}
  ends = {name: end for name, end in ends.items() if end}
  if not ends:
    return []
  any_end = next(iter(ends.values()))
  width, last = any_end['width'], any_end['last']
  number = lambda v, fmt: '–' if math.isnan(v) else format(v, fmt)
  loss = lambda v: '–' if math.isnan(v) else loss_text(v)
  lines = [
      "### The final seeds' last rounds", '',
      f'Whether a row had stopped learning at T = {last} (the block compares rows there), the mean '
      f'over its finished seeds: the train loss over rounds {last - 2 * width + 1}-{last - width} '
      f'and {last - width + 1}-{last}; the change of {block.metric} over the last {METRIC_LOOKBACK} '
      f"rounds ('–': no evaluation at round {last - METRIC_LOOKBACK}); over the last {CLIP_WINDOW} "
      'rounds, the fraction of sampled clients whose update the clip cut and their mean update norm '
      'before it (the clip norm is in the table above), the signal-to-noise ratio of the released '
      "mean (norm of the clipped mean / norm of its noise) and the std of the noise the server's "
      'step puts on each weight (server lr × the noise on the mean): where the clip cuts every '
      'update, C scales signal and noise alike: the ratio does not depend on C, which sets the size of the '
      'noisy step (docs/benchmark.md, section 4).', '',
      f'| row | seeds | train loss, {last - 2 * width + 1}-{last - width} → {last - width + 1}-{last} '
      f'| {block.metric} over the last {METRIC_LOOKBACK} rounds (points) | clipped fraction | '
      'pre-clip update norm | signal-to-noise | noise per weight a step |',
      '|---|---|---|---|---|---|---|---|']
  for name, end in ends.items():
    lines.append(f"| {name} | {len(results[name].records)} | {loss(end['loss_before'])} → "
                 f"{loss(end['loss_last'])} | {number(100 * end['metric_gain'], '+.2f')} | "
                 f"{number(end['clipped_fraction'], '.2f')} | "
                 f"{number(end['mean_update_norm'], '.4g')} | "
                 f"{number(end['signal_to_noise'], '.4f')} | {number(end['step_noise'], '.4f')} |")
  return lines + ['']


def _pct(value: float) -> str:
  return '–' if value is None or math.isnan(value) else f'{100 * value:.2f}'


EDGE = 0.05  # a selected value this close to its range's end (a fraction of the range) is marked


def at_edge(law, value) -> bool:
  """Whether `value` lies within EDGE of either end of its range (on the log scale for a
  log-uniform law): the optimum may lie outside, and the range stays as declared."""
  if law[0] == 'choice' or value is None:
    return False
  low, high, value = float(law[1]), float(law[2]), float(value)
  if law[0] == 'log_uniform':
    low, high, value = math.log(low), math.log(high), math.log(value)
  where = (value - low) / (high - low)
  return where <= EDGE or where >= 1 - EDGE


def _accuracy_text(stats: tuple) -> str:
  """'93.38 ± 0.15' over seeds (the mean alone with one seed, '–' with none)."""
  mean, std, seeds = stats
  return _pct(mean) + (f' ± {100 * std:.2f}' if seeds > 1 else '')


def _values_text(selected: dict | None, ranges: dict) -> str:
  if not selected:
    return '–'
  return ', '.join(f'{k.split(".")[-1]} {format_value(v)}'
                   + (' (edge)' if k in ranges and at_edge(ranges[k], v) else '')
                   for k, v in sorted(selected.items()))


NOT_COVERED = 'not covered'  # a paper form's search eps: its eps does not cover the release
SHARED_SEED = '‡'
SHARED_SEED_NOTE = (f'{SHARED_SEED} searched with a shared public seed (the first design): every trial '
                    'ran at the public config.seed and the final run at that seed reused it, so '
                    'they share cohorts and noise; the ε of a search assumes independent trials and '
                    'does not hold as stated (docs/privacy.md section 9).')
COMPOSE_NOTE = ("Each row's ε is that row's alone: every row of the block trains on the same clients, "
                'so the ε of several rows compose.')


def _epsilon_text(value: float, k: int | None, digits: int) -> str:
  """An eps of a search; '(K = k)' where k's naive composition is the bound (K then published)."""
  return f'{value:.{digits}f}' + (f' (K = {k})' if k is not None else '')


def search_texts(result: RowResult, epsilons: tuple | None, digits: int) -> tuple[str, str]:
  """(eps of the search, eps of search + run) as a table prints them: 'not covered' for a paper
  form, '–' without a search, a SHARED_SEED mark where the search shared its public seed."""
  if result.caveat:
    return NOT_COVERED, NOT_COVERED
  if epsilons is None:
    return '–', '–'
  search, with_run, k = epsilons
  mark = SHARED_SEED if result.shared_seed else ''
  return _epsilon_text(search, k, digits) + mark, _epsilon_text(with_run, k, digits) + mark


def _shared_seed_notes(block, results: dict) -> list[str]:
  return ['', SHARED_SEED_NOTE] if any(results[r.name].shared_seed and not results[r.name].caveat
                                       for r in block.rows) else []


def row_lines(block, results: dict, epsilons: dict) -> list[str]:
  """The block's table: a row per method (the ceiling last) with its accuracy over the final seeds,
  the eps of one run, of its search, and of both (`epsilons`: block_epsilons), and the selected
  values."""
  lines = [f'| row | paper row | {block.metric} (mean ± seed std) | seeds | ε of a run | ε of the '
           'search | ε of search + run | selected values |', '|---|---|---|---|---|---|---|---|']
  skipped = subsumed(block, results)
  for r in block.all_rows():
    result = results[r.name]
    accuracy, seeds = _accuracy_text(result.stats), result.stats[2]
    is_ceiling = block.ceiling is not None and r.name == block.ceiling.name
    name = r.name + (f' ({r.mark})' if r.mark else '')
    if r.name in skipped:
      lines.append(f'| {name} | {r.paper_row} | {subsumed_text(r, skipped[r.name])} | 0 | – | – | – | – |')
      continue
    if is_ceiling:
      privacy = ('non-private', '–', '–')
    else:
      privacy = (format_value(block.eps), *search_texts(result, epsilons.get(r.name), 3))
    lines.append(f"| {name} | {r.paper_row or ('ceiling' if is_ceiling else '–')} | {accuracy} | "
                 f"{seeds} | {' | '.join(privacy)} | {_values_text(result.selected, block.ranges)} |")
  return lines + _shared_seed_notes(block, results)


def verdict_lines(entries: list[dict]) -> list[str]:
  """'The paper claims A > B' table: d, s and the verdict of every claimed pair of rows."""
  lines = ['| the paper claims | rows | d (points) | s | verdict | where the paper says it |',
           '|---|---|---|---|---|---|']
  for e in entries:
    claim = e['claim']
    d = '–' if math.isnan(e['d']) else f"{e['d']:+.2f}"
    s = '–' if math.isnan(e['s']) else f"{e['s']:.2f}"  # one seed: no std yet
    marked = lambda row: row.name + (' †' if row.mark else '')
    lines.append(f"| {claim.better} > {claim.worse} | {marked(e['better'])} vs {marked(e['worse'])} "
                 f"| {d} | {s} | {e['verdict']} | {claim.source} |")
  if any(e['better'].mark or e['worse'].mark for e in entries):
    lines += ['', '† a marked row: what its mark in the table above says holds for its verdicts too.']
  return lines


def block_lines(block, config_name: str, results: dict, epsilons: dict,
                ceiling: float | None) -> list[str]:
  """The block's section of results.md: settings, the table, the regime rule and the verdicts."""
  rule = regime(block, results, ceiling)
  ceiling_text = '–' if ceiling is None else f'{ceiling:.2f} %'
  # A committed ceiling's reference already states its accuracy.
  ceiling_note = '' if ceiling_text in block.ceiling_reference else f' ({ceiling_text})'
  verdict_note = ('' if rule == 'test' else
                  ' (the regime rule has not said "test": these are no verdict on the paper\'s order)')
  laws = (f"K of every search {law_text(block.trials)}" if not block.ceiling_trials else
          f"K of every row's search {law_text(block.trials)}, of the ceiling's "
          f"{law_text(block.ceiling_trials)}")
  return [
      f'## Block ({block.name}): {block.paper}', '',
      f'Config `experiments/configs/{config_name}.py`; {laws}, '
      f'eps {block.eps:g} per trial and per final run, score noise {block.score_noise:g}; '
      f'metric {block.metric} at the final round. Ceiling: {block.ceiling_reference}{ceiling_note}.',
      '',
      *row_lines(block, results, epsilons), '',
      '*ε of a run*: the target each trial and final run was calibrated to (PLD, δ = 1/N). *ε of '
      'the search*: the selection of the released values over the secret K trials, each with its '
      'noised score (RDP, Papernot & Steinke; docs/privacy.md section 9); *(K = k)*: a row whose K '
      "trials' naive composition exceeds it, the bound once K is known (a search's wall time tells "
      'it roughly), and then published with it. *ε of search + run*: that '
      f'selection and one final run composed (RDP): what one model trained this way costs. '
      f'*{NOT_COVERED}*: a paper form, whose ε does not cover what it releases. {COMPOSE_NOTE} Not '
      'covered by any ε: the test accuracies on this page, the other two final seeds (the seed '
      'spread is a measurement, not a release), and the choice of ranges and settings. *(edge)*: '
      f'a selected value within {EDGE:.0%} of an end of its range (log scale for a log-uniform '
      'one): the best value may lie outside; the ranges stay as declared before the runs.', '',
      f'Regime rule: {block.regime_rule}. Applied: **{rule}**.', '',
      f'### The paper\'s claims{verdict_note}', '',
      *verdict_lines(verdicts(block, results)), '', *end_lines(block, results)]


def readme_lines(block, results: dict, epsilons: dict, ceiling: float | None) -> list[str]:
  """The summary table of a block (experiments/results/README.md): each row's accuracy over its
  seeds, the eps of a run and of a model with its search, and what became of the orders the paper
  claims with it on top; then the regime rule's outcome."""
  claims = verdicts(block, results)
  outcome = regime(block, results, ceiling)
  measured = ('' if outcome == 'test' else ' so far (the rule not yet applied)'
              if outcome.startswith('pending') else ' as measured (the rule: no verdict)')
  lines = [f'| method | {block.metric}, % (mean ± seed std) | ε of a run | ε with its search | the '
           f"paper's claims with it on top{measured}: holds / level / contradicted |",
           '|---|---|---|---|---|']
  skipped = subsumed(block, results)
  for r in (r for r in block.rows if r.name not in skipped):
    accuracy = _accuracy_text(results[r.name].stats)
    mine = [e['verdict'] for e in claims if e['better'].name == r.name]
    tally = ' / '.join(str(mine.count(v)) for v in ('holds', 'level', 'contradicted')) if mine else '–'
    undecided = mine.count('undecided')
    tally += f' ({undecided} undecided)' if undecided else ''
    name = f'{r.paper_row or r.name}' + (f' ({r.mark})' if r.mark else '')
    with_run = search_texts(results[r.name], epsilons.get(r.name), 2)[1]
    lines.append(f'| {name} | {accuracy} | {format_value(block.eps)} | {with_run} | {tally} |')
  ceiling_text = '–' if ceiling is None else f'{ceiling:.2f}'
  notes = [f'{name}: {subsumed_text(block.row(name), base)}.' for name, base in skipped.items()]
  return lines + _shared_seed_notes(block, results) + [
      '', *notes, f'Non-private ceiling {ceiling_text} %; the regime rule: **{outcome}**.']
