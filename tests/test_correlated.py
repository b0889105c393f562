"""Correlated noise (privacy/correlated.py): the noise rows are those of the strategy, the samplers are
the ones accounted, the sensitivities agree with brute force, epsilon agrees with jax_privacy's and
dp_accounting's own accountants, and BandMF's buffer survives a resume bit for bit.

The oracles recompute what they check from the keys (keys.py), jax_privacy's materialised strategy and
the config's q, N, sigma, never from the helpers under test (banded_noise, tree_noise, the samplers).
"""

import itertools
import json
import math
import os

import chex
import dp_accounting
import jax
import numpy as np
import pytest
from jax_privacy.accounting import accountants as jp_accountants
from jax_privacy.accounting import analysis as jp_analysis
from jax_privacy.matrix_factorization import toeplitz

from conftest import tiny_config, train_killed_before_checkpoint
from dp2fedsam_jax import checkpoint, keys, run_files, train
from dp2fedsam_jax.algorithms import METHODS, get_method
from dp2fedsam_jax.config import ConfigError, validate_config
from dp2fedsam_jax.privacy import correlated, noise
from dp2fedsam_jax.privacy.noise_mechanisms import BandMF, Independent

_ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
# Zero-out neighbours (a client's uploads replaced by zero in its scheduled rounds): the relation
# dp_accounting accounts its tree event under; for an unsampled Gaussian the same curve as add/remove.
_ZERO_OUT = dp_accounting.NeighboringRelation.REPLACE_SPECIAL


def _zero_update(mechanism, **overrides):
  """dp_fedavg with no local epochs: every update is 0, so a release is the server's noise alone."""
  fields = {'method': 'dp_fedavg', 'local.shared_epochs': 0, 'num_clients': 8, 'sampling_rate': 0.25,
            'dp.noise_mechanism': mechanism, 'dp.num_bands': 3, 'dp.clip_norm': 0.5,
            'dp.noise_multiplier': 0.7, 'dp.delta': 1e-3}
  fields.update(overrides)
  return train.build_experiment(tiny_config(**fields))


def _released_noise(exp, rounds):
  """[rounds] lists of float64 arrays: (new shared - old shared) * denominator / server_lr, i.e. the
  noise on each round's sum (denominator from the config: q N, or m = round(q N) for the tree)."""
  c = exp.config
  m = max(1, round(c.sampling_rate * c.num_clients))
  denominator = m if c.dp.noise_mechanism == 'tree' else c.sampling_rate * c.num_clients
  step = jax.jit(exp.make_round_step())
  state, out = exp.init_state(), []
  for _ in range(rounds):
    new, _ = step(state, exp.data, exp.root_key)
    out.append([(np.asarray(a, np.float64) - np.asarray(b, np.float64)).ravel() * denominator
                / c.server_lr for a, b in zip(jax.tree.leaves(new.shared), jax.tree.leaves(state.shared))])
    state = new
  return out, state


def _z(exp, r):
  """Round r's standard draw Z_r of the noise stream, times sigma C: from keys.py, not the engine."""
  std = exp.mechanism.noise_multiplier * exp.config.dp.clip_norm
  like = exp.init_state().shared
  return [np.asarray(z, np.float64).ravel() for z in
          jax.tree.leaves(noise.gaussian_like(keys.round_keys(exp.root_key, r).noise, like, std))]


