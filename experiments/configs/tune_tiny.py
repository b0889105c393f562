"""A tiny tuning study for the tests of launch/tune.py (seconds a trial): DP2-FedSAM on 6 synthetic
clients with an MLP, 2 rounds at a fixed sigma = 1 (q = 0.5, delta = 1/6), each client's
validation split 25 % of its training rows.

Tuned: the extractor's learning rate (log-uniform in [0.01, 0.3]) and C (log-uniform in [0.3, 3]);
K ~ Poisson(2), drawn with the candidates and the score noise from the study's secret seed (the
tests pass --secret_seed values that draw K = 2, and K = 0 for `k0`); the score is the sum of the
clients' validation accuracies plus N(0, 0.5^2), over the 6 clients. Study `k0`: Poisson(1).
Study `fedavg`: the same search for non-private FedAvg, selected without score noise (no epsilon).
Study `floor`: `tiny` with a pool of at least 4 trials (pool_floor), the selection over its K.
The `seed` entries are the public seeds of the draw before the secret one (draw_plan(spec)).

  python3 -m launch.tune --config=experiments/configs/tune_tiny.py --study=tiny --root=/tmp/tune --plan
"""

from __future__ import annotations

from dp2fedsam_jax.config import base_config
from experiments.configs import _common

DEFAULTS = dict(method='dp2fedsam', seed=0)


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  c = base_config()
  c.method, c.seed = args['method'], args['seed']
  c.dataset, c.model, c.partition, c.num_clients = 'synthetic', 'mlp', 'iid', 6
  c.sampling_rate, c.num_rounds, c.eval_every = 0.5, 2, 2
  _common.set_fields(c, {
      'local.personal_epochs': 1, 'local.shared_epochs': 1, 'local.batch_size': 16,
      'local.lr_personal': 0.05, 'local.lr_shared': 0.05, 'local.momentum': 0.5, 'local.sam_rho': 0.05,
      'dp.clip_norm': 1.0, 'dp.noise_multiplier': 1.0, 'dp.target_epsilon': None,
  })
  return c


def tuning_space() -> dict:
  study = dict(args={}, fixed={'validation_fraction': 0.25},
               space={'local.lr_shared': ('log_uniform', 0.01, 0.3),
                      'dp.clip_norm': ('log_uniform', 0.3, 3.0)},
               trials={'name': 'poisson', 'mu': 2.0}, seed=1, selected_by='validation_accuracy',
               score_noise=0.5)
  return {'tiny': study, 'k0': {**study, 'trials': {'name': 'poisson', 'mu': 1.0}, 'seed': 2},
          'fedavg': {**study, 'args': {'method': 'fedavg'}, 'score_noise': 0.0},
          'floor': {**study, 'pool_floor': 4}}
