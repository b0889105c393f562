r"""How often local training diverges from the initial model, per method and learning rate.

Runs one round's local training (the real client update: head phase, SAM/SGD phase) for the first
`--clients` clients of a config from the same initial model, and prints per (method, lr_shared,
momentum): the fraction of clients whose update or loss is non-finite, and the median / max pre-clip
update norm. This is how the default learning rates were chosen (README, "Learning rates").

  python -m experiments.local_stability --config=experiments/configs/default.py \
      --methods=dp_fedavg,dp_fedsam,centaur,dp2fedsam --settings=0.1:0.7,0.05:0.5

With `--start=<workdir>` every method trains instead from the global model of that run's last
checkpoint, at its round (learning rates decayed to it; personal parameters from the checkpoint
where the method keeps the same ones): the pre-clip norm of one local round of SGD against SAM at
`--rhos` from the same model, apart from the different trajectories whole runs take.

  python -m experiments.local_stability \
      --config=experiments/configs/fmnist_paper_regime.py:method=dp_fedavg \
      --start=$HOME/sweeps/fmnist_paper_regime/dp_fedavg/eps=1/seed=0 \
      --methods=dp_fedavg,dp_fedsam --settings=0.05:0.7 --rhos=0.02,0.05,0.1,0.2 --clients=50
"""

import json
import os

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from dp2fedsam_jax import checkpoint, local, train
from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax.trees import global_norm

_CONFIG = config_flags.DEFINE_config_file('config', 'experiments/configs/default.py', 'Config.')
_METHODS = flags.DEFINE_list('methods', ['dp_fedavg', 'dp_fedsam', 'centaur', 'dp2fedsam'],
                             'Methods (the -FT variants train as their base methods).')
_SETTINGS = flags.DEFINE_list('settings', ['0.1:0.7', '0.05:0.5'], 'lr_shared:momentum pairs.')
_CLIENTS = flags.DEFINE_integer('clients', 40, 'Clients to train (ids 0..n-1).')
_START = flags.DEFINE_string('start', None, "A run's workdir: train from the global model of its "
                             'last checkpoint (--config must be that run\'s) instead of the init.')
_RHOS = flags.DEFINE_list('rhos', None, 'SAM radii to try (replace local.sam_rho); SGD methods '
                          'ignore them.')


def checkpointed_state(config, workdir: str):
  """The server state of the run in workdir at its last checkpoint (built with its method)."""
  with open(os.path.join(workdir, 'config.json')) as f:
    method = json.load(f)['method']
  run_config = config.copy_and_resolve_references()
  run_config.method = method
  state, _ = checkpoint.restore(workdir, train.build_experiment(run_config).init_state())
  if not int(state.round):
    raise ValueError(f'--start={workdir}: no checkpoint there')
  return state


def stability(config, clients: int, start=None) -> dict:
  """One local round for the first `clients` clients, from the initial model or from `start` (a
  checkpointed server state)."""
  exp = train.build_experiment(config)
  state = exp.init_state()
  if start is not None:
    if jax.tree.structure(start.shared) != jax.tree.structure(state.shared):
      raise ValueError(f'--start: {config.method} shares other parameters than the checkpointed '
                       'run; choose methods that share the same ones')
    same_personal = jax.tree.structure(start.personal) == jax.tree.structure(state.personal)
    state = state.replace(shared=start.shared, round=start.round,
                          personal=start.personal if same_personal else state.personal)
  update = jax.jit(make_client_update(exp.spec, exp.model, exp.local_config, exp.data.normalize,
                                      clip_norm=exp.mechanism.clip_norm))
  losses, norms = [], []
  for i in range(clients):
    personal = jax.tree.map(lambda p, i=i: p[i], state.personal)
    result = update(state.shared, personal, *exp.data.client_train(i), jax.random.key(i),
                    int(state.round))
    losses.append(float(result.train_loss))
    norms.append(float(global_norm(result.delta)))
  losses, norms = np.array(losses), np.array(norms)
  finite = np.isfinite(losses) & np.isfinite(norms)
  return {'nonfinite': float(np.mean(~finite)), 'median_norm': float(np.median(norms[finite])),
          'max_norm': float(np.max(norms[finite])), 'max_loss': float(np.max(losses[finite]))}


def main(argv):
  del argv
  start = checkpointed_state(_CONFIG.value, _START.value) if _START.value else None
  if start is not None:
    print(f'From {_START.value} at round {int(start.round)}.')
  print('| method | lr_shared | momentum | SAM rho | non-finite clients | median pre-clip norm | '
        'max norm | max loss |')
  print('|---|---|---|---|---|---|---|---|')
  rhos = [float(r) for r in _RHOS.value] if _RHOS.value else [_CONFIG.value.local.sam_rho]
  for method in _METHODS.value:
    for setting in _SETTINGS.value:
      lr, momentum = (float(v) for v in setting.split(':'))
      sam = isinstance(METHODS[method].shared_optimizer, local.SAM)
      for rho in rhos if sam else [None]:
        config = _CONFIG.value.copy_and_resolve_references()
        config.method, config.local.lr_shared, config.local.momentum = method, lr, momentum
        if sam:
          config.local.sam_rho = rho
        r = stability(config, _CLIENTS.value, start)
        print(f"| {method} | {lr:g} | {momentum:g} | {'–' if rho is None else f'{rho:g}'} | "
              f"{r['nonfinite']:.0%} | "
              f"{r['median_norm']:.3g} | {r['max_norm']:.3g} | {r['max_loss']:.3g} |", flush=True)


if __name__ == '__main__':
  app.run(main)
