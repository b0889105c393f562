r"""Client throughput of one federated round: vmapped vs sequential (vs sharded) clients.

    python -m benchmarks.client_throughput --model=cifar_cnn --clients=10,50 --samples_per_client=45 \
        --batch_size=10 --modes=vmap,sequential --method=dp2fedsam --rounds=3 --json_out=out.json

Every mode runs the same jitted round step (`make_round_step`; only `executor` differs) on synthetic
data of the model's input shape, with every client sampled (fixed sampling, q = 1), so a round trains
exactly `--clients` clients. Compilation and one warm-up round are excluded; the reported time is the
median over `--rounds` rounds. FLOPs come from XLA's cost analysis of the client function
(`benchmarks/flops.py`; the same count for every mode, since every mode does the same work).
With torch installed (`pip install -e '.[bench]'`) and dp2fedsam on the CIFAR CNN or a char LSTM, a
PyTorch CPU loop over the same clients (`benchmarks/torch_baseline.py`) is timed as the comparison line.

The char LSTMs (the Shakespeare round) run on synthetic token rows of `--seq_len` ids from a
vocabulary of `--vocab` (TFF's 80 and 90; id 0 is the pad id, which the rows never contain):

    python -m benchmarks.client_throughput --model=char_lstm --clients=10 --samples_per_client=16 \
        --batch_size=8 --personal_epochs=1 --shared_epochs=1 --rounds=3 --torch_threads=1,2

For them the limit is printed too: the step's own GEMMs ([B, H] x [H, 4H], [B, 4H] x [4H, H] and
[B, in + H] x [in + H, 4H] per layer) timed as a recurrence runs them, one per iteration of a scan,
and the round's FLOPs at the first one's rate (`% step GEMM`). `--lstm_cell=optimized` times flax's
cell (the same parameters) instead of the models' FusedLSTM.
"""

from __future__ import annotations

import json
import os
import statistics

from absl import flags
import jax
import jax.numpy as jnp

from benchmarks import flops as flops_lib
from benchmarks import timing
from dp2fedsam_jax import cli, run_files
from dp2fedsam_jax.algorithms import get_method
from dp2fedsam_jax.config import base_config
from dp2fedsam_jax.local import LocalConfig
from dp2fedsam_jax.models import CONV_IMPLS, count_params, get_model
from dp2fedsam_jax.models.registry import MODELS, is_token_model
from dp2fedsam_jax.registries import did_you_mean

# Every registered model (models.registry.MODELS), a user's too: `--extension=<file>` executes the
# file that registers it (dp2fedsam_jax.register_model) before the model is built.
_MODEL = flags.DEFINE_string('model', 'cifar_cnn', 'Model: a registered name (python3 -m '
                             'experiments.train --list), e.g. ' + ', '.join(MODELS.names()) + '.')
_EXTENSION = flags.DEFINE_string('extension', None, 'A Python file that registers models or methods '
                                 '(e.g. experiments/extending/own_model.py), executed first.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', 80, 'Token models: ids per row (TFF Shakespeare: 80).')
_VOCAB = flags.DEFINE_integer('vocab', 90, 'Token models: vocabulary size incl. pad id 0 (TFF: 90).')
_LSTM_CELL = flags.DEFINE_enum('lstm_cell', 'fused', ['fused', 'optimized', 'lstm'], 'Token models: '
                               "the model's FusedLSTM layer, or flax's OptimizedLSTMCell (fused "
                               'gates) or LSTMCell (one matmul per gate) scanned by nn.RNN.')
_LSTM_UNROLL = flags.DEFINE_integer('lstm_unroll', 1, 'Token models: time steps per scan iteration.')
_CLIENTS = flags.DEFINE_list('clients', ['10', '50'], 'Cohort sizes (clients trained per round).')
_SAMPLES = flags.DEFINE_integer('samples_per_client', 45, 'Training examples per client (the most, '
                                'with --min_samples_per_client).')
_MIN_SAMPLES = flags.DEFINE_integer('min_samples_per_client', None, 'Unequal clients: counts drawn '
                                    'uniformly from [this, samples_per_client] (padding to the '
                                    'largest, as real partitions are; GFLOP/s still counts full '
                                    'clients); None: all equal.')
