"""What a researcher sees first: one-line errors, Ctrl-C, --config.x fixes, the config's help, and the
messages of the round loop."""

import json
import logging
import os
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from absl import flags

from conftest import TINY_FLAGS, tiny_config
from dp2fedsam_jax import cli, config_help, train
from dp2fedsam_jax.config import base_config, ConfigError, validate_config
from dp2fedsam_jax.config_help import FIELD_HELP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = 'experiments/configs/default.py'


def _binary(*args, env=None, timeout=300):
  return subprocess.run([sys.executable, '-m', *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, env={**os.environ, **(env or {})})


def _train_flags(argv):
  from experiments import train as train_binary
  fv = flags.FlagValues()
  train_binary.define_flags(fv)
  cli.parse_flags(['train', *argv], fv)
  return fv


# --- --config.<field> flags -------------------------------------------------------------------


def test_none_unsets_an_optional_field():
  fv = _train_flags([f'--config={DEFAULT}', '--config.dp.target_epsilon=None',
                     '--config.dp.noise_multiplier=1.0'])
  assert fv.config.dp.target_epsilon is None and fv.config.dp.noise_multiplier == 1.0
  assert fv.config.num_rounds == 40  # the rest as the file sets it


@pytest.mark.parametrize('flag, message', [
    ('--config.dp.clip_nrom=1', r"no field 'dp.clip_nrom'; did you mean --config.dp.clip_norm\?"),
    ('--config.clip_norm=1', r"no field 'clip_norm'; did you mean --config.dp.clip_norm\?"),
    ('--config.local.lr=0.1', r"no field 'local.lr'; did you mean --config.local.lr_\w+\?"),
    ('--config.foo=1', r"no field 'foo'; add --print_config to list every field"),
    ('--config.dp.foo=None', r"no field 'dp.foo'"),
])
def test_unknown_config_field_names_the_closest(flag, message):
  with pytest.raises(cli.FlagError, match=message):
    _train_flags([f'--config={DEFAULT}', flag])


@pytest.mark.parametrize('old, new', sorted(config_help.RENAMED_FIELDS.items()))
def test_a_renamed_field_fails_with_one_line_naming_the_new_name(old, new):
  with pytest.raises(cli.FlagError) as flag_error:
    _train_flags([f'--config={DEFAULT}', f'--config.{old}=0.1'])
  message = str(flag_error.value)
  assert f'--config.{new}' in message and '\n' not in message, message
  config = base_config()  # a config file that still sets the old field
  parent, _, leaf = old.rpartition('.')
  (config[parent] if parent else config)[leaf] = 0.1
  with pytest.raises(ConfigError, match=f'^config.{old} was renamed config.{new}'):
    validate_config(config)


def test_user_errors_and_bugs_are_told_apart():
  assert cli.is_user_error(ConfigError('config.x=1: bad'))
  assert cli.is_user_error(NotADirectoryError(20, 'Not a directory', '/etc/passwd/x'))
  assert cli.is_user_error(flags.IllegalFlagValueError('flag --x=y: bad'))
  from launch import sweep
  with pytest.raises(ValueError) as raised_here:  # raised by the project's own code
    sweep.apply_overrides(base_config(), ['--config.nope=1'])
  assert cli.is_user_error(raised_here.value)
  with pytest.raises(ValueError) as raised_in_numpy:  # a library's ValueError is a bug: traceback
    np.zeros(3).reshape(2, 2)
  assert not cli.is_user_error(raised_in_numpy.value)
  assert not cli.is_user_error(KeyError('x')) and not cli.is_user_error(TypeError('x'))
  assert cli.error_line(ConfigError('config.a=1: first\nsecond')) == 'error: config.a=1: first second'
  assert cli.error_line(NotADirectoryError(20, 'Not a directory', '/f/x')) == (
      'error: /f/x: Not a directory')


def _error_lines(out):
  return [l for l in out.stderr.splitlines() if l.strip()]


@pytest.mark.parametrize('args, expected', [
    (['experiments.train', f'--config={DEFAULT}', '--config.dp.clip_norm=0.0', '--workdir={tmp}/w'],
     'error: config.dp.clip_norm=0.0: must be a number > 0.'),
    (['experiments.train', f'--config={DEFAULT}', '--config.dp.clip_nrom=1', '--workdir={tmp}/w'],
     "error: --config.dp.clip_nrom: the config has no field 'dp.clip_nrom'; did you mean "
     '--config.dp.clip_norm?'),
    (['experiments.train', f'--config={DEFAULT}', *TINY_FLAGS, '--workdir={tmp}/file/w'],
     'error: --workdir={tmp}/file/w: cannot create it (Not a directory: {tmp}/file/w)'),
    (['launch.sweep', '--config=experiments/configs/fashion_mnist_methods.py', '--root={tmp}/r',
      '--methods=dp2fedsam,dp_fedsma', '--plan'],
     re.compile(r"error: --methods: unknown method 'dp_fedsma'; did you mean dp_fedsam\? .*")),
    (['experiments.report', '--root={tmp}', '--out={tmp}/out'],
     'error: no workdir with metrics.jsonl and config.json under {tmp}'),
    (['experiments.audit', '--config.dp.clip_norm=0'],
     'error: config.dp.clip_norm=0.0: must be a number > 0.'),
    (['benchmarks.client_throughput', '--modes=vmap,threads', '--dry_run'],
     "error: --modes: unknown ['threads']; choose from ['vmap', 'sequential', 'sharded']"),
], ids=['train-config-error', 'train-typo', 'train-workdir-under-a-file', 'sweep-method',
        'report-empty-root', 'audit-config-error', 'benchmark-mode'])
def test_every_binary_prints_one_line_and_exits_2(args, expected, tmp_path):
  (tmp_path / 'file').write_text('a file, not a directory')
  out = _binary(*[a.replace('{tmp}', str(tmp_path)) for a in args])
  assert out.returncode == 2, out.stderr[-3000:]
  lines = _error_lines(out)
  assert len(lines) == 1, out.stderr[-3000:]  # no traceback, no libtpu INFO line
  if isinstance(expected, str):
    assert lines[0] == expected.replace('{tmp}', str(tmp_path))
  else:
    assert expected.fullmatch(lines[0]), lines[0]
  assert not (tmp_path / 'w').exists()  # a bad config fails before the workdir is made


def test_verbose_flag_adds_the_traceback(tmp_path):
  out = _binary('experiments.train', f'--config={DEFAULT}', '--config.dp.clip_norm=0.0',
                f'--workdir={tmp_path}/w', '-v', '1')
  assert out.returncode == 2
  assert 'Traceback (most recent call last)' in out.stderr and 'ConfigError' in out.stderr
  assert _error_lines(out)[-1] == 'error: config.dp.clip_norm=0.0: must be a number > 0.'


# --- the config's help ------------------------------------------------------------------------


def test_every_config_field_has_one_line_of_help():
  from experiments.configs import audit as audit_config
  fields = set(cli.field_paths(base_config())) | set(cli.field_paths(audit_config.get_config()))
  assert sorted(fields - set(FIELD_HELP)) == []  # a new field needs its line in config_help.py
  assert sorted(set(FIELD_HELP) - fields) == []  # and a removed one takes its line along
  assert all('\n' not in text and text for text in FIELD_HELP.values())


def test_print_config_shows_the_resolved_config_with_help_and_exits():
  out = _binary('experiments.train', f'--config={DEFAULT}:eps=1', '--config.dp.clip_norm=0.25',
                '--config.dp.target_epsilon=None', '--config.dp.noise_multiplier=1.5',
                '--print_config')
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.splitlines()
  assert lines[0] == f'# {DEFAULT}:eps=1, resolved'
  by_field = {l.split(' = ')[0]: l for l in lines[1:] if ' = ' in l}
  assert set(by_field) == {p for p in cli.field_paths(base_config())
                           if p not in ('dp', 'dsu', 'local', 'eval')}
  assert re.fullmatch(r'dp\.clip_norm = 0\.25 +# C, clip of .*', by_field['dp.clip_norm'])
  assert by_field['dp.target_epsilon'].startswith('dp.target_epsilon = None ')
  assert by_field['dp.noise_multiplier'].startswith('dp.noise_multiplier = 1.5 ')
  help_text = _binary('experiments.train', '--help').stdout
  assert '--print_config' in help_text.split('flags:')[0]  # the docstring points to it


# --- the quiet console --------------------------------------------------------------------------


def test_the_quiet_console_shows_project_lines_and_warnings_and_v_shows_everything(monkeypatch):
  def record(path, level=logging.INFO):
    return logging.LogRecord('absl', level, path, 1, 'message', None, None)
  library = os.path.join(os.path.dirname(os.__file__), 'site-packages', 'orbax', 'checkpoint.py')
  assert cli.is_console_record(record(train.__file__))
  assert not cli.is_console_record(record(library))
  assert cli.is_console_record(record(library, logging.WARNING))
  monkeypatch.setattr(cli, '_verbosity_at_start', 0)
  assert not cli.shows_everything_on_stderr()
  monkeypatch.setattr(cli, '_verbosity_at_start', 1)  # -v 1
  assert cli.shows_everything_on_stderr()


# --- messages of the round loop ---------------------------------------------------------------


def test_seconds_include_evaluation_loss_uses_g_compile_is_announced_finished_run_exits(
    tmp_path, monkeypatch, caplog):
  make_evaluate = train.make_evaluate

  def slow_evaluate(*args, **kwargs):
    evaluate = make_evaluate(*args, **kwargs)

    def evaluate_slowly(state, data, key):
      jax.debug.callback(lambda: time.sleep(0.4), ordered=True)
      return evaluate(state, data, key)
    return evaluate_slowly
  monkeypatch.setattr(train, 'make_evaluate', slow_evaluate)
  caplog.set_level(logging.INFO)
  config = tiny_config(num_rounds=2)
  records = [train.train_and_evaluate(config, str(tmp_path))]
  first = caplog.text
  assert first.index('Compiling the round step and the evaluation ...') < first.index(
      'Compiled the round step and the evaluation in')
  metrics = [json.loads(l) for l in open(tmp_path / 'metrics.jsonl')]
  assert all(m['seconds'] >= 0.4 for m in metrics)  # the evaluation is part of a round's time
  for m in metrics:
    assert f"loss {m['train_loss']:.4g} " in first  # %g: never 361374058275776348815360.0000

  caplog.clear()
  monkeypatch.setattr(train, 'build_experiment', None)  # nothing is loaded or compiled
  records.append(train.train_and_evaluate(config, str(tmp_path)))
  assert f'Already finished: {tmp_path} holds all 2 rounds' in caplog.text
  assert 'Compiling the round step' not in caplog.text
  assert records[1] == records[0]


def test_a_failed_run_prints_one_line_and_leaves_failure_json_for_the_report(tmp_path):
  workdir = tmp_path / 'w'
  # sigma = 1e39 overflows float32: the shared parameters are Inf after round 1.
  out = _binary('experiments.train', f'--config={DEFAULT}', *TINY_FLAGS, f'--workdir={workdir}',
                '--config.dp.noise_multiplier=1e39', '--config.num_rounds=2')
  assert out.returncode == 2, out.stderr[-3000:]
  assert 'Traceback' not in out.stderr
  assert out.stderr.strip().splitlines()[-1].startswith('error: round 1: the new shared parameters '
                                                         'are NaN/Inf.')
  failure = json.loads((workdir / 'failure.json').read_text())
  assert failure['error'] == 'FloatingPointError' and failure['round'] == 1
  assert 'no checkpoint was written yet' in failure['message']
