"""The Shakespeare study of experiments/configs/shakespeare_field.py: its rules, verdicts and cost.

The config holds the settings and the grid; this module holds what is applied to them and to the
runs: the protocol block's rule (protocol_decision) and the privacy block's (privacy_decision), both
through experiments.report's rule_label; the re-evaluations a finished run still needs
(pending_reevaluations); a privacy-block row's eps with its tuning (epsilon_with_tuning); sigma of
the fixed clip (fixed_clip_sigma); and the cost model launch.sweep's plan sums (planned_hours).
The history of each choice, with the runs and probes behind it, is in experiments/results/README.md
(section shakespeare_field). Every accuracy is `test_accuracy_pooled`, at round T = 1,000.

(a) Operating point. The non-private FedAvg tuning (study fedavg, 9 trials, 1,071-1,905 s a trial on
the 2 cores) selected trial 3: batch 10, client lr 2.871 constant, max_examples 80, validation 51.59 %,
pooled test 51.68 % (the 9 trials: 43.6-51.7 %). It misses the flatness target (+0.41 points per 100
rounds over rounds 800-1000; every trial still rose 0.27-0.43 there) and sits 2.7 points under the
centralized bound of the same model (54.34 %, 10 epochs). Kept at T = 1,000, as declared.

(b) Protocol rule (fixed before any run): each personal-head row R (P-FedSAM or FedRep, 1 or 10 head
epochs, re-fit under ADAPT) against FedAvg + head fine-tune F: d = mean over seeds of R's pooled
accuracy minus F's, s = sqrt((s_R^2 + s_F^2)/2); R *helps* if d >= max(1 point, 2 s), *hurts* if
d <= -max(1 point, 2 s), else *level*. The primary row, FedRep with 10 head epochs, gives the verdict.
Verdict (2026-11-27): FedRep with 10 head epochs and the re-fit 44.83 +- 0.09 % against FedAvg + head
fine-tune 51.99 +- 0.03 %: d = -7.17 points, s = 0.07: *hurts*. The other rows (P-FedSAM 10: 44.78,
FedRep 1: 43.34, P-FedSAM 1: 43.08) each hurt (d -7.2 to -8.9). What hurts is a personal head
trained from its random start on the role's own visits: FedAvg's head fine-tuned is level with FedAvg
(+0.29 non-private; +0.21 / +0.01 on DP-FedAvg at eps 2 / 8).
PROTOCOL's head epochs are those of the personal-head row with the highest mean pooled TEST accuracy
over its 3 seeds (FedRep with 10): a choice made on the test split of the same roles, outside any count.

(c) Privacy block: C fixed at PRIVATE_CLIP_NORM = 0.5 for every method, below the non-private update
norms (FedRep / P-FedSAM 0.61-0.83, FedAvg 1.16-1.80 a round over rounds 1-1,000), after adaptive
clipping ran away in the first run (C_t 74 by round 175). At the operating point's lrs the noise's
walk made DP2-FedSAM diverge from round ~400; probes at eps 2 (client lr 1.0, server lr 0.3) set the
range the private tuning searches. The private tuning (study dp_fedavg_eps2): DP-FedAvg at eps 2,
server lr log-uniform 0.05-1, client lr 0.3-3, K ~ Poisson(6), seed 0 drew K = 3, score noise 10 on
the validation sum over the 1,063 roles; trial 0 selected (client lr 2.327, server lr 0.2654,
validation 38.45 %), whose lrs serve all four methods at both eps (PRIVATE_POINT).
What its eps covers. Each run's eps (2 or 8, delta = 1/N, PLD) covers that run's training only. The
committed tuning is covered by NO finite eps: its score noise was drawn from the public tuner seed,
so each trial's exact validation sum can be recovered from its published score, and tuning.json
publishes each trial's un-noised metric and test accuracy. epsilon_with_tuning (4.59 at eps 2, 9.39
at eps 8) is what a run and the declared tuning would cost with secret score noise and only the
selection published; it is no bound for the committed tuning. Outside any count, on the same roles:
the operating point (batch, local budget, lr decay, cohort) from the non-private FedAvg search on
their validation splits; PROTOCOL's head epochs from the highest pooled test accuracy of non-private
runs; C from non-private update norms; the server-lr range from probes at eps 2.
Privacy rule (fixed before any privacy run): at each eps, DP2-FedSAM against CENTAUR (what SAM on the
body buys), DP-FedAvg with the head fine-tune and DP-FedAvg-FT, by rule_label on the ADAPT rows;
the papers' order holds if DP2-FedSAM helps against all three, is contradicted if it hurts against
any; a pair whose clip does not bind (mean clipped_fraction < report.CLIP_BINDS over the last 50
rounds) is void. DP-FedAvg + head fine-tune and DP-FedAvg-FT are ONE trained model tested two ways
(their train_metrics.jsonl agree in every value but the wall-clock seconds), not two baselines; its
fine-tune adapts the whole model, DP2-FedSAM's re-fit only the head. Every private row is also
labelled against local_only (nothing released, eps 0).
Verdict at eps 2 (all 12 runs, 3 seeds, every clip binding, T = 1,000): contradicted. DP2-FedSAM
(38.30 +- 0.09 %, heads re-fit) is level with CENTAUR (+0.15 points) and hurts against the DP-FedAvg
model with the head fine-tune (39.49 +- 0.21, d = -1.19) and as DP-FedAvg-FT (39.83 +- 0.19,
d = -1.53); every private row helps against local_only (+6.0 to +7.7).
Verdict at eps 8 (all 12 runs, 3 seeds, every clip binding, T = 1,000): contradicted. DP2-FedSAM
(39.28 +- 0.01 %) is level with CENTAUR at 39.11 +- 0.03 (+0.17 points) and hurts against the DP-FedAvg
model with the head fine-tune (40.72 +- 0.17, d = -1.44) and as DP-FedAvg-FT (40.82 +- 0.17,
d = -1.54), on every seed; every private row helps against local_only (+7.0 to +8.7).
On the mean over roles (the report's final-round column) the gaps to the DP-FedAvg model are larger:
-3.4 points at eps 2, -3.6 to -3.8 at eps 8.
sigma of the fixed clip (PLD, q = 20/1,063, T = 1,000): eps 2: 1.117 (sigma/m = 0.056), eps 8: 0.628
(0.031); a cohort of 50: 2.299 (0.046) / 0.971 (0.019) for 2.5x the compute.

Cost (RUN_HOURS below, 2026-11-27): one 1,000-round run at a time, executor sharded on the 2 CPU
cores as 2 devices (0.40 s a FedAvg round against 0.72 s sequential; 2 sequential runs at a time
0.55 s a run-round), from the runs' train_metrics.jsonl plus their evaluations. Re-evaluations: the
10-epoch head re-fit of all 1,063 roles ~78 s, the full fine-tune ~6 min. GPU, measured (one H200,
benchmarks/device/shakespeare_field.sh): the 12 personal-head privacy runs 6 at a time, each with its
ADAPT re-evaluation, DP2-FedSAM 269-299 s a run, CENTAUR 215-250 s (benchmarks/README.md); their
~50 MB of personal heads cannot come back from a device call, so they finish and re-evaluate there.
"""

