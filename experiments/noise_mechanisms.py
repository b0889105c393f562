r"""What correlated noise buys, from accounting alone: `python -m experiments.noise_mechanisms`
(`--search`: the longer regimes searched for one where BandMF clearly wins, ~15 min on 2 cores;
`--bandmf_regime`: the regime of configs/fmnist_bandmf_regime.py, also under its server momentum).

For each regime (N, q, T, target eps; delta = 1/N) and each dp.noise_mechanism (banded for several
band counts), prints sigma calibrated for the target, eps at sigma = 1, and the root mean square
over t = 1..T of the noise on the model's sum of released updates (A C^-1 Z with A the prefix sums,
in units of C), relative to independent noise at its own calibrated sigma. No data, no training: the
mechanisms are DPMechanism objects as the round step runs them (docs/privacy.md, section 7).
"""

import math
import sys

import numpy as np
from jax_privacy.matrix_factorization import toeplitz

from dp2fedsam_jax.privacy.mechanism import DPMechanism
from dp2fedsam_jax.privacy.noise_mechanisms import BandMF, Independent, TreeAggregation

# (label, N, q, T, target epsilon, band counts): the default experiment and the paper regime.
REGIMES = (('default (configs/default.py)', 1000, 0.02, 40, 2.0, (2, 4, 8)),
           ('paper regime, eps 1', 1000, 0.05, 200, 1.0, (2, 4, 8, 16)),
           ('paper regime, eps 0.5', 1000, 0.05, 200, 0.5, (2, 4, 8, 16)))

# --search: longer runs and more bands (docs/privacy.md section 7, "Where BandMF wins").
SEARCH_REGIMES = (('T=500, q=0.02', 1000, 0.02, 500, 1.0, (2, 5, 10, 25, 50)),
                  ('T=1000, q=0.01', 1000, 0.01, 1000, 1.0, (4, 10, 25, 50, 100)),
                  ('T=500, q=0.1', 1000, 0.1, 500, 1.0, (2, 5, 10)),
                  ('T=1000, q=0.05', 1000, 0.05, 1000, 1.0, (2, 5, 10, 20)),
                  ('T=1000, q=0.01, eps=8', 1000, 0.01, 1000, 8.0, (4, 10, 25, 50, 100)))
# The regime of experiments/configs/fmnist_bandmf_regime.py (`--bandmf_regime`), whose runs use server
# momentum 0.9.
BANDMF_REGIME = (('fmnist_bandmf_regime', 1000, 0.01, 1000, 1.0, (2, 4, 10)),)
BANDMF_REGIME_MOMENTUM = 0.9


def workload(rounds: int, momentum: float = 0.0) -> np.ndarray:
  """A[t, k]: the weight of round k's release in the model after round t (k <= t). Plain SGD sums
  them (the prefix sums BandMF is optimised for); heavy-ball momentum beta weights round k by
  sum_{j=k..t} beta^(j-k) = (1 - beta^(t-k+1)) / (1 - beta)."""
  lag = np.subtract.outer(np.arange(rounds), np.arange(rounds))
  if momentum == 0.0:
    return (lag >= 0).astype(np.float64)
  return np.where(lag >= 0, (1.0 - momentum ** (np.maximum(lag, 0) + 1)) / (1.0 - momentum), 0.0)


def model_noise_variance(mechanism: DPMechanism, rounds: int, momentum: float = 0.0) -> float:
  """Mean over t = 1..T of the per-coordinate variance of the noise in the model after round t
  (workload(rounds, momentum) applied to the noise of the releases), in units of (sigma C)^2."""
  if mechanism.noise_mechanism == 'independent':
    return float(np.mean((workload(rounds, momentum) ** 2).sum(axis=1)))
  if mechanism.noise_mechanism == 'banded':
    c = np.asarray(toeplitz.materialize_lower_triangular(np.asarray(mechanism.noise.strategy), rounds),
                   np.float64)
    b = workload(rounds, momentum) @ np.linalg.inv(c)
    return float(np.mean((b ** 2).sum(axis=1)))
  if momentum:
    raise ValueError('the tree is accounted for its prefix sums only; pass momentum=0.')
  # A finished epoch's sum holds popcount(E) nodes, a prefix s popcount(s).
  epoch = mechanism.noise.epoch_length
  return float(np.mean([(t // epoch) * bin(epoch).count('1') + bin(t % epoch).count('1')
                        for t in range(1, rounds + 1)]))


def main(regimes=REGIMES, momentum: float = 0.0):
  """Prints each regime's table; with `momentum`, one more column: the ratio under heavy-ball
  momentum's workload, which BandMF's strategy is not optimised for."""
  for label, n, q, rounds, eps, bands in regimes:
    delta = 1.0 / n
    base = dict(clip_norm=1.0, noise_multiplier=1.0)
    mechanisms = [('independent', DPMechanism(Independent(n, q), **base))]
    mechanisms += [(f'banded b={b}', DPMechanism(BandMF.for_run(n, q, rounds, b), **base))
                   for b in bands if q * b <= 1]
    if not momentum:
      mechanisms += [('tree', DPMechanism(TreeAggregation(n, q), **base))]
    print(f'\n{label}: N={n} q={q} T={rounds} eps={eps} delta={delta:g}\n')
    extra = f' ... under server momentum {momentum} |' if momentum else ''
    print(f'| mechanism | sigma for the target | eps at sigma = 1 | RMS noise on the model / '
          f'independent |{extra}')
    print('|---|---|---|---|' + ('---|' if momentum else ''))
    reference = None
    for name, mechanism in mechanisms:
      sigma = mechanism.calibrate(eps, rounds, delta)
      rms = [sigma * math.sqrt(model_noise_variance(mechanism, rounds, beta))
             for beta in ((0.0, momentum) if momentum else (0.0,))]
      reference = reference or rms
      ratios = ' | '.join(f'{r / ref:.3f}' for r, ref in zip(rms, reference))
      print(f'| {name} | {sigma:.3f} | {mechanism.epsilon(rounds, delta):.3f} | {ratios} |', flush=True)


if __name__ == '__main__':
  if '--bandmf_regime' in sys.argv[1:]:
    main(BANDMF_REGIME, momentum=BANDMF_REGIME_MOMENTUM)
  else:
    main(SEARCH_REGIMES if '--search' in sys.argv[1:] else REGIMES)
