"""Statistics of the empirical privacy audit: from canary scores, lower bounds on the epsilon of the
mechanism that produced them, and estimates of it (the harness that plants the canaries in the real
round step is `dp2fedsam_jax/canaries.py`).

Scores are oriented: a canary that took part ("in") is expected to score higher than one that did
not ("out"). The test "in iff score >= t" has false-positive rate FPR (out scores >= t) and
false-negative rate FNR (in scores < t).

Bounds (each holds with probability >= 1 - alpha):

- `epsilon_clopper_pearson` (jax_privacy's CanaryScoreAuditor): any (eps, delta)-DP mechanism has
  FPR + e^eps FNR >= 1 - delta and FNR + e^eps FPR >= 1 - delta, so eps >= max(log((1 - delta -
  FNR_hi) / FPR_hi), log((1 - delta - FPR_hi) / FNR_hi)) with Clopper-Pearson upper bounds at
  alpha/2 each. The threshold is chosen on a random `select_fraction` of the scores and the bound
  computed on the rest. With n scores per class it cannot exceed about log(n / log(2/alpha)).
- `gdp_bound` (Nasr et al. 2023, "Tight auditing of differentially private machine learning"): a
  mu-GDP mechanism has FNR >= Phi(Phi^-1(1 - FPR) - mu), so mu >= Phi^-1(1 - FPR) - Phi^-1(FNR);
  with Clopper-Pearson bounds this gives an interval for mu, and eps(mu, delta) of the Gaussian
  trade-off. It extrapolates to the tails through the Gaussian shape, so a few thousand scores
  certify most of the epsilon -- but only against claims of that shape (a Gaussian mechanism and
  its compositions: q = 1 here), not against an arbitrary (eps, delta) claim.
- `epsilon_one_run` (Steinke, Nasr & Jagielski 2023) and `epsilon_one_run_fdp` (Mahloujifar et al.
  2024), from jax_privacy: canaries included independently with probability 1/2 in ONE run; valid
  without independence between the canaries' scores. The f-DP version tests the Gaussian trade-off
  with that (eps, delta), like `gdp_bound`.

Clopper-Pearson and `gdp_bound` treat the scores as independent trials (dp2fedsam_jax/canaries.py says
when its canaries' scores are).

Estimate (no guarantee): `epsilon_gaussian_fit` (Andrew et al. 2024, "One-shot empirical privacy
estimation for federated learning"): fit Gaussians to the in and the out scores and report the
epsilon of that pair of Gaussians, with a bootstrap interval.

Estimate (no guarantee), white-box and for any sampling rate: `noise_multiplier_estimate` measures
the executed mechanism's signal-to-noise ratio from every round's released sum projected on the
canary directions -- the shift a sampled canary causes against the noise std where it was not
sampled -- so that the accountant, fed the estimated sigma, gives an estimated epsilon. It checks
clipping and noise in situ in one run; it takes the sampler's form and q from the accountant.

jax_privacy 2.0.0's `CanaryScoreAuditor.epsilon_from_gdp` is not used: it takes |mu| over thresholds
computed from *upper* bounds of both rates, and where FPR_hi ~ 1 and FNR_hi ~ 0 the reversed test
then reads as strong evidence; on Gaussian-mechanism scores (sigma = 2, 10,000 scores) it exceeded
the true epsilon in 18 of 40 seeds at a claimed 95 % confidence, `gdp_bound` in none
(tests/test_audit.py keeps that measurement).
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
from jax_privacy import auditing
from scipy import optimize
from scipy import special
from scipy import stats

_norm = stats.norm


def _check_scores(in_scores, out_scores):
  in_scores = np.asarray(in_scores, np.float64).ravel()
  out_scores = np.asarray(out_scores, np.float64).ravel()
  if in_scores.size < 2 or out_scores.size < 2:
    raise ValueError(f'audit: at least 2 in and 2 out scores needed; got {in_scores.size} and '
                     f'{out_scores.size}.')
  return in_scores, out_scores


def _split(scores, fraction, rng):
  """(selection part, evaluation part): a random `fraction` of the scores selects."""
  order = rng.permutation(scores.size)
  cut = int(scores.size * fraction)
  return scores[order[:cut]], scores[order[cut:]]


# --- bounds from jax_privacy ----------------------------------------------------------------------


def epsilon_clopper_pearson(in_scores, out_scores, delta, alpha, select_fraction=0.2, seed=0):
  """Two-sided Clopper-Pearson lower bound; threshold chosen on a random split (see module doc)."""
  in_scores, out_scores = _check_scores(in_scores, out_scores)
  auditor = auditing.CanaryScoreAuditor(in_scores, out_scores)
  return float(auditor.epsilon_clopper_pearson(
      alpha, delta, one_sided=False,
      threshold_strategy=auditing.Split(threshold_estimation_frac=select_fraction, seed=seed)))


def epsilon_clopper_pearson_at(in_scores, out_scores, threshold, delta, alpha):
  """The same bound at a given threshold (no selection)."""
  in_scores, out_scores = _check_scores(in_scores, out_scores)
  auditor = auditing.CanaryScoreAuditor(in_scores, out_scores)
  return float(auditor.epsilon_clopper_pearson(
      alpha, delta, one_sided=False, threshold_strategy=auditing.Explicit(threshold)))


def epsilon_one_run(in_scores, out_scores, delta, alpha):
  """Steinke, Nasr & Jagielski (2023): the canaries of one run, each in with probability 1/2."""
  in_scores, out_scores = _check_scores(in_scores, out_scores)
  return float(auditing.CanaryScoreAuditor(in_scores, out_scores).epsilon_one_run(alpha, delta))


def epsilon_one_run_fdp(in_scores, out_scores, delta, alpha):
  """Mahloujifar et al. (2024): the one-run audit of the Gaussian trade-off with (eps, delta)."""
  in_scores, out_scores = _check_scores(in_scores, out_scores)
  return float(auditing.CanaryScoreAuditor(in_scores, out_scores).epsilon_one_run_fdp(alpha, delta))


# --- the Gaussian (GDP) bound of Nasr et al. 2023 -------------------------------------------------


def clopper_pearson_upper(k, n, level):
  """One-sided upper confidence bound on a binomial proportion: P(p > bound) <= level."""
  k = np.asarray(k, np.float64)
  bound = stats.beta.ppf(1.0 - level, k + 1.0, np.maximum(n - k, 1.0))
  return np.where(k >= n, 1.0, bound)


def clopper_pearson_lower(k, n, level):
  """One-sided lower confidence bound on a binomial proportion: P(p < bound) <= level."""
  return 1.0 - clopper_pearson_upper(n - np.asarray(k, np.float64), n, level)


def epsilon_of_gdp(mu, delta):
  """epsilon at delta of a mu-GDP mechanism (the Gaussian mechanism with noise 1/mu): exact."""
  if not mu > 0:
    return 0.0
  if math.isinf(mu):
    return math.inf
  return float(dp_accounting.get_epsilon_gaussian(1.0 / mu, delta))


def gdp_mu(fpr, fnr):
  """The smallest mu of a mu-GDP mechanism that allows a test with these error rates."""
  return _norm.isf(fpr) - _norm.ppf(fnr)


@dataclasses.dataclass(frozen=True)
class GdpBound:
  mu_lower: float   # the interval of mu, 1 - alpha (two-sided)
  mu: float         # at the observed error rates
  mu_upper: float
  epsilon_lower: float  # epsilon(mu, delta) of each
  epsilon: float
  epsilon_upper: float
  threshold: float


def _gdp_interval(in_scores, out_scores, threshold, alpha):
  """(mu_lower, mu, mu_upper) at one threshold; each of the 4 one-sided rate bounds at alpha/4."""
  n_in, n_out = in_scores.size, out_scores.size
  fp = np.sum(out_scores >= threshold)
  fn = np.sum(in_scores < threshold)
  level = alpha / 4
  lower = gdp_mu(clopper_pearson_upper(fp, n_out, level), clopper_pearson_upper(fn, n_in, level))
  upper = gdp_mu(clopper_pearson_lower(fp, n_out, level), clopper_pearson_lower(fn, n_in, level))
  # A rate of exactly 0 makes the point estimate infinite: count half an error there.
  point = gdp_mu(max(fp, 0.5) / n_out, max(fn, 0.5) / n_in)
  return float(lower), float(point), float(upper)


def gdp_bound(in_scores, out_scores, delta, alpha, select_fraction=0.2, seed=0) -> GdpBound:
  """Nasr et al. (2023): an interval for the GDP parameter mu, and the epsilons of its ends.

  The threshold is the midpoint of the in and out means of a random `select_fraction` of the
  scores, the interval is computed on the rest, so the choice does not inflate it. (The midpoint is
  where two Gaussians of one variance are best told apart; searching all thresholds for the largest
  mu_lower overfits and loses, measured, 5-10 % of the bound.) mu_lower <= the mechanism's mu with
  probability >= 1 - alpha/2 if the mechanism is mu-GDP for some mu and the scores are independent.
  """
  in_scores, out_scores = _check_scores(in_scores, out_scores)
  rng = np.random.default_rng(seed)
  select_in, eval_in = _split(in_scores, select_fraction, rng)
  select_out, eval_out = _split(out_scores, select_fraction, rng)
  if min(select_in.size, select_out.size, eval_in.size, eval_out.size) < 1:
    raise ValueError('audit: too few scores to split for threshold selection.')
  threshold = 0.5 * float(np.mean(select_in) + np.mean(select_out))
  lower, point, upper = _gdp_interval(eval_in, eval_out, threshold, alpha)
  return GdpBound(lower, point, upper, epsilon_of_gdp(lower, delta), epsilon_of_gdp(point, delta),
                  epsilon_of_gdp(upper, delta), threshold)


# --- the Gaussian-fit estimate of Andrew et al. 2024 ---------------------------------------------


def _region_mass(a, b, c, mean, std):
  """P(a x^2 + b x + c > 0) for x ~ N(mean, std^2)."""
  cdf = lambda x: special.ndtr((x - mean) / std)
  sf = lambda x: special.ndtr((mean - x) / std)
  if abs(a) < 1e-12 * max(abs(b), 1.0):
    if b == 0:
      return float(c > 0)
    root = -c / b
    return float(sf(root) if b > 0 else cdf(root))
  disc = b * b - 4 * a * c
  if disc <= 0:
    return 1.0 if a > 0 else 0.0
  # The stable pair of roots: nearly equal stds make a tiny, and -b +- sqrt(disc) would cancel.
  q = -0.5 * (b + math.copysign(math.sqrt(disc), b))
  r1, r2 = sorted((q / a, c / q))
  if a > 0:  # outside the roots; summed tails keep their precision
    return float(cdf(r1) + sf(r2))
  return float(cdf(r2) - cdf(r1))


def _gaussian_pair_delta(eps, mean_p, std_p, mean_q, std_q):
  """sup_S P(S) - e^eps Q(S) for P = N(mean_p, std_p^2), Q = N(mean_q, std_q^2): S is where the
  log-likelihood ratio exceeds eps, a quadratic inequality in x."""
  a = 1 / (2 * std_q**2) - 1 / (2 * std_p**2)
  b = mean_p / std_p**2 - mean_q / std_q**2
  c = mean_q**2 / (2 * std_q**2) - mean_p**2 / (2 * std_p**2) + math.log(std_q / std_p) - eps
  return (_region_mass(a, b, c, mean_p, std_p)
          - math.exp(eps) * _region_mass(a, b, c, mean_q, std_q))


def gaussian_pair_epsilon(mean_in, std_in, mean_out, std_out, delta, eps_max=100.0):
  """The epsilon at delta that separates N(mean_in, std_in^2) from N(mean_out, std_out^2), both
  ways. With equal stds it is `epsilon_of_gdp(|mean_in - mean_out| / std)`."""
  def delta_at(eps):
    return max(_gaussian_pair_delta(eps, mean_in, std_in, mean_out, std_out),
               _gaussian_pair_delta(eps, mean_out, std_out, mean_in, std_in))
  if delta_at(0.0) <= delta:
    return 0.0
  if delta_at(eps_max) > delta:
    return eps_max
  return float(optimize.brentq(lambda e: delta_at(e) - delta, 0.0, eps_max, xtol=1e-6))


@dataclasses.dataclass(frozen=True)
class GaussianFitEstimate:
  epsilon: float
  epsilon_low: float    # bootstrap percentile interval of the estimate, 1 - alpha
  epsilon_high: float


def _fit_epsilon(in_scores, out_scores, delta, equal_variance):
  if not equal_variance:
    return gaussian_pair_epsilon(np.mean(in_scores), np.std(in_scores, ddof=1),
                                 np.mean(out_scores), np.std(out_scores, ddof=1), delta)
  pooled = np.sqrt((np.sum((in_scores - np.mean(in_scores))**2)
                    + np.sum((out_scores - np.mean(out_scores))**2))
                   / (in_scores.size + out_scores.size - 2))
  return epsilon_of_gdp(abs(np.mean(in_scores) - np.mean(out_scores)) / pooled, delta)


def epsilon_gaussian_fit(in_scores, out_scores, delta, alpha=0.05, num_bootstrap=200,
                         seed=0, equal_variance=True) -> GaussianFitEstimate:
  """Andrew et al. (2024): the epsilon of Gaussians fitted to the in and out scores. An estimate,
  not a bound; the interval resamples the scores (it says how much the estimate moves, not where
  the true epsilon is).

  `equal_variance` fits one variance to both, the model of the Gaussian mechanism. Fitted
  separately, the two variances differ by sampling error alone, and at delta = 1e-5 any difference
  inflates epsilon: on Gaussian-mechanism scores of 1,000 canaries the median estimate was 10-30 %
  above the true epsilon (one variance: within 3 %).
  """
  in_scores, out_scores = _check_scores(in_scores, out_scores)
  rng = np.random.default_rng(seed)
  resampled = [_fit_epsilon(rng.choice(in_scores, in_scores.size),
                            rng.choice(out_scores, out_scores.size), delta, equal_variance)
               for _ in range(num_bootstrap)]
  low, high = np.quantile(resampled, [alpha / 2, 1 - alpha / 2])
  return GaussianFitEstimate(_fit_epsilon(in_scores, out_scores, delta, equal_variance),
                             float(low), float(high))


@dataclasses.dataclass(frozen=True)
class NoiseMultiplierEstimate:
  noise_multiplier: float  # executed noise std / executed sensitivity, as the accountant's sigma
  low: float               # bootstrap percentile interval over canaries, 1 - alpha
  high: float


def noise_multiplier_estimate(projections, sampled, signs, alpha=0.05, num_bootstrap=200,
                              seed=0) -> NoiseMultiplierEstimate:
  """The noise multiplier a run executed, from its canaries' per-round white-box scores.

  projections[t, i] = <u_t, v_i> / C: round t's released sum on canary i's direction; sampled[t, i]:
  canary i was in round t's cohort; signs[i]: its upload in units of C v_i (+1, 0 or -1). The
  projections are regressed on the contributions (sign where sampled, else 0): the slope is the
  shift per unit of contribution, the residual std the noise. A correct mechanism gives slope 1
  (clipped to exactly C) and std sigma, so their ratio is the accountant's sigma; half the noise or
  twice the sensitivity halves it. Canaries are resampled for the interval.
  """
  projections = np.asarray(projections, np.float64)
  contribution = np.where(np.asarray(sampled, bool), np.asarray(signs, np.float64), 0.0)
  if not np.any(contribution) or projections.size < 3:
    raise ValueError('audit: the noise-multiplier estimate needs a sampled canary with a non-zero '
                     'upload; use more canaries or rounds.')

  def ratio(columns):
    p, c = projections[:, columns], contribution[:, columns]
    if not np.any(c):  # a resample without a sampled canary
      return math.nan
    slope = np.sum(p * c) / np.sum(c * c)
    residual = p - slope * c
    noise = math.sqrt(np.sum(residual * residual) / (residual.size - 1))
    return noise / slope if slope > 0 else math.inf  # no shift towards the canaries: no signal

  k = projections.shape[1]
  rng = np.random.default_rng(seed)
  resampled = np.array([ratio(rng.integers(0, k, k)) for _ in range(num_bootstrap)])
  low, high = np.nanquantile(resampled, [alpha / 2, 1 - alpha / 2], method='nearest')
  return NoiseMultiplierEstimate(float(ratio(np.arange(k))), float(low), float(high))
