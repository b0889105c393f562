"""Shakespeare at the field's operating point: FedAvg tuned first, then the protocol and privacy studies.

Replaces the protocol of `shakespeare.py` (200 rounds, client lr decayed 0.99 a round, at most 8
local steps, personal heads never re-fit, C = 0.5 fixed), under which FedAvg ended at 33.8 % where the
field reports 53-57 % (FedAvg on TFF's Shakespeare: 56.9 %, Reddi et al. 2021, 10 clients a round,
1,200 rounds, 1 local epoch, batch 4, constant tuned lrs, 2x256 LSTM; FedML on LEAF: 53.1 %; McMahan
et al. 2017's target: 54 %). Data as there: 1,063 roles of 38 plays, rows of 80 ids (docs/datasets.md).
Every number compared is `test_accuracy_pooled` (correct over all test characters, docs/evaluation.md).

OPERATING_POINT (below) is the ONE place the training settings live; the protocol and privacy blocks
read it. It holds the tuning's selection (tuning.json's `selected_values`, 2026-11-26; the
starting point before it: client lr 1.0, max_examples 160).

(a) Operating point: `tuning_space()`, study `fedavg` (char_lstm_small, CPU) and `fedavg_char_lstm`
(2x256, for a GPU): non-private FedAvg, T = 1,000 rounds, a cohort of 20 (Poisson q = 20/1,063; each
role is sampled ~19 times), server SGD at lr 1, every round's client lr constant or decayed by at most
0.999 a round (0.37x at the end, against 0.134x before). Searched: the client lr (log-uniform
0.3-3; TFF/FedML use ~1), lr decay (1 or 0.999), batch (4 as Reddi et al., or 10), local budget
local.max_examples (80, 160 rows, or None: one full epoch of every role, up to 619 rows).
K ~ Poisson(8); seed 1, the first seed from 0 that draws K >= E[K] (K = 9; seed 0 drew 3): K and
the candidates depend on the seed alone, never on the data, and FedAvg is not private, so this
choice only buys search. Both studies draw the same 9 candidates (the plan prints them). Selection:
the final round's validation accuracy on each role's 10 % validation split, never the test split.
FedAvg is not private: its trials release unprotected models, so selecting among them spends no
privacy (the tuner records private=false, no epsilon, and adds no score noise). Target: pooled
accuracy >= 45 % and flat at the end (< 0.3 points per 100 rounds over the last 200); if the
selected run misses it, the centralized bound (first step of launch/shakespeare_field.sh) says
whether char_lstm_small can.
The blocks below then train on every training row (validation_fraction 0).
Result (experiments/results/shakespeare_field/tuning/fedavg, 2 trials at a time on the 2 cores,
1,071-1,905 s a trial): trial 3 selected, batch 10, client lr 2.871 constant, max_examples 80:
validation 51.59 %, pooled test 51.68 % at round 1000 (the 9 trials: 43.6-51.7 % pooled). It
misses the flatness target: +0.41 points per 100 rounds over rounds 800-1000 (the report's gain
column); every trial still rose 0.27-0.43 there (trial 1, 50.84 %, the only flat one at 0.27). Kept
at T = 1,000, as declared: the blocks compare methods at the same T, and the selection sits 2.7
points under the centralized bound of the same model (54.34 %, 10 epochs).

(b) Protocol study, non-private, seeds 0-2, 18 training runs: FedAvg; P-FedSAM and FedRep with
personal_epochs 1 and 10 (the head epochs of a visit; FedRep's own protocol is ~10); local_only
(LOCAL_ONLY_VISITS visits of one epoch, chosen before any run). Test-time protocol ADAPT (10 epochs
at the head lr, the same for every method) by re-evaluating each finished run (experiments.evaluate,
nothing trains twice): FedAvg [adapt head] is FedAvg + head fine-tune, FedAvg [adapt full] is
FedAvg-FT, P-FedSAM / FedRep [adapt auto] re-fit their own heads on the final representation.

Decision rule (fixed before any run): for each personal-head row R (P-FedSAM or FedRep, personal_epochs
1 or 10, each with the re-fit) against the FedAvg + head fine-tune row F (the same test-time budget):
d = mean over seeds of R's pooled accuracy minus F's, s = the pooled seed std sqrt((s_R^2 + s_F^2)/2).
R *helps* if d >= max(1 point, 2 s), *hurts* if d <= -max(1 point, 2 s), else it is *level*.
Output-layer personalization helps (hurts) on this data if FedRep with personal_epochs 10 and the re-fit
-- FedRep's own protocol, the pre-declared primary row -- helps (hurts); the other rows are reported
with their labels and do not change the verdict. local_only and plain FedAvg are references.
PROTOCOL's head epochs (fixed before any 1-epoch row ran, 2026-11-27): those of the personal-head row
(P-FedSAM or FedRep, 1 or 10 epochs, with the re-fit) with the highest mean pooled accuracy over
its 3 seeds.
Verdict (2026-11-27, report.rule_label): FedRep with 10 head epochs and the re-fit 44.83 +- 0.09 %
against FedAvg + head fine-tune 51.99 +- 0.03 %: d = -7.17 points, s = 0.07: *hurts*.
The other rows (all 3 seeds, re-fit): P-FedSAM 10 head epochs 44.78 +- 0.03, FedRep 1 43.34 +- 0.27,
P-FedSAM 1 43.08 +- 0.11: each *hurts* (d -7.2 to -8.9 points). PROTOCOL: 10 head epochs (FedRep
with 10 is the best row; protocol_decision on the committed runs).

(c) Privacy study, seeds 0-2, 24 runs: DP2-FedSAM, CENTAUR, DP-FedAvg, DP-FedAvg-FT at eps 2 and 8
(delta = 1/N, PLD; sigma calibrated by the engine from dp.target_epsilon for the operating point's T
and cohort), personal heads with PROTOCOL's head epochs, each run re-evaluated under ADAPT
(REEVALUATIONS: the personal-head methods re-fit their heads, DP-FedAvg-FT fine-tunes, DP-FedAvg
gets the head fine-tune). The mean over clients is reported beside the pooled number.
Clip: a fixed C = PRIVATE_CLIP_NORM = 0.5 for every method, chosen from the protocol block's
non-private update norms (which no eps covers, as the papers' grids). At the operating point's
constant client lr the norms do not decay as the old protocol's did (0.69 -> 0.056 over its 200
rounds, so its C = 0.5 clipped nothing after round ~80): over rounds 1-1,000 the body updates of
FedRep / P-FedSAM average 0.61-0.83 a round and FedAvg's 1.16-1.80 (3 seeds each), so C = 0.5 sits
under both to the end. One C for all methods keeps the papers' comparison (smaller norms, less
clipping error) fair. sigma is then sigma_fixed below.
Changed 2026-11-27, after the first privacy run, from adaptive clipping (Andrew et al. 2021: target
quantile 0.4, C_0 0.5, clip_lr 0.2, count noise 1.2 sigma_fixed), which ran away. DP2-FedSAM at
eps 2, seed 0 was healthy to round ~110 (C_t 0.55-0.8, 46-95 % clipped, 26.9 % pooled at round 100).
Then its update norms grew (1.05 at round 101, 1.98 at 121, 376 at 131), every update was clipped,
C_t rose at clip_lr's top rate (8 % a round) to 74 by round 175, and the noise it scales (4.5 a
coordinate on the mean) wrecked the shared LSTM: the feedback of fmnist_paper_regime's block (f)
(experiments/results/README.md). Its small files: experiments/results/shakespeare_field/probe/
dp2fedsam_adaptive_eps2_seed0. A fixed C cuts the loop: the noise stays sigma C / m = 0.028 (eps 2)
/ 0.016 (eps 8) a coordinate, under the 0.034-0.05 of that run's healthy rounds. No other privacy
run had started, and the verdict rule below was fixed before it and is unchanged.
Why the private runs need their own lrs (2026-11-27). Under the fixed C, DP2-FedSAM at eps 2,
seed 0, at the operating point's client lr 2.871 and server lr 1 (probe/dp2fedsam_fixedC_eps2_seed0,
stopped at round 756) reached 34.9 % pooled at round 300, then fell: 33.8 at 500, 30.5 at 600, 27.8
at 700. From round ~400 its pre-clip update norms grew (1.5 at 401, 7.4 at 481, 5,200 at 601, 1.7e8
at 739), every update clipped: the noise's random walk on the shared LSTM (0.028 a coordinate a
round on the mean) moves it where local SGD at that lr blows up. At client lr 1.0
(probe/dp2fedsam_lr1_eps2_seed0) the same comes later: 33.8 % pooled at round 300, flat to 500
(33.6), the norms growing from ~0.4 (rounds 50-350) to 1.1 at 501 and 2.0 at 587. A larger cohort
does not help at N = 1,063 roles (amplification by sampling keeps the noise on the mean at
sigma C / m = 0.056 C at q = 20/N, 0.044 C at 100/N, 0.043 C at q = 1: PLD, eps 2, T 1,000,
delta 1/N). A third probe at server lr 0.3 (probe/dp2fedsam_serverlr03_eps2_seed0, client lr
2.871, stopped at round ~650) had not diverged (norms 0.64-1.0) and was still rising: 37.1 % pooled
at round 600. These probes are the operator's looks at the private data, outside any count: they
chose what the tuning below searches (the server lr), not its candidates.
The private tuning (study dp_fedavg_eps2, declared 2026-11-27 before its trials ran): DP-FedAvg
at eps 2 under the block's C, T = 1,000 and cohort, on each role's 90 % (validation_fraction 0.1),
searches PRIVATE_TUNING_SPACE (server lr log-uniform 0.05-1, client lr log-uniform 0.3-3); K ~
Poisson(PRIVATE_TRIALS_MEAN = 6), seed 0 (not chosen for its K); selection by the final round's
validation accuracy with score noise PRIVATE_SCORE_NOISE = 10 on the sum over the 1,063 roles (0.9
points on the mean). DP-FedAvg, the cheapest private method and the baseline every row is compared
with, is tuned once and its lrs serve all four methods and both eps, as FedAvg's did for the
protocol block: a choice that, if it favours anyone, favours the baseline over DP2-FedSAM.
Seed 0 drew K = 3. Privacy of the selection (launch.tune, RDP, delta 1/N, each trial eps 2.343
with the score's Gaussian): 4.611 by Papernot & Steinke for a secret K; the seed and so K are
public here, so the bound that holds is the 3 trials composed, 4.387 (docs/privacy.md section 9).
PRIVATE_POINT holds its selected_values (tests/test_configs.py holds it to the committed
tuning.json): trial 0, client lr 2.327, server lr 0.2654 (validation 38.45 %; trials 1-2 at server
lr 0.107 / 0.119: 34.64 / 35.43 %). A released row's eps with that tuning (epsilon_with_tuning,
PLD): 4.59 at eps 2, 9.39 at eps 8.
Verdict at eps 2 (2026-11-27, all 12 runs at 3 seeds, every clip binding, privacy_decision on the
committed runs): contradicted. DP2-FedSAM (38.30 +- 0.09 % pooled, heads re-fit) is level with
CENTAUR (+0.15 points) and hurts against DP-FedAvg + head fine-tune (39.49 +- 0.21, d = -1.19) and
DP-FedAvg-FT (39.83 +- 0.19, d = -1.53); every private row helps against local_only (+6.0 to +7.7).
Verdict at eps 8 (2026-11-27, all 12 runs at 3 seeds, every clip binding): contradicted as well.
DP2-FedSAM (39.28 +- 0.01 %) is level with CENTAUR at 39.11 +- 0.03 (+0.17 points) and hurts against
DP-FedAvg + head fine-tune (40.72 +- 0.17, d = -1.44) and DP-FedAvg-FT (40.82 +- 0.17, d = -1.54),
on every seed; every private row helps against local_only (+7.0 to +8.7).
Tested every PRIVATE_EVAL_EVERY = 100 rounds (the protocol block: 50), declared before any privacy
run: DP-FedAvg-FT's evaluation fine-tunes all 1,063 roles (28 s, one role at a time; a forward-only
evaluation takes 2.6 s), and the report's gain column needs only the records from round 800 on.
sigma_fixed (PLD, q = 20/1,063, T = 1,000): eps 2: 1.117 (sigma/m = 0.056), eps 8: 0.628 (0.031);
a cohort of 50 would give 2.299 (0.046) / 0.971 (0.019) for 2.5x the compute.
A probe before any study run (2026-11-27, DP-FedAvg at eps 2 under the adaptive clip, seed 0,
stopped at round 131, not kept): C_t rose from 0.5 to ~1.45 by round 20 and stayed there (noise std
0.089 a coordinate on the mean, 4.6x the old protocol's 0.0193), 53-87 % of the updates clipped,
train loss 2.57 at round 131 against FedAvg's 1.97 and still falling: slow, not diverging by then.
Privacy verdict rule (fixed 2026-11-27, before any privacy run): every row as re-evaluated under
ADAPT (REEVALUATIONS), pooled accuracy at round 1,000, report.rule_label as in (b). At each eps,
DP2-FedSAM against each of CENTAUR (the same method without SAM: what SAM on the body buys),
DP-FedAvg-FT and DP-FedAvg (+ head fine-tune); the papers' order holds at an eps if DP2-FedSAM
helps against all three, and is contradicted if it hurts against any. Every private row is also
labelled against local_only (nothing released, eps 0): a private method that does not help against
it gives the roles nothing for their privacy cost. A row counts only if its clip binds (mean
clipped_fraction >= 0.05 over the last 50 rounds, report.CLIP_BINDS).

Grid (`sweep_grid()`), 42 runs (18 until PROTOCOL_DECIDED): the protocol block's primary pair
(FedAvg, FedRep with 10 head epochs) at seeds 0-2 first, then its other rows seed by seed (4 a
seed), then the privacy block seed by seed, eps 2 first (8 a seed). `--grid=model=char_lstm` runs
the same grid with the 2x256 LSTM (a GPU's: ~5x the CPU time of the small one per step).

Time, measured before the LSTM speed-up (char_lstm_small, executor sequential, the 2 shared CPU
cores at load average 2.6-4.1 by `uptime`, 2026-11-26; smoke runs of 5 rounds, seed 0, whose
cohorts were 23, 23, 29, 32, 20): FedAvg at the starting point (batch 10, max_examples 160) 2.7 s a
round over rounds 2-5 (0.11 s a client); batch 4 with max_examples None (a full epoch of every
role) 2.8 s; P-FedSAM with personal_epochs 10 4.2 s in the rounds no other job shared (8.5 s mean with a
test run beside it); compile 7-23 s; one evaluation of all 1,063 roles ~5-15 s. A re-evaluation
(experiments.evaluate on that 5-round state, load 2.1-3.3): the 10-epoch head re-fit of all 1,063
roles 78 s wall, the 10-epoch full fine-tune of 100 random roles 51 s (~6 min for all). Per
1,000-round run (20 evaluations): FedAvg / DP-FedAvg ~0.85 h, FedRep / CENTAUR ~1.0 h, P-FedSAM /
DP2-FedSAM ~1.5 h, DP-FedAvg-FT ~1.1 h (each evaluation fine-tunes every role one epoch), local_only
~0.3 h (54 s a visit of every role, docs/evaluation.md; seed 0 ran vmapped, 92 s a visit).
Planned CPU hours: tuning K = 9 trials x
~1-1.3 h (a second, validation evaluation) = ~10 h; protocol block 3 x 6.2 h = ~18.5 h; privacy
block 3 x 2 x 4.45 h = ~27 h; 42 re-evaluations ~1.5 h; centralized bounds ~1.5 h (87 s and ~440 s
an epoch, 10 epochs); ~60 CPU hours in all.
Executor (2026-11-27, FedAvg at the operating point, rounds 6-30, nothing else running): sequential
0.72 s a round; 'sharded' on 2 CPU devices 0.40 s (each device loops over every other slot, padded
steps skipped); 2 sequential runs at a time ran ~1.1 s a round each (0.55 s a run-round). So the
grid runs one at a time, sharded: ~1.4x the runs per hour of 2 sequential ones. The runs finished
before (FedAvg seeds 0-2, FedRep seed 0-1) ran sequentially, 2 at a time.
GPU, measured (one H200, 2026-11-27, launch/shakespeare_field_device.sh): the privacy block's 12
personal-head runs, 6 at a time, each 1,000 rounds plus its ADAPT re-evaluation there: DP2-FedSAM
269-299 s a run, CENTAUR 215-250 s, 358 s and 330 s for the two calls of 6 (benchmarks/README.md).
Their ~50 MB of personal heads cannot come back from a device call, so those runs must finish and
be re-evaluated there; DP-FedAvg(-FT), with no personal state, ran on the CPU.

  python3 -m launch.tune --config=experiments/configs/shakespeare_field.py --study=fedavg \
      --root=$HOME/sweeps --plan
  python3 -m launch.sweep --config=experiments/configs/shakespeare_field.py --root=$HOME/sweeps --plan
  bash launch/shakespeare_field.sh          # the whole study in order, resumable

Arguments: `:method=fedavg,eps=inf,seed=0,personal_epochs=1,model=char_lstm_small`.
"""

