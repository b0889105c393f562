"""Privacy mutation tests: each mutant breaks the DP guarantee in one named way, and a
privacy oracle of the suite must fail under it. The session ends with the table mutant -> killing
test (conftest.py); a mutant that survives fails the run.

A mutant is a monkeypatch of a name the engine looks up while a round step is traced: a method of
DPMechanism, or an attribute of `keys`, `noise`, `round` or `state`. The patches so survive
refactors that keep these seams, and every killer builds and jits a fresh round step, so no jit
cache hides a patch. The round calls the privatizer's halves (DPMechanism.client, .server), which
reach the patched methods by name. Adaptive clipping's mutants patch its clip rule
(clip_rules.AdaptiveClip, clip_rules.unclipped_count) or the DPMechanism calls that reach it.

A kill is an AssertionError from a killer that passes on the real code (it passed earlier in the
session, or it is run unpatched here first); any other exception means the patch is broken and fails
the test. Each mutant tries the killer it names first, then all the others, so the harness costs
about one killer run per mutant.

Most mutants break the guarantee; a few (breaks_privacy=False) only change accuracy or add noise,
yet change what the method or the docs claim, so they are planted and killed too. docs/privacy.md
section 6 lists every mutant by name with that mark, and a test here holds the two equal.
"""

from __future__ import annotations

import functools
import pathlib
import tempfile
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import pytest

import conftest
import test_accounting
import test_adaptive_clipping
import test_correlated
import test_engine
import test_keys
import test_mechanism
from dp2fedsam_jax import checkpoint, keys
from dp2fedsam_jax import federated_round as round_module
from dp2fedsam_jax import state as state_module
from dp2fedsam_jax.algorithms import specs
from dp2fedsam_jax.data.federated import FederatedData
from dp2fedsam_jax.privacy import accounting, clip_rules, correlated, noise, sampling
from dp2fedsam_jax.privacy.clip_rules import AdaptiveClip
from dp2fedsam_jax.privacy.mechanism import DPMechanism
from dp2fedsam_jax.trees import global_norm


class Killer(NamedTuple):
  name: str              # the test's node id, as the table prints it
  run: Callable[[], None]


def _killer(test, *params) -> Killer:
  name = f'{test.__module__}.py::{test.__name__}' + (f'[{"-".join(params)}]' if params else '')
  return Killer(name, functools.partial(test, *params))


CLIPPING = _killer(test_engine.test_clipping_matches_a_float64_oracle_of_all_arrays_concatenated)
CLIPPED_SUM = _killer(test_engine.test_round_releases_the_clipped_sum_over_the_expected_cohort)
HEADS = _killer(test_engine.test_personal_heads_train_but_never_reach_the_release)
NOISE_CENTRAL = _killer(
    test_mechanism.test_released_noise_is_the_calibrated_sigma_c_on_every_array_and_fresh_each_round,
    'poisson', 'central')
NOISE_DISTRIBUTED = _killer(
    test_mechanism.test_released_noise_is_the_calibrated_sigma_c_on_every_array_and_fresh_each_round,
    'poisson', 'distributed')
SAMPLER = _killer(test_mechanism.test_the_rounds_cohorts_are_the_accounted_sampler, 'poisson')
DRAWS = _killer(test_keys.test_every_random_draw_of_two_rounds_uses_its_own_key)
BANDED_ROWS = _killer(test_correlated.test_banded_noise_rows_satisfy_c_w_equals_z)
TREE_ROWS = _killer(test_correlated.test_tree_noise_is_the_difference_of_the_prefix_sums_of_tree_nodes)
BANDED_SAMPLER = _killer(test_correlated.test_banded_cohorts_are_poisson_within_one_group_per_round)
TREE_SAMPLER = _killer(test_correlated.test_tree_cohorts_hold_every_client_exactly_once_per_epoch)
BANDED_JAX_PRIVACY = _killer(
    test_correlated.test_banded_epsilon_is_jax_privacys_cyclic_poisson_bandmf_accountant)
# The run's epsilon() and the tuner's dp_event(T) are one number (the banded accounting mutant's own).
ONE_EPSILON = _killer(test_accounting.test_dp_event_composed_by_dp_accounting_is_the_runs_epsilon,
                      'banded', 'poisson', 'fixed', 'rdp')
