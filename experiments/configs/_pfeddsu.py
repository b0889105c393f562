"""The experimental setup of dp-pfeddsu.txt §VI-A, shared by its table configs.

Paper values: ResNet-20; lr 0.01 for extractor and head; server lr 1; C = 0.01; reparameterised
sparsity S = 0.05 on the last 4 layers; lambda = 0.2 (dynamic adaptive norm, Table VII);
5 local epochs on the extractor, 15 on the classifier head; pathological split with s classes per
client ([15] = FedRep); EMNIST: 20 clients, 50 rounds; CIFAR-10: 20 clients, 100 rounds; CIFAR-100:
100 clients, 100 rounds; eps = 1 unless varied.

NOT stated in the paper (our assumptions, overridable, flagged here so nobody mistakes them for the
paper's): client sampling rate q = 0.5 (Algorithm 1 samples with probability q but no value is
given), delta = 1/N, local batch size 10, momentum 0, no lr decay, the EMNIST split (we use the
62-class one), Poisson sampling with PLD accounting, evaluation every 5 rounds.
"""

from __future__ import annotations

import math

from dp2fedsam_jax.config import base_config
from experiments.configs import _common

# Table II columns, in the paper's order.
TABLE_METHODS = ('dp_fedavg_fb', 'ppsgd', 'pmtl_ft', 'centaur', 'dp_pfeddsu')
TABLE2_SETTINGS = (('emnist', 5), ('emnist', 10), ('cifar10', 2), ('cifar10', 5), ('cifar10', 10),
                   ('cifar100', 3), ('cifar100', 5), ('cifar100', 10))

DEFAULTS = dict(method='dp_pfeddsu', dataset='cifar10', s=5, eps=1.0, seed=0, sparsity=0.05,
                layers=4, lam=0.2)

_DATASETS = {  # name -> (registry name, clients, rounds)
    'emnist': (_common.EMNIST_62, 20, 50),
    'cifar10': ('cifar10', 20, 100),
    'cifar100': ('cifar100', 100, 100),
}


def paper_config(args: dict):
  if args['dataset'] not in _DATASETS:
    raise ValueError(f"dataset={args['dataset']!r}: dp-pfeddsu.txt uses {sorted(_DATASETS)}")
  c = base_config()
  c.method = args['method']
  c.seed = args['seed']
  c.dataset, c.num_clients, c.num_rounds = _DATASETS[args['dataset']]
  c.model = 'resnet20'
  c.partition, c.classes_per_client = 'pathological', args['s']
  c.sampling_rate = 0.5  # ASSUMPTION: not stated in the paper
  c.eval_every = 5
  c.server_lr = 1.0
  _common.set_fields(c, {
      'local.personal_epochs': 15, 'local.shared_epochs': 5, 'local.batch_size': 10,
      'local.lr_personal': 0.01, 'local.lr_shared': 0.01, 'local.lr_decay': 1.0, 'local.momentum': 0.0,
      'dp.clip_norm': 0.01,
  })
  # The -fb / -FT baselines fine-tune the classifier for the paper's 15 classifier epochs.
  _common.set_fields(c, {
      'local.finetune_epochs': 15, 'dsu.keep_fraction': args['sparsity'],
      'dsu.masked_layers': args['layers'], 'dsu.lam': args['lam'],
  })
  eps = args['eps']
  c.dp.target_epsilon = None if math.isinf(eps) else eps
  c.dp.delta = None  # 1 / N (assumption)
  return c