def test_banded_noise_rows_satisfy_c_w_equals_z():
  """T = 5 released rounds W: C W = Z with C jax_privacy's materialised b-banded Toeplitz matrix of
  the run's coefficients (the ones jax_privacy's optimiser returns for T, b), and W is not Z."""
  rounds, bands = 5, 3
  exp = _zero_update('banded', num_rounds=rounds, **{'dp.num_bands': bands})
  coefs = np.asarray(exp.mechanism.noise.strategy)
  assert coefs.shape == (bands,) and abs(np.linalg.norm(coefs) - 1) < 1e-6
  np.testing.assert_allclose(coefs, np.asarray(toeplitz.optimize_banded_toeplitz(rounds, bands)),
                             rtol=1e-4)
  c_matrix = np.asarray(toeplitz.materialize_lower_triangular(coefs, rounds), np.float64)
  released, _ = _released_noise(exp, rounds)
  for i in range(len(released[0])):
    w = np.stack([released[r][i] for r in range(rounds)])       # [T, d]
    z = np.stack([_z(exp, r)[i] for r in range(rounds)])
    scale = np.abs(z).max()
    np.testing.assert_allclose(c_matrix @ w, z, atol=2e-5 * scale, err_msg=f'array {i}')
    assert np.abs(w[1:] - z[1:]).max() > 0.1 * scale  # correlated: not the independent draws


def _tree_prefix_noise(exp, epoch, s):
  """The sum of the node noises of s's binary decomposition (node (l, j) = rounds [j 2^l, (j+1) 2^l)),
  each node's noise from keys.tree_node_key: the tree's prefix-sum noise after s rounds of an epoch."""
  std = exp.mechanism.noise_multiplier * exp.config.dp.clip_norm
  like = exp.init_state().shared
  total, start = None, 0
  for level in reversed(range(s.bit_length())):
    if s >> level & 1:
      node = start >> level
      z = [np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(
          noise.gaussian_like(keys.tree_node_key(exp.root_key, epoch, level, node), like, std))]
      total = z if total is None else [a + b for a, b in zip(total, z)]
      start += 1 << level
  return total


def test_tree_noise_is_the_difference_of_the_prefix_sums_of_tree_nodes():
  """N = 8, m = 2: epochs of E = 4 rounds; 6 rounds = one epoch and a half. Within each epoch the sum
  of the released noises of its first s rounds is the sum of the nodes of s's dyadic decomposition,
  and the tree restarts at the epoch boundary."""
  exp = _zero_update('tree', num_rounds=6)
  epoch_length = math.ceil(8 / round(0.25 * 8))
  released, _ = _released_noise(exp, 6)
  for r in range(6):
    epoch, s = divmod(r, epoch_length)
    prefix = [sum(released[epoch * epoch_length + k][i] for k in range(s + 1))
              for i in range(len(released[r]))]
    for got, want in zip(prefix, _tree_prefix_noise(exp, epoch, s + 1)):
      np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max(), err_msg=f'round {r}')


# ------------------------------------------------------------------------ sensitivity, brute force
@pytest.mark.parametrize('rounds,bands', [(7, 2), (8, 3), (6, 1)])
def test_banded_sensitivity_by_enumerating_participations(rounds, bands):
  """Every participation pattern the banded sampler allows (any subset of the rounds of one group):
  the columns of C do not overlap, so ||C 1_S||^2 = sum of the column norms^2 <= |S| ||c||^2, the
  maximum is jax_privacy's min-sep sensitivity, and one participation costs max_column_norm."""
  coefs = np.asarray(correlated.banded_strategy(rounds, bands))
  c_matrix = np.asarray(toeplitz.materialize_lower_triangular(coefs, rounds), np.float64)
  col_sq = (c_matrix ** 2).sum(axis=0)
  worst = 0.0
  for group in range(bands):
    own = list(range(group, rounds, bands))
    for k in range(1, len(own) + 1):
      for subset in itertools.combinations(own, k):
        x = np.zeros(rounds)
        x[list(subset)] = 1.0
        sens_sq = float(np.sum((c_matrix @ x) ** 2))
        np.testing.assert_allclose(sens_sq, col_sq[list(subset)].sum(), rtol=1e-9)
        worst = max(worst, sens_sq)
  np.testing.assert_allclose(worst, float(toeplitz.minsep_sensitivity_squared(coefs, bands, n=rounds)),
                             rtol=1e-5)
  np.testing.assert_allclose(correlated.max_column_norm(correlated.banded_strategy(rounds, bands)),
                             np.sqrt(col_sq.max()), rtol=1e-6)