from __future__ import annotations

import functools
import math

from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.config import base_config
from experiments.configs import _common

NUM_CLIENTS = 1063  # data/shakespeare.py with its defaults
# The one place of the training settings: the FedAvg tuning's selected_values (study fedavg, trial 3).
OPERATING_POINT = {
    'num_rounds': 1000, 'cohort': 20, 'server_lr': 1.0,
    'local.lr_shared': 2.871, 'local.lr_decay': 1.0, 'local.batch_size': 10, 'local.max_examples': 80,
}
# Head epochs a visit for the privacy block's personal-head methods: those of the best personal-head
# row of the protocol study (docstring (b); protocol_decision on the committed runs, 2026-11-27).
PROTOCOL = {'personal_epochs': 10}
# Set once the protocol block's 3 seeds decided PROTOCOL (tests/test_configs.py holds both to the
# runs). While False the grid holds no privacy run and no private config is built: the privacy
# workdirs do not name the head epochs, so a run under an undecided PROTOCOL would count as the study's.
PROTOCOL_DECIDED = True
HEAD_LR = 0.5  # local.lr_personal, as shakespeare.py
# The test-time protocol of every re-evaluation (docs/evaluation.md section 2).
ADAPT = {'eval.adapt_epochs': 10, 'eval.adapt_lr': HEAD_LR}
# What each method is re-evaluated with (eval.adapt_part under ADAPT); local_only keeps no state.
REEVALUATIONS = {'fedavg': ('head', 'full'), 'dp_fedavg': ('head',), 'p_fedsam': ('auto',),
                 'fedrep': ('auto',), 'dp2fedsam': ('auto',), 'centaur': ('auto',),
                 'dp_fedavg_ft': ('auto',)}
