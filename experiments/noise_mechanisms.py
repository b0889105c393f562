r"""What correlated noise buys, from accounting alone: `python -m experiments.noise_mechanisms`
(`--search`: the longer regimes searched for one where BandMF clearly wins, ~15 min on 2 cores).

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

# Issue 35: longer runs and more bands (docs/privacy.md section 7, "Where BandMF wins").
SEARCH_REGIMES = (('T=500, q=0.02', 1000, 0.02, 500, 1.0, (2, 5, 10, 25, 50)),
                  ('T=1000, q=0.01', 1000, 0.01, 1000, 1.0, (4, 10, 25, 50, 100)),
                  ('T=500, q=0.1', 1000, 0.1, 500, 1.0, (2, 5, 10)),
                  ('T=1000, q=0.05', 1000, 0.05, 1000, 1.0, (2, 5, 10, 20)),
                  ('T=1000, q=0.01, eps=8', 1000, 0.01, 1000, 8.0, (4, 10, 25, 50, 100)))


def prefix_noise_variance(mechanism: DPMechanism, rounds: int) -> float:
  """Mean over t = 1..T of the per-coordinate variance of the summed noise of rounds 1..t, in units
  of (sigma C)^2."""
  if mechanism.noise_mechanism == 'independent':
    return float(np.mean(np.arange(1, rounds + 1)))
  if mechanism.noise_mechanism == 'banded':
    c = np.asarray(toeplitz.materialize_lower_triangular(np.asarray(mechanism.noise.strategy), rounds),
                   np.float64)
    b = np.tril(np.ones((rounds, rounds))) @ np.linalg.inv(c)
    return float(np.mean((b ** 2).sum(axis=1)))
  # A finished epoch's sum holds popcount(E) nodes, a prefix s popcount(s).
  epoch = mechanism.noise.epoch_length
  return float(np.mean([(t // epoch) * bin(epoch).count('1') + bin(t % epoch).count('1')
                        for t in range(1, rounds + 1)]))


def main(regimes=REGIMES):
  for label, n, q, rounds, eps, bands in regimes:
    delta = 1.0 / n
    base = dict(clip_norm=1.0, noise_multiplier=1.0)
    mechanisms = [('independent', DPMechanism(Independent(n, q), **base))]
    mechanisms += [(f'banded b={b}', DPMechanism(BandMF.for_run(n, q, rounds, b), **base))
                   for b in bands if q * b <= 1]
    mechanisms += [('tree', DPMechanism(TreeAggregation(n, q), **base))]
    print(f'\n{label}: N={n} q={q} T={rounds} eps={eps} delta={delta:g}\n')
    print('| mechanism | sigma for the target | eps at sigma = 1 | RMS noise on the model / independent |')
    print('|---|---|---|---|')
    reference = None
    for name, mechanism in mechanisms:
      sigma = mechanism.calibrate(eps, rounds, delta)
      rms = sigma * math.sqrt(prefix_noise_variance(mechanism, rounds))
      reference = reference or rms
      print(f'| {name} | {sigma:.3f} | {mechanism.epsilon(rounds, delta):.3f} | {rms / reference:.3f} |',
            flush=True)


if __name__ == '__main__':
  main(SEARCH_REGIMES if '--search' in sys.argv[1:] else REGIMES)
