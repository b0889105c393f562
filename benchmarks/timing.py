"""What every timing benchmark shares, without flags: the machine, synthetic clients, one timed round.

`client_throughput` (its command line), `conv_sweep` and `pfl_cifar10` build on these, so a line of
any of them is timed the same way: the real round step (`make_round_step`), compiled once, one
warm-up round, then wall-clock rounds with the device synchronised.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from dp2fedsam_jax import executors, host
from dp2fedsam_jax.data import from_flat_arrays
from dp2fedsam_jax.federated_round import make_round_step, RoundConfig
from dp2fedsam_jax.models import AUTO_CONV_IMPL
from dp2fedsam_jax.privacy.mechanism import DPMechanism, NonPrivate
from dp2fedsam_jax.privacy.noise_mechanisms import Independent
from dp2fedsam_jax.state import init_state


# What each matmul precision does to an f32 dot or convolution (jax.default_matmul_precision; the
# GPU and TPU meanings of 'default' are jax.lax.Precision's docstring). Written into the JSON.
MATMUL_PRECISIONS = {
    'default': "the backend's choice: f32 on CPU; TF32 tensor cores on NVIDIA A100/H100/H200 (inputs "
               'rounded to 10-bit mantissas, rel. ~5e-4, f32 sums), plain f32 on older GPUs; bf16 '
               'passes on a TPU',
    'float32': 'full f32 products (on a TPU and on tensor cores: several bf16/TF32 passes)',
    'tensorfloat32': 'inputs rounded to TF32 (10-bit mantissa, rel. ~5e-4), f32 sums',
    'bfloat16': 'inputs rounded to bf16 (7-bit mantissa, rel. ~4e-3), f32 sums',
}


def load_average() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


def device_description() -> dict:
  return host.describe()


def call_seconds(f, args: tuple, repeats: int) -> list[float]:
  """Wall seconds of `repeats` calls of `f(*args)` (jitted or compiled) after one warm-up call,
  each waited for on the device."""
  jax.block_until_ready(f(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(f(*args))
    times.append(time.perf_counter() - start)
  return times


def matmul_peak_gflops(n: int, repeats: int = 10) -> float:
  """Best f32 n x n matmul rate on the default device (GFLOP/s): the machine's practical peak."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  return 2 * n ** 3 / min(call_seconds(jax.jit(lambda x: x @ x), (a,), repeats)) / 1e9


def peak_memory() -> dict:
  """Peak device memory where the backend reports it (GPU/TPU), else this process's peak RSS."""
  stats = jax.devices()[0].memory_stats()
  if stats and 'peak_bytes_in_use' in stats:
    return {'peak_device_memory_bytes': int(stats['peak_bytes_in_use'])}
  # Linux reports KiB. Process-wide and monotone: a later entry includes earlier ones.
  return {'peak_rss_bytes_process': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def synthetic_data(num_clients: int, samples: int, input_shape, num_classes: int, seed: int = 0,
                   min_samples: int | None = None, tokens: bool = False):
  """Random images (uint8) and labels, or token rows: ids in [1, num_classes) and a next id per
  position (pad id 0, never drawn)."""
  rng = np.random.default_rng(seed)
  low = 1 if tokens else 0
  x = rng.integers(low, num_classes if tokens else 256, (num_clients, samples, *input_shape),
                   dtype=np.uint8)
  y = rng.integers(low, num_classes, (num_clients, samples, *(input_shape if tokens else ())))
  y = y.astype(np.uint8 if tokens else np.int32)
  count = np.full((num_clients,), samples, np.int32)
  if min_samples is not None:
    count = rng.integers(min_samples, samples + 1, num_clients).astype(np.int32)
  c = input_shape[-1]
  real = np.arange(samples)[None, :] < count[:, None]  # each client's first count examples
  kind = (dict(input_kind='tokens', pad_id=0) if tokens else
          dict(mean=(0.5,) * c, std=(0.25,) * c))
  return from_flat_arrays(
      train_x=x[real], train_y=y[real], train_offsets=np.r_[0, np.cumsum(count)],
      test_x=x[:, 0], test_y=y[:, 0], test_offsets=np.arange(num_clients + 1),
      num_classes=num_classes, **kind)


def precision_context(name: str):
  """The context the timed programs are traced in: jax.default_matmul_precision(name), or nothing."""
  if name not in MATMUL_PRECISIONS:
    raise ValueError(f'matmul precision {name!r} is unknown; choose one of {list(MATMUL_PRECISIONS)}')
  return contextlib.nullcontext() if name == 'default' else jax.default_matmul_precision(name)


def time_round(mode: str, cohort: int, spec, model, lc, *, samples: int, rounds: int,
               min_samples: int | None = None, chunk_size: int | None = None,
               tokens: bool = False) -> dict:
  """One (executor, cohort) line: `cohort` clients of `samples` synthetic examples, every client
  sampled; compile, one warm-up round, then the median of `rounds` timed rounds. The last round's
  update norm and loss are kept, to compare the numerics of lines that differ in precision only."""
  data = synthetic_data(cohort, samples, model.input_shape, model.num_classes,
                        min_samples=min_samples, tokens=tokens)
  privatizer = DPMechanism if spec.private else NonPrivate
  mechanism = privatizer(Independent(cohort, 1.0, 'fixed'), clip_norm=0.1,
                         noise_multiplier=1.0 if spec.private else 0.0)
  rc = RoundConfig(mechanism=mechanism, server_lr=1.0,
                   executor=executors.from_name(mode, chunk_size))
  step = jax.jit(make_round_step(spec, model, lc, rc), donate_argnums=0)
  state = init_state(spec, model, jax.random.key(0), cohort)
  key = jax.random.key(1)
  state, data, key = rc.executor.place((state, data, key))
  load_before = load_average()
  start = time.perf_counter()
  compiled = step.lower(state, data, key).compile()
  compile_seconds = time.perf_counter() - start
  mem = compiled.memory_analysis()
  state, metrics = compiled(state, data, key)  # warm-up round
  jax.block_until_ready(state)
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    state, metrics = compiled(state, data, key)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - start)
  assert int(metrics['cohort_size']) == cohort and bool(metrics['finite']), metrics
  seconds = statistics.median(times)
  return {'mode': mode, 'clients': cohort, 'seconds_per_round': seconds, 'round_seconds': times,
          'clients_per_second': cohort / seconds,
          'examples_per_second': int(np.sum(data.train_count)) * (
              lc.personal_epochs * spec.personal_phase + lc.shared_epochs) / seconds,
          'last_round': {k: float(metrics[k]) for k in ('mean_update_norm', 'train_loss') if k in metrics},
          'compile_seconds': compile_seconds, 'capacity': rc.capacity,
          'xla_temp_bytes': int(getattr(mem, 'temp_size_in_bytes', 0) or 0),
          **peak_memory(), 'load_before': load_before, 'load_after': load_average()}


