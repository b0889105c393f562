"""Every command in README.md and WORKSPACE.md still works, so the docs cannot rot.

The commands are the ```bash blocks (with `reproduce X` expanded from the function the block
defines) and the inline `python3 -m ...` spans, plus the `--config...` fragments of WORKSPACE.md's
"Running" section (on top of the default command). Each is checked without training:

  experiments.train           --dry_run, in this process (fresh flags; calibrations and datasets
                              cached across commands), through the binary's own flag parsing
  launch.sweep                --plan, in this process (every run's config is validated;
                              --seed_from copies into a fresh root, and those runs are finished)
  launch.tune                 --plan, in this process, in a fresh root (K, the candidates, the cost)
  launch.fair_benchmark       --plan, in this process, in a fresh root (runs, CPU hours, GPU estimate);
                              --publish from an empty root into a fresh directory
  experiments.audit           flags parsed, every audited config validated
  experiments.report          run on an empty --root: the flags parse and it says there is nothing
  benchmarks.client_throughput  --dry_run, in a subprocess
  benchmarks.cohort_scaling     --dry_run, in a subprocess (benchmarks/accelerator.sh runs end to
                                end in tests/test_benchmark.py)
  benchmarks.runs_at_a_time     --dry_run, in a subprocess (its experiment's own --dry_run)

Across every guide (README.md, WORKSPACE.md, benchmarks/README.md, docs/*.md): each `python3 -m`
module of the project that a doc names exists, and each relative link resolves. Every path that
WORKSPACE.md names (its layout tree included) exists. (benchmarks/README.md's numbers are generated
from their JSON: tests/test_generated_docs.py and tests/test_benchmark_tables.py.)
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from absl import flags

from dp2fedsam_jax import cli, train
from dp2fedsam_jax.algorithms import METHODS
from dp2fedsam_jax.config import validate_config
from dp2fedsam_jax.privacy import accounting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ('README.md', 'WORKSPACE.md')
PROJECT_PACKAGES = ('experiments.', 'launch.', 'benchmarks.')
TOP_FOLDERS = ('dp2fedsam_jax', 'experiments', 'launch', 'benchmarks', 'tests', 'docs', r'\.ci')
BINARIES = ('experiments.train', 'launch.sweep', 'experiments.report', 'experiments.audit',
            'benchmarks.client_throughput', 'benchmarks.cohort_scaling', 'launch.tune',
            'launch.fair_benchmark', 'benchmarks.runs_at_a_time')


def _bash_commands(text: str) -> list[str]:
  commands = []
  for block in re.findall(r'^\s*```bash\n(.*?)^\s*```', text, re.S | re.M):
    block = re.sub(r'\\\n\s*', ' ', block)  # continuation lines
    functions = {}
    for match in re.finditer(r'(\w+)\(\)\s*\{(.*?);\s*\}', block, re.S):
      functions[match.group(1)] = match.group(2)
    block = re.sub(r'\w+\(\)\s*\{.*?;\s*\}', '', block, flags=re.S)
    for line in block.splitlines():
      line = re.sub(r'\s#.*$', '', line).strip()  # comments
      if not line or line.startswith('#'):
        continue
      words = line.split()
      if words[0] in functions:  # e.g. `reproduce dp2fedsam_table2`
        line = functions[words[0]]
        for i, arg in enumerate(words[1:], 1):
          line = line.replace(f'${i}', arg)
      commands.extend(part.strip() for part in line.split('&&'))
  return commands


def _inline_commands(text: str) -> list[str]:
  spans = re.findall(r'`(python3 -m [^`]+)`', text)
  return [' '.join(span.split()) for span in spans]


def _running_fragments(text: str) -> list[str]:
  """`--config...=value` spans of WORKSPACE.md's Running section, as default train commands."""
  section = text.split('## Running', 1)[1]
  commands = []
  for span in re.findall(r'`(--config[^`]*)`', section):
    span = ' '.join(span.split())
    if not re.search(r'=\S', span):  # a field name in prose, not an argument
      continue
    config = '' if span.startswith('--config=') else '--config=experiments/configs/default.py '
    commands.append(f'python3 -m experiments.train {config}{span}')
  return commands


def doc_commands() -> list[tuple[str, str]]:
  found = []
  for doc in DOCS:
    text = open(os.path.join(ROOT, doc)).read()
    commands = _bash_commands(text) + _inline_commands(text)
    if doc == 'WORKSPACE.md':
      commands += _running_fragments(text)
    for command in commands:
      words = shlex.split(command)
      if len(words) > 2 and words[:2] == ['python3', '-m'] and words[2] in BINARIES:
        found.append((doc, command))
  return found


