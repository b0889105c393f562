"""Statistics of the empirical privacy audit: from the scores of trials with and without a canary,
a lower bound on the epsilon of the mechanism that produced them (the harness that plants the
canary in the real round step is `dp2fedsam_jax/audit.py`).

A threshold tau gives the test "canary iff s >= tau" with false-positive rate FPR (without) and
false-negative rate FNR (with). Any (eps, delta)-DP mechanism satisfies FPR + e^eps FNR >= 1 - delta
and FNR + e^eps FPR >= 1 - delta, so

  eps_lower = max(log((1 - delta - FNR_hi) / FPR_hi), log((1 - delta - FPR_hi) / FNR_hi), 0)

where FPR_hi and FNR_hi are one-sided Clopper-Pearson upper bounds at level alpha/2 each: with
probability >= 1 - alpha (union bound) the true epsilon is at least eps_lower. tau is chosen on a
separate `select_fraction` of the trials, so the bound is not inflated by picking the best of many
thresholds on the same data. A finite audit can certify at most about log(n / log(2/alpha)) with n
evaluation trials per world, whatever the mechanism.
"""

from __future__ import annotations

import numpy as np
from scipy import stats as _stats

def clopper_pearson_upper(k, n, level):
  """One-sided upper confidence bound on a binomial proportion: P(p > bound) <= level."""
  k = np.asarray(k, np.float64)
  bound = _stats.beta.ppf(1.0 - level, k + 1.0, np.maximum(n - k, 1e-300))
  return np.where(k >= n, 1.0, bound)


def epsilon_lower_bound(fp, fn, n_without, n_with, delta, alpha):
  """eps_lower from false positives / negatives counted on n_without / n_with trials (arrays ok)."""
  fpr_hi = clopper_pearson_upper(fp, n_without, alpha / 2)
  fnr_hi = clopper_pearson_upper(fn, n_with, alpha / 2)
  with np.errstate(divide='ignore', invalid='ignore'):
    a = np.log(np.maximum(1.0 - delta - fnr_hi, 0.0) / fpr_hi)
    b = np.log(np.maximum(1.0 - delta - fpr_hi, 0.0) / fnr_hi)
  return np.maximum(np.maximum(np.nan_to_num(a, nan=0.0, neginf=0.0),
                               np.nan_to_num(b, nan=0.0, neginf=0.0)), 0.0), fpr_hi, fnr_hi


def _errors(scores_with, scores_without, thresholds):
  """(false positives, false negatives) of 'canary iff score >= t' for each threshold t."""
  fp = len(scores_without) - np.searchsorted(np.sort(scores_without), thresholds, side='left')
  fn = np.searchsorted(np.sort(scores_with), thresholds, side='left')
  return fp, fn


def epsilon_from_scores(scores_with, scores_without, delta, alpha, select_fraction=0.5):
  """Chooses the threshold on the first `select_fraction` of each world's trials, bounds on the rest.

  Returns (eps_lower, threshold, fpr, fnr, fpr_hi, fnr_hi) on the evaluation trials.
  """
  scores_with, scores_without = np.asarray(scores_with), np.asarray(scores_without)
  k_with = int(len(scores_with) * select_fraction)
  k_without = int(len(scores_without) * select_fraction)
  sel_with, eval_with = scores_with[:k_with], scores_with[k_with:]
  sel_without, eval_without = scores_without[:k_without], scores_without[k_without:]
  candidates = np.unique(np.concatenate([sel_with, sel_without]))
  fp, fn = _errors(sel_with, sel_without, candidates)
  eps, _, _ = epsilon_lower_bound(fp, fn, len(sel_without), len(sel_with), delta, alpha)
  threshold = float(candidates[int(np.argmax(eps))])
  fp, fn = _errors(eval_with, eval_without, np.array([threshold]))
  eps, fpr_hi, fnr_hi = epsilon_lower_bound(fp, fn, len(eval_without), len(eval_with), delta, alpha)
  return (float(eps[0]), threshold, float(fp[0]) / len(eval_without),
          float(fn[0]) / len(eval_with), float(fpr_hi[0]), float(fnr_hi[0]))
