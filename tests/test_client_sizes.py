"""experiments/client_sizes.py: the size summary of a federation's split."""

import numpy as np

from experiments import client_sizes


def test_split_summary_counts_the_budget_and_the_padding():
  counts = np.array([1, 3, 10, 0, 6])
  s = client_sizes.split_summary(counts, example_bytes=2, budget=4)
  assert (s['clients'], s['examples'], s['clients_without_examples']) == (5, 20, 1)
  assert s['fraction_of_clients_above_budget'] == 2 / 5           # the clients of 10 and 6
  assert s['fraction_of_examples_beyond_budget'] == (6 + 2) / 20  # what a round leaves out
  assert s['padded_input_bytes'] == 5 * 10 * 2                    # N x the largest client
  assert s['ragged_input_bytes'] == 20 * 2 + 4 * 6                # the examples + int32 offsets
  assert (s['quantiles']['p0'], s['quantiles']['p50'], s['quantiles']['p100']) == (0, 3, 10)


def test_split_summary_without_a_budget_leaves_nothing_out():
  s = client_sizes.split_summary(np.array([5, 7]), example_bytes=1, budget=None)
  assert s['fraction_of_clients_above_budget'] == 0.0
  assert s['fraction_of_examples_beyond_budget'] == 0.0
