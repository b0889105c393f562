"""Every registered method computes exactly what it computed when tests/data/
method_metrics_golden.json was written (tests/method_golden.py): two rounds' metrics, the final
server state's SHA-256 and one evaluation, bit for bit. A refactor of the engine must leave them
all unchanged; a change meant to alter a method regenerates the file and says so."""

import json

import pytest

import method_golden
from dp2fedsam_jax.algorithms import METHODS


@pytest.fixture(scope='module')
def golden():
  with open(method_golden.GOLDEN) as f:
    return json.load(f)


def test_every_registered_method_has_a_golden_case(golden):
  assert {name for name, spec in METHODS.items() if spec.federated} <= set(golden)
  assert set(golden) == set(method_golden.cases())


@pytest.mark.parametrize('case', sorted(method_golden.cases()))
def test_method_metrics_are_bit_identical_to_the_golden_file(case, golden):
  method, overrides = method_golden.cases()[case]
  assert method_golden.run_case(method, overrides) == golden[case]
