"""The server state: everything a round reads and writes, as one pytree (so it jits, donates, saves).

`ServerState(round, shared, personal[N], times_sampled[N], noise_state, server_opt_state,
clip_state)`; `init_state` builds round 0. The privatizer's part (noise_state, clip_state) is its
PrivatizerState (privacy/mechanism.py).
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from dp2fedsam_jax.algorithms.specs import MethodSpec
from dp2fedsam_jax.privacy.mechanism import PrivatizerState


@flax.struct.dataclass
class ServerState:
  round: jax.Array  # int32 scalar: rounds completed so far
  shared: Any       # the global params the server aggregates, e.g. {'extractor': ...}
  personal: Any     # every client's personal params stacked on a leading [num_clients] axis
  times_sampled: jax.Array  # int32[num_clients]: rounds each client took part in (for evaluation)
  # What the noise mechanism carries between rounds (privacy/correlated.py): BandMF's last b-1 noise
  # draws, shaped like `shared` with a leading [b-1] axis; () for independent and tree noise.
  noise_state: Any = ()
  # The server optimizer's state (server_optimizer.py: momentum, Adam's moments); () for sgd.
  server_opt_state: Any = ()
  # The clip rule's state (privacy/clip_rules.py): adaptive clipping's C_t, a float32 scalar; () for
  # a fixed clip norm.
  clip_state: Any = ()

  @property
  def privatizer_state(self) -> PrivatizerState:
    """The privatizer's part of the state (noise_state, clip_state), as its halves read it."""
    return PrivatizerState(self.noise_state, self.clip_state)


def split_params(spec: MethodSpec, params: dict) -> tuple[dict, dict]:
  """{'extractor', 'head'} -> (shared part, a client's initial personal part) as the method says."""
  return spec.personal.split(params)


def model_params(spec: MethodSpec, shared: dict, personal: dict) -> dict:
  """A client's full model {'extractor', 'head'} from the global part and its personal part."""
  return spec.personal.model_params(shared, personal)


def init_state(spec: MethodSpec, model, key: jax.Array, num_clients: int) -> ServerState:
  """Global init; every client's personal head starts as the same initial head."""
  shared, personal = split_params(spec, model.init(key))
  personal = jax.tree.map(lambda p: jnp.broadcast_to(p, (num_clients,) + p.shape).copy(), personal)
  return ServerState(round=jnp.zeros((), jnp.int32), shared=shared, personal=personal,
                     times_sampled=jnp.zeros((num_clients,), jnp.int32))
