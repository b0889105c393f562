"""Every method on one Fashion-MNIST split: same (N, S), same epsilon, same rounds, same seed.

A short, CPU-sized comparison (about 1-2 minutes a method on 2 cores), not a paper table: the default
experiment's (1000, 2) pathological split and hyperparameters, q = 0.01 (~10 clients a round),
30 rounds, sigma calibrated for eps. Fine-tuning evaluations (-ft, -fb, pmtl_ft) train every client,
so they are evaluated only at the last round.

  python -m launch.sweep ... or, one method:
  python -m experiments.train --config=experiments/configs/fashion_mnist_methods.py:method=dp_fedsam \
      --workdir=runs/methods/dp_fedsam
"""

from experiments.configs import default


def get_config(arg: str | None = None):
  args = dict(item.split('=', 1) for item in arg.split(',')) if arg else {}
  c = default.get_config(arg)
  c.sampling_rate = float(args.get('q', 0.01))
  c.num_rounds = int(args.get('rounds', 30))
  c.eval_every = 5
  if c.method.endswith(('_ft', '_fb')):
    c.eval_every = c.num_rounds
  return c
