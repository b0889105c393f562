"""How much of a row's number is its search's luck: tuning curves, the private search's spread, and
the verdict rule that counts both (docs/benchmark.md, second design).

A row's pool is every trial its search ran: (validation score, test accuracy) pairs, measured, not
released, so no epsilon covers what is computed here (the pages say so).

- Tuning curve (Dodge et al. 2019, "Show your work"): the expected test accuracy of the
  validation-best of k trials drawn with replacement from the pool, k = 1..K, with bootstrap bands.
- Search SD: the declared private search simulated on the pool: K from its law, K trials drawn from
  the pool, each validation score plus the score's noise, the best one's test accuracy; the SD over
  the resamples is how far another search of the same law would move the row.
- The rule: d = mean over paired seeds of A - B; s^2 = the variance of the paired differences +
  s^2(search of A) + s^2(search of B); A helps if d >= max(min gap, 2 s), hurts if
  d <= -max(min gap, 2 s), else level.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math

import numpy as np

from dp2fedsam_jax.privacy.selection import TrialDistribution


@dataclasses.dataclass(frozen=True)
class Pool:
  """A row's trials: validation scores (what the search selects by) and test accuracies."""
  validation: np.ndarray
  test: np.ndarray

  def __post_init__(self):
    if len(self.validation) != len(self.test) or not len(self.test):
      raise ValueError(f'a pool needs as many validation scores as test accuracies (>= 1): '
                       f'{len(self.validation)} and {len(self.test)}')

  @classmethod
  def of(cls, validation, test) -> 'Pool':
    return cls(np.asarray(validation, np.float64), np.asarray(test, np.float64))

  def __len__(self) -> int:
    return len(self.test)


def expected_best(pool: Pool, k: int) -> float:
  """E[test accuracy of the validation-best of k draws with replacement from the pool]: with the
  pool sorted by validation score, the j-th of n is the best of k with probability
  (j/n)^k - ((j-1)/n)^k (ties broken by the order of the pool, as a stable sort)."""
  order = np.argsort(pool.validation, kind='stable')
  n = len(pool)
  ranks = np.arange(1, n + 1, dtype=np.float64)
  weights = (ranks / n) ** k - ((ranks - 1) / n) ** k
  return float(np.dot(weights, pool.test[order]))


@dataclasses.dataclass(frozen=True)
class TuningCurve:
  k: np.ndarray       # 1..K
  mean: np.ndarray    # expected_best at each k
  low: np.ndarray     # the bootstrap band's lower edge at each k
  high: np.ndarray    # and its upper edge

  def to_dict(self) -> dict:
    return {name: [float(x) for x in getattr(self, name)] for name in ('k', 'mean', 'low', 'high')}


def tuning_curve(pool: Pool, max_k: int, rng: np.random.Generator, resamples: int = 1000,
                 band: float = 0.95) -> TuningCurve:
  """expected_best for k = 1..max_k, with a percentile bootstrap band over pools resampled with
  replacement."""
  ks = np.arange(1, max_k + 1)
  mean = np.array([expected_best(pool, k) for k in ks])
  boot = np.empty((resamples, max_k))
  for b in range(resamples):
    pick = rng.integers(len(pool), size=len(pool))
    resampled = Pool(pool.validation[pick], pool.test[pick])
    boot[b] = [expected_best(resampled, k) for k in ks]
  tail = 100 * (1 - band) / 2
  return TuningCurve(ks, mean, np.percentile(boot, tail, axis=0), np.percentile(boot, 100 - tail,
                                                                                axis=0))


def simulated_searches(pool: Pool, law: TrialDistribution, score_noise_on_mean: float,
                       rng: np.random.Generator, resamples: int = 1000) -> np.ndarray:
  """The test accuracy each of `resamples` simulated private searches selects: K from `law`, K
  trials from the pool with replacement, each validation score plus N(0, score_noise_on_mean^2)
  (the score's noise divided by the public client count), the best one's test accuracy. A search
  that draws K = 0 selects nothing and is left out."""
  chosen = []
  for _ in range(resamples):
    k = law.sample(rng)
    if k == 0:
      continue
    pick = rng.integers(len(pool), size=k)
    scores = pool.validation[pick] + score_noise_on_mean * rng.standard_normal(k)
    chosen.append(pool.test[pick[int(np.argmax(scores))]])
  return np.asarray(chosen)


def search_sd(pool: Pool, law: TrialDistribution, score_noise_on_mean: float,
              rng: np.random.Generator, resamples: int = 1000) -> float:
  """The SD of simulated_searches: how far another search under the same law moves the row."""
  chosen = simulated_searches(pool, law, score_noise_on_mean, rng, resamples)
  return float(np.std(chosen, ddof=1)) if len(chosen) > 1 else float('nan')


