"""Import layers: the package's, and experiments/ below launch/; no import cycles in either.

In dp2fedsam_jax no module imports a layer above its own. Above the package, launch/ (the sweep,
the tuner, the fair benchmark) may import experiments/ (configs, studies, the report, the
programs), never the reverse; a config imports no report and no study but the fair protocol
(experiments/studies/fair.py, and the second design's pilot rules and search measures, which read
committed runs: fair2_pilot.py, search_spread.py), which imports no config but _common.

The imports are read from the source with `ast` -- every import, also those inside functions (a lazy
import is still a dependency) -- so the check is exact and starts no JAX. One runtime check on top:
importing `config.py` stays cheap (no JAX), which config files and the sweep launcher rely on.
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = 'dp2fedsam_jax'

# Lowest first. A module may import its own unit (a top-level module, or a subpackage as a whole) and
# the units of lower layers; units that share a layer must not import each other.
LAYERS = (
    ('trees', 'keys', 'errors', 'progress', 'checkpoint', 'sharding', 'stopping', 'config_help',
     'metric_writers', 'compilation_cache', 'server_optimizer', 'host',
     'protocol'),                # leaves; protocol: config.eval's fields and defaults, no JAX;
                                 # host: the machine a run records
    ('registries',),             # the one name -> entry registry class, and the pieces' knobs
    ('executors',),              # how a round runs its cohort (vmap, sequential, sharded on the mesh)
    ('cli', 'run_files'),        # what binaries share; a workdir's lock, config.json and metrics
    ('models', 'data'),          # the model zoo; sources -> partitions -> FederatedData
    ('privacy', 'local', 'eval_blocks'),  # DP primitives (selection: tuning's eps); one client's
                                 # local training; how the evaluation walks its clients
    ('algorithms',),             # MethodSpec registry and the pieces methods compose
    ('state',),                  # ServerState, split/merge of shared and personal params
    ('adaptation',),             # the test-time protocol run: the model each client tests
    ('client', 'evaluation'),    # one client's round; per-client test accuracy
    ('federated_round', 'local_only'),  # the jitted round step; the local-only baseline
    ('config',),                 # validate_config checks against the choice lists of the layers below
    ('train', 'canaries'),       # build_experiment, train_and_evaluate; the audit's canary harness
    ('search_program',),         # a search's trials as one mapped axis of one compiled program
    ('api',),                    # the public extension API (register_*), re-exported by __init__
)

# Known violations, each with the issue that removes it; strict: the test fails once it is fixed.
KNOWN_VIOLATIONS: dict[str, str] = {}


def _modules(package: str = PACKAGE) -> dict[str, str]:
  """{dotted module name: path} of every module of `package` (a package as its __init__)."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, package)):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith(('.', '__')))
    parts = os.path.relpath(dirpath, ROOT).split(os.sep)
    for name in sorted(filenames):
      if name.endswith('.py'):
        dotted = parts if name == '__init__.py' else parts + [name[:-3]]
        out['.'.join(dotted)] = os.path.join(dirpath, name)
  return out


MODULES = _modules()
# The programs above the package: launch/ may import experiments/, never the reverse.
PROGRAMS = {**_modules('experiments'), **_modules('launch')}
# The study modules a config may import: the fair benchmark's rules (they import no config).
FAIR_PROTOCOL = ('experiments.studies.fair', 'experiments.studies.fair2_pilot',
                 'experiments.studies.search_spread')


def _unit(module: str) -> str:
  """'dp2fedsam_jax.data.sources' -> 'data'; the package's own __init__ -> ''."""
  parts = module.split('.')
  return parts[1] if len(parts) > 1 else ''


def _layer(unit: str) -> int:
  if unit == '':
    return len(LAYERS)  # dp2fedsam_jax/__init__.py: the public face, it imports api (on first use)
  for i, units in enumerate(LAYERS):
    if unit in units:
      return i
  raise AssertionError(f'{PACKAGE}.{unit} is in no layer: add it to LAYERS in {__file__}')