from __future__ import annotations

import functools
import json
import math
import os

import dp_accounting

from dp2fedsam_jax import metric_writers
from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.privacy import accounting
from dp2fedsam_jax.privacy.mechanism import DPMechanism
from experiments import report
from experiments.config_files import arg_string
from experiments.configs import _common
from experiments.configs import shakespeare_field as config

# Hours of one 1,000-round run, one at a time, executor sharded on the 2 cores: the sum of the rounds'
# seconds (train_metrics.jsonl) of the runs that ran so, plus their evaluations (2026-11-27): FedRep
# with 1 head epoch 0.19 h, P-FedSAM with 1 0.37 h; 10 head epochs a visit add 0.09-0.10 h (FedRep
# 0.30 h, P-FedSAM 0.46 h); FedAvg 0.11 h from 30 rounds at 0.40 s. The private methods as their
# non-private twins (DP-FedAvg-FT's 10 evaluations fine-tune every role: 18 s each); local_only 20
# visits of every role, one at a time.
RUN_HOURS = {'fedavg': 0.13, 'dp_fedavg': 0.13, 'fedrep': 0.21, 'centaur': 0.21, 'p_fedsam': 0.4,
             'dp2fedsam': 0.4, 'dp_fedavg_ft': 0.18, 'local_only': 0.3}
