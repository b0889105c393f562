"""Privacy audit setups for `python -m experiments.audit` (not a training sweep: no sweep_grid).

A small synthetic MLP federation (10 clients, 4,160 shared parameters) plus the audit's canary
clients, so that a round with 1,000 canaries takes about a second on a CPU; the audit does not
depend on the data, only on clipping, sampling and noise.
Arguments: `--config=experiments/configs/audit.py:sigma=1,sampling=fixed,placement=distributed`
(`q`, `rounds`, `trials`, `canaries`, `method`, `seed`, `noise` = independent | banded | tree and
`bands` too). `audit_grid()` is the table in
docs/privacy.md.
"""

from dp2fedsam_jax.config import base_config
from experiments.configs import _common

DEFAULTS = dict(sigma=1.0, sampling='poisson', q=1.0, placement='central', rounds=1, trials=20,
                canaries=1000, method='dp2fedsam', seed=0, noise='independent', bands=2)


def get_config(arg: str | None = None):
  args = _common.parse_args(arg, **DEFAULTS)
  c = _common.synthetic_mlp(base_config(), num_clients=10)
  c.method = args['method']
  c.sampling_rate = args['q']
  c.num_rounds = args['rounds']  # rounds per trial: the audited and the accounted mechanism
  c.dp.noise_multiplier = args['sigma']
  c.dp.delta = 1e-5
  c.dp.sampling = args['sampling']
  c.dp.accountant = 'rdp' if c.dp.sampling == 'fixed' else 'pld'
  c.dp.noise_placement = args['placement']
  c.dp.noise_mechanism, c.dp.num_bands = args['noise'], args['bands']
  c.seed = args['seed']
  c.audit = dict(num_trials=args['trials'], num_canaries=args['canaries'], canary_norm=10.0,
                 alpha=0.05, select_fraction=0.2, batch_trials=1, seed=c.seed,
                 estimate_every=0)
  return c


def audit_grid() -> list[dict]:
  """The table in docs/privacy.md: sigma x (Poisson q = 1 central and distributed, fixed m = N),
  then Poisson q = 0.5, four rounds of composition, and the correlated mechanisms over four rounds
  where their accountants claim a Gaussian (BandMF b = 2 at q b = 1; the tree)."""
  grid = []
  for sigma in (0.5, 1.0, 2.0):
    grid.append(dict(sigma=sigma, sampling='poisson', q=1.0, placement='central'))
    grid.append(dict(sigma=sigma, sampling='poisson', q=1.0, placement='distributed'))
    grid.append(dict(sigma=sigma, sampling='fixed', q=1.0, placement='central'))
  grid.append(dict(sigma=1.0, sampling='poisson', q=0.5, placement='central'))
  grid.append(dict(sigma=2.0, sampling='poisson', q=1.0, placement='central', rounds=4))
  grid.append(dict(sigma=1.0, sampling='poisson', q=0.5, placement='central', rounds=4,
                   noise='banded', bands=2))
  grid.append(dict(sigma=1.0, sampling='poisson', q=0.5, placement='central', rounds=4,
                   noise='tree'))
  return grid
