r"""One full evaluation of a token experiment (default: the Shakespeare config, all 1,063 roles):
compile time, seconds per evaluation, real test rows and the buffer rows the blocks compute.

    python3 -m benchmarks.eval_time --method=dp2fedsam --cells=fused,optimized --reps=3

Each --cells entry is the same model (same parameters) with another LSTM layer; the timings are
interleaved, one evaluation of each in turn, so a shared machine's load hits them alike.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time

from absl import flags
import jax
import numpy as np

from dp2fedsam_jax import cli, eval_blocks, host, run_files
from dp2fedsam_jax.models import get_model
from dp2fedsam_jax.train import build_experiment
from experiments.configs import shakespeare

_METHOD = flags.DEFINE_string('method', 'dp2fedsam', 'Method of the Shakespeare config.')
_CELLS = flags.DEFINE_list('cells', ['fused'], 'char LSTM layers to time (fused, optimized, lstm).')
_REPS = flags.DEFINE_integer('reps', 3, 'Evaluations timed per cell (the median is reported).')
_JSON_OUT = flags.DEFINE_string('json_out', None, 'Write the results as JSON here.')


def buffer_rows(test_counts, clients_per_batch: int, finetunes: bool) -> int:
  """The buffer rows eval_blocks.test_clients computes: its blocks, largest test sets first."""
  counts = np.sort(np.asarray(test_counts))[::-1]
  sizes = np.asarray(eval_blocks.test_buffer_sizes(int(counts.max())))
  cap = max(1, min(clients_per_batch, len(counts)))
  start, rows = 0, 0
  while start < len(counts):
    b = int(sizes[np.searchsorted(sizes, counts[start])])
    k = cap if finetunes else max(1, min(cap, eval_blocks.TEST_ROWS_PER_BLOCK // b))
    rows, start = rows + k * b, start + k
  return rows


def main(argv):
  if len(argv) > 1:
    raise ValueError(f'unexpected arguments: {argv[1:]}')
  config = shakespeare.get_config(f'method={_METHOD.value}')
  exp = build_experiment(config)
  data, key = exp.data, jax.random.key(0)
  state = exp.init_state()
  plan = exp.protocol.for_method(exp.spec, exp.local_config)
  cpb = eval_blocks.evaluation_batch(exp.round_config.executor, plan.own_weights)[0]
  finetunes = not plan.forward_only
  runs = {}
  for cell in _CELLS.value:
    model = get_model(config.model, data.num_classes, data.input_shape, cell=cell)
    evaluate = dataclasses.replace(exp, model=model).make_evaluate()
    start = time.perf_counter()
    compiled = jax.jit(evaluate).lower(state, data, key).compile()
    runs[cell] = {'compiled': compiled, 'compile_seconds': time.perf_counter() - start,
                  'seconds': [], 'load': []}
  for _ in range(_REPS.value):
    for run in runs.values():
      run['load'].append(round(os.getloadavg()[0], 2))
      start = time.perf_counter()
      metrics = jax.device_get(run['compiled'](state, data, key))
      run['seconds'].append(time.perf_counter() - start)
      run['test_accuracy'] = float(metrics['test_accuracy'])
  counts = np.asarray(data.test_count)
  result = {'method': _METHOD.value, 'clients': int(data.num_clients),
            'real_test_rows': int(counts.sum()), 'max_test': int(data.max_test),
            'buffer_rows': buffer_rows(counts, cpb, finetunes),
            'padded_to_max_rows': int(data.num_clients * data.max_test),
            'cpu_model': host.cpu_model(),
            'cells': {c: {k: v for k, v in r.items() if k != 'compiled'} for c, r in runs.items()}}
  print(f"{result['clients']} clients, {result['real_test_rows']:,} real test rows, "
        f"{result['buffer_rows']:,} buffer rows computed (padding all to {result['max_test']}: "
        f"{result['padded_to_max_rows']:,})")
  for cell, r in result['cells'].items():
    print(f"{cell}: {statistics.median(r['seconds']):.2f} s per evaluation (median of "
          f"{', '.join(f'{s:.2f}' for s in r['seconds'])}; load {r['load']}), compile "
          f"{r['compile_seconds']:.1f} s, test_accuracy {r['test_accuracy']:.4f}")
  if _JSON_OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_JSON_OUT.value)), exist_ok=True)
    run_files.write_json_atomic(_JSON_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