_BATCH = flags.DEFINE_integer('batch_size', 10, 'Local batch size.')
_HEAD_EPOCHS = flags.DEFINE_integer('personal_epochs', 2, 'Head-phase epochs (tau_h).')
_BODY_EPOCHS = flags.DEFINE_integer('shared_epochs', 2, 'Shared-phase epochs (tau_phi).')
# The names before the shared / personal renaming still work (commands in notes and issues use them).
flags.DEFINE_alias('head_epochs', 'personal_epochs')
flags.DEFINE_alias('body_epochs', 'shared_epochs')
_MODES = flags.DEFINE_list('modes', ['vmap', 'sequential', 'sharded'], 'Executors: vmap, '
                          'sequential, sharded (skipped on one device).')
_CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', None, 'CPU devices JAX splits the host into (jax_num_cpu_devices). The sharded '
    'executor trains one slice of the cohort on each, one per core, where XLA runs a client\'s '
    'small per-step GEMMs on one thread. Default: one per host core (os.cpu_count()).')
_METHOD = flags.DEFINE_string('method', 'dp2fedsam', 'Method (algorithms registry name).')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds per (mode, cohort); the median is reported.')
_CONV_IMPL = flags.DEFINE_enum('conv_impl', 'auto', list(CONV_IMPLS), 'Conv lowering.')
_PRECISION = flags.DEFINE_enum('matmul_precision', 'default', list(timing.MATMUL_PRECISIONS),
                               'jax.default_matmul_precision for every dot and convolution timed '
                               '(the matmul peak too, so %% peak is against the same precision).')
_CHUNK = flags.DEFINE_integer('chunk_size', None, 'Clients per chunk (memory bound); None: whole cohort.')
_JSON_OUT = flags.DEFINE_string('json_out', None, 'Write the results as JSON here.')
_TORCH = flags.DEFINE_bool('torch', True, 'Time the PyTorch baseline too (dp2fedsam on '
                           'cifar_cnn or a char LSTM, if torch is importable).')
_TORCH_THREADS = flags.DEFINE_list('torch_threads', [str(os.cpu_count())],
                                   'torch.set_num_threads values to time the baseline with.')
_TORCH_CLIENTS = flags.DEFINE_list('torch_clients', None, 'Cohort sizes for the PyTorch baseline '
                                   '(default: --clients). Its clients run one after another, so '
                                   'seconds per client do not depend on the cohort.')
_MATMUL = flags.DEFINE_integer('matmul_size', 2048, 'Square f32 matmul size for the machine peak '
                               '(0: skip).')
_FLOPS = flags.DEFINE_bool('flops', True, "XLA's FLOP count of one client (GFLOP/s columns); off "
                           'saves its compilations.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Check the flags, print what would be timed as one '
                             'JSON line, and exit.')
_MODE_NAMES = ('vmap', 'sequential', 'sharded')