TREE_CALIBRATION = _killer(
    test_correlated.test_calibrated_sigma_meets_the_target_under_the_libraries_accountants, 'tree')
COUNT_NOISE = _killer(test_adaptive_clipping.test_the_clip_norm_moves_by_the_noised_count_with_std_s_b_over_m)
SAMPLED_ROUND = _killer(
    test_adaptive_clipping.test_at_q_below_one_the_noise_is_sigma_c_t_and_the_count_is_over_valid_slots_and_the_public_m)
PAIR_EPSILON = _killer(
    test_adaptive_clipping.test_one_round_of_the_pair_is_the_two_dimensional_gaussian_computed_by_hand)


def _banded_resume():
  with tempfile.TemporaryDirectory() as workdir, pytest.MonkeyPatch.context() as mp:
    test_correlated.test_banded_resume_restores_the_noise_buffer_bit_for_bit(pathlib.Path(workdir), mp)


BANDED_RESUME = Killer(
    'test_correlated.py::test_banded_resume_restores_the_noise_buffer_bit_for_bit', _banded_resume)

# Cheapest first: the order in which a mutant's fallbacks are tried.
KILLERS = {k.name: k.run for k in
           (COUNT_NOISE, PAIR_EPSILON, SAMPLED_ROUND, CLIPPING, CLIPPED_SUM, SAMPLER, HEADS, NOISE_CENTRAL,
            NOISE_DISTRIBUTED, DRAWS,
            ONE_EPSILON, BANDED_JAX_PRIVACY, TREE_CALIBRATION, TREE_SAMPLER, BANDED_SAMPLER, TREE_ROWS,
            BANDED_ROWS, BANDED_RESUME)}

# name -> (patch(monkeypatch), killer names to try first)
MUTANTS: dict[str, tuple[Callable, list[str]]] = {}
# The mutants that only change accuracy or add noise: epsilon still holds under them.
NOT_PRIVACY_BREAKS: set[str] = set()


def mutant(name: str, *try_first: Killer, breaks_privacy: bool = True):
  def register(patch):
    MUTANTS[name] = (patch, [k.name for k in try_first])
    if not breaks_privacy:
      NOT_PRIVACY_BREAKS.add(name)
    return patch
  return register


@mutant('per-array clipping', CLIPPING)
def _per_array_clipping(mp):
  def clip_each_array(self, delta):  # sensitivity C sqrt(L) instead of C
    scale = lambda x: jnp.minimum(1.0, self.clip_norm / jnp.maximum(global_norm(x), 1e-30))
    return jax.tree.map(lambda x: x * scale(x), delta), global_norm(delta)
  mp.setattr(DPMechanism, 'clip', clip_each_array)


@mutant('no clipping', CLIPPING)
def _no_clipping(mp):
  mp.setattr(DPMechanism, 'clip', lambda self, delta: (delta, global_norm(delta)))


@mutant('noise std sigma C / 2', NOISE_CENTRAL)
def _half_noise(mp):
  real = DPMechanism.noise_std
  mp.setattr(DPMechanism, 'noise_std', property(lambda self: real.fget(self) / 2))


@mutant('noise on all arrays but one', NOISE_CENTRAL)
def _one_array_without_noise(mp):
  real = noise.gaussian_like

  def all_but_the_smallest(key, tree, stddev):  # the smallest array moves a pooled std least
    leaves, treedef = jax.tree.flatten(real(key, tree, stddev))
    smallest = min(range(len(leaves)), key=lambda i: leaves[i].size)
    leaves[smallest] = jnp.zeros_like(leaves[smallest])
    return jax.tree.unflatten(treedef, leaves)
  mp.setattr(noise, 'gaussian_like', all_but_the_smallest)


@mutant('the same noise key every round', NOISE_CENTRAL)
def _same_noise_key(mp):
  real = keys.round_keys
  mp.setattr(keys, 'round_keys', lambda root, r: real(root, r)._replace(noise=real(root, 0).noise))


@mutant('the rand-k mask key equal to a noise key', DRAWS)
def _mask_key_is_a_noise_key(mp):
  real = keys.round_keys

  def round_keys(root, r):  # the bug that once shipped: fold_in(noise, 1) == split(noise, L)[1]
    streams = real(root, r)
    return streams._replace(public_mask=jax.random.fold_in(streams.noise, 1))
  mp.setattr(keys, 'round_keys', round_keys)