def paired_rule(a_seeds, b_seeds, a_search_sd: float, b_search_sd: float,
                min_gap: float = 0.01) -> tuple[str, float, float]:
  """(label, d, s) of A against B on the same seeds: d the mean of the paired differences, s^2 their
  variance across seeds (an SD, not the SE of the mean, as the first design's s) plus each row's
  search variance. 'helps' if d >= max(min_gap, 2 s), 'hurts' if d <= -max(min_gap, 2 s), else
  'level'."""
  a, b = np.asarray(a_seeds, np.float64), np.asarray(b_seeds, np.float64)
  if a.shape != b.shape or a.size < 2:
    raise ValueError(f'paired seeds: the same seeds for both rows, at least 2 ({a.size}, {b.size})')
  differences = a - b
  d = float(differences.mean())
  s = math.sqrt(differences.var(ddof=1) + a_search_sd ** 2 + b_search_sd ** 2)
  bar = max(min_gap, 2 * s)
  return ('helps' if d >= bar else 'hurts' if d <= -bar else 'level'), d, s


def rank_stability(early: list[float], late: list[float]) -> float:
  """Spearman's rho between configurations' validation scores at T_trial and at T (the pilot's
  check that a short trial ranks as a long one does: the design asks rho >= 0.8 on >= 10)."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  if len(early) != len(late) or len(early) < 3:
    raise ValueError(f'rank stability needs the same >= 3 configurations at both lengths '
                     f'({len(early)}, {len(late)})')
  return float(stats.spearmanr(early, late).statistic)


def pool_of_trials(trials: list[dict]) -> Pool:
  """A row's pool from its search's trials (launch.tune's operator record: each with 'status',
  the un-noised validation 'metric' and 'test_accuracy'): a trial that failed or did not finish is
  a draw that ranks last and scores 0 (a search can draw it; it trains nothing)."""
  validation, test = [], []
  for trial in trials:
    finished = trial.get('status') == 'finished' and trial.get('test_accuracy') is not None
    validation.append(float(trial['metric']) if finished else -math.inf)
    test.append(float(trial['test_accuracy']) if finished else 0.0)
  return Pool.of(validation, test)


# What a published record keeps of each trial: enough to recompute the record (its noised score is
# left out: only the selected trial's is released, under the selection's epsilon).
POOL_FIELDS = ('run', 'values', 'status', 'metric', 'test_accuracy', 'in_selection')  # (a floor's)


def search_record(trials: list[dict], law: TrialDistribution, score_noise_on_mean: float,
                  seed: int, resamples: int = 1000) -> dict:
  """What a row of the second design publishes of its search (row.json's 'search'): its pool (each
  trial's values, status, un-noised validation 'metric' and test accuracy) with the inputs that
  recompute the rest (recomputed): the pool's size, its tuning curve to k = K, the private search's
  SD (the law simulated on the pool), and the pool's validation-best trial ("tuned well").
  Accuracies in [0, 1]; measurements of the pool, which no epsilon covers."""
  inputs = {'pool': [{field: trial.get(field) for field in POOL_FIELDS} for trial in trials],
            'score_noise_on_mean': score_noise_on_mean, 'seed': seed, 'resamples': resamples,
            'covered_by_epsilon': False}
  if not trials:  # K = 0: no pool
    return {**inputs, 'pool_size': 0, 'tuning_curve': None, 'search_sd': None, 'pool_best': None}
  pool = pool_of_trials(trials)
  rng = np.random.default_rng(seed)
  best = int(np.argmax(pool.validation))
  trained = math.isfinite(pool.validation[best])
  return {**inputs, 'pool_size': len(pool),
          'tuning_curve': tuning_curve(pool, len(pool), rng, resamples).to_dict(),
          'search_sd': search_sd(pool, law, score_noise_on_mean, rng, resamples),
          'pool_best': {'run': trials[best].get('run'), 'values': trials[best].get('values'),
                        'validation_accuracy': float(pool.validation[best]),
                        'test_accuracy': float(pool.test[best])} if trained else None}


def recomputed(record: dict, law: TrialDistribution) -> dict:
  """search_record again from a published record's pool and inputs: what a page shows of a search
  comes from its trials, never from the numbers stored beside them."""
  inputs = ('pool', 'score_noise_on_mean', 'seed', 'resamples')
  missing = [k for k in inputs if k not in record]
  if missing:
    raise ValueError(f"a search record without {', '.join(missing)}: it cannot be recomputed from "
                     'its trials; publish the row again (launch.fair_benchmark --publish)')
  # A report reads each row several times (table, verdicts, plot, README): resampled once.
  return copy.deepcopy(_recomputed(json.dumps({k: record[k] for k in inputs}, sort_keys=True), law))


@functools.lru_cache(maxsize=64)
def _recomputed(inputs: str, law: TrialDistribution) -> dict:
  given = json.loads(inputs)
  return search_record(given['pool'], law, given['score_noise_on_mean'], given['seed'],
                       given['resamples'])
