"""What every binary shares: one-line errors, a clean stop, and `--config.<field>` fixes.

`run(main)` replaces `absl.app.run(main)` in experiments/train.py, launch/sweep.py,
experiments/report/, experiments/audit.py and benchmarks/client_throughput.py:

- The project's own errors (a bad config field, a missing dataset, a NaN loss, out of memory, a
  refused workdir, a file-system error) and flag errors print one line, `error: <message>`, on
  stderr and exit with 2. `-v 1` (or the environment variable DP2FEDSAM_TRACEBACK=1) prints the
  traceback first. Any other exception is a bug and keeps its traceback.
- Ctrl-C prints one line and exits with 130. Inside train_and_evaluate, Ctrl-C and SIGTERM stop the
  run at the next round boundary and exit with 130 and 143 (the protocol: stopping.py).
- `--config.<field>=None` sets an optional field (e.g. dp.target_epsilon) to None; an unknown
  `--config.<field>` is refused naming the closest field.
- A quiet console (`log_to_file`): everything logged goes to absl's log file, stderr shows only the
  project's own lines (the run header, one line per evaluation) and warnings; orbax's ~60 INFO lines
  per checkpoint stay in the file. `--alsologtostderr` or `-v 1` shows everything again.

This module imports no JAX, so that importing it is cheap.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging as std_logging
import os
import re
import signal
import sys
import traceback
from typing import Callable

from absl import app
from absl import flags
from absl import logging as absl_logging

from dp2fedsam_jax import config_help, stopping

EXIT_ERROR = 2
TRACEBACK_ENV = 'DP2FEDSAM_TRACEBACK'

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PROJECT_PACKAGES = ('dp2fedsam_jax', 'experiments', 'launch', 'benchmarks')


class FlagError(ValueError):
  """A command-line flag cannot be applied (unknown --config field, bad value)."""


# ---------------------------------------------------------------------------------------------
# Errors


def _in_project(path: str) -> bool:
  """A file of this project's packages, in a checkout or installed from the wheel (site-packages)."""
  return any(path.startswith(os.path.join(_ROOT, package) + os.sep) for package in _PROJECT_PACKAGES)


def _raised_in_project(error: BaseException) -> bool:
  """Raised by a `raise` statement of this project (not by a library it called)."""
  tb = traceback.extract_tb(error.__traceback__)
  if not tb:
    return False
  path = os.path.abspath(tb[-1].filename)
  return _in_project(path) and (tb[-1].line or '').lstrip().startswith('raise')


def is_user_error(error: BaseException) -> bool:
  """An error the user can fix from its message, as opposed to a bug (which keeps its traceback)."""
  if isinstance(error, (flags.Error, app.UsageError, FlagError)):
    return True
  if type(error).__module__.split('.')[0] in _PROJECT_PACKAGES:  # ConfigError, OutOfMemoryError, ...
    return True
  if isinstance(error, OSError) and error.filename is not None:  # a path the user gave
    return True
  return isinstance(error, (ValueError, FloatingPointError)) and _raised_in_project(error)


def error_line(error: BaseException) -> str:
  """`error: <message>` on one line."""
  if isinstance(error, OSError) and error.filename is not None and error.strerror:
    message = f'{error.filename}: {error.strerror}'
  else:
    message = str(error) or type(error).__name__
  message = ' '.join(line.strip() for line in message.splitlines() if line.strip())
  return f'error: {message}'


def _want_traceback() -> bool:
  if os.environ.get(TRACEBACK_ENV, '') not in ('', '0'):
    return True
  return _verbosity_at_start >= 1


_verbosity_at_start = -1  # -v as given on the command line (binaries may lower it later)


def _exit_with(error: BaseException) -> None:
  if _want_traceback():
    traceback.print_exception(error)
  sys.stdout.flush()
  print(error_line(error), file=sys.stderr, flush=True)
  sys.exit(EXIT_ERROR)


# ---------------------------------------------------------------------------------------------
# --config.<field> flags


def execute_file(path: str, flag: str = '--config', module_name: str = '_cli_config_file'):
  """Executes the Python file `path` as a module (its registrations run) and returns the module."""
  module_spec = importlib.util.spec_from_file_location(module_name, path)
  if module_spec is None or module_spec.loader is None or not os.path.isfile(path):
    raise FlagError(f'{flag}={path}: no such Python file')
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def load_config_file(spec: str):
  """The ConfigDict of 'path.py' or 'path.py:arg', loaded the way ml_collections loads it."""
  path, sep, arg = spec.partition(':')
  if not os.path.isfile(path):
    raise FlagError(f'--config={spec}: no such config file')
  module = execute_file(path)
  return module.get_config(arg) if sep else module.get_config()