def _tree_membership(epoch_length):
  """[nodes, E] 0/1: the complete dyadic nodes over E rounds (those some prefix sum releases)."""
  rows = []
  for s in range(1, epoch_length + 1):
    start = 0
    for level in reversed(range(s.bit_length())):
      if s >> level & 1:
        row = np.zeros(epoch_length)
        row[start:start + (1 << level)] = 1
        rows.append(tuple(row))
        start += 1 << level
  return np.array(sorted(set(rows)))


@pytest.mark.parametrize('epoch_length', range(1, 21))
def test_tree_sensitivity_by_enumerating_the_released_nodes(epoch_length):
  """A client in one round per epoch: the squared sensitivity is the largest number of released
  nodes one round is in (the largest column norm^2 of the node matrix), = tree_sensitivity_squared,
  and dp_accounting's SingleEpochTreeAggregationDpEvent composes to the same RDP as our Gaussian."""
  members = _tree_membership(epoch_length)
  worst = float((members ** 2).sum(axis=0).max())
  assert correlated.tree_sensitivity_squared(epoch_length) == worst
  orders = [2.0, 8.0, 32.0]
  ours = dp_accounting.rdp.RdpAccountant(orders, _ADD_REMOVE).compose(
      dp_accounting.GaussianDpEvent(1.3 / math.sqrt(worst)))
  library = dp_accounting.rdp.RdpAccountant(orders, _ZERO_OUT).compose(
      dp_accounting.SingleEpochTreeAggregationDpEvent(1.3, epoch_length))
  np.testing.assert_allclose(ours._rdp, library._rdp, rtol=1e-12)  # pylint: disable=protected-access


# ------------------------------------------------------------------------------------- accounting
def test_banded_epsilon_is_jax_privacys_cyclic_poisson_bandmf_accountant():
  """N = 12 = 3 groups of 4, q = 0.25: jax_privacy's DpsgdTrainingAccountant with cycle_length b
  (the amplified BandMF reduction) gives the run's epsilon after every number of rounds."""
  exp = _zero_update('banded', num_clients=12, num_rounds=7)
  params = jp_analysis.DpParams(noise_multipliers=exp.mechanism.noise_multiplier, num_samples=12,
                                delta=1e-3, batch_size=3, cycle_length=3)
  accountant = jp_analysis.DpsgdTrainingAccountant(jp_accountants.PldAccountantConfig())
  for rounds in (1, 3, 4, 7):
    np.testing.assert_allclose(exp.epsilon_after(rounds), accountant.compute_epsilon(rounds, params),
                               rtol=1e-6)


def test_tree_epsilon_is_dp_accountings_tree_event_under_rdp():
  exp = _zero_update('tree', num_rounds=6, **{'dp.accountant': 'rdp'})  # E = 4
  sigma = exp.mechanism.noise_multiplier
  event = dp_accounting.ComposedDpEvent([
      dp_accounting.SelfComposedDpEvent(dp_accounting.SingleEpochTreeAggregationDpEvent(sigma, 4), 1),
      dp_accounting.SingleEpochTreeAggregationDpEvent(sigma, 2)])
  want = dp_accounting.rdp.RdpAccountant(neighboring_relation=_ZERO_OUT).compose(
      event).get_epsilon(1e-3)
  np.testing.assert_allclose(exp.epsilon_after(6), want, rtol=1e-9)


def test_one_band_is_independent_noise_with_poisson_sampling():
  banded = _zero_update('banded', **{'dp.num_bands': 1})
  independent = _zero_update('independent')
  assert banded.epsilon_after(5) == independent.epsilon_after(5)


