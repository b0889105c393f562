r"""How often local training diverges from the initial model, per method and learning rate.

Runs one round's local training (the real client update: head phase, SAM/SGD phase) for the first
`--clients` clients of a config from the same initial model, and prints per (method, lr_body,
momentum): the fraction of clients whose update or loss is non-finite, and the median / max pre-clip
update norm. This is how the default learning rates were chosen (README, "Learning rates").

  python -m experiments.local_stability --config=experiments/configs/default.py \
      --methods=dp_fedavg,dp_fedsam,centaur,dp2fedsam --settings=0.1:0.7,0.05:0.5
"""

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from dp2fedsam_jax import train
from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax.privacy.clipping import global_norm

_CONFIG = config_flags.DEFINE_config_file('config', 'experiments/configs/default.py', 'Config.')
_METHODS = flags.DEFINE_list('methods', ['dp_fedavg', 'dp_fedsam', 'centaur', 'dp2fedsam'],
                             'Methods (the -FT variants train as their base methods).')
_SETTINGS = flags.DEFINE_list('settings', ['0.1:0.7', '0.05:0.5'], 'lr_body:momentum pairs.')
_CLIENTS = flags.DEFINE_integer('clients', 40, 'Clients to train (ids 0..n-1).')


def stability(config, clients: int) -> dict:
  exp = train.build_experiment(config)
  state = exp.init_state()
  update = jax.jit(make_client_update(exp.spec, exp.model, exp.local_config, exp.data.normalize,
                                      exp.method_params))
  losses, norms = [], []
  for i in range(clients):
    personal = jax.tree.map(lambda p, i=i: p[i], state.personal)
    result = update(state.shared, personal, exp.data.train_x[i], exp.data.train_y[i],
                    exp.data.train_count[i], jax.random.key(i), 0)
    losses.append(float(result.train_loss))
    norms.append(float(global_norm(result.delta)))
  losses, norms = np.array(losses), np.array(norms)
  finite = np.isfinite(losses) & np.isfinite(norms)
  return {'nonfinite': float(np.mean(~finite)), 'median_norm': float(np.median(norms[finite])),
          'max_norm': float(np.max(norms[finite])), 'max_loss': float(np.max(losses[finite]))}


def main(argv):
  del argv
  print('| method | lr_body | momentum | non-finite clients | median pre-clip norm | max norm | max loss |')
  print('|---|---|---|---|---|---|---|')
  for method in _METHODS.value:
    for setting in _SETTINGS.value:
      lr, momentum = (float(v) for v in setting.split(':'))
      config = _CONFIG.value.copy_and_resolve_references()
      config.method, config.local.lr_body, config.local.momentum = method, lr, momentum
      r = stability(config, _CLIENTS.value)
      print(f"| {method} | {lr:g} | {momentum:g} | {r['nonfinite']:.0%} | {r['median_norm']:.3g} | "
            f"{r['max_norm']:.3g} | {r['max_loss']:.3g} |", flush=True)


if __name__ == '__main__':
  app.run(main)
