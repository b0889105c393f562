"""The experimental setup of dp2-fedsam.txt §5.1, shared by its table and figure configs.

Paper values: T = 200 rounds; client sampling ratio r = 0.05 per round; eta_phi (extractor) = 0.1,
eta_h (head) = 0.005, both decayed by 0.99 per round; momentum 0.3 (FEMNIST) / 0.7 (CIFAR-10);
tau_h = tau_phi = 2 local epochs (2 epochs in total for the full-model baselines); C = 0.2 (FEMNIST)
/ 0.1 (CIFAR-10); SAM radius rho = 0.5 (FEMNIST) / 0.1 (CIFAR-10); delta = 1/N; 3 seeds; the head is
the last fully connected layer. FEMNIST: 500 of the 3,550 writers, ResNet-18 (GroupNorm),
11,181,642 params; CIFAR-10: pathological (N, S) split, the 667,402-param CNN. Each client's data is
split 90 % train / 10 % test.

Learning rates, which reading: §5.1 writes "the learning rate for the shared representation
extractor eta_h ... 0.1 and for the personal classifier eta_phi ... 0.005", which swaps the symbols
of Algorithm 2 (there eta_h steps the head h, eta_phi the extractor phi). We follow the roles the
sentence names, not its symbols: extractor 0.1 (`local.lr_shared`), head 0.005 (`local.lr_personal`).
The other reading (head 0.1, extractor 0.005) is `--config.local.lr_personal=0.1
--config.local.lr_shared=0.005`.

Not stated in the paper (our choices, overridable): local batch size 10, Poisson sampling with PLD
accounting (the paper does not name its accountant), evaluation every 5 rounds. Both models were
pretrained on ImageNet in the paper: pass `--config.init_checkpoint=PATH` (the data/model change adds
the field) to start from such a checkpoint; without it the models start from scratch.
"""

from __future__ import annotations

import math

from dp2fedsam_jax.config import base_config
from experiments.configs import _common

# Table 2 / 3 rows, in the paper's order.
TABLE_METHODS = ('dp_fedavg', 'dp_fedavg_ft', 'dp_fedsam', 'dp_fedsam_ft', 'centaur', 'dp2fedsam')
CIFAR10_SETTINGS = ((500, 5), (1000, 2), (1000, 5))  # (N, S)

DEFAULTS = dict(method='dp2fedsam', dataset='cifar10', N=1000, S=2, eps=1.0, seed=0, rho=-1.0,
                tau=2)


def paper_config(args: dict):
  """The §5.1 config for one grid entry. rho < 0: the paper's value for the dataset."""
  c = base_config()
  c.method = args['method']
  c.seed = args['seed']
  c.num_rounds = 200
  c.eval_every = 5
  c.sampling_rate = 0.05
  c.server_lr = 1.0
  if args['dataset'] == 'femnist':
    c.dataset, c.partition, c.model = 'femnist', 'natural', 'resnet18_gn'
    c.num_clients = 500  # writers sampled from the 3,550
    momentum, clip, rho = 0.3, 0.2, 0.5
  elif args['dataset'] == 'cifar10':
    c.dataset, c.partition, c.model = 'cifar10', 'pathological', 'cifar_cnn'
    c.num_clients, c.classes_per_client = args['N'], args['S']
    momentum, clip, rho = 0.7, 0.1, 0.1
  else:
    raise ValueError(f"dataset={args['dataset']!r}: dp2-fedsam.txt uses 'femnist' or 'cifar10'")
  _common.set_fields(c, {
      'local.personal_epochs': 2, 'local.shared_epochs': args['tau'], 'local.batch_size': 10,
      'local.lr_shared': 0.1, 'local.lr_personal': 0.005, 'local.lr_decay': 0.99,
      'local.momentum': momentum, 'local.sam_rho': rho if args['rho'] < 0 else args['rho'],
      'dp.clip_norm': clip,
  })
  # -FT baselines fine-tune the downloaded model before testing; the paper does not give the
  # number of epochs: we use tau_h = 2.
  _common.set_fields(c, {'local.finetune_epochs': 2})
  eps = args['eps']
  c.dp.target_epsilon = None if math.isinf(eps) else eps  # eps=inf: non-private methods only
  c.dp.delta = None  # 1 / N
  return c