@mutant('dividing by the actual cohort size', CLIPPED_SUM)
def _actual_cohort(mp):
  mp.setattr(DPMechanism, 'denominator',
             lambda self, cohort: jnp.maximum(cohort, 1).astype(jnp.float32))


@mutant('weighting by client sample counts', CLIPPED_SUM)
def _count_weighting(mp):
  # A client's examples are gathered inside its mapped function, so the mutant hands the count of
  # the client being traced from the gather to the clipping that follows it in the same trace.
  real_gather, real_clip = FederatedData.train_examples, DPMechanism.clip
  traced = {}

  def train_examples(self, client_id, budget, key=None, *args, **kwargs):
    x, y, count = real_gather(self, client_id, budget, key, *args, **kwargs)
    traced['weight'] = count / (self.train_offsets[-1] / self.num_clients)  # n_i / mean n
    return x, y, count

  def clip(self, delta):  # pop: a clip outside a client's trace (the round's zero sums) weighs 1
    upload, norm = real_clip(self, delta)
    weight = traced.pop('weight', 1.0)
    return jax.tree.map(lambda u: (u * weight).astype(u.dtype), upload), norm
  mp.setattr(FederatedData, 'train_examples', train_examples)
  mp.setattr(DPMechanism, 'clip', clip)


@mutant('a fixed-size sampler accounted as Poisson', SAMPLER)
def _fixed_size_sampler(mp):
  real = DPMechanism.sample

  def sample(self, key, round_index=0, root=None):
    if self.sampling == 'poisson':
      return sampling.sample_cohort(key, 'fixed', self.sampling_rate, self.num_clients)
    return real(self, key, round_index, root)
  mp.setattr(DPMechanism, 'sample', sample)


@mutant('distributed shares sigma C / |S| instead of sigma C / sqrt|S|', NOISE_DISTRIBUTED)
def _shares_over_cohort(mp):
  real = DPMechanism.client_noise_std

  def client_noise_std(self, cohort):
    return real(self, jnp.ones_like(cohort)) / jnp.maximum(cohort, 1).astype(jnp.float32)
  mp.setattr(DPMechanism, 'client_noise_std', client_noise_std)


# Clipped and noised with the shared part (sensitivity C still), so not a privacy break: the
# method is no longer the personalized one it claims to be.
@mutant('the personal head included in the upload', HEADS, breaks_privacy=False)
def _head_in_upload(mp):
  real_split, real_make = state_module.split_params, round_module.make_client_update

  def split_params(spec, params):  # the server holds a head too, so the upload can carry one
    shared, personal = real_split(spec, params)
    if spec.personal == specs.OWN_HEAD:
      shared = {**shared, 'head': params['head']}
    return shared, personal

  def make_client_update(spec, model, local_config, normalize, **kwargs):
    update = real_make(spec, model, local_config, normalize, **kwargs)

    def client_update(shared, personal, *args):
      result = update(shared, personal, *args)
      if 'head' in result.delta and 'head' in personal:  # the head phase's change goes up
        change = jax.tree.map(jnp.subtract, result.personal['head'], personal['head'])
        result = result._replace(delta={**result.delta, 'head': change})
      return result
    return client_update
  mp.setattr(state_module, 'split_params', split_params)
  mp.setattr(round_module, 'make_client_update', make_client_update)


@mutant('padded slots included in the sum', CLIPPED_SUM)
def _padding_in_sum(mp):
  mp.setattr(round_module, '_masked_sum',
             lambda tree, valid: jax.tree.map(lambda x: jnp.sum(x, axis=0), tree))


# ---------------------------------------------------------------- correlated noise
@mutant('banded: independent draws, rows not C^-1 Z', BANDED_ROWS)
def _banded_uncorrelated(mp):
  mp.setattr(correlated, 'banded_noise', lambda z, buffer, strategy: (z, buffer))