LOCAL_ONLY_VISITS = 20
EVAL_EVERY = 50
# Rounds between checkpoints (besides every evaluation's and a stop's round): one every round cost
# ~0.3 s (orbax, 44 MB with 1,063 personal heads) of FedRep's ~0.9 s (its log, rounds 990-996).
CHECKPOINT_EVERY = 10
PRIVATE_EVAL_EVERY = 100  # the privacy block (docstring (c))
PROTOCOL_METHODS = ('fedavg', 'p_fedsam', 'fedrep', 'local_only')
HEAD_METHODS, HEAD_EPOCHS = ('p_fedsam', 'fedrep'), (1, 10)  # personal heads: 1 or 10 epochs a visit
PRIVATE = ('dp2fedsam', 'centaur', 'dp_fedavg', 'dp_fedavg_ft')
EPSILONS = (2.0, 8.0)
PRIVATE_CLIP_NORM = 0.5  # every private method's fixed C (docstring (c))
# The private runs' server and client lr: the selected_values of the private tuning (study
# dp_fedavg_eps2, docstring (c)). None: undecided, the privacy block stays out of the grid and only
# the tuning's trials build a private config (OPERATING_POINT's lr diverges under the noise).
PRIVATE_POINT = {'local.lr_shared': 2.327, 'server_lr': 0.2654}
MODELS = ('char_lstm_small', 'char_lstm')
DEFAULTS = dict(method='fedavg', eps=math.inf, seed=0, personal_epochs=PROTOCOL['personal_epochs'],
                model='char_lstm_small', tuning=False)