def loop_gemm_gflops(m: int, k: int, n: int, steps: int = 80, repeats: int = 20) -> dict:
  """An [m, k] x [k, n] f32 GEMM as a recurrent step runs it: one per iteration of a lax.scan of
  `steps` (inputs streamed in, products stacked out). Median and best GFLOP/s over `repeats` scans."""
  a = jax.random.normal(jax.random.key(0), (steps, m, k), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
  f = jax.jit(lambda a, w: jax.lax.scan(lambda c, x: (c, x @ w), 0.0, a)[1])
  times = [t / steps for t in timing.call_seconds(f, (a, w), repeats)]
  flop = 2 * m * k * n
  return {'shape': [[m, k], [k, n]], 'us_per_gemm': 1e6 * statistics.median(times),
          'gflops_median': flop / statistics.median(times) / 1e9, 'gflops_best': flop / min(times) / 1e9}


def lstm_step_gemms(model, batch: int) -> list[dict]:
  """The char LSTM's per-step GEMMs at batch `batch`, timed in a loop: [B, H] x [H, 4H] (the fused
  layer's forward), [B, 4H] x [4H, H] (its backward), [B, in + H] x [in + H, 4H] (a cell that
  multiplies input and carry in the loop), for each layer size."""
  embed, hidden = model.extractor.embed_dim, tuple(model.extractor.hidden)
  shapes = []
  for in_dim, h in zip((embed, *hidden[:-1]), hidden):
    for shape in ((batch, h, 4 * h), (batch, 4 * h, h), (batch, in_dim + h, 4 * h)):
      if shape not in shapes:
        shapes.append(shape)
  return [loop_gemm_gflops(*shape) for shape in shapes]


def input_shape(model: str) -> tuple:
  """The input a model is timed on: its registered benchmark_input_shape (models.registry.MODELS)."""
  return MODELS.lookup(model).benchmark_input_shape


def build_model(seq_len: int | None = None, unroll: int | None = None):
  """The --model; token models at `seq_len` ids (default --seq_len) and `unroll` (--lstm_unroll)."""
  if not is_token_model(_MODEL.value):
    return get_model(_MODEL.value, 10, input_shape(_MODEL.value), _CONV_IMPL.value)
  return get_model(_MODEL.value, _VOCAB.value, (seq_len or _SEQ_LEN.value,), cell=_LSTM_CELL.value,
                   unroll=unroll or _LSTM_UNROLL.value)


def local_config() -> LocalConfig:
  c = base_config()
  c.local.personal_epochs, c.local.shared_epochs = _HEAD_EPOCHS.value, _BODY_EPOCHS.value
  c.local.batch_size = _BATCH.value
  return LocalConfig.from_config(c)


def time_mode(mode: str, cohort: int, spec, model, lc) -> dict:
  return timing.time_round(mode, cohort, spec, model, lc, samples=_SAMPLES.value,
                           rounds=_ROUNDS.value, min_samples=_MIN_SAMPLES.value,
                           chunk_size=_CHUNK.value, tokens=is_token_model(_MODEL.value))


def torch_rows(cohorts, lc, client_gflop) -> list[dict]:
  try:
    from benchmarks import torch_baseline
  except ImportError:
    print('torch is not importable: no PyTorch baseline (pip install -e ".[bench]").')
    return []
  rows = []
  for threads in _TORCH_THREADS.value:
    for cohort in cohorts:
      load_before = timing.load_average()
      r = torch_baseline.run(cohort, _SAMPLES.value, model=_MODEL.value, seq_len=_SEQ_LEN.value,
                             vocab=_VOCAB.value, batch_size=lc.batch_size,
                             personal_epochs=lc.personal_epochs, shared_epochs=lc.shared_epochs,
                             rounds=_ROUNDS.value, threads=int(threads), lr_personal=lc.lr_personal,
                             lr_shared=lc.lr_shared, momentum=lc.momentum, rho=lc.sam_rho)
      s = r['seconds_per_round']
      rows.append({'mode': f'torch_sequential_{threads}t', 'clients': cohort, **r,
                   'clients_per_second': cohort / s,
                   'examples_per_second': (cohort * _SAMPLES.value
                                           * (lc.personal_epochs + lc.shared_epochs) / s),
                   # JAX's executed count (padded last batch included); PyTorch skips the padding.
                   'gflops_per_second': cohort * client_gflop / s,
                   'load_before': load_before, 'load_after': timing.load_average()})
  return rows


def main(argv):
  with timing.precision_context(_PRECISION.value):
    _main(argv)


def _client_flops(spec, model, lc, data1, tokens: bool):
  """One client's FLOPs (--flops), or NaN everywhere (the GFLOP/s columns are then NaN)."""
  if _FLOPS.value and tokens:  # the scan over time is counted once by XLA: lengths 2 and 3, unrolled
    return flops_lib.sequence_flops(
        lambda t: flops_lib.client_flops(spec, build_model(t, t), lc, _SAMPLES.value,
                                         data1.normalize, data1.loss_mask), _SEQ_LEN.value)
  if _FLOPS.value:
    return flops_lib.client_flops(spec, model, lc, _SAMPLES.value, data1.normalize)
  return flops_lib.ClientFlops(*(float('nan'),) * 4, head_steps=0, body_steps=0)


def _with_peak_percents(row: dict, machine: dict) -> dict:
  """The row with its GFLOP/s as a percentage of each peak the machine was measured at."""
  if 'matmul_peak_gflops' in machine:
    row['percent_of_matmul_peak'] = 100 * row['gflops_per_second'] / machine['matmul_peak_gflops']
  if 'step_gemm_peak_gflops' in machine:
    row['percent_of_step_gemm_peak'] = (100 * row['gflops_per_second']
                                        / machine['step_gemm_peak_gflops'])
  return row


def _print_results(result: dict, machine: dict, model, cf, cohorts: list[int]) -> None:
  """The machine line, the step-GEMM limits (token models) and one table row per timed line;
  adds each row's ratio to the fastest PyTorch line at its cohort ('x_torch')."""
  print(f"\n{machine.get('cpu_model') or machine['device_kind']} ({machine['platform']}, "
        f"{machine['device_count']} device(s)); matmul peak "
        f"{machine.get('matmul_peak_gflops', float('nan')):.0f} GFLOP/s; {_MODEL.value} "
        f"({model.conv_impl}), {cf.total / 1e9:.2f} GFLOP per client "
        f"(head phase {cf.personal_phase / 1e9:.2f}, shared phase {cf.body_phase / 1e9:.2f})")
  if 'step_gemms' in machine:
    for g in machine['step_gemms']:
      (m, k), (_, n) = g['shape']
      print(f"step GEMM [{m}, {k}] x [{k}, {n}] in a scan: {g['us_per_gemm']:.1f} us, "
            f"{g['gflops_median']:.1f} GFLOP/s (best {g['gflops_best']:.1f})")
    peak = machine['step_gemm_peak_gflops']
    for cohort in cohorts:
      print(f'limit at {cohort} clients: {cohort * cf.total / 1e9 / peak:.3f} s/round (every FLOP at '
            f'[B, H] x [H, 4H] loop rate, {peak:.1f} GFLOP/s)')
  # x PyTorch: seconds per round over the fastest PyTorch line's (of --torch_threads) at the cohort.
  torch_seconds = {}
  for r in result['results']:
    if r['mode'].startswith('torch'):
      torch_seconds[r['clients']] = min(r['seconds_per_round'],
                                        torch_seconds.get(r['clients'], float('inf')))
  for r in result['results']:
    if r['clients'] in torch_seconds:
      r['x_torch'] = r['seconds_per_round'] / torch_seconds[r['clients']]
  header = ('mode', 'clients', 's/round', 'x PyTorch', 'clients/s', 'examples/s', 'GFLOP/s', '% peak',
            '% step GEMM', 'compile s', 'peak mem MB', 'load')
  print(' | '.join(header))
  for r in result['results']:
    mem = r.get('peak_device_memory_bytes', r.get('peak_rss_bytes_process'))
    print(' | '.join([r['mode'], str(r['clients']), f"{r['seconds_per_round']:.3f}",
                      f"{r.get('x_torch', float('nan')):.2f}",
                      f"{r['clients_per_second']:.2f}", f"{r['examples_per_second']:.0f}",
                      f"{r['gflops_per_second']:.1f}",
                      f"{r.get('percent_of_matmul_peak', float('nan')):.0f}",
                      f"{r.get('percent_of_step_gemm_peak', float('nan')):.0f}",
                      f"{r.get('compile_seconds', float('nan')):.1f}",
                      f"{mem / 2**20:.0f}" if mem else '-', str(r['load_before'][0])]))


def _main(argv):
  if len(argv) > 1:
    raise ValueError(f'unexpected arguments: {argv[1:]}')
  cpu_devices = os.cpu_count() or 1 if _CPU_DEVICES.value is None else _CPU_DEVICES.value
  if cpu_devices < 1:
    raise ValueError(f'--cpu_devices={cpu_devices}: at least 1')
  jax.config.update('jax_num_cpu_devices', cpu_devices)  # before the backend starts
  if _EXTENSION.value:
    cli.execute_file(_EXTENSION.value, '--extension', '_benchmark_extension')
  if _MODEL.value not in MODELS:
    raise ValueError(f'--model={_MODEL.value}: unknown; {did_you_mean(_MODEL.value, MODELS.names())}'
                     f'choose one of {MODELS.names()}, or register your own in a file passed as '
                     '--extension=<file> (docs/extending.md).')
  spec = get_method(_METHOD.value)
  if is_token_model(_MODEL.value) and not 2 <= _VOCAB.value <= 256:
    raise ValueError(f'--vocab={_VOCAB.value}: token ids are stored as uint8; use 2..256')
  model = build_model()
  lc = local_config()
  try:
    cohorts = [int(c) for c in _CLIENTS.value]
  except ValueError as e:
    raise ValueError(f'--clients={",".join(_CLIENTS.value)}: a list of integers ({e})') from e
  unknown = sorted(set(_MODES.value) - set(_MODE_NAMES))
  if unknown:
    raise ValueError(f'--modes: unknown {unknown}; choose from {list(_MODE_NAMES)}')
  if _DRY_RUN.value:
    print(json.dumps({'model': _MODEL.value, 'conv_impl': model.conv_impl,
                      'matmul_precision': _PRECISION.value, 'method': _METHOD.value,
                      'clients': cohorts, 'modes': _MODES.value, 'rounds': _ROUNDS.value,
                      'chunk_size': _CHUNK.value, 'json_out': _JSON_OUT.value}))
    return
  tokens = is_token_model(_MODEL.value)
  data1 = timing.synthetic_data(1, _SAMPLES.value, model.input_shape, model.num_classes,
                                tokens=tokens)
  cf = _client_flops(spec, model, lc, data1, tokens)
  layers = flops_lib.layer_matmul_flops(model)
  conv = sum(v for k, v in layers.items() if k.startswith('conv:'))
  machine = timing.device_description()
  if _MATMUL.value:
    machine['matmul_peak_gflops'] = timing.matmul_peak_gflops(_MATMUL.value)
    machine['matmul_size'] = _MATMUL.value
  if _MATMUL.value and tokens:  # the limit: the step's own GEMM shapes, timed in a loop
    machine['step_gemms'] = lstm_step_gemms(model, _BATCH.value)
    machine['step_gemm_peak_gflops'] = machine['step_gemms'][0]['gflops_median']
  result = {
      'config': {'model': _MODEL.value, 'num_params': count_params(jax.eval_shape(
                     model.init, jax.random.key(0))), 'conv_impl': model.conv_impl,
                 'matmul_precision': _PRECISION.value,
                 'matmul_precision_means': timing.MATMUL_PRECISIONS[_PRECISION.value],
                 'method': _METHOD.value, 'samples_per_client': _SAMPLES.value,
                 'min_samples_per_client': _MIN_SAMPLES.value, 'batch_size': _BATCH.value,
                 'personal_epochs': _HEAD_EPOCHS.value,
                 'shared_epochs': _BODY_EPOCHS.value, 'rounds': _ROUNDS.value,
                 'chunk_size': _CHUNK.value,
                 **({'seq_len': _SEQ_LEN.value, 'vocab': _VOCAB.value, 'lstm_cell': _LSTM_CELL.value,
                     'lstm_unroll': _LSTM_UNROLL.value} if tokens else {})},
      'device': machine,
      'client_flops': {'total': cf.total, 'personal_phase': cf.personal_phase, 'body_phase': cf.body_phase,
                       'features_once': cf.features, 'head_step': cf.head_step,
                       'body_step': cf.body_step, 'head_steps': cf.head_steps,
                       'body_steps': cf.body_steps,
                       'forward_matmul_flops_per_example': layers,
                       'conv_fraction_of_forward_matmul': conv / max(sum(layers.values()), 1.0)},
      'results': [],
  }
  for cohort in cohorts:
    for mode in _MODES.value:
      if mode == 'sharded' and jax.device_count() == 1:
        print('sharded: skipped, one device (--cpu_devices=2 or more on a CPU)', flush=True)
        continue
      row = time_mode(mode, cohort, spec, model, lc)
      row['gflops_per_second'] = cohort * cf.total / row['seconds_per_round'] / 1e9
      result['results'].append(_with_peak_percents(row, machine))
      print(f"{mode:>10} {cohort:>5} clients: {row['seconds_per_round']:.3f} s/round", flush=True)
  if (_TORCH.value and (_MODEL.value == 'cifar_cnn' or is_token_model(_MODEL.value))
      and _METHOD.value == 'dp2fedsam' and jax.process_count() == 1):
    torch_cohorts = [int(c) for c in (_TORCH_CLIENTS.value or cohorts)]
    for row in torch_rows(torch_cohorts, lc, cf.total / 1e9):
      result['results'].append(_with_peak_percents(row, machine))

  _print_results(result, machine, model, cf, cohorts)
  if _JSON_OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_JSON_OUT.value)), exist_ok=True)
    run_files.write_json_atomic(_JSON_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
