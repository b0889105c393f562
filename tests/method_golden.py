"""Every registered method's metrics on tiny data, recorded so that a refactor can prove it changes
nothing (tests/test_method_registry_golden.py).

Two properties, two checks:

  * portable: a fresh run matches tests/data/method_metrics_golden.json within RTOL / ATOL (the
    metrics and a summary of the final state). XLA:CPU compiles for the host's instruction set
    (AVX-512, AVX2, SSE4.2, NEON), so the same program rounds differently on another CPU: measured
    on one AVX-512 host, `--xla_cpu_max_isa=SSE4_2` moves 55 of the file's floats by at most
    3.2e-7 relative and 1.2e-7 absolute, and changes every final state's SHA-256.
  * exact: on one machine, one program gives the same bits every time. Before a refactor that must
    change nothing, write the golden of the base commit on your machine, then compare bit for bit
    (float repr and the final state's SHA-256):

        git stash; python3 tests/method_golden.py --out /tmp/golden_base.json; git stash pop
        DP2FEDSAM_EXACT_GOLDEN=/tmp/golden_base.json python3 -m pytest -q tests/test_method_registry_golden.py

Regenerate the committed file only when a change is *meant* to alter what a method computes (say
so in the commit): `python3 tests/method_golden.py`. The numbers are those of XLA:CPU under
conftest.py's XLA_FLAGS, which this script sets the same way (importing conftest).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
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
# The portable check's tolerance: ~600x the largest difference measured across instruction sets
# (3.2e-7 relative, 1.2e-7 absolute, see above), still far below any change a refactor or a bug
# would make to two rounds of training (the exact check covers the rest).
RTOL = 2e-4
ATOL = 1e-5
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
  for name in METHODS.builtin_names():  # the package's own: a method a test registers has no case
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


def _summary(tree) -> dict:
  """Per leaf of the state: [sum |x|, ||x||_2, sum s_i x_i] with fixed pseudo-random signs s_i, so
  that a change of any one entry moves the last number (floats, compared within tolerance)."""
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    a = np.asarray(leaf, np.float64).ravel()
    signs = np.random.default_rng(a.size).choice([-1.0, 1.0], a.size)
    out[jax.tree_util.keystr(path)] = [repr(float(np.abs(a).sum())),
                                       repr(float(np.sqrt((a * a).sum()))), repr(float(signs @ a))]
  return out


def run_case(method: str, overrides: dict) -> dict:
  """ROUNDS rounds' train metrics, the final state (digest and summary) and one evaluation."""
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
  return {'rounds': rounds, 'state_sha256': _digest(state), 'state_summary': _summary(state),
          'evaluation': flat}


def compute_all() -> dict:
  return {case: run_case(method, overrides) for case, (method, overrides) in cases().items()}


def _scale(number) -> float:
  return float(number) if isinstance(number, str) else number


def mismatches(got: dict, want: dict, rtol: float = RTOL, atol: float = ATOL) -> list[str]:
  """The portable comparison: integers equal, floats within rtol * |want| + atol (NaN only where
  the golden has NaN); the state's SHA-256 is left out (it differs across instruction sets), its
  summary compared as floats, the state summary's signed sum within rtol times its leaf's sum |x|.
  Returns one line per difference (empty: the case matches)."""
  out = []

  def compare(name, g, w, scale=None):
    if isinstance(w, int) or isinstance(g, int):
      if g != w:
        out.append(f'{name}: {g!r} != {w!r} (an integer metric must match exactly)')
      return
    g, w = float(g), float(w)
    if math.isnan(w) or math.isnan(g):
      if not (math.isnan(w) and math.isnan(g)):
        out.append(f'{name}: {g!r} != {w!r}')
      return
    if abs(g - w) > rtol * abs(scale if scale is not None else w) + atol:
      out.append(f'{name}: {g!r} != {w!r} (|diff| {abs(g - w):.3g})')

  if len(got['rounds']) != len(want['rounds']):
    return [f'rounds: {len(got["rounds"])} != {len(want["rounds"])}']
  for i, (g_round, w_round) in enumerate(zip(got['rounds'], want['rounds'])):
    if set(g_round) != set(w_round):
      out.append(f'round {i}: metrics {sorted(g_round)} != {sorted(w_round)}')
    for key in sorted(set(g_round) & set(w_round)):
      compare(f'round {i} {key}', g_round[key], w_round[key])
  for part in ('evaluation', 'state_summary'):
    if set(got[part]) != set(want[part]):
      out.append(f'{part}: keys {sorted(got[part])} != {sorted(want[part])}')
    for key in sorted(set(got[part]) & set(want[part])):
      g, w = got[part][key], want[part][key]
      if part == 'evaluation':
        compare(f'evaluation {key}', g, w)
      else:  # [sum |x|, ||x||, signed sum]: the signed sum's scale is the leaf's sum |x|
        for label, g_i, w_i in zip(('sum|x|', 'norm', 'signed sum'), g, w):
          compare(f'state {key} {label}', g_i, w_i,
                  scale=_scale(w[0]) if label == 'signed sum' else None)
  return out


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default=GOLDEN,
                      help='where to write (default: the committed golden file)')
  out_path = parser.parse_args().out
  result = compute_all()
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  with open(out_path, 'w') as f:
    json.dump(result, f, indent=1, sort_keys=True)
    f.write('\n')
  print(f'wrote {len(result)} cases to {out_path}')