COMMANDS = doc_commands()


def _markdown_files() -> list[str]:
  found = ['README.md', 'WORKSPACE.md', 'benchmarks/README.md']
  docs = os.listdir(os.path.join(ROOT, 'docs'))
  found += sorted(os.path.join('docs', name) for name in docs if name.endswith('.md'))
  return [f for f in found if os.path.exists(os.path.join(ROOT, f))]


def test_the_docs_have_the_commands_this_test_knows():
  """Every `python3 -m` module of this project that a doc names exists, and the commands this test
  runs are of binaries it knows how to check."""
  named = set()
  for doc in _markdown_files():
    text = open(os.path.join(ROOT, doc)).read()
    for command in _bash_commands(text) + _inline_commands(text):
      words = shlex.split(command)
      if len(words) > 2 and words[:2] == ['python3', '-m'] and words[2].startswith(PROJECT_PACKAGES):
        named.add(words[2])
  for module in named:
    path = os.path.join(ROOT, *module.split('.'))
    assert os.path.exists(path + '.py') or os.path.exists(os.path.join(path, '__main__.py')), module
  assert {shlex.split(c)[2] for _, c in COMMANDS} <= set(BINARIES)
  assert len(COMMANDS) >= 10
  fragments = _running_fragments(open(os.path.join(ROOT, 'WORKSPACE.md')).read())
  assert fragments and all((('WORKSPACE.md', c) in COMMANDS) for c in fragments)  # and run below


@pytest.mark.parametrize('doc', _markdown_files())
def test_relative_links_resolve(doc):
  text = open(os.path.join(ROOT, doc)).read()
  for target in re.findall(r'\]\(([^)\s]+)\)', text):
    if target.startswith(('http://', 'https://', '#', 'mailto:')):
      continue
    path = os.path.join(ROOT, os.path.dirname(doc), target.split('#')[0])
    assert os.path.exists(path), f'{doc}: link to {target} resolves to nothing'


def _layout_paths(text: str) -> list[str]:
  """The paths of WORKSPACE.md's layout tree: each entry's name under the folders it is indented in,
  and for a folder the file names its description lists (`specs.py`, `privacy.md`) inside it."""
  block = text.split('## Layout', 1)[1].split('```', 2)[1]
  paths, folders, entry = [], [], ''  # folders: (indent, path)
  for line in block.splitlines():
    if not line.strip():
      continue
    indent = len(line) - len(line.lstrip())
    if indent < 20:  # a new entry; deeper indents continue the description column
      name, line = line.split()[0], line.strip()[len(line.split()[0]):]
      folders = [(i, f) for i, f in folders if i < indent]
      entry = (folders[-1][1] if folders else '') + name
      paths.append(entry)
      if name.endswith('/'):
        folders.append((indent, entry))
    if entry.endswith('/'):
      paths += [entry + n for n in re.findall(r'(?<![\w./])(\w+\.(?:py|md|sh|ipynb))\b', line)]
  return paths


def _named_paths(text: str) -> list[str]:
  """Repository paths named anywhere in the text (`dp2fedsam_jax/...`, `tests/...`, `docs/x.md`)."""
  return re.findall(r'(?<![\w/.$-])((?:%s)/[\w./-]*[\w/])' % '|'.join(TOP_FOLDERS), text)


def test_every_path_workspace_names_exists():
  text = open(os.path.join(ROOT, 'WORKSPACE.md')).read()
  paths = _layout_paths(text) + _named_paths(text)
  assert len(paths) > 40
  missing = [p for p in paths if not os.path.exists(os.path.join(ROOT, p))]
  assert not missing, f'WORKSPACE.md names paths that do not exist: {missing}'


@pytest.fixture(scope='module')
def cached_experiments():
  """Calibration and data loading are the slow parts of a dry run: each distinct one runs once."""
  calibrate = functools.lru_cache(accounting.calibrate_noise_multiplier)
  make_data = functools.lru_cache(train.make_federated_data)
  patch = pytest.MonkeyPatch()
  patch.setattr(accounting, 'calibrate_noise_multiplier', calibrate)
  patch.setattr(train, 'make_federated_data', make_data)
  yield
  patch.undo()


def _flag_values(define, argv):
  fv = flags.FlagValues()
  define(fv)
  cli.parse_flags(['binary', *argv], fv)
  return fv


