"""Every registered method computes what it computed when tests/data/method_metrics_golden.json was
written (tests/method_golden.py): two rounds' metrics, the final server state and one evaluation.

Which property each test holds:
  * test_method_metrics_match_the_golden_file: portable. Within method_golden.RTOL / ATOL on any CPU
    (XLA:CPU rounds differently per instruction set); integers exactly.
  * test_method_metrics_are_bit_identical_to_the_exact_golden: exact, on one machine. Runs only with
    DP2FEDSAM_EXACT_GOLDEN=<a golden written on this machine from the base commit> (how: the
    docstring of tests/method_golden.py); the check a refactor that must change nothing runs.
  * test_a_case_run_twice_gives_the_same_bits: exact. The same program on the same machine, twice.
  * test_golden_cases_hold_under_another_instruction_set: portable, proven. Three cases compiled for
    SSE4.2 in a subprocess match the committed file within the same tolerance, so the suite cannot
    drift back to holding one machine's bits.
"""

import json
import os
import subprocess
import sys

import pytest

import method_golden
from dp2fedsam_jax.algorithms import METHODS

TESTS = os.path.dirname(os.path.abspath(__file__))
EXACT_GOLDEN = os.environ.get('DP2FEDSAM_EXACT_GOLDEN')


@pytest.fixture(scope='module')
def golden():
  with open(method_golden.GOLDEN) as f:
    return json.load(f)


def test_every_built_in_method_has_a_golden_case(golden):
  """The package's methods (METHODS.builtin_names()); one a user's file or a test registers has none.
  A new built-in method adds its case by regenerating the file (tests/method_golden.py)."""
  assert {name for name in METHODS.builtin_names() if METHODS[name].federated} <= set(golden)
  assert set(golden) == set(method_golden.cases())


def test_the_portable_comparison_catches_a_real_change(golden):
  case = golden['dp2fedsam']
  assert method_golden.mismatches(case, case) == []
  moved = json.loads(json.dumps(case))
  moved['rounds'][1]['train_loss'] = repr(float(case['rounds'][1]['train_loss']) * (1 + 1e-3))
  leaf = next(iter(moved['state_summary']))
  moved['state_summary'][leaf][2] = repr(float(case['state_summary'][leaf][2])
                                         + 1e-3 * float(case['state_summary'][leaf][0]))
  moved['rounds'][0]['cohort_size'] += 1
  problems = method_golden.mismatches(moved, case)
  assert len(problems) == 3, problems


@pytest.mark.parametrize('case', sorted(method_golden.cases()))
def test_method_metrics_match_the_golden_file(case, golden):
  method, overrides = method_golden.cases()[case]
  assert method_golden.mismatches(method_golden.run_case(method, overrides), golden[case]) == []


@pytest.mark.skipif(not EXACT_GOLDEN, reason='set DP2FEDSAM_EXACT_GOLDEN to a golden written on this '
                    'machine (tests/method_golden.py --out) to check a refactor bit for bit')
@pytest.mark.parametrize('case', sorted(method_golden.cases()))
def test_method_metrics_are_bit_identical_to_the_exact_golden(case):
  with open(EXACT_GOLDEN) as f:
    exact = json.load(f)
  method, overrides = method_golden.cases()[case]
  assert method_golden.run_case(method, overrides) == exact[case]


def test_a_case_run_twice_gives_the_same_bits():
  method, overrides = method_golden.cases()['dp_fedavg_blur+adaptive']
  assert method_golden.run_case(method, overrides) == method_golden.run_case(method, overrides)


_OTHER_ISA_CASES = ('dp2fedsam', 'dp_fedsam_topk', 'dp_pfeddsu_safe+adaptive')


def test_golden_cases_hold_under_another_instruction_set(golden, tmp_path):
  flags = f'{os.environ["XLA_FLAGS"]} --xla_cpu_max_isa=SSE4_2'
  out = tmp_path / 'other_isa.json'
  script = ('import json, sys, method_golden as m; cases = m.cases(); '
            'json.dump({c: m.run_case(*cases[c]) for c in sys.argv[2:]}, open(sys.argv[1], "w"))')
  proc = subprocess.run([sys.executable, '-c', script, str(out), *_OTHER_ISA_CASES], cwd=TESTS,
                        env=dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS='cpu',
                                 DP2FEDSAM_COMPILATION_CACHE=str(tmp_path / 'cache'),
                                 # this checkout's package, not an installed one
                                 PYTHONPATH=os.pathsep.join(filter(None, [
                                     os.path.dirname(TESTS), os.environ.get('PYTHONPATH')]))),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(out.read_text())
  for case in _OTHER_ISA_CASES:
    assert method_golden.mismatches(got[case], golden[case]) == [], case
