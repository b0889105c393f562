"""DP²-FedSAM and its baselines on Fashion-MNIST in the papers' regime (dp2-fedsam.txt §5.1): the
Table 2 comparison on data anyone can get offline.

Setup: pathological (N, S) = (1000, 2) split (FedRep shards; `S=5` for (1000, 5)), 54 train / 6 test
examples a client; emnist_cnn from a random init; T = 200 rounds; Poisson sampling r = 0.05 (~50
clients a round, each client sampled ~10 times); eps = 1 at delta = 1/N (sigma calibrated with PLD);
C = 0.1, SAM rho = 0.1, tau_h = tau_phi = 2 epochs (2 epochs for the full-model methods, 2 epochs of
fine-tuning for the -FT ones), batch 10, momentum 0.7, lr decay 0.99 per round; evaluation every 20
rounds.

Learning rates: the head 0.005 as §5.1 assigns it (by role: see _dp2fedsam.py); the extractor
0.05, not the paper's 0.1: with momentum 0.7, 0.1 makes 15 % of DP-FedAvg clients diverge in
their first local round from a random init (`python -m experiments.local_stability`), while 0.05
keeps every client of every method finite. The same rates for every method; no per-method tuning.

Grid (`sweep_grid()`), 93 runs in this order (launch/sweep.py runs them in grid order, so an
interrupted sweep has done the first blocks):
  the first 15 (the first committed block; their workdirs must not change, so the committed runs
  count as finished):
    dp2fedsam, centaur, dp_fedavg, dp_fedsam, dp_fedavg_ft, dp_fedsam_ft and the non-private
    ceilings p_fedsam and fedavg at seed 0; seeds 1 and 2 for dp2fedsam, centaur and dp_fedsam_ft;
    and one more ceiling, dp_fedavg at eps = inf, i.e. sigma = 0 (clipping only): plain FedAvg
    collapses in round 1 at these rates (an unclipped client blow-up, results README), so this is
    the ceiling that shows what the noise costs DP-FedAvg, at the same rates;
  (a) 6 runs: seeds 1 and 2 of dp_fedavg, dp_fedsam and dp_fedavg_ft at eps = 1 (seed 1
    of all three first), so that every eps = 1 method has three seeds;
  (e) 18 runs: BandMF noise (`noise=banded,bands=2`: b = 2, the best band count in this
    regime, docs/privacy.md section 7) for dp2fedsam and dp_fedavg_ft at eps = 1, seeds 0, 1, 2
    (their independent-noise runs are done); then at eps = 0.5, seed by seed, the two banded runs
    and the two independent-noise runs they are compared with. The report sets each banded
    setting against the same method with independent noise;
  (b) 10 runs: the privacy-utility curve, eps in {0.5, 0.25, 2} x CURVE (dp2fedsam, centaur,
    dp_fedsam_ft, dp_fedavg_ft) at seed 0, less the two eps = 0.5 runs (e) made; (c) the same
    at seed 1; (d) at seed 2. With the eps = 1 runs these give accuracy against eps at eps in
    {0.25, 0.5, 1, 2};
  (f) 24 runs, seed by seed, eps = 1 then 0.25, for dp2fedsam and dp_fedavg_ft (their
    fixed-C, server-SGD runs are (a)-(d)'s): `clip=adaptive`, adaptive clipping (Andrew et al.
    2021; docs/privacy.md section 8) with gamma = 0.5, eta = 0.2 and an untuned C_0 = 1.0, ten
    times the hand-tuned C = 0.1; and `server=momentum`, server momentum 0.9 at server_lr 0.1,
    whose steady step lr / (1 - 0.9) = 1 is plain SGD's server_lr.
    The count's noise s_b = 1.2 sigma(eps), sigma(eps) the fixed-C multiplier below: then the
    update's multiplier is 1.1 sigma(eps) (sigma = (sigma_eff^-2 - (2 s_b)^-2)^-1/2 with sigma_eff
    = sigma(eps)), the count's noise on the unclipped fraction s_b / 50 = 0.048 at eps = 1 (the
    paper's 0.05) and 0.14 at eps = 0.25, where the default s_b = 50 / 20 would leave nothing for
    the update (2 s_b = 5 < 5.924).
Time, 2 cores, quiet machine: ~13-25 min a run (dp_fedavg and centaur the fastest), ~45 min an -FT
run (the fine-tuning evaluation every 20 rounds). Block (a) ~3 h, (e) ~9 h; each of (b), (c), (d)
~5.5 h (10 runs, four of them -FT); (f) ~4.7 h a seed (8 runs, four -FT), ~14 h. The runs from
dp_fedavg at eps = inf on ran with `--parallel=2` (two at a time on the 2 cores: DP-FedAvg 2.8
s/round, DP-FedSAM 4.9 s/round while sharing them; not a controlled comparison with one at a time).
Only the sweep's arguments name a workdir, so the (e) runs' `noise` and `bands` do not rename the
others.
Calibrated sigma at delta = 1e-3 (PLD): 5.924 / 3.401 / 2.014 / 1.280 for eps = 0.25 / 0.5 / 1 / 2.

Seeding a fresh root with the committed runs (so that the sweep skips them; only finished runs are
copied, only into workdirs that hold no metrics or checkpoints, never over anything; the plan then
says how many of the 93 are finished and how many are left):

  python -m launch.sweep --config=experiments/configs/fmnist_paper_regime.py --root=$HOME/sweeps \
      --seed_from=experiments/results/fmnist_paper_regime/runs --plan

The sweep (resumes where it stopped; runs in the grid's order) and the report (while the sweep goes
on, of the finished runs, whose small files are committed at once):

  python -m launch.sweep --config=experiments/configs/fmnist_paper_regime.py --root=$HOME/sweeps
  python -m experiments.report --root=$HOME/sweeps/fmnist_paper_regime \
      --out=experiments/results/fmnist_paper_regime --copy_runs --finished_only

The report draws final accuracy against eps (log axis, seed-std error bars, the eps = inf ceilings
as horizontal lines) and tabulates DP2-FedSAM's gap to every other method at each eps, in points
and in pooled seed stds.

Tuning with its privacy cost (`tuning_space()`, launch/tune.py): DP2-FedSAM (lr_shared, C, SAM rho)
and DP-FedAvg-FT (lr_shared, C) at eps = 1 per trial, K logarithmic with E[K] = 10; each client keeps
10 % of its 54 training rows (5) as its validation split, and the score is the mean over the 1,000
clients of their validation accuracies with N(0, 10^2) on the sum (std 1 point on the mean).
Result (2026-11-27, experiments/results/fmnist_tuning, one trial at a time on the 2 cores): DP2-FedSAM
K = 7, selected trial 5 (C 0.069, lr_shared 0.013, rho 0.099): 95.42 % test; DP-FedAvg-FT K = 4,
selected trial 2 (C 0.161, lr_shared 0.018): 93.98 %; selection eps 2.498 for each study, against
the hand-tuned C = 0.1 runs at eps = 1 (95.51 +- 0.15 / 94.39 +- 0.27) whose grid is not counted.
The plan prints K, the candidates and the cost (selection eps against one trial's and naive):

  python3 -m launch.tune --config=experiments/configs/fmnist_paper_regime.py --study=dp2fedsam \
      --root=$HOME/tuning --plan

Arguments: `:method=dp2fedsam,S=2,eps=1,seed=0,noise=independent,bands=2,clip=fixed,server=sgd`
(`noise` = independent | banded | tree, `bands`: BandMF's b, `clip` = fixed | adaptive, `server` =
sgd | momentum).
"""

