"""Comparisons between rows: each method against the next below it, the reference method against every
other at each eps, a setting with extra arguments against its baseline, and the pre-declared rule
(rule_label) that the studies' verdicts use (experiments/studies/)."""

from __future__ import annotations

import collections
import math

from experiments.report.summary import Row
from experiments.report.workdirs import format_value


def ordering(rows: list[Row]) -> list[tuple[Row, Row, float, float]]:
  """(higher, lower, gap, gap / pooled seed std) for each method against the next one below it in
  the same config and setting, by final-round mean accuracy. The pooled std is
  sqrt((s_hi^2 + s_lo^2) / 2) over seeds; nan when either side has fewer than two seeds."""
  pairs = []
  by_setting = collections.defaultdict(list)
  for r in rows:
    if not math.isnan(r.final_acc[0]):
      by_setting[(r.config_name, r.setting)].append(r)
  for _, ranked in sorted(by_setting.items()):
    ranked.sort(key=lambda r: -r.final_acc[0])
    for hi, lo in zip(ranked, ranked[1:]):
      pairs.append((hi, lo, *_gap(hi, lo)))
  return pairs


def _gap(hi: Row, lo: Row) -> tuple[float, float]:
  """(hi - lo in final-round mean accuracy, that gap / pooled seed std sqrt((s_hi^2 + s_lo^2)/2));
  the second is nan when either side has fewer than two seeds."""
  gap = hi.final_acc[0] - lo.final_acc[0]
  pooled = math.sqrt((hi.final_acc[1] ** 2 + lo.final_acc[1] ** 2) / 2)  # nan if one seed
  return gap, gap / pooled if pooled > 0 else float('nan')


def rule_label(candidate: Row, reference: Row, min_gap: float = 0.01, min_seeds: int = 3,
               key: str = 'test_accuracy_pooled') -> tuple[str, float, float]:
  """(label, d, s): seed_rule (below) on two rows' `key` (experiments/configs/shakespeare_field.py)."""
  return seed_rule((*candidate.pooled[key], candidate.num_seeds),
                   (*reference.pooled[key], reference.num_seeds), min_gap, min_seeds)


def seed_rule(candidate: tuple, reference: tuple, min_gap: float = 0.01,
              min_seeds: int = 3) -> tuple[str, float, float]:
  """(label, d, s): the pre-declared rule between two rows, each (mean, std, number of seeds).

  d = the candidate's mean over seeds minus the reference's, s = the pooled seed std
  sqrt((s_c^2 + s_r^2) / 2). 'helps' if d >= max(min_gap, 2 s), 'hurts' if d <= -max(min_gap, 2 s),
  else 'level'; 'undecided' while either row has fewer than min_seeds seeds."""
  (c_mean, c_std, c_seeds), (r_mean, r_std, r_seeds) = candidate, reference
  d = c_mean - r_mean
  s = math.sqrt((c_std ** 2 + r_std ** 2) / 2)
  if min(c_seeds, r_seeds) < min_seeds or math.isnan(d + s):
    return 'undecided', d, s
  bar = max(min_gap, 2 * s)
  return ('helps' if d >= bar else 'hurts' if d <= -bar else 'level'), d, s


def reference_gaps(rows: list[Row], reference: str) -> dict:
  """The reference method against every other method at the same eps: (config, setting without
  eps) -> {other method: {eps label: (reference row, other row, gap, gap / pooled std)}}, for the
  settings where the reference method has a result."""
  by_setting = collections.defaultdict(dict)
  for r in rows:
    if not math.isnan(r.final_acc[0]):
      by_setting[(r.config_name, r.setting)][r.method] = r
  gaps = collections.defaultdict(lambda: collections.defaultdict(dict))
  for (config_name, _), methods in sorted(by_setting.items()):
    ref = methods.get(reference)
    if ref is None:
      continue
    for method, other in methods.items():
      if method != reference:
        gaps[(config_name, ref.rest)][method][eps_label(ref)] = (ref, other, *_gap(ref, other))
  return gaps


def variant_gaps(rows: list[Row]) -> list[tuple[Row, Row, float, float]]:
  """(variant, baseline, gap, gap / pooled std) for each row whose setting is another row's plus
  extra arguments (e.g. noise=banded,bands=2 on top of eps=1), same config and method: what the
  extra arguments change. Only the closest baseline (the most shared arguments) is used."""
  pairs = []
  by_method = collections.defaultdict(list)
  for r in rows:
    if not math.isnan(r.final_acc[0]):
      by_method[(r.config_name, r.method)].append(r)
  for _, group in sorted(by_method.items()):
    for variant in group:
      bases = [b for b in group if b is not variant and set(b.setting_args) < set(variant.setting_args)
               and all(format_value(variant.setting_args[k]) == format_value(v)
                       for k, v in b.setting_args.items())]
      if bases:
        base = max(bases, key=lambda b: len(b.setting_args))
        pairs.append((variant, base, *_gap(variant, base)))
  return sorted(pairs, key=lambda p: (p[0].config_name, p[0].rest, p[0].method,
                                      -eps_sort_key(eps_label(p[0]))))


def eps_label(row: Row) -> str:
  eps = row.eps_setting if row.eps_setting is not None else row.epsilon
  return format_value(float(eps))


def eps_sort_key(label: str) -> float:
  return float(label)
