"""The default experiment: DP²-FedSAM on Fashion-MNIST, pathological (N, S) split, sigma calibrated for eps.

Runs offline (Debian package dataset-fashion-mnist) in a few minutes on a 2-core CPU.

Learning rates are tuned for this regime: N = 1000 clients of 54 training examples from 2 classes,
batch 10, 2 + 2 local epochs, from a random (not pretrained) emnist_cnn. The papers' extractor step
0.1 with momentum 0.7 (an effective step of 0.33) makes local training diverge from the initial
model: in one round from init, 15 % of 40 DP-FedAvg clients end non-finite and the median pre-clip
update norm is 1.6e6 (DP-FedSAM: 2 % non-finite; CENTAUR / DP2-FedSAM: norms up to 2.7e4 / 2.2e3);
with lr_shared 0.05 and momentum 0.5 no client of any of the four diverges and the largest norm is 29
(`python -m experiments.local_stability`, table in experiments/results/README.md). Flax's
lecun_normal initialisation is also sqrt(3) larger per layer than PyTorch's default, for which the
papers' rates were chosen.
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
  c.local.personal_epochs = 2
  c.local.shared_epochs = 2
  c.local.batch_size = 10
  c.local.lr_personal = 0.05  # paper: 0.005 over 200 rounds; a 40-round run needs heads that learn faster
  c.local.lr_shared = 0.05  # the papers' 0.1 with momentum 0.7 diverges here (docstring)
  c.local.momentum = 0.5
  c.local.sam_rho = 0.1
  c.dp.clip_norm = 0.1
  c.dp.target_epsilon = args['eps']
  c.seed = args['seed']
  return c


def sweep_grid() -> list[dict]:
  """The README's comparison: DP-FedAvg, DP-FedSAM, CENTAUR, DP²-FedSAM x 3 seeds at eps = 2."""
  return [dict(method=m, eps=2.0, seed=s)
          for m in ('dp_fedavg', 'dp_fedsam', 'centaur', 'dp2fedsam') for s in (0, 1, 2)]