def _resolve(name: str, modules: dict[str, str] = MODULES) -> str | None:
  """The module of `modules` an imported name lands in (longest known prefix), or None if outside."""
  parts = name.split('.')
  while parts:
    if '.'.join(parts) in modules:
      return '.'.join(parts)
    parts.pop()
  return None


def _imports(module: str, source: str | None = None,
             modules: dict[str, str] = MODULES) -> list[tuple[int, str]]:
  """(line, imported module of `modules`) for every import statement of `module`, at any depth."""
  if source is None:
    with open(modules[module]) as f:
      source = f.read()
  is_package = modules[module].endswith('__init__.py')
  out = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:  # relative: from the module's own package upwards
        anchor = module.split('.')
        anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
        base = '.'.join(anchor + ([base] if base else []))
      # `from pkg import name`: the submodule pkg.name if there is one, else pkg itself.
      names = [f'{base}.{alias.name}' if f'{base}.{alias.name}' in modules else base
               for alias in node.names]
    else:
      continue
    for name in names:
      target = _resolve(name, modules)
      if target is not None and target != module:
        out.append((node.lineno, target))
  return out


def test_every_unit_has_a_layer_and_every_layer_unit_exists():
  units = {_unit(m) for m in MODULES} - {''}
  listed = [u for layer in LAYERS for u in layer]
  assert len(listed) == len(set(listed)), 'a unit is listed twice in LAYERS'
  assert units == set(listed), (f'in no layer: {sorted(units - set(listed))}; '
                                f'listed but missing: {sorted(set(listed) - units)}')
  for module in KNOWN_VIOLATIONS:  # a stale entry would hide nothing: drop it
    assert module in MODULES, f'{module} no longer exists: remove it from KNOWN_VIOLATIONS'


def _upward_imports(module: str) -> list[str]:
  own_unit = _unit(module)
  own = _layer(own_unit)
  bad = []
  for line, target in _imports(module):
    unit = _unit(target)
    if unit != own_unit and _layer(unit) >= own:
      where = 'the same layer' if _layer(unit) == own else 'a higher layer'
      bad.append(f'{MODULES[module]}:{line} imports {target} ({where})')
  return bad


@pytest.mark.parametrize('module', [
    pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=KNOWN_VIOLATIONS[m]))
    if m in KNOWN_VIOLATIONS else m for m in sorted(MODULES)])
def test_no_upward_import(module):
  bad = _upward_imports(module)
  assert not bad, '\n'.join(bad)


def test_the_import_reader_sees_every_kind_of_import():
  source = '\n'.join([
      'import numpy as np',                                  # external: ignored
      'import dp2fedsam_jax.privacy.clipping',               # 2
      'from dp2fedsam_jax.privacy import sparsify, noise',   # 3: two submodules
      'from dp2fedsam_jax.algorithms import METHODS',        # 4: a name -> the package __init__
      'from ..federated_round import make_round_step',       # 5: relative
      'from . import clipping',                              # 6: relative, same package
      'def f():',
      '  from dp2fedsam_jax import train',                   # 8: inside a function
  ])
  found = _imports(f'{PACKAGE}.privacy.noise', source)
  p = PACKAGE
  assert found == [(2, f'{p}.privacy.clipping'), (3, f'{p}.privacy.sparsify'),
                   (4, f'{p}.algorithms'), (5, f'{p}.federated_round'), (6, f'{p}.privacy.clipping'),
                   (8, f'{p}.train')], found  # the module's own import of noise is dropped


def test_the_layer_order_forbids_the_old_upward_imports():
  # local.py reaching into privacy/ and a privacy module running the round step, as they once did.
  assert _layer('privacy') == _layer('local')
  assert _layer('privacy') < _layer('algorithms') < _layer('federated_round') < _layer('train')
  assert _layer('trees') < _layer('privacy')