# Reading the lines of a lowering sweep (conv_sweep.py), without its flags so that tests can too.
GOAL_SPEEDUP = 10.0  # issue 59: vmap >= 10x the best sequential line at cohort 50 on one H100/H200


def sweep_summary(rows: list[dict], goal_cohort: int) -> dict:
  """The ratios the issue asks for, from the lines that ran at the default precision."""
  ok = [r for r in rows if r.get('status') == 'ok' and r['matmul_precision'] == 'default']
  sequential = [r['seconds_per_round'] / r['clients'] for r in ok if r['mode'] == 'sequential']
  best_seq = min(sequential) if sequential else None  # seconds per client, any lowering
  vmap = {}
  for r in ok:
    if r['mode'] == 'vmap':
      vmap.setdefault(r['clients'], {})[r['conv_impl']] = r['seconds_per_round']
  fastest = {c: min(lines, key=lines.get) for c, lines in sorted(vmap.items())}
  speedups = {str(c): {impl: best_seq * c / s for impl, s in lines.items()}
              for c, lines in sorted(vmap.items())} if best_seq else {}
  at_goal = speedups.get(str(goal_cohort), {})
  summary = {'best_sequential_seconds_per_client': best_seq,
             'vmap_over_best_sequential': speedups,
             'fastest_vmap_impl': {str(c): impl for c, impl in fastest.items()},
             'goal': f'vmap >= {GOAL_SPEEDUP:g}x the best sequential line at cohort {goal_cohort}',
             'goal_met': (max(at_goal.values()) >= GOAL_SPEEDUP) if at_goal else None}
  if goal_cohort in fastest:  # executor auto is vmap off the CPU: its fastest lowering is auto's
    summary['auto_conv_impl_supported'] = {jax.default_backend(): fastest[goal_cohort]}
    summary['auto_conv_impl_now'] = {jax.default_backend(): AUTO_CONV_IMPL.get(jax.default_backend())}
  return summary


def numerics(rows: list[dict]) -> list[dict]:
  """Each precision's last-round update norm and loss against the float32 line of the same
  (lowering, executor, cohort): relative differences after the same rounds from the same start."""
  ref = {(r['conv_impl'], r['mode'], r['clients']): r['last_round'] for r in rows
         if r.get('status') == 'ok' and r['matmul_precision'] == 'float32'}
  out = []
  for r in rows:
    key = (r['conv_impl'], r['mode'], r['clients'])
    if r.get('status') != 'ok' or key not in ref or r['matmul_precision'] == 'float32':
      continue
    out.append({'conv_impl': key[0], 'mode': key[1], 'clients': key[2],
                'matmul_precision': r['matmul_precision'],
                'relative_difference_to_float32': {
                    k: abs(v - ref[key][k]) / max(abs(ref[key][k]), 1e-30)
                    for k, v in r['last_round'].items() if k in ref[key]}})
  return out
