"""Random streams: no key is shared by two streams, and the noise is independent of public masks.

In this JAX `split(k, n)[i] == fold_in(k, i)`, so a parent key that is both split and folded hands
one key to two streams (it did: the rand-k mask and the noise on the second array).
"""

import collections

import jax
import numpy as np
import pytest

from conftest import tiny_config
from dp2fedsam_jax import keys, train


def test_split_and_fold_in_collide_in_this_jax():
  """The premise of keys.py: if this ever stops holding, the rule is still safe, just stricter."""
  k = jax.random.key(7)
  np.testing.assert_array_equal(jax.random.key_data(jax.random.split(k, 4)[1]),
                                jax.random.key_data(jax.random.fold_in(k, 1)))


def _trace_key_ops(monkeypatch, fn, *args):
  """Traces fn(*args) and returns {id(parent key): {'split', 'fold_in'}} for every public call."""
  ops = collections.defaultdict(set)
  parents = []  # keeps every parent alive, so ids are not reused while tracing
  real_split, real_fold = jax.random.split, jax.random.fold_in

  def split(key, num=2):
    parents.append(key)
    ops[id(key)].add('split')
    return real_split(key, num)

  def fold_in(key, data):
    parents.append(key)
    ops[id(key)].add('fold_in')
    return real_fold(key, data)

  monkeypatch.setattr(jax.random, 'split', split)
  monkeypatch.setattr(jax.random, 'fold_in', fold_in)
  jax.jit(fn).lower(*args)
  monkeypatch.undo()
  assert ops, 'no key was derived: the interception is broken'
  return ops


@pytest.mark.parametrize('method,placement', [
    ('dp2fedsam', 'central'), ('fed_smp_randk', 'central'), ('fed_smp_randk', 'distributed'),
    ('dp_fedsam_topk', 'distributed'), ('dp_pfeddsu_safe', 'central'), ('dp_fedavg_ft', 'central')])
def test_no_key_is_both_split_and_folded_in_a_round_or_an_evaluation(monkeypatch, method,
                                                                     placement):
  exp = train.build_experiment(tiny_config(method=method, **{'dp.noise_placement': placement}))
  state = exp.init_state()
  for fn, args in ((exp.make_round_step(), (state, exp.data, exp.root_key)),
                   (exp.make_evaluate(), (state, exp.data, exp.eval_key(1)))):
    ops = _trace_key_ops(monkeypatch, fn, *args)
    both = [parent for parent, kinds in ops.items() if kinds == {'split', 'fold_in'}]
    assert not both, f'{len(both)} key(s) both split and folded while tracing {fn}'


def test_keys_module_derivations_of_two_rounds_are_distinct():
  """The keys keys.py derives for two rounds, followed by hand (streams, clients, their phases,
  per-array noise, eval, init); what the round step actually draws from is checked below."""
  root, num_clients, num_arrays, epochs = jax.random.key(0), 5, 6, 3
  derived = [keys.init_key(root)]
  for r in (0, 1):
    streams = keys.round_keys(root, r)
    derived += list(streams) + [keys.eval_key(root, r)]
    derived += list(jax.random.split(streams.noise, num_arrays))
    derived += list(jax.random.split(keys.eval_key(root, r), num_clients))
    for client_id in range(num_clients):
      client_key = keys.client_key(streams.clients, client_id)
      train_key, upload_key = keys.train_and_upload(client_key)
      head, body = keys.personal_and_shared(train_key)
      derived += [client_key, train_key, upload_key, head, body, keys.examples_key(client_key)]
      derived += list(jax.random.split(upload_key, num_arrays))
      derived += list(jax.random.split(head, epochs)) + list(jax.random.split(body, epochs))
  data = np.stack([np.asarray(jax.random.key_data(k)) for k in derived])
  assert len(np.unique(data, axis=0)) == len(derived)


# The public samplers the package draws from; each call records the key it consumes.
_DRAWS = ('normal', 'uniform', 'permutation', 'bernoulli', 'choice', 'randint', 'categorical',
          'truncated_normal', 'gumbel', 'bits')


