r"""Top-k masks: the project's radix select against `jax.lax.top_k`'s indices scattered.

    python -m benchmarks.sparsify_masks [--sizes=51200,524288] [--keep=0.02,0.05,0.5] \
        [--cohort=10] [--repeats=20] [--out=DIR]

DP-pFedDSU keeps the top S of each masked kernel by magnitude and recomputes that mask at every
local step (privacy/sparsify.py; benchmarks/README.md, "Sparsification masks"), so the mask's cost
is paid once per step and client. For each layer size (default: `emnist_cnn`'s conv1 kernel, its
second, 51,200 weights, and its fc0 kernel, 524,288) and keep fraction, times both ways of making
the mask on one client and vmapped over `--cohort` clients (as the vmap executor runs them):
compile, one warm-up call, the median of `--repeats` calls. Checks that both give the same mask, and writes
`<out>/sparsify_masks.json` with the machine. Which is faster is a property of the backend and of
vmap: `sparsify._mask_from_scores` uses the radix select on a CPU where k > 1,024 + size / 512
(`sparsify.radix_select_pays`, from this benchmark's lines), `top_k` elsewhere, until this benchmark
has run there.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time

from absl import flags
import jax
import jax.numpy as jnp

from benchmarks import timing
from dp2fedsam_jax import cli
from dp2fedsam_jax.privacy import sparsify

_SIZES = flags.DEFINE_list('sizes', ['51200', '524288'], 'Layer sizes (weights in one masked kernel).')
_KEEP = flags.DEFINE_list('keep', ['0.02', '0.05', '0.5'], 'Fractions kept (DP-pFedDSU\'s S).')
_COHORT = flags.DEFINE_integer('cohort', 10, 'Clients of the vmapped line.')
_REPEATS = flags.DEFINE_integer('repeats', 20, 'Timed calls per line (the median is reported).')
_OUT = flags.DEFINE_string('out', None, 'Directory for sparsify_masks.json (none: print only).')


WAYS = {'radix_select': sparsify.radix_select_mask, 'top_k_scatter': sparsify.top_k_scatter}


def time_call(fn, scores: jax.Array, repeats: int) -> tuple[float, float, jax.Array]:
  """(compile seconds, median seconds of a call, the mask) of a jitted `fn(scores)`."""
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(scores).compile()
  compile_seconds = time.perf_counter() - start
  seconds = statistics.median(timing.call_seconds(compiled, (scores,), repeats))
  return compile_seconds, seconds, compiled(scores)


def lines(sizes: list[int], keeps: list[float], cohort: int, repeats: int) -> list[dict]:
  """A row per (size, keep, single / vmapped, way), the two ways' masks checked equal."""
  rows = []
  for size in sizes:
    scores = jnp.abs(jax.random.normal(jax.random.key(size), (cohort, size)))
    for keep in keeps:
      k = sparsify.num_kept(keep, size)
      for batch, inputs, wrap in (('one client', scores[0], lambda f: f),
                                  (f'vmap over {cohort}', scores, jax.vmap)):
        masks = {}
        for way, make in WAYS.items():
          compile_seconds, seconds, masks[way] = time_call(
              wrap(functools.partial(make, k=k)), inputs, repeats)
          rows.append({'size': size, 'keep': keep, 'k': k, 'batch': batch, 'way': way,
                       'seconds': seconds, 'compile_seconds': compile_seconds})
        if not bool(jnp.all(masks['radix_select'] == masks['top_k_scatter'])):
          raise AssertionError(f'size {size}, keep {keep}, {batch}: the two masks differ')
  return rows


def main(argv):
  if len(argv) > 1:
    raise ValueError(f'unexpected arguments: {argv[1:]}')
  sizes, keeps = [int(s) for s in _SIZES.value], [float(p) for p in _KEEP.value]
  if any(s < 1 for s in sizes) or any(not 0 < p <= 1 for p in keeps) or _COHORT.value < 1:
    raise ValueError('--sizes >= 1, --keep in (0, 1], --cohort >= 1')
  load_before = timing.load_average()
  rows = lines(sizes, keeps, _COHORT.value, _REPEATS.value)
  print('size | keep | k | batch | radix select ms | top_k + scatter ms | speed-up')
  for fast, slow in zip(rows[0::2], rows[1::2]):
    print(f"{fast['size']} | {fast['keep']} | {fast['k']} | {fast['batch']} | "
          f"{1e3 * fast['seconds']:.2f} | {1e3 * slow['seconds']:.2f} | "
          f"{slow['seconds'] / fast['seconds']:.1f}x")
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    with open(os.path.join(_OUT.value, 'sparsify_masks.json'), 'w') as f:
      json.dump({'device': timing.device_description(), 'load_before': load_before,
                 'load_after': timing.load_average(), 'repeats': _REPEATS.value,
                 'cohort': _COHORT.value, 'rows': rows}, f, indent=2)


if __name__ == '__main__':
  cli.run(main)