from __future__ import annotations

import math

from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.config import base_config
from experiments.configs import _common

DEFAULTS = dict(method='dp2fedsam', N=1000, S=2, eps=1.0, seed=0, noise='independent', bands=2,
                clip='fixed', server='sgd')
TABLE_METHODS = ('dp2fedsam', 'centaur', 'dp_fedavg', 'dp_fedsam', 'dp_fedavg_ft', 'dp_fedsam_ft')
CEILINGS = ('p_fedsam', 'fedavg')  # non-private: eps = inf
SEEDED = ('dp2fedsam', 'centaur', 'dp_fedsam_ft')
# (a)-(d): the other eps = 1 methods get seeds 1 and 2; the curve's methods run at CURVE_EPS too.
SEEDED_LATER = ('dp_fedavg', 'dp_fedsam', 'dp_fedavg_ft')
CURVE = ('dp2fedsam', 'centaur', 'dp_fedsam_ft', 'dp_fedavg_ft')
CURVE_EPS = (0.5, 0.25, 2.0)  # in the order they run: the small eps, where methods should separate
# (e): BandMF against independent noise, b = 2 bands (the lowest model-noise ratio in this
# regime, docs/privacy.md section 7), at eps = 1 and the lower eps = 0.5.
BANDED = ('dp2fedsam', 'dp_fedavg_ft')
BANDED_EPS = (1.0, 0.5)
# (f): adaptive clipping and server momentum against the fixed C and server SGD runs above.
TOOLKIT = ('dp2fedsam', 'dp_fedavg_ft')
TOOLKIT_EPS = (1.0, 0.25)
TOOLKIT_VARIANTS = (dict(clip='adaptive'), dict(server='momentum'))
# sigma calibrated for eps at delta = 1e-3 with a fixed C (PLD; tests/test_configs.py checks them).
FIXED_CLIP_SIGMA = {0.25: 5.924, 0.5: 3.401, 1.0: 2.014, 2.0: 1.280}
COUNT_NOISE_PER_SIGMA = 1.2  # s_b / sigma(eps): the update's multiplier becomes 1.1 sigma(eps)
INITIAL_CLIP_NORM = 1.0      # adaptive clipping's C_0: untuned, 10x the hand-tuned dp.clip_norm


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  c = base_config()
  c.method, c.seed = args['method'], args['seed']
  c.dataset, c.model, c.partition = 'fashion_mnist', 'emnist_cnn', 'pathological'
  c.num_clients, c.classes_per_client = args['N'], args['S']
  c.num_rounds, c.eval_every, c.sampling_rate, c.server_lr = 200, 20, 0.05, 1.0
  # 'auto': sequential on a CPU (on 2 cores a round of ~50 clients took 15.4 s against 27.2 s
  # vmapped), vmap on a GPU. The results do not depend on it (tested); config.json records which ran.
  c.executor = 'auto'
  _common.set_fields(c, {
      'local.personal_epochs': 2, 'local.shared_epochs': 2, 'local.finetune_epochs': 2,
      'local.batch_size': 10, 'local.lr_personal': 0.005, 'local.lr_shared': 0.05,
      'local.lr_decay': 0.99, 'local.momentum': 0.7, 'local.sam_rho': 0.1,
      'dp.clip_norm': 0.1, 'dp.sampling': 'poisson', 'dp.accountant': 'pld',
  })
  c.dp.target_epsilon = None if math.isinf(args['eps']) else args['eps']
  if math.isinf(args['eps']) and METHODS[c.method].private:
    c.dp.noise_multiplier = 0.0  # a private method at eps = inf: clipped, no noise
  c.dp.delta = None  # 1 / N
  c.dp.noise_mechanism, c.dp.num_bands = args['noise'], args['bands']
  if args['clip'] not in ('fixed', 'adaptive') or args['server'] not in ('sgd', 'momentum'):
    raise ValueError(f"clip={args['clip']!r}, server={args['server']!r}: clip is fixed | adaptive, "
                     'server is sgd | momentum.')
  if args['clip'] == 'adaptive':
    c.dp.clipping, c.dp.initial_clip_norm = 'adaptive', INITIAL_CLIP_NORM
    c.dp.target_quantile, c.dp.clip_lr = 0.5, 0.2
    c.dp.count_noise_multiplier = round(COUNT_NOISE_PER_SIGMA * FIXED_CLIP_SIGMA[args['eps']], 3)
  if args['server'] == 'momentum':
    c.server_optimizer, c.server_momentum, c.server_lr = 'momentum', 0.9, 0.1
  return c