def _check_train(argv, capsys):
  from experiments import train as train_binary
  from launch import sweep
  if '--list' in argv:  # the registries' listing: every built-in method is in it
    fv = _flag_values(train_binary.define_flags, argv)
    capsys.readouterr()
    train_binary.run(fv)
    out = capsys.readouterr().out
    assert all(name in out for name in METHODS), out[-2000:]
    return
  if '--dry_run' not in argv and '--print_config' not in argv:
    argv = [*argv, '--dry_run']
  fv = _flag_values(train_binary.define_flags, argv)
  fv.distributed = False  # the flags parsed; joining a cluster is not part of a dry run here
  if fv.dry_run and sweep.missing_data(fv.config):  # the data is not here: all but loading it
    validate_config(fv.config, METHODS)
    train.DPMechanism.from_config(fv.config, fv.config.num_clients, train.get_method(fv.config.method))
    return
  capsys.readouterr()
  train_binary.run(fv)
  out = capsys.readouterr().out.strip().splitlines()
  if fv.dry_run:
    info = json.loads(out[-1])
    assert info['method'] == fv.config.method and info['num_params'] > 0
  else:
    assert out[0].startswith('# ') and len(out) > 40


def _check_sweep(argv, tmp_path):
  from launch import sweep
  overrides = [a for a in argv if a.startswith('--config.')]
  fv = _flag_values(sweep.define_flags, [a for a in argv if not a.startswith('--config.')])
  sweep._check_methods(fv.methods)
  root = str(tmp_path / 'root')
  runs = sweep.plan(fv.config, root, sweep._axes(fv), overrides, fv.only)
  seeded = sweep.seed_from(runs, root, fv.seed_from) if fv.seed_from else []
  assert not fv.seed_from or seeded, f'--seed_from={fv.seed_from} seeded no run'
  runs = sweep.plan(fv.config, root, sweep._axes(fv), overrides, fv.only)
  assert runs and sweep.plan_summary(runs).startswith(f'{len(runs)} runs: {len(seeded)} finished')


def _check_tune(argv, tmp_path, capsys):
  from launch import tune
  fv = _flag_values(tune.define_flags, [a for a in argv if not a.startswith('--config.')])
  capsys.readouterr()
  tune.tune(fv.config, str(tmp_path / 'root'), fv.study,
            [a for a in argv if a.startswith('--config.')], plan_only=True)
  assert 'selection eps' in capsys.readouterr().out


def _check_fair_benchmark(argv, tmp_path, capsys):
  from launch import fair_benchmark
  fv = _flag_values(fair_benchmark.define_flags, argv)
  if fv.publish:  # from an empty root into a fresh directory: every block's page, all pending
    for letter in fv.blocks:
      with open(fair_benchmark.publish(letter, str(tmp_path / 'root'), str(tmp_path / 'out'))) as f:
        assert 'Applied: **pending' in f.read()
    return
  if fv.smoke:  # every config the smoke would run, built and validated; none trained here
    for letter in fv.blocks:
      assert fair_benchmark.smoke_configs(letter, fv.rows)
    return
  assert fv.plan, 'a fair_benchmark command in the docs runs here only with --plan, --publish or --smoke'
  capsys.readouterr()
  totals = fair_benchmark.print_plan(fv.blocks, str(tmp_path / 'root'))
  assert totals['runs'] > 0 and 'total:' in capsys.readouterr().out


def _check_audit(argv):
  from experiments import audit
  fv = _flag_values(audit.define_flags, argv)
  for config in audit.configs_to_audit(fv):
    validate_config(config, METHODS)


def _run(argv, tmp_path):
  return subprocess.run([sys.executable, '-m', *argv], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)


@pytest.mark.parametrize('doc, command', COMMANDS, ids=[f'{d}:{c[10:70]}' for d, c in COMMANDS])
def test_doc_command_works(doc, command, tmp_path, capsys, cached_experiments):
  binary, *argv = shlex.split(command)[2:]
  if binary == 'experiments.train':
    _check_train(argv, capsys)
  elif binary == 'launch.sweep':
    _check_sweep(argv, tmp_path)
  elif binary == 'experiments.audit':
    _check_audit(argv)
  elif binary == 'launch.tune':
    _check_tune(argv, tmp_path, capsys)
  elif binary == 'launch.fair_benchmark':
    _check_fair_benchmark(argv, tmp_path, capsys)
  elif binary == 'experiments.report':
    argv = [a for a in argv if not a.startswith(('--root=', '--out='))]
    out = _run([binary, *argv, f'--root={tmp_path}', f'--out={tmp_path / "out"}'], tmp_path)
    assert out.stderr.strip() == f'error: no workdir with metrics.jsonl and config.json under {tmp_path}'
  else:
    argv = [a if not a.startswith('--json_out=') else f'--json_out={tmp_path / "out.json"}'
            for a in argv]
    out = _run([binary, *argv, '--dry_run'], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])['modes']
