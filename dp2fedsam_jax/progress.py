"""A one-line progress display for the round loop: redrawn in place on a terminal, silent otherwise.

On a TTY the line shows the round, the last evaluated accuracy and epsilon (with the round they
belong to: both are computed only at evaluation rounds), seconds per round and the time left. When
stderr is a file or a pipe (sweeps, CI, notebooks' captured logs) it writes nothing: the logging
lines at evaluation rounds are the record there.
"""

from __future__ import annotations

import math
import sys
from typing import TextIO


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  return f'{hours}h{rest // 60:02d}m' if hours else f'{rest // 60}m{rest % 60:02d}s'


class RoundProgress:
  """`update(...)` after every round, `close()` at the end (ends the line on a TTY)."""

  def __init__(self, total_rounds: int, stream: TextIO | None = None, enabled: bool | None = None):
    self.total_rounds = total_rounds
    self.stream = stream if stream is not None else sys.stderr
    if enabled is None:
      isatty = getattr(self.stream, 'isatty', None)
      enabled = bool(isatty and isatty())
    self.enabled = enabled
    self._last_width = 0
    self._accuracy: tuple[int, float] | None = None
    self._epsilon: tuple[int, float] | None = None

  def format_line(self, round_index: int, seconds_per_round: float) -> str:
    parts = [f'round {round_index}/{self.total_rounds}']
    if self._accuracy is not None:
      r, acc = self._accuracy
      parts.append(f'acc {100 * acc:.2f}% (r{r})')
    if self._epsilon is not None:
      r, eps = self._epsilon
      parts.append(f'eps {eps:.3f} (r{r})' if math.isfinite(eps) else 'eps inf')
    parts.append(f'{seconds_per_round:.2f} s/round')
    left = self.total_rounds - round_index
    if left > 0:
      parts.append(f'{_duration(left * seconds_per_round)} left')
    return ' | '.join(parts)

  def update(self, round_index: int, seconds_per_round: float, accuracy: float | None = None,
             epsilon: float | None = None) -> None:
    if accuracy is not None:
      self._accuracy = (round_index, float(accuracy))
    if epsilon is not None:
      self._epsilon = (round_index, float(epsilon))
    if not self.enabled:
      return
    line = self.format_line(round_index, seconds_per_round)
    pad = max(0, self._last_width - len(line))  # erase what a longer previous line left behind
    self.stream.write('\r' + line + ' ' * pad)
    self.stream.flush()
    self._last_width = len(line)

  def clear(self) -> None:
    """Erases the line, so that a log line can be written; the next update redraws it."""
    if self.enabled and self._last_width:
      self.stream.write('\r' + ' ' * self._last_width + '\r')
      self.stream.flush()
      self._last_width = 0

  def close(self) -> None:
    if self.enabled and self._last_width:
      self.stream.write('\n')
      self.stream.flush()
    self._last_width = 0