def field_paths(config, prefix: str = '') -> list[str]:
  """Every field of a ConfigDict as a dotted path (sub-dicts and their leaves)."""
  paths = []
  for key in config.keys():
    value = config[key]
    paths.append(prefix + key)
    if hasattr(value, 'keys') and callable(value.keys):
      paths.extend(field_paths(value, prefix + key + '.'))
  return paths


def closest_field(path: str, paths: list[str]) -> str | None:
  """The field a mistyped path most likely meant (same leaf name elsewhere, or a near spelling)."""
  leaf = path.rsplit('.', 1)[-1]
  same_leaf = [p for p in paths if p.rsplit('.', 1)[-1] == leaf]
  if same_leaf:
    return same_leaf[0]
  scored = [(max(difflib.SequenceMatcher(None, path, p).ratio(),
                 difflib.SequenceMatcher(None, leaf, p.rsplit('.', 1)[-1]).ratio()), p)
            for p in paths]
  score, best = max(scored, default=(0.0, None))
  return best if score >= 0.6 else None


def unknown_field_message(flag: str, path: str, paths: list[str]) -> str:
  if path in config_help.RENAMED_FIELDS:
    return f'--{flag}.{path}: ' + config_help.renamed_field_message(path)
  leaves = [p for p in paths if not any(q.startswith(p + '.') for q in paths)]
  guess = closest_field(path, leaves)
  hint = f'did you mean --{flag}.{guess}?' if guess else 'add --print_config to list every field'
  return f'--{flag}.{path}: the config has no field {path!r}; {hint}'


def _has_field(config, path: str) -> bool:
  node = config
  for part in path.split('.'):
    if not (hasattr(node, 'keys') and part in node.keys()):
      return False
    node = node[part]
  return True


def _overrides(argv: list[str], flag: str) -> list[tuple[str, str, str]]:
  """(argument, field path, value text) of each --flag.path=value in argv."""
  out = []
  for arg in argv:
    match = re.fullmatch(rf'--?(?:no)?{flag}\.([^=]+)(?:=(.*))?', arg, re.DOTALL)
    if match:
      out.append((arg, match.group(1), match.group(2)))
  return out


def _config_spec(argv: list[str], flag: str) -> str | None:
  for i, arg in enumerate(argv):
    if arg.startswith(f'--{flag}='):
      return arg.split('=', 1)[1]
    if arg == f'--{flag}' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS,
                config_flag: str | None = 'config') -> list[str]:
  """Parses argv into flag_values like absl does, with the `--config.<field>` fixes above.

  Raises flags.Error or FlagError (one line each) instead of ml_collections' chained tracebacks.
  """
  global _verbosity_at_start
  nones = []
  if config_flag and config_flag in flag_values:
    nones = [(a, p) for a, p, v in _overrides(argv[1:], config_flag) if v in ('None', 'none')]
  kept = [a for a in argv if a not in {a for a, _ in nones}]
  saved_argv = sys.argv
  sys.argv = kept  # ml_collections reads the --config.x overrides from sys.argv
  try:
    rest = flag_values(kept)
  except flags.Error:
    raise
  except Exception as e:  # ml_collections: AttributeError/KeyError for a field that is not there
    if not (config_flag and config_flag in flag_values):
      raise
    raise _diagnose_config_flags(kept, config_flag, e) from e
  finally:
    sys.argv = saved_argv
  if 'verbosity' in flag_values:
    _verbosity_at_start = flag_values['verbosity'].value
  if nones:
    config = flag_values[config_flag].value
    paths = field_paths(config)
    for _, path in nones:
      if not _has_field(config, path):
        raise FlagError(unknown_field_message(config_flag, path, paths))
      *parents, leaf = path.split('.')
      node = config
      for p in parents:
        node = node[p]
      node[leaf] = None
  return rest


def _diagnose_config_flags(argv: list[str], flag: str, error: Exception) -> Exception:
  """Which --config.x could not be applied, and the field it probably meant."""
  spec = _config_spec(argv, flag)
  if spec is None:
    return FlagError(f'--{flag}.<field> needs --{flag}=<file> before it ({error})')
  try:
    config = load_config_file(spec)
  except Exception as load_error:  # pylint: disable=broad-except
    return FlagError(f'--{flag}={spec}: cannot load it ({type(load_error).__name__}: '
                     f'{load_error})')
  paths = field_paths(config)
  for _, path, _ in _overrides(argv, flag):
    if not _has_field(config, path):
      return FlagError(unknown_field_message(flag, path, paths))
  return FlagError(f'--{flag}: {type(error).__name__}: {error}')


