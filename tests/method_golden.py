"""Every registered method's metrics on tiny data, recorded so that a refactor can prove it changes
nothing: tests/test_method_registry_golden.py compares a fresh run with tests/data/
method_metrics_golden.json bit for bit (float64 repr).

Regenerate (only when a change is *meant* to alter what a method computes, and say so in the commit):

    python3 tests/method_golden.py

The numbers are those of XLA:CPU under conftest.py's XLA_FLAGS, which this script sets the same way
(importing conftest), so the file and the test compile identical programs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conftest  # noqa: E402  (sets XLA_FLAGS before JAX starts)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from dp2fedsam_jax import train  # noqa: E402
from dp2fedsam_jax.algorithms import METHODS  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data',
                      'method_metrics_golden.json')
ROUNDS = 2
# Small enough that some updates are clipped.
CLIP = {'dp.clip_norm': 0.3}

# Methods that sparsify their own noised upload need client-side noise.
_DISTRIBUTED = ('dp_fedsam_topk',)
# Beyond one case per method: the pieces that read the round's C (regularizers, DSU) under adaptive
# clipping, where C is the traced C_t.
_EXTRA = {
    'dp2fedsam+adaptive': ('dp2fedsam', {'dp.clipping': 'adaptive', 'dp.clip_lr': 0.5}),
    'dp_fedavg_blur+adaptive': ('dp_fedavg_blur', {'dp.clipping': 'adaptive', 'dp.clip_lr': 0.5}),
    'dp_pfeddsu_safe+adaptive': ('dp_pfeddsu_safe', {'dp.clipping': 'adaptive', 'dp.clip_lr': 0.5}),
}


def cases() -> dict[str, tuple[str, dict]]:
  out = {}
  for name in sorted(METHODS):
    if not METHODS[name].federated:  # local_only runs no round (tests/test_protocol.py)
      continue
    placement = 'distributed' if name in _DISTRIBUTED else 'central'
    out[name] = (name, {'dp.noise_placement': placement})
  out.update(_EXTRA)
  return out


def _number(x):
  x = np.asarray(x)
  return repr(float(x)) if x.dtype.kind == 'f' else int(x)


def _digest(tree) -> str:
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    a = np.asarray(leaf)
    h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
  return h.hexdigest()


def run_case(method: str, overrides: dict) -> dict:
  """ROUNDS rounds' train metrics, the final state's digest and one evaluation's metrics."""
  exp = train.build_experiment(conftest.tiny_config(method=method, num_clients=6,
                                                    sampling_rate=0.5, **CLIP, **overrides))
  step = jax.jit(exp.make_round_step())
  evaluate = jax.jit(exp.make_evaluate())
  state = exp.init_state()
  rounds = []
  for _ in range(ROUNDS):
    state, metrics = step(state, exp.data, exp.root_key)
    rounds.append({k: _number(v) for k, v in sorted(jax.device_get(metrics).items())})
  evaluation = jax.device_get(evaluate(state, exp.data, exp.eval_key(ROUNDS)))
  flat = {jax.tree_util.keystr(path): _number(v)
          for path, v in jax.tree_util.tree_leaves_with_path(evaluation)}
  return {'rounds': rounds, 'state_sha256': _digest(state), 'evaluation': flat}


def compute_all() -> dict:
  return {case: run_case(method, overrides) for case, (method, overrides) in cases().items()}


if __name__ == '__main__':
  result = compute_all()
  os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
  with open(GOLDEN, 'w') as f:
    json.dump(result, f, indent=1, sort_keys=True)
    f.write('\n')
  print(f'wrote {len(result)} cases to {GOLDEN}')
