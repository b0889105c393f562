"""orbax's INFO lines (dp2fedsam_jax/checkpoint.py's filter on absl's logger): kept out of a notebook's
or a script's output, kept where absl writes a log file (the binary's train.INFO) and with -v 1."""

import logging

import jax.numpy as jnp
import pytest
from absl import logging as absl_logging

from dp2fedsam_jax import checkpoint
from dp2fedsam_jax.state import ServerState


class _Records(logging.Handler):
  def __init__(self):
    super().__init__(logging.DEBUG)
    self.records = []

  def emit(self, record):
    self.records.append(record)


@pytest.fixture
def info_records():
  """Every record of absl's logger at INFO verbosity, as a notebook that asks for INFO lines sees."""
  handler, logger = _Records(), logging.getLogger('absl')
  # The logger's own level, not get_verbosity(): an unset level (0) reads as the root's WARNING, and
  # setting that back would hide every later test's INFO lines.
  verbosity, level = absl_logging.get_verbosity(), logger.level
  absl_logging.set_verbosity(absl_logging.INFO)
  logger.addHandler(handler)
  yield handler.records
  logger.removeHandler(handler)
  absl_logging.set_verbosity(verbosity)
  logger.setLevel(level)


def _save_and_restore(workdir: str) -> None:
  state = ServerState(round=jnp.int32(1), shared={'w': jnp.ones(3)}, personal={'h': jnp.zeros((2, 3))},
                      times_sampled=jnp.zeros(2, jnp.int32))
  checkpoint.save(workdir, state, [{'round': 1}])
  assert int(checkpoint.restore_run(workdir, state.replace(round=jnp.int32(0))).state.round) == 1
  absl_logging.info('the project line')


def _orbax_info(records) -> list:
  return [r for r in records if r.levelno < logging.WARNING and checkpoint._ORBAX_DIR in r.pathname]


def test_a_checkpoint_logs_no_orbax_info_line_without_a_log_file(tmp_path, info_records):
  _save_and_restore(str(tmp_path))
  assert not _orbax_info(info_records)
  assert [r.getMessage() for r in info_records] == ['the project line']


@pytest.mark.parametrize('where', ['log file', '-v 1'])
def test_orbax_info_lines_go_to_a_log_file_and_with_verbose(tmp_path, info_records, monkeypatch, where):
  if where == 'log file':
    monkeypatch.setattr(checkpoint, '_absl_writes_a_file', lambda: True)
  else:
    absl_logging.set_verbosity(absl_logging.DEBUG)
  _save_and_restore(str(tmp_path))
  assert len(_orbax_info(info_records)) > 10
