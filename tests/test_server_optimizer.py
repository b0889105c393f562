"""Server optimizers (dp2fedsam_jax/server_optimizer.py): the pseudo-gradient's sign and each rule,
the optimizer state through a round and a resume, and epsilon untouched (post-processing)."""

import json
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import canaries, checkpoint, train
from dp2fedsam_jax.server_optimizer import SERVER_OPTIMIZERS, make_server_step

SUM = {'w': jnp.asarray([3.0, -0.3, 0.0]), 'b': jnp.asarray([[0.6]])}  # a released noised sum
SHARED = {'w': jnp.asarray([1.0, 2.0, -1.0]), 'b': jnp.asarray([[0.5]])}
M, LR = 3.0, 0.1  # the public denominator and server_lr


def _step(name, sums, **hyper):
  opt = make_server_step(name, **hyper)
  shared, state = SHARED, opt.init(SHARED)
  for s in sums:
    shared, state = opt.apply(shared, s, jnp.asarray(M), LR, state)
  return jax.tree.map(np.asarray, shared), state


def _expected(fn, *trees):
  return jax.tree.map(lambda *leaves: fn(*[np.asarray(x, np.float64) for x in leaves]), *trees)


def test_sgd_is_the_plain_rule_and_keeps_no_state():
  got, state = _step('sgd', [SUM])
  assert state == ()
  chex.assert_trees_all_equal(got, jax.tree.map(lambda p, s: np.asarray(p + LR * s / M), SHARED, SUM))


def test_momentum_is_heavy_ball_on_the_mean_update():
  """v1 = mean1, v2 = beta v1 + mean2; phi moves by lr v along the released means (not against)."""
  second = jax.tree.map(lambda s: -2 * s, SUM)
  got, _ = _step('momentum', [SUM, second], momentum=0.5)
  want = _expected(lambda p, a, b: p + LR * (a / M) + LR * (0.5 * a / M + b / M), SHARED, SUM, second)
  chex.assert_trees_all_close(got, want, rtol=1e-6)


def test_adam_first_step_moves_each_coordinate_lr_along_the_sign_of_the_mean():
  """Bias-corrected (optax) Adam's first step: lr * g / (|g| + eps), g the mean update."""
  got, _ = _step('adam', [SUM], eps=1e-3)
  want = _expected(lambda p, s: p + LR * (s / M) / (np.abs(s / M) + 1e-3), SHARED, SUM)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-7)


def test_yogi_first_step_is_zaheer_et_al_on_the_pseudo_gradient():
  """optax's Yogi (moments from 1e-6, bias-corrected) on pseudo-gradient -g: b1, b2, eps as given."""
  got, _ = _step('yogi', [SUM], beta1=0.8, beta2=0.95, eps=1e-2)
  def want(p, s):
    g = -s / M
    mu, nu = 0.8 * 1e-6 + 0.2 * g, 1e-6 - 0.05 * np.sign(1e-6 - g ** 2) * g ** 2
    return p - LR * (mu / 0.2) / (np.sqrt(nu / 0.05) + 1e-2)
  chex.assert_trees_all_close(got, _expected(want, SHARED, SUM), rtol=1e-5, atol=1e-7)


def test_adagrad_divides_by_the_root_of_eps_squared_plus_the_squares_so_far():
  second = jax.tree.map(lambda s: 0.5 * s, SUM)
  got, _ = _step('adagrad', [SUM, second], eps=0.1)
  def want(p, a, b):
    a, b = a / M, b / M
    return p + LR * a / np.sqrt(0.01 + a ** 2) + LR * b / np.sqrt(0.01 + a ** 2 + b ** 2)
  chex.assert_trees_all_close(got, _expected(want, SHARED, SUM, second), rtol=1e-5)


def test_momentum_state_in_the_round_step_holds_the_released_mean():
  """Round 1 from the same state releases the same noised sum under sgd and momentum (keys depend on
  the round only): both take the same first step, and momentum's trace (optax's, of the
  pseudo-gradient) is minus that mean."""
  exp = train.build_experiment(tiny_config(method='dp_fedavg', server_optimizer='momentum'))
  sgd = train.build_experiment(tiny_config(method='dp_fedavg'))
  state = exp.init_state()
  assert sgd.init_state().server_opt_state == ()
  new, _ = jax.jit(exp.make_round_step())(state, exp.data, exp.root_key)
  plain, _ = jax.jit(sgd.make_round_step())(sgd.init_state(), sgd.data, sgd.root_key)
  chex.assert_trees_all_close(new.shared, plain.shared, rtol=1e-6)
  trace = new.server_opt_state[0].trace
  chex.assert_trees_all_close(trace, jax.tree.map(lambda a, b: (b - a) / exp.config.server_lr,
                                                  plain.shared, state.shared), rtol=1e-4, atol=1e-6)
  assert any(np.any(np.asarray(t) != 0) for t in jax.tree.leaves(trace))


def test_a_resumed_run_repeats_the_uninterrupted_one_bit_for_bit(tmp_path):
  """Adam's state (count and both moments) is checkpointed and restored with the ServerState."""
  optimizer = 'adam'
  config = lambda rounds: tiny_config(num_rounds=rounds, server_optimizer=optimizer, server_lr=0.1)
  full_dir, split_dir = str(tmp_path / 'full'), str(tmp_path / 'split')
  full = train.train_and_evaluate(config(3), full_dir)
  train.train_and_evaluate(config(2), split_dir)  # "killed" after round 2
  resumed = train.train_and_evaluate(config(3), split_dir)
  drop_time = lambda r: {k: v for k, v in r.items() if k != 'seconds'}
  assert drop_time(resumed) == drop_time(full)
  initial = train.build_experiment(config(3)).init_state()
  a, _ = checkpoint.restore(full_dir, initial)
  b, _ = checkpoint.restore(split_dir, initial)
  chex.assert_trees_all_equal(a, b)
  assert jax.tree.structure(a.server_opt_state) == jax.tree.structure(initial.server_opt_state)
  assert any(np.any(np.asarray(x) != 0) for x in jax.tree.leaves(a.server_opt_state))
  assert int(a.server_opt_state[0].count) == 3
  written = json.loads((tmp_path / 'full' / 'config.json').read_text())
  assert written['server_optimizer'] == optimizer


def test_epsilon_and_sigma_do_not_depend_on_the_server_optimizer():
  """Post-processing: the accounted epsilon (what --dry_run reports) is the same for every one."""
  described = [train.describe(tiny_config(server_optimizer=name)) for name in SERVER_OPTIMIZERS]
  assert len({(d['noise_multiplier'], d['epsilon']) for d in described}) == 1
  assert 0 < described[0]['epsilon'] < math.inf


def test_unknown_optimizer_is_refused_and_the_audit_wants_sgd():
  with pytest.raises(ValueError, match=r"^config\.server_optimizer='lion'"):
    make_server_step('lion')
  exp = train.build_experiment(tiny_config(server_optimizer='adam'))
  with pytest.raises(ValueError, match=r"^config\.server_optimizer='adam': the audit"):
    canaries.make_trial_scores(exp, canaries.AuditSettings())