def sweep_grid() -> list[dict]:
  """The first 15 entries in their order, then the later blocks in priority order."""
  first = ([dict(method=m, eps=1.0, seed=0) for m in TABLE_METHODS]
           + [dict(method=m, eps=math.inf, seed=0) for m in CEILINGS])
  issue14 = (first + [dict(method=m, eps=1.0, seed=s) for s in (1, 2) for m in SEEDED]
             + [dict(method='dp_fedavg', eps=math.inf, seed=0)])
  seeds_at_eps1 = [dict(method=m, eps=1.0, seed=s) for s in (1, 2) for m in SEEDED_LATER]
  # Only the banded entries name the noise: the other workdirs keep their names. eps = 1 first (its
  # independent-noise runs are done); at eps = 0.5 each seed's banded runs sit beside the
  # independent ones they are compared with, which the curve's blocks then skip.
  banded = lambda e, s: [dict(method=m, eps=e, seed=s, noise='banded', bands=2) for m in BANDED]
  compared = [entry for s in (0, 1, 2) for entry in banded(1.0, s)]
  for e in BANDED_EPS[1:]:
    for s in (0, 1, 2):
      compared += banded(e, s) + [dict(method=m, eps=e, seed=s) for m in BANDED]
  curve = [dict(method=m, eps=e, seed=s) for s in (0, 1, 2) for e in CURVE_EPS for m in CURVE]
  toolkit = [dict(method=m, eps=e, seed=s, **variant) for s in (0, 1, 2) for e in TOOLKIT_EPS
             for variant in TOOLKIT_VARIANTS for m in TOOLKIT]
  return issue14 + seeds_at_eps1 + compared + [e for e in curve if e not in compared] + toolkit


