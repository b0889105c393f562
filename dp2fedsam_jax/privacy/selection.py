"""Private selection: epsilon of running K random trials of a DP training and releasing the best.

Papernot & Steinke (ICLR 2022, "Hyperparameter Tuning with Renyi Differential Privacy"): draw K
independently of the data, run K trainings (each with its own hyperparameters), release only the
best one and its score. If every trial is (lambda, eps(lambda))-RDP, the whole procedure is
(lambda, eps'(lambda))-RDP with

  K ~ truncated negative binomial D_{eta, gamma} (Theorem 2; eta = 0 is the logarithmic law):
    eps'(lambda) = eps(lambda) + (1 + eta) min_{lambda^} [(1 - 1/lambda^) eps(lambda^)
                   + log(1/gamma) / lambda^] + log(E[K]) / (lambda - 1)
  K ~ Poisson(mu) (Theorem 6), with (eps^, delta^)-DP of one trial at e^eps^ = 1 + 1/(lambda - 1):
    eps'(lambda) = eps(lambda) + mu delta^ + log(mu) / (lambda - 1)

then (eps, delta) by dp_accounting's RDP conversion. Both formulas are dp_accounting's
(`RepeatAndSelectDpEvent`, shape = eta or inf); here over the pointwise maximum of the trials' own
RDP curves, so trials of different mechanisms (BandMF, tree, adaptive clipping) are covered as long
as dp_accounting's RDP accountant supports each trial's event. With Poisson K = 0 happens (prob.
e^-mu): the procedure outputs nothing, and the bound covers that outcome too.

numpy and dp_accounting only: importing this loads no JAX (launch/tune.py --plan stays light).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _rdp

POISSON = 'poisson'
TRUNCATED_NEGATIVE_BINOMIAL = 'truncated_negative_binomial'
FIXED = 'fixed'  # K = k every time: no private-selection bound, so for non-private searches only
TRIAL_DISTRIBUTIONS = (POISSON, TRUNCATED_NEGATIVE_BINOMIAL, FIXED)
PARAMETERS = {POISSON: {'mu'}, TRUNCATED_NEGATIVE_BINOMIAL: {'eta', 'gamma'}, FIXED: {'k'}}
ORDERS = tuple(float(a) for a in _rdp.DEFAULT_RDP_ORDERS)  # the accountant's own orders
_ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def tnb_mean(eta: float, gamma: float) -> float:
  """E[K] of the truncated negative binomial D_{eta, gamma} (eta = 0: logarithmic)."""
  if eta == 0:
    return (1.0 / gamma - 1.0) / math.log(1.0 / gamma)
  return eta * (1.0 - gamma) / (gamma * (1.0 - gamma ** eta))


@dataclasses.dataclass(frozen=True)
class TrialDistribution:
  """The law of the number of trials K: Poisson(mu), truncated negative binomial (eta, gamma), or
  fixed (K = k: a non-private search's, which no selection theorem covers)."""
  name: str
  mu: float | None = None
  eta: float | None = None
  gamma: float | None = None
  k: int | None = None

  def __post_init__(self):
    if self.name == FIXED:
      if not isinstance(self.k, int) or self.k < 1:
        raise ValueError(f'trial distribution fixed: k={self.k!r}; a whole number of trials >= 1.')
    elif self.name == POISSON:
      if self.mu is None or not 1.0 <= self.mu < math.inf:
        raise ValueError(f'trial distribution poisson: mu={self.mu!r}; dp_accounting bounds '
                         'Poisson(mu) for mu >= 1 only (a finite mean number of trials).')
    elif self.name == TRUNCATED_NEGATIVE_BINOMIAL:
      if self.eta is None or not 0.0 <= self.eta < math.inf:
        raise ValueError(f'trial distribution truncated_negative_binomial: eta={self.eta!r}; the '
                         'accounting covers eta >= 0 (0: logarithmic, 1: geometric).')
      if self.gamma is None or not 0.0 < self.gamma < 1.0:
        raise ValueError(f'trial distribution truncated_negative_binomial: gamma={self.gamma!r} '
                         'must lie in (0, 1) (smaller gamma: more trials).')
    else:
      raise ValueError(f'trial distribution {self.name!r}: choose one of {TRIAL_DISTRIBUTIONS}.')

  @classmethod
  def from_dict(cls, spec: dict) -> 'TrialDistribution':
    """{'name': 'poisson', 'mu': 10} or {'name': 'truncated_negative_binomial', 'eta': 0, 'gamma':
    g}; the latter may give 'mean' instead of 'gamma' (gamma found as dp_accounting does)."""
    spec = dict(spec)
    name = spec.pop('name', None)
    if name not in TRIAL_DISTRIBUTIONS:
      raise ValueError(f'trial distribution {name!r}: choose one of {TRIAL_DISTRIBUTIONS}.')
    if name == TRUNCATED_NEGATIVE_BINOMIAL and 'gamma' not in spec and 'mean' in spec:
      eta, mean = float(spec.pop('eta', 0.0)), float(spec.pop('mean'))
      spec.update(eta=eta, gamma=_rdp._gamma_truncated_negative_binomial(eta, mean))  # pylint: disable=protected-access
    allowed = PARAMETERS[name]
    if set(spec) - allowed:
      raise ValueError(f'trial distribution {name!r}: unknown parameters {sorted(set(spec) - allowed)}'
                       f'; it takes {sorted(allowed)}.')
    if name == FIXED:
      k = spec.get('k')
      return cls(name, k=int(k) if isinstance(k, (int, float)) and float(k).is_integer() else k)
    return cls(name, **{k: float(v) for k, v in spec.items()})

  @property
  def private(self) -> bool:
    """Whether a private search may draw its K from this law (a selection theorem covers it)."""
    return self.name != FIXED

  def to_dict(self) -> dict:
    if self.name == FIXED:
      return {'name': FIXED, 'k': self.k}
    if self.name == POISSON:
      return {'name': POISSON, 'mu': self.mu}
    return {'name': TRUNCATED_NEGATIVE_BINOMIAL, 'eta': self.eta, 'gamma': self.gamma}

  @property
  def mean(self) -> float:
    """E[K]."""
    if self.name == FIXED:
      return float(self.k)
    return self.mu if self.name == POISSON else tnb_mean(self.eta, self.gamma)

  @property
  def shape(self) -> float:
    """dp_accounting's shape: inf for Poisson, eta for the truncated negative binomial."""
    if not self.private:
      raise ValueError(f'trial distribution fixed (k={self.k}): no private-selection bound covers a '
                       'fixed number of trials; a private search draws K from poisson or '
                       'truncated_negative_binomial.')
    return math.inf if self.name == POISSON else self.eta

  def pmf(self, k: int) -> float:
    """P[K = k]."""
    if self.name == FIXED:
      return float(k == self.k)
    if self.name == POISSON:
      return math.exp(-self.mu + k * math.log(self.mu) - math.lgamma(k + 1))
    if k < 1:
      return 0.0
    eta, gamma = self.eta, self.gamma
    # (1 - gamma)^k / (gamma^-eta - 1) prod_{l<k} (l + eta)/(l + 1); the eta -> 0 limit for eta = 0
    if eta == 0:
      return (1.0 - gamma) ** k / (k * math.log(1.0 / gamma))
    log_p = (k * math.log1p(-gamma) - math.log(math.expm1(-eta * math.log(gamma)))
             + math.lgamma(k + eta) - math.lgamma(eta + 1) - math.lgamma(k + 1) + math.log(eta))
    return math.exp(log_p)

  def sample(self, rng: np.random.Generator) -> int:
    """One draw of K from `rng` (inverse CDF for the truncated negative binomial)."""
    if self.name == FIXED:
      return self.k
    if self.name == POISSON:
      return int(rng.poisson(self.mu))
    u, k, cdf = rng.random(), 1, 0.0
    p = self.pmf(1)
    while True:
      cdf += p
      if u < cdf or p == 0.0 and k > self.mean:
        return k
      p *= (1.0 - self.gamma) * (k + self.eta) / (k + 1)  # pmf(k + 1) from pmf(k)
      k += 1


def rdp_curve(events: Sequence[dp_accounting.DpEvent],
              neighboring_relation=_ADD_OR_REMOVE, orders: Sequence[float] = ORDERS) -> np.ndarray:
  """The pointwise maximum over `events` of their RDP at `orders` (every trial is then RDP at it).

  Raises ValueError naming the event that dp_accounting's RDP accountant cannot compose (a
  PLD-only event): the selection theorems need each trial's RDP curve.
  """
  if not events:
    raise ValueError('rdp_curve: no trial events given.')
  curves = []
  for event in events:
    accountant = _rdp.RdpAccountant(list(orders), neighboring_relation)
    if not accountant.supports(event):
      raise ValueError(
          f'private selection needs each trial\'s RDP curve, and dp_accounting\'s RDP accountant '
          f'({neighboring_relation.name}) cannot compose {type(event).__name__} ({event!r:.200}); '
          'tune such runs with a mechanism that has an RDP bound, or account the selection '
          'by hand.')
    accountant.compose(event)
    curves.append(np.asarray(accountant._rdp, np.float64))  # pylint: disable=protected-access
  return np.max(np.stack(curves), axis=0)


def selection_rdp(rdp: Sequence[float], distribution: TrialDistribution,
                  orders: Sequence[float] = ORDERS) -> np.ndarray:
  """eps'(lambda) at `orders` of releasing the best of K ~ `distribution` trials, each RDP at `rdp`."""
  return np.asarray(_rdp._compute_rdp_repeat_and_select(  # pylint: disable=protected-access
      list(orders), list(rdp), distribution.mean, distribution.shape), np.float64)


def epsilon_of_rdp(rdp: Sequence[float], delta: float, orders: Sequence[float] = ORDERS) -> float:
  """(eps, delta)-DP from an RDP curve: dp_accounting's conversion (optimal order)."""
  if not 0.0 < delta < 1.0:
    raise ValueError(f'delta={delta!r} must lie in (0, 1).')
  return float(_rdp.compute_epsilon(list(orders), list(rdp), delta)[0])


@dataclasses.dataclass(frozen=True)
class SelectionCost:
  """The privacy of one tuning: each trial's epsilon, the selection's and naive composition's."""
  trial_distribution: dict
  expected_trials: float
  delta: float
  per_trial_epsilon: float      # one trial (the maximum RDP curve over the trials), RDP -> DP
  selection_epsilon: float      # the best of K random trials released (the theorems)
  naive_epsilon: float          # naive_trials trials composed (each trial's whole output released)
  naive_trials: int
  accountant: str = 'rdp'

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def selection_cost(events: Sequence[dp_accounting.DpEvent], distribution: TrialDistribution,
                   delta: float, naive_trials: int | None = None,
                   neighboring_relation=_ADD_OR_REMOVE) -> SelectionCost:
  """Epsilon at `delta` of the private selection over trials with these events, against one trial
  and the naive composition of `naive_trials` trials (default: round(E[K]), at least 1)."""
  curve = rdp_curve(events, neighboring_relation)
  if naive_trials is None:
    naive_trials = max(1, round(distribution.mean))
  return SelectionCost(
      trial_distribution=distribution.to_dict(), expected_trials=distribution.mean, delta=delta,
      per_trial_epsilon=epsilon_of_rdp(curve, delta),
      selection_epsilon=epsilon_of_rdp(selection_rdp(curve, distribution), delta),
      naive_epsilon=epsilon_of_rdp(naive_trials * curve, delta) if naive_trials else 0.0,
      naive_trials=int(naive_trials))


def selection_then_run_epsilon(events: Sequence[dp_accounting.DpEvent],
                               distribution: TrialDistribution, run: dp_accounting.DpEvent,
                               delta: float, neighboring_relation=_ADD_OR_REMOVE) -> float:
  """Epsilon at `delta` of the selection over trials with these events followed by one more run
  (`run`) on the same clients at the selected values: what a model trained this way costs in all
  (RDP composition of the selection's curve and the run's)."""
  curve = selection_rdp(rdp_curve(events, neighboring_relation), distribution)
  return epsilon_of_rdp(curve + rdp_curve([run], neighboring_relation), delta)


def trials_then_run_epsilon(events: Sequence[dp_accounting.DpEvent], num_trials: int,
                            run: dp_accounting.DpEvent, delta: float,
                            neighboring_relation=_ADD_OR_REMOVE) -> float:
  """Epsilon at `delta` of `num_trials` trials (each at the maximum RDP curve of `events`) and one
  more run composed: the search and its model once K is known (the naive composition, RDP)."""
  curve = num_trials * rdp_curve(events, neighboring_relation)
  return epsilon_of_rdp(curve + rdp_curve([run], neighboring_relation), delta)


CANDIDATE_STREAM = 1  # the generator stream of a study's candidates (launch/tune.py's streams)


def draw_candidate(space: dict, seed: int, index: int, stream: int = CANDIDATE_STREAM,
                   tied: dict | None = None) -> dict:
  """A random search's candidate `index`: each field of `space` ((log_uniform | uniform, lo, hi) or
  (choice, [values])) drawn from the generator of [seed, stream, index], in sorted field order, a
  number to 4 significant digits; a tied field ({follower: leader}) takes its leader's value.
  Candidates are i.i.d. and do not depend on K (launch/tune.py draws a study's with it)."""
  rng = np.random.default_rng([seed, stream, index])
  values = {}
  for field in sorted(space):
    law = space[field]
    if law[0] == 'choice':
      values[field] = law[1][int(rng.integers(len(law[1])))]
    else:
      lo, hi = float(law[1]), float(law[2])
      x = math.exp(rng.uniform(math.log(lo), math.log(hi))) if law[0] == 'log_uniform' else (
          rng.uniform(lo, hi))
      values[field] = float(f'{x:.4g}')
  for follower, leader in (tied or {}).items():
    values[follower] = values[leader]
  return values