def _oracle_epsilon(exp, rounds):
  """Epsilon from the config alone, through jax_privacy (banded) and dp_accounting (tree)."""
  c, sigma = exp.config, exp.mechanism.noise_multiplier
  if c.dp.noise_mechanism == 'banded':
    b = c.dp.num_bands
    params = jp_analysis.DpParams(noise_multipliers=sigma, num_samples=c.num_clients,
                                  delta=exp.mechanism.delta,
                                  batch_size=round(c.sampling_rate * c.num_clients), cycle_length=b)
    return jp_analysis.DpsgdTrainingAccountant(jp_accountants.PldAccountantConfig()).compute_epsilon(
        rounds, params)
  epoch = math.ceil(c.num_clients / max(1, round(c.sampling_rate * c.num_clients)))
  full, rest = divmod(rounds, epoch)
  events = [dp_accounting.SelfComposedDpEvent(
      dp_accounting.SingleEpochTreeAggregationDpEvent(sigma, epoch), full)]
  events += [dp_accounting.SingleEpochTreeAggregationDpEvent(sigma, rest)] if rest else []
  return dp_accounting.rdp.RdpAccountant(neighboring_relation=_ZERO_OUT).compose(
      dp_accounting.ComposedDpEvent(events)).get_epsilon(exp.mechanism.delta)


@pytest.mark.parametrize('mechanism', ['banded', 'tree'])
def test_calibrated_sigma_meets_the_target_under_the_libraries_accountants(mechanism):
  """sigma calibrated for eps = 2 spends [0.98, 1] of it by the libraries' own accountants (banded:
  jax_privacy's PLD; tree: RDP, the accountant dp_accounting's tree event has)."""
  accountant = 'rdp' if mechanism == 'tree' else 'pld'
  exp = _zero_update(mechanism, num_clients=12, num_rounds=7,
                     **{'dp.noise_multiplier': None, 'dp.target_epsilon': 2.0,
                        'dp.accountant': accountant})
  epsilon = _oracle_epsilon(exp, 7)
  assert 0.98 * 2.0 <= epsilon <= 2.0 * (1 + 1e-3), (exp.mechanism.noise_multiplier, epsilon)


# --------------------------------------------------------------------------------------- samplers
def _cohorts(exp, rounds):
  step = jax.jit(exp.make_round_step())
  state, sampled = exp.init_state(), []
  for _ in range(rounds):
    new, _ = step(state, exp.data, exp.root_key)
    sampled.append(np.asarray(new.times_sampled - state.times_sampled) > 0)
    state = new
  return np.array(sampled)


def test_banded_cohorts_are_poisson_within_one_group_per_round():
  """300 rounds, N = 16, b = 4, q = 0.125: every client is sampled only in rounds of one residue
  mod b (its group), the groups have 4 clients each, and within its group's rounds a client is
  sampled with the accounted probability (the event's q b = 0.5; binomial bounds)."""
  rounds, bands = 300, 4
  exp = _zero_update('banded', num_clients=16, sampling_rate=0.125, num_rounds=rounds,
                     **{'dp.num_bands': bands})
  q_group = exp.mechanism.dp_event(1).event.sampling_probability
  assert q_group == pytest.approx(0.125 * bands)
  sampled = _cohorts(exp, rounds)
  residues = [set(np.nonzero(sampled[:, i])[0] % bands) for i in range(16)]
  assert all(len(r) == 1 for r in residues), residues
  groups = np.array([r.pop() for r in residues])
  assert sorted(np.bincount(groups, minlength=bands)) == [4] * bands
  chances = rounds // bands
  per_client = sampled.sum(axis=0)
  assert np.all(np.abs(per_client - chances * q_group)
                < 5 * np.sqrt(chances * q_group * (1 - q_group))), per_client