# Tuning (launch/tune.py): ranges around the hand-tuned values (lr_shared 0.05, C = 0.1, rho = 0.1).
TUNING_EPS = 1.0
TUNING_TRIALS = {'name': 'truncated_negative_binomial', 'eta': 0.0, 'mean': 10.0}  # logarithmic


def tuning_space() -> dict:
  """Two studies at eps = 1 per trial. A trial is tested once, at round 200 (eval_every = T): the
  selection reads only the last record, and an -FT evaluation (1,000 clients fine-tuned, once for
  validation and once for test) took 133 s of DP-FedAvg-FT's 2,720 s at eval_every 20.
  seconds_per_run, measured on the studies' own trials (2026-11-27, one at a time, 2 cores, nothing
  else running): DP2-FedSAM 884-1,114 s (3.7-4.8 s a round), DP-FedAvg-FT 632-728 s (2.3-2.7 s a
  round, its two fine-tuning evaluations included). The plan had said 19 / 28 min, from the
  committed eps = 1 runs, which shared the cores."""
  common = dict(fixed={'validation_fraction': 0.1, 'eval_every': 200}, trials=TUNING_TRIALS,
                selected_by='validation_accuracy', score_noise=10.0)
  space = {'local.lr_shared': ('log_uniform', 0.01, 0.1), 'dp.clip_norm': ('log_uniform', 0.02, 0.5)}
  return {
      'dp2fedsam': dict(common, args=dict(method='dp2fedsam', eps=TUNING_EPS), seed=0,
                        space={**space, 'local.sam_rho': ('log_uniform', 0.02, 0.5)},
                        seconds_per_run=17 * 60),
      'dp_fedavg_ft': dict(common, args=dict(method='dp_fedavg_ft', eps=TUNING_EPS), seed=1,
                           space=space, seconds_per_run=12 * 60),
  }