# ---------------------------------------------------------------------------------------------
# The console


def _stderr_threshold() -> int:
  """The level from which absl's own handler also writes a record to stderr (--stderrthreshold)."""
  return absl_logging.converter.string_to_standard(flags.FLAGS['stderrthreshold'].value)


def is_console_record(record: std_logging.LogRecord) -> bool:
  """What the quiet console shows: this project's own lines, and warnings and errors of anyone."""
  if record.levelno >= std_logging.WARNING:
    return record.levelno < _stderr_threshold()  # else absl's handler writes it to stderr itself
  path = os.path.abspath(record.pathname)
  return _in_project(path)


class _Console(std_logging.Handler):
  """The quiet console: is_console_record's lines, in absl's format, on the current sys.stderr."""

  def __init__(self):
    super().__init__()
    self.setFormatter(absl_logging.PythonFormatter())
    self.addFilter(is_console_record)

  def emit(self, record: std_logging.LogRecord) -> None:
    try:
      sys.stderr.write(self.format(record) + '\n')
      sys.stderr.flush()
    except Exception:  # pylint: disable=broad-except
      self.handleError(record)


def shows_everything_on_stderr() -> bool:
  """--logtostderr, --alsologtostderr or -v 1 and above: every log line on stderr, as absl does."""
  f = flags.FLAGS
  return f['logtostderr'].value or f['alsologtostderr'].value or _verbosity_at_start >= 1


def log_to_file(log_dir: str, program_name: str) -> str | None:
  """Sends every log record to absl's log file in log_dir and leaves the console quiet.

  The file (`<program>.<host>.<user>.log.INFO.<time>.<pid>`, linked as `<program>.INFO`) gets all
  records, library chatter included; stderr gets what `is_console_record` accepts. With
  --alsologtostderr or -v 1, stderr gets every record too; with --logtostderr there is no file
  (absl's meaning). Returns the file's path, or None with --logtostderr.
  """
  f = flags.FLAGS
  if f['logtostderr'].value:
    return None
  handler = absl_logging.get_absl_handler()
  handler.start_logging_to_file(program_name=program_name, log_dir=log_dir)
  root = std_logging.getLogger()
  for old in [h for h in root.handlers if isinstance(h, _Console)]:  # a second call replaces it
    root.removeHandler(old)
  if shows_everything_on_stderr():
    f['alsologtostderr'].value = True  # -v 1: absl's own handler mirrors every record
  else:
    root.addHandler(_Console())
  return handler.python_handler.stream.name


# ---------------------------------------------------------------------------------------------
# The entry point


class _QuietMissingTpu(std_logging.Filter):
  """Drops jax's INFO line about a missing libtpu.so, printed on every CPU/GPU machine."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not (record.levelno < std_logging.WARNING
                and 'Unable to initialize backend' in str(record.msg))


def quiet_jax_backend_probe() -> None:
  std_logging.getLogger('jax._src.xla_bridge').addFilter(_QuietMissingTpu())


def run(main: Callable[[list[str]], object],
        flags_parser: Callable[[list[str]], list[str]] | None = None) -> None:
  """absl.app.run(main) with one-line errors (exit 2) and a clean stop (Ctrl-C: 130, SIGTERM: 143)."""
  stopping.set_hard_exit()
  quiet_jax_backend_probe()

  def parser(argv: list[str]) -> list[str]:
    try:
      return flags_parser(argv) if flags_parser else parse_flags(argv)
    except KeyboardInterrupt:
      print('interrupted', file=sys.stderr)
      sys.exit(stopping.EXIT_INTERRUPTED)
    except Exception as e:  # pylint: disable=broad-except
      if not is_user_error(e):
        raise
      _exit_with(e)

  def wrapped_main(argv: list[str]):
    try:
      return main(argv)
    except BrokenPipeError:  # `... | head`: the reader left; say nothing more
      devnull = os.open(os.devnull, os.O_WRONLY)
      os.dup2(devnull, sys.stdout.fileno())
      sys.exit(1)
    except KeyboardInterrupt as e:
      for signum in stopping.STOP_SIGNALS:  # exiting: a second signal changes nothing
        signal.signal(signum, signal.SIG_IGN)
      sys.stdout.flush()
      print(str(e) or 'interrupted', file=sys.stderr, flush=True)
      sys.exit(getattr(e, 'exit_code', stopping.EXIT_INTERRUPTED))
    except Exception as e:  # pylint: disable=broad-except
      if not is_user_error(e):
        raise
      _exit_with(e)

  app.run(wrapped_main, flags_parser=parser)