TEN_HEAD_EPOCHS_HOURS = 0.1  # FedRep / P-FedSAM with 10 head epochs a visit - with 1
LARGE_MODEL_FACTOR = 5.0  # char_lstm's SGD step of 10 rows against char_lstm_small's: 0.097 / 0.019 s
                          # (the centralized smoke checks, docs/evaluation.md section 5)
PLANNED_ON = 'CPU hours, 2 cores as 2 devices (executor sharded), char_lstm_small; a GPU ~12-18x less'
# The private tuning whose selection is the config's PRIVATE_POINT, and its committed record.
PRIVATE_TUNING = 'dp_fedavg_eps2'
PRIVATE_TUNING_RECORD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                     'results', 'shakespeare_field', 'tuning', PRIVATE_TUNING,
                                     'tuning.json')


def planned_hours(args: dict) -> float:
  """Hours of one run (launch.sweep's plan sums them); args as the config's get_config reads them,
  missing ones at the config's DEFAULTS."""
  args = {**config.DEFAULTS, **args}
  hours = RUN_HOURS[args['method']]
  if METHODS[args['method']].personal_phase and args['personal_epochs'] >= 10:  # a head each visit
    hours += TEN_HEAD_EPOCHS_HOURS
  return hours * (LARGE_MODEL_FACTOR if args['model'] == 'char_lstm' else 1.0)


@functools.lru_cache(maxsize=None)
def fixed_clip_sigma(eps: float, q: float, rounds: int) -> float:
  """sigma for eps at delta = 1/N with a fixed C (PLD): what the engine calibrates for the privacy
  block, and its noise on the mean update, sigma C / m."""
  return accounting.calibrate_noise_multiplier(eps, q, rounds, 1 / config.NUM_CLIENTS, accountant='pld')


def _dp_event(run_config):
  """The dp_event of a private run over its rounds, as the engine's mechanism accounts it."""
  mechanism = DPMechanism.from_config(run_config, config.NUM_CLIENTS, METHODS[run_config.method])
  return mechanism.dp_event(int(run_config.num_rounds))


def epsilon_with_tuning(eps: float, tuning_record: str = PRIVATE_TUNING_RECORD) -> float:
  """The eps (delta 1/N, PLD) of one privacy-block run at target `eps` composed with the private
  tuning as declared (study dp_fedavg_eps2): its K drawn trials, each with its score's Gaussian, K
  public (seed 0: the candidates its tuning.json's plan records). It assumes secret score noise and
  only the selection released, which the committed tuning does not meet (docstring (c)): it bounds
  the declared design, not that release."""
  with open(tuning_record) as f:
    candidates = json.load(f)['plan']['candidates']
  spec = config.tuning_space()[PRIVATE_TUNING]
  score = dp_accounting.GaussianDpEvent(spec['score_noise'])
  events = []
  for values in candidates:  # each trial as launch.tune builds it: the study's args, fixed, values
    trial = config.get_config(arg_string(spec['args']))
    _common.set_fields(trial, {**spec['fixed'], **values})
    events.append(dp_accounting.ComposedDpEvent([_dp_event(trial), score]))
  run = config.get_config(arg_string({'method': config.PRIVATE[0], 'eps': eps, 'tuning': True}))
  events.append(_dp_event(run))
  accountant = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
  for event in events:
    accountant.compose(event)
  return float(accountant.get_epsilon(1 / config.NUM_CLIENTS))


def _study_rows(runs_root: str):
  """(rows, adapted): experiments.report's rows of the runs under runs_root by (setting, method), and
  adapted(method, setting, part=None) -> the row re-evaluated under ADAPT with that part (None: the
  method's first REEVALUATIONS part), or None while it has not run."""
  rows = {(r.setting, r.method): r for r in report.summarize(report.load_runs(runs_root))}

  def adapted(method, setting, part=None):
    label = report.protocol_label({**config.ADAPT,
                                   'eval.adapt_part': part or config.REEVALUATIONS[method][0]})
    return rows.get((setting, f'{method} [{label}]'))
  return rows, adapted


