"""experiments/local_stability.py: one local round from the initial model or from a run's checkpoint."""

import jax
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import train
from experiments import local_stability


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('run'))
  config = tiny_config(method='dp_fedavg', num_rounds=2, **{'local.lr_decay': 1e-3})
  train.train_and_evaluate(config, workdir)
  return config, workdir


def test_start_trains_from_the_checkpointed_global_model_at_its_round(run):
  config, workdir = run
  start = local_stability.checkpointed_state(config, workdir)
  initial = train.build_experiment(config).init_state()
  assert int(start.round) == 2
  assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start.shared),
                                                      jax.tree.leaves(initial.shared)))
  sam = config.copy_and_resolve_references()
  sam.method = 'dp_fedsam'
  from_init = local_stability.stability(sam, clients=3)
  from_start = local_stability.stability(sam, clients=3, start=start)
  # Round 2 with lr decay 1e-3 per round: steps 1e-6 of round 0's, so the update all but vanishes.
  assert from_init['median_norm'] > 0
  assert from_start['median_norm'] < 1e-4 * from_init['median_norm']


def test_start_refuses_a_method_that_shares_other_parameters(run):
  config, workdir = run
  start = local_stability.checkpointed_state(config, workdir)
  other = config.copy_and_resolve_references()
  other.method = 'dp2fedsam'  # shares the extractor only
  with pytest.raises(ValueError, match='--start'):
    local_stability.stability(other, clients=1, start=start)


def test_start_without_a_checkpoint_is_an_error(tmp_path):
  config = tiny_config(method='dp_fedavg')
  (tmp_path / 'config.json').write_text('{"method": "dp_fedavg"}')
  with pytest.raises(ValueError, match='no checkpoint'):
    local_stability.checkpointed_state(config, str(tmp_path))