def _cycle(graph: dict[str, list[str]]) -> list[str] | None:
  """One import cycle of `graph` (module -> imported modules), or None."""
  state = {}  # 1: on the DFS stack, 2: done
  stack = []

  def visit(node):
    state[node] = 1
    stack.append(node)
    for nxt in graph.get(node, ()):
      if state.get(nxt) == 1:
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_cycle_finder():
  assert _cycle({'a': ['b'], 'b': ['c'], 'c': []}) is None
  assert _cycle({'a': ['b'], 'b': ['a']}) == ['a', 'b', 'a']


def test_no_import_cycles():
  graph = {m: sorted({t for _, t in _imports(m)}) for m in MODULES}
  cycle = _cycle(graph)
  assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


def _program_imports(prefix: str) -> list[tuple[str, int, str]]:
  """(module, line, imported module) of every import of the programs' modules under `prefix`."""
  return [(m, line, target) for m in sorted(PROGRAMS) if m.startswith(prefix)
          for line, target in _imports(m, modules=PROGRAMS)]


def test_the_program_tree_is_read():
  assert {'experiments.config_files', 'experiments.studies.fair', 'experiments.report',
          'launch.sweep'} <= set(PROGRAMS)
  # the old violation, as experiments/audit.py once had it, and a config's lazy import of a study
  found = _imports('experiments.audit', 'from launch import sweep', PROGRAMS)
  assert found == [(1, 'launch.sweep')], found
  found = _imports('experiments.configs.shakespeare_field', 'def f():\n  from experiments.studies '
                   'import shakespeare_field', PROGRAMS)
  assert found == [(2, 'experiments.studies.shakespeare_field')], found


def test_experiments_never_import_launch():
  bad = [f'{PROGRAMS[m]}:{line} imports {t}' for m, line, t in _program_imports('experiments.')
         if t.split('.')[0] == 'launch']
  assert not bad, '\n'.join(bad)


def test_configs_import_no_report_and_no_study_but_the_fair_protocol():
  """A config declares (get_config, its grid, its search space); the logic over it lives in a
  study, which imports the config, and in the report."""
  bad = [f'{PROGRAMS[m]}:{line} imports {t}' for m, line, t in _program_imports('experiments.configs.')
         if t.startswith(('experiments.report', 'experiments.studies')) and t not in FAIR_PROTOCOL]
  assert not bad, '\n'.join(bad)
  for protocol in FAIR_PROTOCOL:
    fair = {t for m, _, t in _program_imports(protocol) if m == protocol
            and t.startswith('experiments.')}
    assert fair <= {'experiments.configs._common', *FAIR_PROTOCOL}, (protocol, fair)


def test_no_import_cycles_among_the_programs():
  graph = {m: sorted({t for _, t in _imports(m, modules=PROGRAMS)}) for m in PROGRAMS}
  cycle = _cycle(graph)
  assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


def test_config_import_is_cheap():
  """Config files and launch/sweep.py import config.py; it must not start JAX or the engine."""
  code = ('import sys, dp2fedsam_jax.config; '
          'print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "dp2fedsam_jax")))')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, check=True).stdout
  # protocol.py: config.eval's fields and defaults (dataclasses only); registries.py: the knobs that
  # registered methods add to the config (dataclasses only).
  assert out.split() == ["['dp2fedsam_jax',", "'dp2fedsam_jax.config',", "'dp2fedsam_jax.errors',",
                         "'dp2fedsam_jax.protocol',", "'dp2fedsam_jax.registries']"], out


def test_selection_import_is_cheap():
  """privacy/selection.py (the tuner's accounting) sits in the privacy layer but loads no JAX:
  launch/tune.py's plan and the cost table need numpy and dp_accounting only."""
  code = ('import sys, dp2fedsam_jax.privacy.selection; '
          'print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "dp2fedsam_jax")))')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, check=True).stdout
  assert out.split() == ["['dp2fedsam_jax',", "'dp2fedsam_jax.privacy',",
                         "'dp2fedsam_jax.privacy.selection']"], out