def test_tree_cohorts_hold_every_client_exactly_once_per_epoch():
  """N = 8, q = 0.25: m = 2 clients a round, E = 4 rounds an epoch; 3 epochs; the shuffles differ."""
  exp = _zero_update('tree', num_rounds=12)
  sampled = _cohorts(exp, 12)
  assert set(sampled.sum(axis=1).tolist()) == {2}
  for epoch in range(3):
    assert np.all(sampled[4 * epoch:4 * epoch + 4].sum(axis=0) == 1), epoch
  orders = {tuple(np.argmax(sampled[4 * e:4 * e + 4], axis=0)) for e in range(3)}
  assert len(orders) > 1


# ------------------------------------------------------------------------------------------ resume
def _resume_config():
  return tiny_config(num_rounds=4, eval_every=1, **{'dp.noise_mechanism': 'banded',
                                                    'dp.num_bands': 2})


def test_banded_resume_restores_the_noise_buffer_bit_for_bit(tmp_path, monkeypatch):
  """A banded run killed before round 3's checkpoint resumes from round 2's, whose noise buffer is
  the live run's (non-zero), and ends bit-identical to the uninterrupted run."""
  full = str(tmp_path / 'full')
  train.train_and_evaluate(_resume_config(), full)
  exp = train.build_experiment(_resume_config())
  want, _ = checkpoint.restore(full, exp.init_state())

  workdir = str(tmp_path / 'killed')
  saved = {}
  train_killed_before_checkpoint(
      monkeypatch, _resume_config(), workdir, kill_round=3,
      on_save=lambda wd, state: saved.update({int(state.round): jax.device_get(state.noise_state)}))
  restored, _ = checkpoint.restore(workdir, exp.init_state())
  assert int(restored.round) == 2
  assert any(np.any(np.asarray(x) != 0) for x in jax.tree.leaves(saved[2]))
  chex.assert_trees_all_equal(restored.noise_state, saved[2])
  train.train_and_evaluate(_resume_config(), workdir)
  got, _ = checkpoint.restore(workdir, exp.init_state())
  chex.assert_trees_all_equal(got, want)
  assert os.path.exists(os.path.join(workdir, 'metrics.jsonl'))


def test_banded_run_refuses_a_resume_with_another_num_rounds(tmp_path):
  workdir = str(tmp_path)
  config = _resume_config()
  config.num_rounds = 2
  train.train_and_evaluate(config, workdir)
  config.num_rounds = 3
  with pytest.raises(ValueError, match='num_rounds: 2 -> 3'):
    train.train_and_evaluate(config, workdir)


# ------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize('fields,field', [
    ({'dp.num_bands': 3, 'sampling_rate': 0.5}, 'dp.num_bands'),
    ({'dp.num_bands': 5, 'num_rounds': 4, 'sampling_rate': 0.1}, 'dp.num_bands'),
    ({'dp.noise_placement': 'distributed'}, 'dp.noise_placement'),
    ({'dp.sampling': 'fixed', 'dp.accountant': 'rdp'}, 'dp.sampling'),
])
def test_banded_config_conflicts_are_refused_naming_the_field(fields, field):
  config = tiny_config(**{'dp.noise_mechanism': 'banded', 'dp.num_bands': 2, **fields})
  with pytest.raises(ConfigError, match='^config.' + field.replace('.', r'\.') + '='):
    validate_config(config)


REFUSED = ('fed_smp_randk', 'fed_smp_topk', 'dp_pfeddsu', 'dp_fedsam_topk')


@pytest.mark.parametrize('mechanism', ['banded', 'tree'])
def test_every_central_noised_sum_method_takes_correlated_noise_and_the_others_are_refused(mechanism):
  for name in sorted(METHODS):
    spec = get_method(name)
    if spec.private and name not in REFUSED:
      spec.check_noise_mechanism(mechanism)
    else:
      with pytest.raises(ConfigError, match=r"^config\.dp\.noise_mechanism="):
        spec.check_noise_mechanism(mechanism)