def protocol_decision(runs_root: str) -> dict:
  """Docstring (b)'s rule applied to the protocol runs under `runs_root` (each run re-evaluated under
  ADAPT): {'rows': {(method, head epochs): (label, d, s)} for every personal-head row with the re-fit
  against FedAvg + head fine-tune, 'verdict': the primary row's label, 'personal_epochs': the head
  epochs of the row with the highest mean pooled accuracy (None until every such row has 3 seeds)}."""
  _, adapted = _study_rows(runs_root)
  reference = adapted('fedavg', 'default', 'head')
  heads = {(m, h): adapted(m, f'personal_epochs={h}')
           for m in config.HEAD_METHODS for h in config.HEAD_EPOCHS}
  labels = {k: report.rule_label(r, reference) for k, r in heads.items()
            if r is not None and reference is not None}
  primary = (config.PRIMARY[1]['method'], config.PRIMARY[1]['personal_epochs'])
  complete = all(r is not None and r.num_seeds >= len(_common.SEEDS) for r in heads.values())
  best = max(heads, key=lambda k: heads[k].pooled['test_accuracy_pooled'][0]) if complete else None
  return {'rows': labels, 'verdict': labels[primary][0] if primary in labels else 'undecided',
          'personal_epochs': best[1] if best else None}


def privacy_decision(runs_root: str) -> dict:
  """Docstring (c)'s rule on the privacy runs under `runs_root`: eps -> {'against': {other method:
  (label, d, s)} for DP2-FedSAM against CENTAUR, DP-FedAvg-FT and DP-FedAvg (+ head fine-tune),
  'against_local_only': {method: (label, d, s)}, 'binds': {method: whether its clip binds},
  'order': 'holds' | 'contradicted' | 'open' (a level pair) | 'void' | 'undecided' (fewer than 3
  seeds)}. A pair with a side whose clip does not bind is 'void': it cannot test the papers'
  mechanism."""
  rows, adapted = _study_rows(runs_root)
  local_only = rows.get(('default', 'local_only'))
  out = {}
  for eps in config.EPSILONS:
    setting = report.setting_label({'eps': eps})
    binds = {m: (setting, m) in rows and rows[setting, m].clip_binds for m in config.PRIVATE}
    mine = {m: adapted(m, setting) for m in config.PRIVATE}

    def label(m, reference, reference_binds=True, mine=mine, binds=binds):
      if mine[m] is None or reference is None:
        return ('undecided', math.nan, math.nan)
      got = report.rule_label(mine[m], reference)
      void = got[0] != 'undecided' and not (binds[m] and reference_binds)
      return ('void', *got[1:]) if void else got

    against = {m: label(config.PRIVATE[0], mine[m], binds[m]) for m in config.PRIVATE[1:]}
    labels = {v[0] for v in against.values()}
    order = ('undecided' if 'undecided' in labels else 'void' if 'void' in labels
             else 'holds' if labels == {'helps'} else 'contradicted' if 'hurts' in labels
             else 'open')
    out[eps] = {'against': against, 'binds': binds, 'order': order,
                'against_local_only': {m: label(m, local_only) for m in config.PRIVATE}}
  return out


def pending_reevaluations(root: str) -> list[tuple[str, list[str]]]:
  """[(workdir, --config.* flags)] of every finished run under root that lacks one of its method's
  REEVALUATIONS under ADAPT (evaluations.jsonl has none with that protocol) and still has its
  checkpoints: what experiments.evaluate must run, nothing trains twice."""
  out = []
  for d, _, files in sorted(os.walk(root)):
    if 'config.json' not in files or 'checkpoints' not in os.listdir(d) or 'metrics.jsonl' not in files:
      continue
    with open(os.path.join(d, 'config.json')) as f:
      run_config = json.load(f)
    records = metric_writers.read_jsonl(os.path.join(d, 'metrics.jsonl'))
    if not records or records[-1]['round'] < run_config['num_rounds']:
      continue
    done = (metric_writers.read_jsonl(os.path.join(d, 'evaluations.jsonl'))
            if 'evaluations.jsonl' in files else [])
    for part in config.REEVALUATIONS.get(run_config['method'], ()):
      protocol = {**config.ADAPT, 'eval.adapt_part': part}
      if not any(all(r.get(k) == v for k, v in protocol.items()) for r in done):
        out.append((d, [f'--config.{k}={v}' for k, v in protocol.items()]))
  return out