# Fresh noise of the tree's std every round: more noise than the tree, not less privacy.
@mutant('tree: independent leaf noise, not the prefix-sum nodes', TREE_ROWS, breaks_privacy=False)
def _tree_uncorrelated(mp):
  def leaf_only(root, round_index, like, stddev, epoch_length):
    node = keys.tree_node_key(root, round_index // epoch_length, 0, round_index % epoch_length)
    return noise.gaussian_like(node, like, stddev)
  mp.setattr(correlated, 'tree_noise', leaf_only)


# The resumed run restarts the correlation (noise still calibrated): the run is not the one it
# claims to repeat, but no release loses noise.
@mutant('banded: the noise buffer not restored on resume (saved as zeros)', BANDED_RESUME,
        breaks_privacy=False)
def _buffer_not_checkpointed(mp):
  real = checkpoint.save

  def save(workdir, state, records, *window):
    real(workdir, state.replace(noise_state=jax.tree.map(jnp.zeros_like, state.noise_state)), records,
         *window)
  mp.setattr(checkpoint, 'save', save)


@mutant('banded: Poisson q over all N, not within the round\'s group', BANDED_SAMPLER)
def _banded_poisson_everyone(mp):
  mp.setattr(correlated, 'sample_banded', lambda key, round_index, root, q, n, bands:
             jax.random.uniform(key, (n,)) < q)


@mutant('tree: Poisson q, a client more than once per epoch', TREE_SAMPLER)
def _tree_poisson(mp):
  mp.setattr(correlated, 'sample_tree', lambda round_index, root, q, n:
             jax.random.uniform(keys.epoch_order_key(root, round_index), (n,)) < q)


@mutant('banded: accounted as T independent rounds at rate q', ONE_EPSILON)
def _banded_accounted_as_independent(mp):
  real = DPMechanism.dp_event

  def dp_event(self, rounds):
    if self.correlated and self.noise_mechanism == 'banded':
      return accounting.dp_event(self.noise_multiplier, self.sampling_rate, rounds)
    return real(self, rounds)
  mp.setattr(DPMechanism, 'dp_event', dp_event)


@mutant('tree: noise scaled for sensitivity C, not C sqrt(levels)', TREE_CALIBRATION)
def _tree_sensitivity_one(mp):
  mp.setattr(correlated, 'tree_sensitivity_squared', lambda rounds: 1)


# ---------------------------------------------------------------- adaptive clipping
@mutant('adaptive clipping: the count of unclipped clients not noised', COUNT_NOISE)
def _count_not_noised(mp):
  def noiseless(self, key, unclipped, cohort, divisor):
    del key
    return (unclipped.astype(jnp.float32) - 0.5 * cohort.astype(jnp.float32)) / divisor + 0.5
  mp.setattr(AdaptiveClip, 'noised_unclipped_fraction', noiseless)


@mutant("adaptive clipping: the count's noise left out of the accounting", PAIR_EPSILON)
def _count_not_accounted(mp):
  mp.setattr(DPMechanism, 'effective_noise_multiplier', property(lambda self: self.noise_multiplier))


@mutant('adaptive clipping: C moved by the un-noised count', COUNT_NOISE)
def _clip_norm_from_the_exact_count(mp):
  real = AdaptiveClip.noised_unclipped_fraction

  def next_state(self, key, state, unclipped, cohort, divisor):
    real(self, key, unclipped, cohort, divisor)  # released, but not what C moves by
    exact = unclipped.astype(jnp.float32) / cohort.astype(jnp.float32)
    return state * jnp.exp(-self.clip_lr * (exact - self.target_quantile))
  mp.setattr(AdaptiveClip, 'next_state', next_state)


@mutant('adaptive clipping: clipped to C_t but noised at sigma C_0', SAMPLED_ROUND)
def _noise_at_initial_clip_norm(mp):
  # The round's mechanism is built at trace time from the state's C_t; the mutant keeps C_0 (the
  # run's mechanism's C) for the noise and lets clipping use C_t.
  real = DPMechanism.at_clip_state
  initial = {}

  def at_clip_state(self, clip_state):
    initial['clip_norm'] = self.clip_norm
    return real(self, clip_state)
  mp.setattr(DPMechanism, 'at_clip_state', at_clip_state)
  mp.setattr(DPMechanism, 'noise_std', property(
      lambda self: self.noise_multiplier * initial.get('clip_norm', self.clip_norm)
      if self.private else 0.0))


@mutant("adaptive clipping: the padded cohort slots' bits counted", SAMPLED_ROUND)
def _count_padded_slots(mp):
  mp.setattr(clip_rules, 'unclipped_count', lambda norms, valid, clip_norm: jnp.sum(
      norms <= clip_norm, dtype=jnp.int32))


@mutant('adaptive clipping: the noised count over the realised |S|, not the public m',
        SAMPLED_ROUND)
def _count_over_realised_cohort(mp):
  def next_clip_state(self, key, clip_state, unclipped, cohort):
    if not self.adaptive:
      return clip_state
    return self.clipping.next_state(key, clip_state, unclipped, cohort,
                                    jnp.maximum(cohort, 1).astype(jnp.float32))
  mp.setattr(DPMechanism, 'next_clip_state', next_clip_state)


# ---------------------------------------------------------------- private selection (tuning)
import numpy as np  # noqa: E402  (this block stays apart: the accounting of launch/tune.py)
import test_selection  # noqa: E402
from dp2fedsam_jax.privacy import selection  # noqa: E402

SELECTION_TNB = Killer(
    'test_selection.py::test_truncated_negative_binomial_epsilon_is_theorem_2_by_hand[0.0-0.05]',
    functools.partial(test_selection.test_truncated_negative_binomial_epsilon_is_theorem_2_by_hand,
                      0.0, 0.05))
SELECTION_SAMPLER = Killer(
    'test_selection.py::test_the_sampler_draws_k_from_its_distribution[spec0]',
    functools.partial(test_selection.test_the_sampler_draws_k_from_its_distribution,
                      {'name': 'poisson', 'mu': 4.0}))
KILLERS.update({k.name: k.run for k in (SELECTION_TNB, SELECTION_SAMPLER)})


@mutant("tuning: the selection reported at one trial's epsilon", SELECTION_TNB)
def _selection_at_one_trial(mp):
  mp.setattr(selection, 'selection_rdp', lambda rdp, distribution, orders=selection.ORDERS:
             np.asarray(rdp, np.float64))


@mutant('tuning: K fixed at round(E[K]) but accounted as random', SELECTION_SAMPLER)
def _fixed_number_of_trials(mp):
  mp.setattr(selection.TrialDistribution, 'sample', lambda self, rng: max(1, round(self.mean)))


import test_tune  # noqa: E402
from launch import tune  # noqa: E402


def _in_tmp_dir(test) -> Callable[[], None]:
  """A killer of a test taking (tmp_path, monkeypatch), run in its own directory and patches."""
  def run():
    with tempfile.TemporaryDirectory() as workdir, pytest.MonkeyPatch.context() as mp:
      test(pathlib.Path(workdir), mp)
  return run


TUNE_SECRET = Killer(
    'test_tune.py::test_the_score_noise_k_and_candidates_come_from_the_operators_secret_not_the_'
    'public_seed', _in_tmp_dir(
        test_tune.test_the_score_noise_k_and_candidates_come_from_the_operators_secret_not_the_public_seed))
TUNE_PUBLISHED = Killer(  # the K = 2 draw: K published with its bound, no trial record
    'test_tune.py::test_the_published_file_holds_no_per_trial_record_and_the_operator_file_holds_it'
    f'[{test_tune.SECRET_LARGE_K2}]', _in_tmp_dir(functools.partial(
        test_tune.test_the_published_file_holds_no_per_trial_record_and_the_operator_file_holds_it,
        secret=test_tune.SECRET_LARGE_K2)))
KILLERS.update({k.name: k.run for k in (TUNE_SECRET, TUNE_PUBLISHED)})


@mutant('tuning: the score noise drawn from the public seed', TUNE_SECRET)
def _score_noise_from_the_public_seed(mp):
  real = tune._trial_outcome  # the committed studies' bug: score - s z / N is the exact sum
  mp.setattr(tune, '_trial_outcome', lambda run, config, spec, index, secret:
             real(run, config, spec, index, int(spec['seed'])))


@mutant("tuning: the selected trial's un-noised metric in the published file", TUNE_PUBLISHED)
def _un_noised_metric_published(mp):
  real = tune.published_record

  def published_record(record):
    out = real(record)
    if record['selected_index'] is not None:
      out['selected_metric'] = record['trials'][record['selected_index']]['metric']
    return out
  mp.setattr(tune, 'published_record', published_record)


TRIAL_SEEDS = Killer(
    'test_tune.py::test_each_trial_draws_its_own_secret_training_seed_and_shares_no_stream_with_'
    'another', _in_tmp_dir(
        test_tune.test_each_trial_draws_its_own_secret_training_seed_and_shares_no_stream_with_another))
KILLERS[TRIAL_SEEDS.name] = TRIAL_SEEDS.run


@mutant('tuning: every trial at one seed', TRIAL_SEEDS)
def _every_trial_at_one_seed(mp):
  real = tune.trial_runs  # the first design's bug: every trial at config.seed's cohorts and noise

  def at_the_public_seed(module, config_path, spec, candidates, directory, overrides, names=None,
                         seeds=None):
    return real(module, config_path, spec, candidates, directory, overrides, names)
  mp.setattr(tune, 'trial_runs', at_the_public_seed)


POOL_FLOOR = Killer(
    'test_tune.py::test_a_pool_floor_runs_more_trials_but_the_selection_sees_only_its_k',
    _in_tmp_dir(test_tune.test_a_pool_floor_runs_more_trials_but_the_selection_sees_only_its_k))
KILLERS[POOL_FLOOR.name] = POOL_FLOOR.run


@mutant("tuning: the selection over a pool floor's further trials too", POOL_FLOOR)
def _selection_over_the_whole_pool(mp):
  real = tune._result  # the K of the selection taken as the pool's size: trials no eps covers
  mp.setattr(tune, '_result', lambda *args: real(*args[:-1], len(args[3])))


import dataclasses  # noqa: E402

SAFE_COVERAGE = _killer(test_mechanism.test_a_safe_variant_noises_every_coordinate_of_the_shared_update,
                        'dp_pfeddsu_safe')
KILLERS[SAFE_COVERAGE.name] = SAFE_COVERAGE.run


@mutant("dp_pfeddsu_safe: noise only where its clients' private masks are 1", SAFE_COVERAGE)
def _safe_variant_noised_on_its_masks(mp):
  safe = specs.METHODS['dp_pfeddsu_safe']
  mp.setitem(specs.METHODS, 'dp_pfeddsu_safe', dataclasses.replace(safe, noise_on_mask=True))


_PASSED_HERE = set()


def _check_passes_unpatched(killer: str) -> None:
  """A failure under a mutant counts only from a killer that passes on the real code."""
  if killer in _PASSED_HERE or any(node.endswith(killer) for node in conftest.PASSED_TESTS):
    return
  try:
    KILLERS[killer]()
  except AssertionError as e:
    pytest.fail(f'{killer} fails on the real code, so it cannot kill a mutant: {e}')
  _PASSED_HERE.add(killer)


@pytest.mark.parametrize('name', list(MUTANTS))
def test_privacy_mutant_is_killed(name, request):
  patch, try_first = MUTANTS[name]
  table = request.config.stash.setdefault(conftest.MUTANT_TABLE, {})
  request.config.stash.setdefault(conftest.MUTANT_NOT_BREAKS, set()).update(NOT_PRIVACY_BREAKS)
  table[name] = None
  for killer in [*try_first, *(k for k in KILLERS if k not in try_first)]:
    _check_passes_unpatched(killer)
    with pytest.MonkeyPatch.context() as mp:
      patch(mp)
      try:
        KILLERS[killer]()
      except AssertionError:
        table[name] = killer
        return
  pytest.fail(f'mutant {name!r} survived every killer: {list(KILLERS)}')


DOCS = pathlib.Path(__file__).resolve().parent.parent / 'docs' / 'privacy.md'
NOT_A_BREAK = '(not a privacy break)'


def test_the_docs_table_lists_every_mutant_and_marks_the_ones_that_are_not_privacy_breaks():
  """docs/privacy.md section 6: every mutant of the harness by its name (in backticks) in the
  table's last column, and `name` (not a privacy break) exactly for NOT_PRIVACY_BREAKS."""
  text = DOCS.read_text()
  section = text[text.index('## 6. Which test backs which claim'):text.index('## 7.')]
  cells = [line.rstrip(' |').rsplit(' | ', 1)[-1] for line in section.splitlines()
           if line.startswith('| ') and not line.startswith('| claim')]
  listed = {}
  for cell in cells:
    for name, rest in zip(cell.split('`')[1::2], cell.split('`')[2::2]):
      listed[name.replace('\\|', '|')] = rest.lstrip().startswith(NOT_A_BREAK)
  assert set(listed) == set(MUTANTS), (set(MUTANTS) - set(listed), set(listed) - set(MUTANTS))
  assert {name for name, mark in listed.items() if mark} == NOT_PRIVACY_BREAKS
