"""Every random stream of a run, derived in one place from named constants.

In this JAX, `jax.random.split(k, n)[i]` is bit-identical to `jax.random.fold_in(k, i)`, so a parent
key that is both split and folded hands the same key to two streams (e.g. a public mask and the noise:
the noise would then be a function of public data and epsilon void). The rule here: a parent key is
either *folded* with the distinct constants below, or *split* into a fresh array of keys, never both.

    root = root_key(seed | training_seed)             folded: round r, INIT, EVAL, SCHEDULE, TREE_NOISE
      round key = fold_in(root, r)                    folded: SAMPLE, CLIENTS, NOISE, PUBLIC_MASK,
                                                      COUNT_NOISE
        clients key                                   folded with the client id (only ever folded)
          client key                                  folded: TRAIN, UPLOAD, EXAMPLES
            train key                                 folded: PERSONAL, SHARED (each split per epoch)
            upload key                                split per array (the client's noise share)
            examples key                              folded: example j -> its sort key (the round's
                                                      subset when a client exceeds its budget)
        noise key                                     split per array (the server's noise)
        count noise key                               one draw: the noise on adaptive clipping's count
      eval key = fold_in(fold_in(root, EVAL), r)      folded with the client id (fine-tuning order)
      init key = fold_in(root, INIT)                  the model's initialiser
      schedule key = fold_in(root, SCHEDULE)          folded: GROUPS, EPOCHS (correlated noise's samplers)
        groups key                                    one permutation: BandMF's public client groups
        epochs key                                    folded: epoch e -> the tree's shuffle of epoch e
      tree key = fold_in(root, TREE_NOISE)            folded: epoch -> level -> node (split per array)

The privacy audit (dp2fedsam_jax/canaries.py) has its own root, key(audit seed), so its canaries do not
depend on the experiment's seed:

    audit root = key(audit seed)          folded: AUDIT_DIRECTIONS, AUDIT_RUNS, AUDIT_INCLUSION
      runs key                            split into one root key per trial (a run as above)
      inclusion key                       one draw: which canary is in which trial
"""


from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

# Children of the root key. Rounds use fold_in(root, r) for r < 2**31 - 4; these lie beyond.
INIT = 2**31 - 1
EVAL = 2**31 - 2
SCHEDULE = 2**31 - 3    # the public cohort schedules of the correlated-noise samplers
TREE_NOISE = 2**31 - 4  # the tree's node noises (DP-FTRL)

# Children of the schedule key.
GROUPS = 1        # BandMF's fixed public client groups
EPOCHS = 2        # parent of the tree's per-epoch shuffles (folded by epoch)

# Children of a round key.
SAMPLE = 1        # who takes part
CLIENTS = 2       # parent of the per-client keys (split by client id)
NOISE = 3         # the server's Gaussian noise (split per array)
PUBLIC_MASK = 4   # rand-k's public mask, the same for every client
COUNT_NOISE = 5   # the server's noise on the count of unclipped clients (adaptive clipping)

# Children of a client key.
TRAIN = 1         # local training (parent of PERSONAL and SHARED)
UPLOAD = 2        # the client's own noise share (distributed placement; split per array)
EXAMPLES = 3      # which of its examples a client over config.local.max_examples trains on

# Children of a train key.
PERSONAL = 1  # the personal phase
SHARED = 2    # the shared phase

# Children of the audit's root key.
AUDIT_DIRECTIONS = 1  # the canaries' directions
AUDIT_RUNS = 2        # parent of the trials' root keys (split by trial)
AUDIT_INCLUSION = 3   # which canaries take part in which trial


class RoundKeys(NamedTuple):
  sample: jax.Array
  clients: jax.Array
  noise: jax.Array
  public_mask: jax.Array
  count_noise: jax.Array


def root_key(seed: int, training_seed: int | None = None) -> jax.Array:
  """The run's root key: of `training_seed` when set (a tuner's secret seed per trial), else of
  `seed`, all 64 bits as the threefry key [high 32, low 32]. That equals jax.random.key(seed) below
  2**32; jax.random.key keeps only the low 32 bits of a larger int, so two secret seeds could
  collide there. A secret seed of 2**32 or more is never the key of a public seed below 2**32."""
  value = int(seed if training_seed is None else training_seed)
  if not 0 <= value < 2**64:
    raise ValueError(f'a key seed must lie in [0, 2**64): {value}')
  return jax.random.wrap_key_data(np.array([value >> 32, value & 0xFFFFFFFF], np.uint32))


def round_keys(root: jax.Array, round_index) -> RoundKeys:
  """The streams of round `round_index` (0-based) of the run whose root key is `root`."""
  round_key = jax.random.fold_in(root, round_index)
  return RoundKeys(*(jax.random.fold_in(round_key, s)
                     for s in (SAMPLE, CLIENTS, NOISE, PUBLIC_MASK, COUNT_NOISE)))


def client_key(clients_key: jax.Array, client_id) -> jax.Array:
  """The key of one client id: a client's run does not depend on its slot, chunk or executor.

  O(1) per sampled client, and the same key as `split(clients_key, N)[client_id]` (the keys of
  runs before the ragged data model, which split over all N clients every round).
  """
  return jax.random.fold_in(clients_key, client_id)


def examples_key(client_key: jax.Array) -> jax.Array:
  return jax.random.fold_in(client_key, EXAMPLES)


def train_and_upload(client_key: jax.Array) -> tuple[jax.Array, jax.Array]:
  return jax.random.fold_in(client_key, TRAIN), jax.random.fold_in(client_key, UPLOAD)


def personal_and_shared(train_key: jax.Array) -> tuple[jax.Array, jax.Array]:
  return jax.random.fold_in(train_key, PERSONAL), jax.random.fold_in(train_key, SHARED)


def init_key(root: jax.Array) -> jax.Array:
  return jax.random.fold_in(root, INIT)


def eval_key(root: jax.Array, round_index: int) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(root, EVAL), round_index)


def group_key(root: jax.Array) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(root, SCHEDULE), GROUPS)


def epoch_order_key(root: jax.Array, epoch) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(root, SCHEDULE), EPOCHS), epoch)


def tree_node_key(root: jax.Array, epoch, level: int, node) -> jax.Array:
  """The key of the tree's node (level, node) of `epoch`: split per array into its noise."""
  key = jax.random.fold_in(jax.random.fold_in(root, TREE_NOISE), epoch)
  return jax.random.fold_in(jax.random.fold_in(key, level), node)


class AuditKeys(NamedTuple):
  directions: jax.Array
  runs: jax.Array       # [num_trials] root keys
  inclusion: jax.Array


def audit_keys(seed: int, num_trials: int) -> AuditKeys:
  root = jax.random.key(seed)
  return AuditKeys(jax.random.fold_in(root, AUDIT_DIRECTIONS),
                   jax.random.split(jax.random.fold_in(root, AUDIT_RUNS), num_trials),
                   jax.random.fold_in(root, AUDIT_INCLUSION))