@functools.lru_cache(maxsize=None)
def fixed_clip_sigma(eps: float, q: float, rounds: int) -> float:
  """sigma for eps at delta = 1/N with a fixed C (PLD): what the engine calibrates for the privacy
  block (docstring (c)), and its noise on the mean update, sigma C / m."""
  from dp2fedsam_jax.privacy import accounting  # pylint: disable=import-outside-toplevel
  return accounting.calibrate_noise_multiplier(eps, q, rounds, 1 / NUM_CLIENTS, accountant='pld')


def epsilon_with_tuning(eps: float) -> float:
  """The eps (delta 1/N, PLD) of one privacy-block run at target `eps` together with the private
  tuning that chose its lrs: the study dp_fedavg_eps2's K drawn trials, each with its score's
  Gaussian, composed with the run. K is public here (seed 0), so the trials compose as they are
  (docs/privacy.md section 9, assumption 2)."""
  import dp_accounting  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.privacy.mechanism import DPMechanism  # pylint: disable=import-outside-toplevel
  from launch import sweep, tune  # pylint: disable=import-outside-toplevel
  module, _, _, spec = tune.load_study(__file__, 'dp_fedavg_eps2')
  _, candidates = tune.draw_plan(spec)
  trials = tune.trial_runs(module, __file__, spec, candidates, '', [])  # configs only, no workdir
  events = [tune.scored_event(tune.trial_event(trial)[0], spec['score_noise']) for _, trial in trials]
  run = get_config(sweep.arg_string({'method': PRIVATE[0], 'eps': eps, 'tuning': True}))
  events.append(DPMechanism.from_config(run, NUM_CLIENTS, METHODS[run.method]).dp_event(run.num_rounds))
  accountant = dp_accounting.pld.PLDAccountant(
      dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
  for event in events:
    accountant.compose(event)
  return float(accountant.get_epsilon(1 / NUM_CLIENTS))


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  if args['model'] not in MODELS:
    raise ValueError(f"config argument model={args['model']!r}: choose from {MODELS}")
  op = dict(OPERATING_POINT)
  c = base_config()
  c.method, c.seed = args['method'], args['seed']
  c.dataset, c.model, c.partition = 'shakespeare', args['model'], 'natural'
  c.num_clients = NUM_CLIENTS
  c.num_rounds, c.eval_every = op.pop('num_rounds'), EVAL_EVERY
  c.checkpoint_every = CHECKPOINT_EVERY
  c.sampling_rate = round(op.pop('cohort') / NUM_CLIENTS, 5)
  c.server_lr = op.pop('server_lr')
  # Each device loops over its share of the cohort (a GPU vmaps it): one device per core with
  # JAX_NUM_CPU_DEVICES (launch/shakespeare_field.sh sets it), else the sequential loop. Runs
  # finished under 'auto' (sequential) still count (run_files.finished_record).
  c.executor = 'sharded'
  _common.set_fields(c, {
      'local.personal_epochs': args['personal_epochs'], 'local.shared_epochs': 1,
      'local.finetune_epochs': 1, 'local.lr_personal': HEAD_LR, 'local.momentum': 0.0,
      'local.sam_rho': 0.05, 'dp.clip_norm': PRIVATE_CLIP_NORM, 'dp.sampling': 'poisson',
      'dp.accountant': 'pld', **op})
  c.dp.delta = None  # 1 / N
  if c.method == 'local_only':
    c.num_rounds = LOCAL_ONLY_VISITS  # visits of one epoch each; no round runs
  if METHODS[c.method].private:
    if not PROTOCOL_DECIDED:
      raise ValueError(f'method={c.method}: the privacy block waits for PROTOCOL (its head epochs), '
                       'which the protocol block decides (docstring (b)); set PROTOCOL and '
                       'PROTOCOL_DECIDED = True in experiments/configs/shakespeare_field.py first.')
    if PRIVATE_POINT is None and not args['tuning']:
      raise ValueError(f'method={c.method}: the privacy block waits for PRIVATE_POINT, the server and '
                       'client lr the private tuning selects (docstring (c): the operating point\'s, '
                       'tuned without noise, diverges under it). Run the study dp_fedavg_eps2 '
                       '(launch.tune) and copy its selected_values into '
                       'experiments/configs/shakespeare_field.py first.')
    if PRIVATE_POINT is not None:  # a tuning trial sets both itself
      _common.set_fields(c, PRIVATE_POINT)
    c.eval_every = PRIVATE_EVAL_EVERY
    if math.isinf(args['eps']):
      c.dp.noise_multiplier = 0.0  # clipped, no noise
    else:
      c.dp.target_epsilon = args['eps']
  return c


# Hours of one 1,000-round run, one at a time, executor sharded on the 2 cores: the sum of the rounds'
# seconds (train_metrics.jsonl) of the runs that ran so, plus their evaluations (2026-11-27): FedRep
# with 1 head epoch 0.19 h, P-FedSAM with 1 0.37 h; 10 head epochs a visit add 0.09-0.10 h (FedRep
# 0.30 h, P-FedSAM 0.46 h); FedAvg 0.11 h from 30 rounds at 0.40 s. The private methods as their
# non-private twins (DP-FedAvg-FT's 10 evaluations fine-tune every role: 18 s each); local_only 20
# visits of every role, one at a time.
PLANNED_ON = 'CPU hours, 2 cores as 2 devices (executor sharded), char_lstm_small; a GPU ~12-18x less'
RUN_HOURS = {'fedavg': 0.13, 'dp_fedavg': 0.13, 'fedrep': 0.21, 'centaur': 0.21, 'p_fedsam': 0.4,
             'dp2fedsam': 0.4, 'dp_fedavg_ft': 0.18, 'local_only': 0.3}
TEN_HEAD_EPOCHS_HOURS = 0.1  # FedRep / P-FedSAM with 10 head epochs a visit - with 1
LARGE_MODEL_FACTOR = 5.0  # char_lstm's SGD step of 10 rows against char_lstm_small's: 0.097 / 0.019 s
                          # (the centralized smoke checks, docs/evaluation.md section 5)


def planned_hours(args: dict) -> float:
  hours = RUN_HOURS[args['method']]
  head_epochs = args.get('personal_epochs', PROTOCOL['personal_epochs'])
  if METHODS[args['method']].personal_phase and head_epochs >= 10:  # a head trained each visit
    hours += TEN_HEAD_EPOCHS_HOURS
  return hours * (LARGE_MODEL_FACTOR if args.get('model', 'char_lstm_small') == 'char_lstm' else 1.0)


# The decision rule's primary comparison, run first at every seed: FedAvg (re-evaluated with the head
# fine-tune) and FedRep with 10 head epochs a visit (re-fit).
PRIMARY = ({'method': 'fedavg'}, {'method': 'fedrep', 'personal_epochs': 10})


def _study_rows(runs_root: str):
  """(rows, adapted): experiments.report's rows of the runs under runs_root by (setting, method), and
  adapted(method, setting, part=None) -> the row re-evaluated under ADAPT with that part (None: the
  method's first REEVALUATIONS part), or None while it has not run."""
  from experiments import report  # pylint: disable=import-outside-toplevel
  rows = {(r.setting, r.method): r for r in report.summarize(report.load_runs(runs_root))}

  def adapted(method, setting, part=None):
    label = report.protocol_label({**ADAPT, 'eval.adapt_part': part or REEVALUATIONS[method][0]})
    return rows.get((setting, f'{method} [{label}]'))
  return rows, adapted


def protocol_decision(runs_root: str) -> dict:
  """Docstring (b)'s rule applied to the protocol runs under `runs_root` (experiments.report's rows,
  each run re-evaluated under ADAPT): {'rows': {(method, head epochs): (label, d, s)} for every
  personal-head row with the re-fit against FedAvg + head fine-tune, 'verdict': the primary row's
  label, 'personal_epochs': the head epochs of the row with the highest mean pooled accuracy
  (None until every personal-head row has 3 seeds)}."""
  from experiments import report  # pylint: disable=import-outside-toplevel
  _, adapted = _study_rows(runs_root)
  reference = adapted('fedavg', 'default', 'head')
  heads = {(m, h): adapted(m, f'personal_epochs={h}') for m in HEAD_METHODS for h in HEAD_EPOCHS}
  labels = {k: report.rule_label(r, reference) for k, r in heads.items()
            if r is not None and reference is not None}
  primary = (PRIMARY[1]['method'], PRIMARY[1]['personal_epochs'])
  complete = all(r is not None and r.num_seeds >= len(_common.SEEDS) for r in heads.values())
  best = max(heads, key=lambda k: heads[k].pooled['test_accuracy_pooled'][0]) if complete else None
  return {'rows': labels, 'verdict': labels[primary][0] if primary in labels else 'undecided',
          'personal_epochs': best[1] if best else None}


def privacy_decision(runs_root: str) -> dict:
  """Docstring (c)'s verdict rule on the privacy runs under `runs_root`: eps -> {'against':
  {other method: (label, d, s)} for DP2-FedSAM against CENTAUR, DP-FedAvg-FT and DP-FedAvg,
  'against_local_only': {method: (label, d, s)}, 'binds': {method: whether its clip binds},
  'order': 'holds' | 'contradicted' | 'open' (a level pair) | 'void' | 'undecided' (fewer than 3
  seeds)}. A pair with a side whose clip does not bind is 'void': it cannot test the papers'
  mechanism."""
  from experiments import report  # pylint: disable=import-outside-toplevel
  rows, adapted = _study_rows(runs_root)
  local_only = rows.get(('default', 'local_only'))
  out = {}
  for eps in EPSILONS:
    setting = report.setting_label({'eps': eps})
    binds = {m: (setting, m) in rows and rows[setting, m].clip_binds for m in PRIVATE}
    mine = {m: adapted(m, setting) for m in PRIVATE}

    def label(m, reference, reference_binds=True, mine=mine, binds=binds):
      if mine[m] is None or reference is None:
        return ('undecided', math.nan, math.nan)
      got = report.rule_label(mine[m], reference)
      void = got[0] != 'undecided' and not (binds[m] and reference_binds)
      return ('void', *got[1:]) if void else got

    against = {m: label(PRIVATE[0], mine[m], binds[m]) for m in PRIVATE[1:]}
    labels = {v[0] for v in against.values()}
    order = ('undecided' if 'undecided' in labels else 'void' if 'void' in labels
             else 'holds' if labels == {'helps'} else 'contradicted' if 'hurts' in labels
             else 'open')
    out[eps] = {'against': against, 'binds': binds, 'order': order,
                'against_local_only': {m: label(m, local_only) for m in PRIVATE}}
  return out


def pending_reevaluations(root: str) -> list[tuple[str, list[str]]]:
  """[(workdir, --config.* flags)] of every finished run under root that lacks one of its method's
  REEVALUATIONS under ADAPT (evaluations.jsonl has none with that protocol) and still has its
  checkpoints: what experiments.evaluate must run, nothing trains twice."""
  import json  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax import metric_writers  # pylint: disable=import-outside-toplevel
  out = []
  for d, _, files in sorted(os.walk(root)):
    if 'config.json' not in files or 'checkpoints' not in os.listdir(d) or 'metrics.jsonl' not in files:
      continue
    with open(os.path.join(d, 'config.json')) as f:
      config = json.load(f)
    records = metric_writers.read_jsonl(os.path.join(d, 'metrics.jsonl'))
    if not records or records[-1]['round'] < config['num_rounds']:
      continue
    done = (metric_writers.read_jsonl(os.path.join(d, 'evaluations.jsonl'))
            if 'evaluations.jsonl' in files else [])
    for part in REEVALUATIONS.get(config['method'], ()):
      protocol = {**ADAPT, 'eval.adapt_part': part}
      if not any(all(r.get(k) == v for k, v in protocol.items()) for r in done):
        out.append((d, [f'--config.{k}={v}' for k, v in protocol.items()]))
  return out


def protocol_grid() -> list[dict]:
  """The primary pair seed by seed, then the other protocol rows seed by seed."""
  primary = [dict(entry, seed=s) for s in _common.SEEDS for entry in PRIMARY]
  rest = []
  for s in _common.SEEDS:
    for m in PROTOCOL_METHODS:
      for h in (HEAD_EPOCHS if m in HEAD_METHODS else (None,)):
        entry = dict(method=m, seed=s) if h is None else dict(method=m, seed=s, personal_epochs=h)
        if entry not in primary:
          rest.append(entry)
  return primary + rest


def privacy_grid() -> list[dict]:
  return [dict(method=m, eps=e, seed=s) for s in _common.SEEDS for e in EPSILONS for m in PRIVATE]


def sweep_grid() -> list[dict]:
  """The protocol block seed by seed, then the privacy block seed by seed (eps 2 first), once
  PROTOCOL_DECIDED and PRIVATE_POINT is set."""
  ready = PROTOCOL_DECIDED and PRIVATE_POINT is not None
  return protocol_grid() + (privacy_grid() if ready else [])


TUNING_SPACE = {
    'local.lr_shared': ('log_uniform', 0.3, 3.0),
    'local.lr_decay': ('choice', [1.0, 0.999]),
    'local.batch_size': ('choice', [4, 10]),
    'local.max_examples': ('choice', [80, 160, None]),
}


# The private tuning (docstring (c)): DP-FedAvg at eps 2 over the server and client lr.
PRIVATE_TUNING_SPACE = {'server_lr': ('log_uniform', 0.05, 1.0),
                        'local.lr_shared': ('log_uniform', 0.3, 3.0)}
PRIVATE_TRIALS_MEAN = 6.0
PRIVATE_SCORE_NOISE = 10.0


def tuning_space() -> dict:
  """Non-private FedAvg: selection by validation accuracy, no score noise (nothing to protect)."""
  common = dict(fixed={'validation_fraction': 0.1}, space=TUNING_SPACE,
                trials={'name': 'poisson', 'mu': 8.0}, selected_by='validation_accuracy',
                score_noise=0.0)
  return {
      'fedavg': dict(common, args=dict(method='fedavg'), seed=1, seconds_per_run=3900),
      'fedavg_char_lstm': dict(common, args=dict(method='fedavg', model='char_lstm'), seed=1),
      'dp_fedavg_eps2': dict(
          args=dict(method='dp_fedavg', eps=2.0, tuning=True), fixed={'validation_fraction': 0.1},
          space=PRIVATE_TUNING_SPACE, trials={'name': 'poisson', 'mu': PRIVATE_TRIALS_MEAN},
          seed=0, selected_by='validation_accuracy', score_noise=PRIVATE_SCORE_NOISE),
  }
