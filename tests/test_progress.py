"""The per-round progress line: redrawn in place on a TTY, silent otherwise, and wired into training."""

import io
import re
import sys

from conftest import tiny_config
from dp2fedsam_jax import train
from dp2fedsam_jax.progress import RoundProgress


def _numbers_by_field(frame: str) -> list[list[str]]:
  """The numbers of each ' | '-separated field of a drawn line (round, acc, eps, s/round, time left)."""
  return [re.findall(r'\d+(?:\.\d+)?', field) for field in frame.strip().split(' | ')]


class FakeTTY(io.StringIO):
  def isatty(self):
    return True


def test_tty_line_is_redrawn_in_place_and_keeps_the_last_eval():
  stream = FakeTTY()
  p = RoundProgress(10, stream)
  p.update(1, 2.0)
  p.update(2, 2.0, accuracy=0.5, epsilon=1.25)
  p.update(3, 3.0)
  p.close()
  text = stream.getvalue()
  frames = text.split('\r')[1:]
  assert len(frames) == 3 and text.endswith('\n') and '\n' not in text[:-1]
  # Round 1 of 10 at 2 s a round: 0 min 18 s left.
  assert _numbers_by_field(frames[0]) == [['1', '10'], ['2.00'], ['0', '18']]
  assert 'acc' not in frames[0]
  # Round 3 was not evaluated: it shows round 2's accuracy and epsilon, labelled as such.
  assert _numbers_by_field(frames[2])[:4] == [['3', '10'], ['50.00', '2'], ['1.250', '2'], ['3.00']]
  assert frames[2].count('(r2)') == 2


def test_shorter_line_erases_the_longer_one():
  stream = FakeTTY()
  p = RoundProgress(100, stream)
  p.update(9, 1.0, accuracy=0.5, epsilon=float('inf'))
  first = stream.getvalue()
  p.update(100, 1.0)
  second = stream.getvalue()[len(first):]
  assert 'eps inf' in first and len(second) >= len(first)


def test_silent_when_not_a_tty():
  stream = io.StringIO()
  p = RoundProgress(5, stream)
  p.update(1, 1.0, accuracy=0.3, epsilon=0.5)
  p.clear()
  p.close()
  assert stream.getvalue() == ''


def test_training_draws_a_line_per_round_on_a_tty(tmp_path, monkeypatch):
  stream = FakeTTY()
  monkeypatch.setattr(sys, 'stderr', stream)
  train.train_and_evaluate(tiny_config(num_rounds=3, eval_every=2), str(tmp_path))
  frames = [f for f in stream.getvalue().split('\r') if f.startswith('round ')]
  assert [f.split('/')[0] for f in frames] == ['round 1', 'round 2', 'round 3']
  assert 'acc' not in frames[0] and '(r2)' in frames[1] and '(r3)' in frames[2]
