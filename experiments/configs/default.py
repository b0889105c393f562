"""The default experiment: DP²-FedSAM on Fashion-MNIST, pathological (N, S) split, sigma calibrated for eps.

Runs offline (Debian package dataset-fashion-mnist) in a few minutes on a 2-core CPU.
Arguments: `--config=experiments/configs/default.py:eps=2,method=centaur`.
"""

from dp2fedsam_jax.config import base_config
from experiments.configs import _common

DEFAULTS = dict(method='dp2fedsam', eps=2.0, seed=0)


def get_config(arg: str | None = None):
  return default_config(_common.parse_args(arg, **DEFAULTS))


def default_config(args: dict):
  """The default experiment for parsed arguments (`method`, `eps`, `seed`; other keys are ignored)."""
  c = base_config()
  c.method = args['method']
  c.dataset = 'fashion_mnist'
  c.model = 'emnist_cnn'
  c.num_clients = 1000  # (N, S) = (1000, 2) as in the paper's CIFAR-10 table: 54 train / 6 test each
  c.partition = 'pathological'
  c.classes_per_client = 2
  c.sampling_rate = 0.02  # ~20 clients a round keeps a round near 5 s on 2 CPU cores
  c.num_rounds = 40
  c.eval_every = 10
  c.local.head_epochs = 2
  c.local.body_epochs = 2
  c.local.batch_size = 10
  c.local.lr_head = 0.05  # paper: 0.005 over 200 rounds; a 40-round run needs heads that learn faster
  c.local.lr_body = 0.1
  c.local.momentum = 0.7
  c.local.sam_rho = 0.1
  c.dp.clip_norm = 0.1
  c.dp.target_epsilon = args['eps']
  c.seed = args['seed']
  return c


def sweep_grid() -> list[dict]:
  """The README's comparison: DP-FedAvg, DP-FedSAM, CENTAUR, DP²-FedSAM x 3 seeds at eps = 2."""
  return [dict(method=m, eps=2.0, seed=s)
          for m in ('dp_fedavg', 'dp_fedsam', 'centaur', 'dp2fedsam') for s in (0, 1, 2)]
