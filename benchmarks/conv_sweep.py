r"""The convolution lowering sweep: which `conv_impl` (and matmul precision) makes the CNN round fast.

    python -m benchmarks.conv_sweep --out=benchmarks/results/<machine> \
        --impls=xla,im2col --vmap_cohorts=16,50,100,500 --sequential_cohorts=50 \
        --extra_precisions=float32,bfloat16 --precision_cohort=50 --rounds=2

Under `vmap` with per-client kernels every `lax.conv_general_dilated` ('xla') becomes a grouped
convolution; 'im2col' stays a batched GEMM. Each (lowering, executor, cohort) is one line of
`timing.time_round` (the real round step, every client sampled, compile and a warm-up round
excluded, median of --rounds), at the default matmul precision; then, at --precision_cohort under
vmap, the fastest lowering again at each of --extra_precisions (`timing.MATMUL_PRECISIONS` says
what each does to the numerics; the last round's update norm and loss of each line are compared
with the float32 line's).

The work is client_throughput's (its flags --model, --method, --samples_per_client, --batch_size,
--personal_epochs, --shared_epochs, --rounds, --matmul_size and --flops apply; the rest are ignored). FLOPs
are XLA's count of one client on the CPU backend (`flops.cost_flops`: XLA:GPU leaves cuDNN
convolutions out), the same for every line; % peak is against a 2048^2 matmul at the line's precision.
A line that fails (out of memory) is recorded as such and the sweep goes on. Writes (after every
line, so a run cut short keeps what it timed) `<out>/conv_sweep.json`: the lines, and the summary:
vmap over the best sequential line per cohort, the fastest lowering per cohort and the
`AUTO_CONV_IMPL` entry the measurement supports for this backend.
"""

from __future__ import annotations

import os

from absl import flags
import jax

from benchmarks import client_throughput as ct
from benchmarks import flops as flops_lib
from benchmarks import timing
from dp2fedsam_jax import cli, run_files
from dp2fedsam_jax.algorithms import get_method
from dp2fedsam_jax.models import count_params, get_model

_OUT = flags.DEFINE_string('out', None, 'Directory for conv_sweep.json.')
_IMPLS = flags.DEFINE_list('impls', ['xla', 'im2col'], 'Lowerings to time (models.CONV_IMPLS but auto).')
_VMAP_COHORTS = flags.DEFINE_list('vmap_cohorts', ['16', '50', '100', '500'], 'Cohorts under vmap.')
# accelerator.py times the loop at 50 clients only: on the H200 its cost per client was flat from 16
# to 500 (4.9-5.1 ms, results/gpu-h200/speedups.json), so one cohort of it gives every ratio.
_SEQ_COHORTS = flags.DEFINE_list('sequential_cohorts', ['16', '50', '100', '500'],
                                 'Cohorts under the sequential executor (empty: none).')
_EXTRA_PRECISIONS = flags.DEFINE_list('extra_precisions', ['float32', 'bfloat16'],
                                      'Matmul precisions to time the fastest lowering at, besides '
                                      'default (timing.MATMUL_PRECISIONS).')
_PRECISION_COHORT = flags.DEFINE_integer('precision_cohort', 50, 'The vmap cohort of those lines; '
                                         'also the cohort of the goal (vmap >= 10x sequential).')


def _ints(values: list[str], name: str) -> list[int]:
  try:
    return [int(v) for v in values]
  except ValueError as e:
    raise ValueError(f'--{name}={",".join(values)}: a list of integers ({e})') from e