def test_every_random_draw_of_two_rounds_uses_its_own_key():
  """Records, while two real rounds run, the key of every random draw (sampling, rand-k mask,
  epoch orders, the clients' noise shares, the server's noise): no key may be drawn from twice.
  fed_smp_randk, distributed, q = 1 (no padded slot, which would repeat client 0's keys); the
  sequential executor, since callbacks under vmap compile slowly (keys belong to client ids, so the
  executor does not change them)."""
  exp = train.build_experiment(tiny_config(
      method='fed_smp_randk', keep_fraction=0.5, sampling_rate=1.0, num_clients=4, executor='sequential',
      **{'dp.noise_placement': 'distributed', 'dp.delta': 0.1}))
  drawn = []

  def recording(name, draw):
    def wrapped(key, *args, **kwargs):
      jax.debug.callback(lambda data: drawn.append((name, np.asarray(data).tobytes())),
                         jax.random.key_data(key))
      return draw(key, *args, **kwargs)
    return wrapped

  with pytest.MonkeyPatch.context() as mp:
    for name in _DRAWS:
      mp.setattr(jax.random, name, recording(name, getattr(jax.random, name)))
    step = jax.jit(exp.make_round_step())
    state = exp.init_state()
    for _ in range(2):
      state, _ = step(state, exp.data, exp.root_key)
    jax.effects_barrier()
  assert {'normal', 'uniform'} <= {name for name, _ in drawn}, 'the recording is broken'
  users = collections.defaultdict(list)
  for name, key in drawn:
    users[key].append(name)
  shared = {key.hex(): names for key, names in users.items() if len(names) > 1}
  assert not shared, f'{len(shared)} key(s) drawn from more than once: {list(shared.values())[:5]}'


def test_released_noise_is_independent_of_the_public_randk_mask():
  """fed_smp_randk, zero updates: what the server releases is noise on the public mask only.

  On each array the released coordinates must look like fresh N(0, (sigma C / m)^2) noise, also
  when grouped by the mask bit at the same flat index of the whole mask. When the mask and the
  noise shared a key, the noise on the second array at index j was > +0.25 sigma C exactly where
  bit j of the mask was 1.
  """
  config = tiny_config(method='fed_smp_randk', keep_fraction=0.5, sampling_rate=1.0, num_clients=4,
                       **{'local.lr_shared': 0.0, 'dp.noise_multiplier': 1.0, 'dp.clip_norm': 1.0,
                          'dp.delta': 0.1})
  exp = train.build_experiment(config)
  step = jax.jit(exp.make_round_step())
  state0 = exp.init_state()
  by_array = collections.defaultdict(lambda: ([], []))  # array -> (values, mask bit at same index)
  for seed in range(4):
    new, _ = step(state0, exp.data, jax.random.key(seed))
    # The noise std on the sum is sigma C = 1; the server divides by m = 4.
    released = [np.asarray(a - b).ravel() * 4.0
                for a, b in zip(jax.tree.leaves(new.shared), jax.tree.leaves(state0.shared))]
    mask = np.concatenate(released) != 0  # the public mask (Gaussian noise is never exactly 0)
    for i, values in enumerate(released):
      seen = values != 0
      by_array[i][0].append(values[seen])
      by_array[i][1].append(mask[:values.size][seen])
  checked = 0
  for i, (values, bits) in by_array.items():
    values, bits = np.concatenate(values), np.concatenate(bits)
    if min(bits.sum(), (~bits).sum()) < 50:
      continue
    checked += 1
    assert abs(values.mean()) < 5 / np.sqrt(values.size), (i, values.mean())
    assert 0.9 < values.std() < 1.1, (i, values.std())
    gap = values[bits].mean() - values[~bits].mean()
    assert abs(gap) < 5 * np.sqrt(1 / bits.sum() + 1 / (~bits).sum()), (i, gap)
  assert checked >= 2
