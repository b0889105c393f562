"""The PNGs: accuracy, update norm and clip norm against the round per setting, and final accuracy
against eps where settings differ only in eps. Matplotlib comes with the `[report]` extra."""

from __future__ import annotations

import collections
import functools
import math
import os
import re

import numpy as np

from experiments.report.summary import mean_std
from experiments.report.workdirs import RunResult, format_value, setting_label


# 24 colours (matplotlib's tab10, its lighter tab20 twins, then four dark ones) and 11 markers: a
# method's (colour, marker) pair is its own for up to 264 methods; the first 10 differ in hue alone,
# the next ones in hue and line style.
_COLOURS = [f'tab:{hue}' for hue in ('blue', 'orange', 'green', 'red', 'purple', 'brown', 'pink',
                                     'gray', 'olive', 'cyan')]
_LIGHT = ['#aec7e8', '#ffbb78', '#98df8a', '#ff9896', '#c5b0d5', '#c49c94', '#f7b6d2', '#c7c7c7',
          '#dbdb8d', '#9edae5']
_DARK = ['black', '#393b79', '#8c6d31', '#843c39']
_MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X', '<', '>', 'h', '*')


def method_styles(methods: list[str]) -> dict:
  """One look per method across every plot: a colour of 24 and a marker of 11, so that no two of
  up to 264 methods look alike; past 10 methods the line style changes with the colours."""
  colours = _COLOURS + _LIGHT + _DARK
  return {m: {'color': colours[i % len(colours)], 'linestyle': ('-', '--', ':')[i // 10 % 3],
              'marker': _MARKERS[i % len(_MARKERS)]} for i, m in enumerate(methods)}


def _new_axes():
  import matplotlib
  matplotlib.use('Agg')  # files only: no display needed
  import matplotlib.pyplot as plt
  return plt.subplots(figsize=(6.4, 4.2), dpi=120)


def _save(fig, ax, title: str, path: str) -> None:
  import matplotlib.pyplot as plt
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  if len(ax.get_legend_handles_labels()[1]) > 6:  # many methods: the legend goes beside the axes
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.set_size_inches(9.6, 4.8)
  else:
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def _safe(text: str) -> str:
  return re.sub(r'[^A-Za-z0-9_.=,+-]+', '_', text)


def _curves(group: list[RunResult], key: str, per_round: bool = False):
  """(rounds, mean, std) over seeds at the rounds every seed has (per_round: from the runs'
  train_metrics.jsonl, else at the evaluated rounds)."""
  lines = {id(r): (r.rounds if per_round else r.records) for r in group}
  common = sorted(set.intersection(*({rec['round'] for rec in lines[id(r)] if key in rec}
                                     for r in group)))
  values = np.array([[next(rec[key] for rec in lines[id(r)] if rec['round'] == rnd)
                      for rnd in common] for r in group], dtype=float)
  std = values.std(axis=0, ddof=1) if len(group) > 1 else np.zeros(len(common))
  return np.array(common), values.mean(axis=0), std


def _off_scale_limit(values: np.ndarray) -> float | None:
  """The top of the y axis when a few values are orders of magnitude above the rest (a blow-up in
  the first rounds of DP-FedAvg reaches 1e19 while every later norm is near 1): 3x the largest of
  the rest, so that the curves stay readable; None when nothing is that far out."""
  values = values[np.isfinite(values)]
  if not len(values) or np.median(values) <= 0:
    return None
  rest = values[values <= 100 * np.median(values)]
  return 3 * rest.max() if len(rest) < len(values) else None


def _plot_curves(by_method: dict, key: str, ylabel: str, title: str, path: str, colors: dict,
                 scale=1.0, per_round: bool = False, off_scale: bool = False) -> None:
  """One line per method with its seed band; the legend in the order of the final values."""
  fig, ax = _new_axes()
  curves = {m: _curves(g, key, per_round) for m, g in sorted(by_method.items())}
  means = np.concatenate([c[1] for c in curves.values()] or [np.zeros(0)])
  top = _off_scale_limit(means) if off_scale else None
  shown = means if top is None else means[means <= top]
  # Norms that still span orders of magnitude (after the off-scale ones) get a log axis.
  log = bool(len(shown)) and shown.min() > 0 and shown.max() / shown.min() > 100
  if log:
    ax.set_yscale('log')
  # The legend lists the methods from the highest final value down, as the lines end.
  ranked = sorted(by_method, key=lambda m: (-curves[m][1][-1] if len(curves[m][0]) else 0.0, m))
  for method in ranked:
    group = by_method[method]
    rounds, mean, std = curves[method]
    if not len(rounds):
      continue
    lower, upper = mean - std, mean + std
    if log:  # a band below zero cannot be drawn on a log axis: floor it under the lowest mean
      lower = np.maximum(lower, 0.5 * shown.min())
    style = colors[method]
    ax.plot(rounds, scale * mean, marker=style['marker'], markersize=3, color=style['color'],
            linestyle=style['linestyle'], label=f'{method} (n={len(group)})')
    ax.fill_between(rounds, scale * lower, scale * upper, color=style['color'], alpha=0.2,
                    linewidth=0)
    for rnd, value in ([] if top is None else zip(rounds, mean)):
      if value > top:  # drawn at the top edge, labelled with its value
        ax.plot([rnd], [scale * top], marker='^', color=style['color'], markersize=7, clip_on=False)
        ax.annotate(f'off scale: {scale * value:.1e}', (rnd, scale * top), xytext=(4, -10),
                    textcoords='offset points', fontsize=7, color=style['color'])
  if top is not None:
    ax.set_ylim(top=scale * top)
    if not log:
      ax.set_ylim(bottom=min(0.0, scale * shown.min()))
  ax.set_xlabel('round')
  from matplotlib.ticker import MaxNLocator  # pylint: disable=import-outside-toplevel
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
  ax.set_ylabel(ylabel + (' (log scale)' if log else ''))
  _save(fig, ax, title, path)


def _plot_vs_eps(points: dict, title: str, path: str, colors: dict) -> None:
  """points: method -> list of (eps, mean, std, seeds). Each method with finite eps is a line with
  seed-std error bars; eps = inf (non-private, or clipping only) a dashed horizontal line. The y
  axis spans the methods drawn at two eps or more; a point or line far outside that span (a
  collapsed ceiling at 10 %) would flatten them, so it is listed in a note on the axes instead.
  A log eps axis when the eps span a factor of 4 or more."""
  fig, ax = _new_axes()
  curves = {m: sorted(p for p in pts if math.isfinite(p[0]) and p[0] > 0)
            for m, pts in points.items()}
  focus = [p for pts in curves.values() if len(pts) >= 2 for p in pts] or [
      p for pts in curves.values() for p in pts]
  lows = [100 * (p[1] - np.nan_to_num(p[2])) for p in focus]
  highs = [100 * (p[1] + np.nan_to_num(p[2])) for p in focus]
  low, high = (min(lows), max(highs)) if focus else (0.0, 100.0)
  slack = max(2.0, high - low)
  keep = (low - slack, high + slack)
  off = []
  for method in sorted(points):
    style = colors[method]
    finite = curves[method]
    shown = [p for p in finite if keep[0] <= 100 * p[1] <= keep[1]]
    off += [f'{method} {100 * p[1]:.1f} % at ε = {p[0]:.3g}' for p in finite if p not in shown]
    if shown:
      eps, mean, std, seeds = (np.array(v) for v in zip(*shown))
      n = f'{seeds.min()}' if seeds.min() == seeds.max() else f'{seeds.min()}–{seeds.max()}'
      ax.errorbar(eps, 100 * mean, yerr=100 * np.nan_to_num(std), marker=style['marker'],
                  capsize=3, color=style['color'], linestyle=style['linestyle'],
                  label=f'{method} ({n} seed{"" if n == "1" else "s"})')
      bars = 100 * np.nan_to_num(std)
      low, high = min(low, *(100 * mean - bars)), max(high, *(100 * mean + bars))
    # Horizontal lines: non-private runs (ε = ∞) and local_only (nothing released, ε = 0).
    for at, linestyle, eps_text in ((lambda e: not math.isfinite(e), '--', '∞'),
                                    (lambda e: e == 0, ':', '0')):
      line = [p[1] for p in points[method] if at(p[0])]
      if not line:
        continue
      value = 100 * float(np.mean(line))
      if keep[0] <= value <= keep[1]:
        ax.axhline(value, linestyle=linestyle, color=style['color'],
                   label=f'{method} (ε = {eps_text})')
        low, high = min(low, value), max(high, value)
      else:
        off.append(f'{method} {value:.1f} % at ε = {eps_text}')
  finite_eps = sorted({round(p[0], 6) for pts in curves.values() for p in pts})
  if finite_eps and finite_eps[0] > 0 and finite_eps[-1] / finite_eps[0] >= 4:
    ax.set_xscale('log')
    ax.set_xticks(finite_eps)
    ax.set_xticklabels([f'{e:.3g}' for e in finite_eps])
    ax.minorticks_off()
  pad = max(0.3, 0.05 * (high - low))
  ax.set_ylim(low - pad, high + pad)
  if off:
    ax.text(0.01, 0.01, 'off scale: ' + '; '.join(off), transform=ax.transAxes, fontsize=7,
            va='bottom', ha='left', wrap=True)
  ax.set_xlabel('ε (reached after the final round)' + (', log scale' if ax.get_xscale() == 'log'
                                                       else ''))
  ax.set_ylabel('final-round test accuracy (%)')
  _save(fig, ax, title, path)


def write_plots(runs: list[RunResult], out: str) -> list[str]:
  """Draws every plot of plot_plan; returns their paths."""
  paths = []
  for path, draw in plot_plan(runs, out):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    draw(path)
    paths.append(path)
  return paths


def plot_plan(runs: list[RunResult], out: str) -> list[tuple]:
  """[(path, draw)]: each plot's path and the function that draws it there (nothing drawn yet)."""
  plan = []
  # One colour per method across every plot.
  colors = method_styles(sorted({r.method for r in runs}))
  groups = collections.defaultdict(lambda: collections.defaultdict(list))
  for run in runs:
    groups[(run.config_name, setting_label(run.setting))][run.method].append(run)
  for (config_name, setting), by_method in sorted(groups.items()):
    directory = os.path.join(out, _safe(config_name))
    title = f'{config_name}: {setting} (mean ± std over seeds)'
    plan.append((os.path.join(directory, f'{_safe(setting)}_accuracy.png'), functools.partial(
        _plot_curves, by_method, 'test_accuracy', 'test accuracy (%)', title, colors=colors,
        scale=100.0)))
    # Every round where every run has its per-round file (runs that predate it: evaluated rounds).
    per_round = all(r.rounds for group in by_method.values() for r in group)
    plan.append((os.path.join(directory, f'{_safe(setting)}_update_norm.png'), functools.partial(
        _plot_curves, by_method, 'mean_update_norm', 'mean update norm before clipping', title,
        colors=colors, per_round=per_round, off_scale=True)))
    if all(r.rounds and 'clip_norm' in r.rounds[0] for g in by_method.values() for r in g):
      plan.append((os.path.join(directory, f'{_safe(setting)}_clip_norm.png'), functools.partial(
          _plot_curves, by_method, 'clip_norm', 'clip norm C', title, colors=colors,
          per_round=True)))  # adaptive clipping's C_t

  # Accuracy vs epsilon: settings that differ only in eps.
  by_rest = collections.defaultdict(lambda: collections.defaultdict(list))
  for row_group in _group_final(runs).items():
    (config_name, rest, method), pts = row_group
    by_rest[(config_name, rest)][method].extend(pts)
  for (config_name, rest), points in sorted(by_rest.items()):
    eps_values = {round(p[0], 6) for pts in points.values() for p in pts
                  if math.isfinite(p[0]) and p[0] > 0}
    if len(eps_values) < 2:
      continue
    path = os.path.join(out, _safe(config_name), f'{_safe(rest)}_accuracy_vs_eps.png')
    plan.append((path, functools.partial(
        _plot_vs_eps, points, f'{config_name}: final accuracy vs ε ({rest}; mean ± std over seeds)',
        colors=colors)))
  return plan


def _group_final(runs: list[RunResult]) -> dict:
  """(config, setting without eps, method) -> [(eps reached, final acc mean, std, seeds)] per eps, over
  finished runs (a run stopped early has reached a smaller epsilon than its setting's)."""
  groups = collections.defaultdict(list)
  for run in runs:
    if not run.finished:
      continue
    rest = setting_label({k: v for k, v in run.setting.items() if k != 'eps'})
    eps_key = format_value(run.setting.get('eps', run.records[-1]['epsilon']))
    groups[(run.config_name, rest, run.method, eps_key)].append(run)
  out = collections.defaultdict(list)
  for (config_name, rest, method, _), group in groups.items():
    mean, std = mean_std([r.records[-1]['test_accuracy'] for r in group])
    eps = float(np.mean([r.records[-1]['epsilon'] for r in group]))
    out[(config_name, rest, method)].append((eps, mean, std, len(group)))
  return out