def main(argv):
  if len(argv) > 1:
    raise ValueError(f'unexpected arguments: {argv[1:]}')
  if not _OUT.value:
    raise ValueError('--out: a directory for conv_sweep.json is needed')
  impls = list(_IMPLS.value)
  bad = sorted(set(impls) - {'xla', 'im2col'})
  if bad:
    raise ValueError(f'--impls: {bad} are not lowerings; choose from xla, im2col')
  precisions = ['default', *[p for p in _EXTRA_PRECISIONS.value if p != 'default']]
  bad = sorted(set(precisions) - set(timing.MATMUL_PRECISIONS))
  if bad:
    raise ValueError(f'--extra_precisions: unknown {bad}; choose from {list(timing.MATMUL_PRECISIONS)}')
  vmap_cohorts = _ints(_VMAP_COHORTS.value, 'vmap_cohorts')
  seq_cohorts = _ints(_SEQ_COHORTS.value, 'sequential_cohorts')
  os.makedirs(_OUT.value, exist_ok=True)
  path = os.path.join(_OUT.value, 'conv_sweep.json')
  spec, lc = get_method(ct._METHOD.value), ct.local_config()
  models = {impl: get_model(ct._MODEL.value, 10, ct.input_shape(ct._MODEL.value), impl) for impl in impls}
  counted = models[impls[0]]
  data1 = timing.synthetic_data(1, ct._SAMPLES.value, counted.input_shape, counted.num_classes)
  client_flops = (flops_lib.client_flops(spec, counted, lc, ct._SAMPLES.value, data1.normalize).total
                  if ct._FLOPS.value else float('nan'))  # --noflops: the GFLOP/s columns are NaN
  machine = timing.device_description()
  peaks = {}
  if ct._MATMUL.value:
    for p in precisions:
      with timing.precision_context(p):
        peaks[p] = timing.matmul_peak_gflops(ct._MATMUL.value)
  machine['matmul_peak_gflops'] = peaks
  result = {'config': {'model': ct._MODEL.value, 'method': ct._METHOD.value,
                       'num_params': count_params(jax.eval_shape(counted.init, jax.random.key(0))),
                       'samples_per_client': ct._SAMPLES.value, 'batch_size': lc.batch_size,
                       'personal_epochs': lc.personal_epochs, 'shared_epochs': lc.shared_epochs,
                       'rounds': ct._ROUNDS.value, 'impls': impls, 'vmap_cohorts': vmap_cohorts,
                       'sequential_cohorts': seq_cohorts, 'precision_cohort': _PRECISION_COHORT.value,
                       'matmul_precisions': {p: timing.MATMUL_PRECISIONS[p] for p in precisions}},
            'device': machine, 'client_gflop': client_flops / 1e9,
            'client_flops_counted_on': 'cpu (flops.cost_flops)', 'results': []}

  def line(impl: str, mode: str, cohort: int, precision: str) -> dict:
    row = {'conv_impl': impl, 'matmul_precision': precision, 'mode': mode, 'clients': cohort}
    print(f'{impl:>7} {precision:>13} {mode:>10} {cohort:>5} clients: ', end='', flush=True)
    try:
      with timing.precision_context(precision):
        row.update(timing.time_round(mode, cohort, spec, models[impl], lc, samples=ct._SAMPLES.value,
                                     rounds=ct._ROUNDS.value), status='ok')
    except Exception as e:  # noqa: BLE001 - one line that does not fit must not end the sweep
      text = str(e)
      row.update(status='out of memory' if 'RESOURCE_EXHAUSTED' in text else 'error', error=text[:800])
      print(row['status'], flush=True)
      return row
    row['gflops_per_second'] = cohort * client_flops / row['seconds_per_round'] / 1e9
    if precision in peaks:
      row['percent_of_matmul_peak'] = 100 * row['gflops_per_second'] / peaks[precision]
    print(f"{row['seconds_per_round']:.4f} s/round", flush=True)
    return row

  def record(row: dict) -> None:
    result['results'].append(row)
    result['summary'] = timing.sweep_summary(result['results'], _PRECISION_COHORT.value)
    result['numerics'] = timing.numerics(result['results'])
    run_files.write_json_atomic(path, result)

  for impl in impls:
    for cohort in vmap_cohorts:
      record(line(impl, 'vmap', cohort, 'default'))
    for cohort in seq_cohorts:
      record(line(impl, 'sequential', cohort, 'default'))
  fastest = result.get('summary', {}).get('fastest_vmap_impl', {}).get(str(_PRECISION_COHORT.value))
  for precision in precisions[1:]:
    if fastest:
      record(line(fastest, 'vmap', _PRECISION_COHORT.value, precision))
  print_table(result)


def print_table(result: dict) -> None:
  print(f"\n{result['device']['device_kind']} ({result['device']['platform']}), "
        f"{result['config']['model']}, {result['client_gflop']:.2f} GFLOP per client")
  print('conv_impl | precision | mode | clients | s/round | clients/s | GFLOP/s | % peak | compile s')
  for r in result['results']:
    if r['status'] != 'ok':
      print(f"{r['conv_impl']} | {r['matmul_precision']} | {r['mode']} | {r['clients']} | {r['status']}")
      continue
    print(' | '.join([r['conv_impl'], r['matmul_precision'], r['mode'], str(r['clients']),
                      f"{r['seconds_per_round']:.4f}", f"{r['clients_per_second']:.1f}",
                      f"{r['gflops_per_second']:.1f}", f"{r.get('percent_of_matmul_peak', float('nan')):.1f}",
                      f"{r['compile_seconds']:.1f}"]))
  s = result.get('summary', {})
  for cohort, lines in s.get('vmap_over_best_sequential', {}).items():
    print(f'vmap over the best sequential line, {cohort} clients: '
          + ', '.join(f'{impl} {x:.2f}x' for impl, x in lines.items()))
  if s.get('goal_met') is not None:
    print(f"{s['goal']}: {'met' if s['goal_met'] else 'not met'}")
  if 'auto_conv_impl_supported' in s:
    print(f"AUTO_CONV_IMPL: measured fastest {s['auto_conv_impl_supported']}, "
          f"now {s['auto_conv_impl_now']}")


if __name__ == '__main__':
  cli.run(main)