def test_banded_run_refuses_a_resume_whose_strategy_differs(tmp_path, monkeypatch):
  """BandMF's coefficients are recomputed at every start: a resume whose optimiser returns others
  (another jax_privacy, another backend) is refused against the ones the run stored."""
  workdir = str(tmp_path)
  train_killed_before_checkpoint(monkeypatch, _resume_config(), workdir, kill_round=2)
  with open(os.path.join(workdir, run_files.MECHANISM_FILE)) as f:
    stored = json.load(f)
  assert stored == {'noise_mechanism': 'banded',
                    'strategy': list(correlated.banded_strategy(4, 2))}
  other = tuple(c * (1 + 1e-6 * j) for j, c in enumerate(correlated.banded_strategy(4, 2)))
  monkeypatch.setattr(correlated, 'banded_strategy', lambda rounds, bands: other)
  with pytest.raises(ValueError, match='another noise strategy'):
    train.train_and_evaluate(_resume_config(), workdir)
  monkeypatch.undo()
  train.train_and_evaluate(_resume_config(), workdir)  # the stored strategy resumes


def test_each_mechanism_names_the_neighbouring_relation_its_epsilon_holds_under():
  """docs/privacy.md section 7's last column: the tree's epsilon is a zero-out guarantee
  (REPLACE_SPECIAL), not add/remove; the dry run says which."""
  assert Independent(10, 0.5).neighbours == 'add/remove one client'
  assert Independent(10, 0.5, 'fixed').neighbours == 'replace one client'
  assert BandMF(10, 0.25, (1.0,)).neighbours == 'add/remove one client'
  info = train.describe(tiny_config(num_rounds=3, **{'dp.noise_mechanism': 'tree'}))
  assert info['neighbours'] == 'zero-out one client'


# ---------------------------------------------------------------- experiments/noise_mechanisms.py


def test_the_momentum_workload_is_the_server_optimizers_model():
  """workload(T, beta)[t] is how the model after round t weights each round's release under the
  server optimizer the runs use (optax momentum through server_optimizer), and beta = 0 gives the
  prefix sums BandMF is optimised for."""
  from experiments import noise_mechanisms as tool  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.server_optimizer import make_server_step  # pylint: disable=import-outside-toplevel
  rounds, beta = 7, 0.9
  np.testing.assert_array_equal(tool.workload(rounds), np.tril(np.ones((rounds, rounds))))
  # Round k releases the unit vector e_k; the model's coordinate k after round t is A[t, k].
  server = make_server_step('momentum', momentum=beta)
  model = np.zeros(rounds, np.float32)
  state, rows = server.init(model), []
  for k in range(rounds):
    model, state = server.apply(model, np.eye(rounds, dtype=np.float32)[k], 1.0, 1.0, state)
    rows.append(np.asarray(model))
  np.testing.assert_allclose(tool.workload(rounds, beta), np.stack(rows), rtol=1e-6)


def test_model_noise_variance_of_independent_noise_is_the_workloads_row_norms():
  from experiments import noise_mechanisms as tool  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.privacy.mechanism import DPMechanism  # pylint: disable=import-outside-toplevel
  independent = DPMechanism(Independent(100, 0.1), clip_norm=1.0, noise_multiplier=1.0)
  assert tool.model_noise_variance(independent, 5) == pytest.approx(3.0)  # mean of 1..5
  a = tool.workload(5, 0.5)
  assert tool.model_noise_variance(independent, 5, 0.5) == pytest.approx(np.mean((a ** 2).sum(1)))
  banded = DPMechanism(BandMF.for_run(100, 0.1, 5, 2), clip_norm=1.0, noise_multiplier=1.0)
  c = toeplitz.materialize_lower_triangular(np.asarray(banded.noise.strategy), 5)
  assert tool.model_noise_variance(banded, 5, 0.5) == pytest.approx(
      np.mean(((a @ np.linalg.inv(np.asarray(c, np.float64))) ** 2).sum(1)))
