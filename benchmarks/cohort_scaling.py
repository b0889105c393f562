r"""How the cost of a round grows with the cohort: seconds per client and peak memory, per executor.

    python -m benchmarks.cohort_scaling --models=cifar_cnn,resnet18_gn --cohorts=1,4,16,64,256 \
        --modes=vmap,sequential,chunked --chunk_size=16 --out=benchmarks/results/<machine>/scaling

Every (model, mode, cohort) is timed by `benchmarks.client_throughput` in a process of its own, so
that its peak memory is its own: the device's peak where the backend reports one (GPU/TPU), else
the process's peak RSS (CPU). `chunked` is the vmap executor over sub-chunks of `--chunk_size`
clients (a `lax.map` of vmaps: memory bounded by the chunk). A cohort that does not fit (XLA's
RESOURCE_EXHAUSTED, or the process killed for memory) is recorded as such and ends that mode's
sweep; so does a round predicted to take longer than `--max_round_seconds` (extrapolated linearly
from the last cohort), so that one command stays affordable on a laptop.

Writes `<out>/cohort_scaling.json` (every row, with the machine) and `<out>/cohort_scaling.png`
(seconds per client and peak memory against the cohort size, log-log, one line per model and
mode), and prints the table and, per model, the cohorts where vmap beats the loop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from absl import flags

from dp2fedsam_jax import cli

_MODELS = flags.DEFINE_list('models', ['cifar_cnn', 'resnet18_gn'], 'Models to sweep.')
_COHORTS = flags.DEFINE_list('cohorts', ['1', '4', '16', '64', '256'], 'Cohort sizes, ascending.')
_MODES = flags.DEFINE_list('modes', ['vmap', 'sequential', 'chunked'],
                           'Executors: vmap (whole cohort), sequential, chunked (vmap in chunks).')
_CHUNK = flags.DEFINE_integer('chunk_size', 16, 'Clients per vmapped chunk of the chunked mode.')
_SAMPLES = flags.DEFINE_integer('samples_per_client', 45, 'Training examples per client.')
_BATCH = flags.DEFINE_integer('batch_size', 10, 'Local batch size.')
_EPOCHS = flags.DEFINE_integer('epochs', 2, 'Head-phase and shared-phase epochs (each).')
_ROUNDS = flags.DEFINE_integer('rounds', 1, 'Timed rounds per entry (after one warm-up round).')
_MAX_ROUND = flags.DEFINE_float('max_round_seconds', 90.0, 'Skip the larger cohorts of a mode once '
                                'a round is predicted to take longer than this.')
_TIMEOUT = flags.DEFINE_integer('timeout', 1800, 'Seconds before an entry is given up.')
_OUT = flags.DEFINE_string('out', None, 'Directory for cohort_scaling.json and .png.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the entries as one JSON line and exit.')
_MODE_NAMES = ('vmap', 'sequential', 'chunked')


def throughput_args(model: str, mode: str, cohort: int, json_out: str) -> list[str]:
  """The client_throughput command line of one entry."""
  executor = 'vmap' if mode == 'chunked' else mode
  args = [f'--model={model}', f'--clients={cohort}', f'--modes={executor}',
          f'--samples_per_client={_SAMPLES.value}', f'--batch_size={_BATCH.value}',
          f'--personal_epochs={_EPOCHS.value}', f'--shared_epochs={_EPOCHS.value}',
          f'--rounds={_ROUNDS.value}', '--notorch', '--matmul_size=0', '--noflops', f'--json_out={json_out}']
  if mode == 'chunked':
    args.append(f'--chunk_size={min(_CHUNK.value, cohort)}')
  return [sys.executable, '-m', 'benchmarks.client_throughput', *args]


def _did_not_fit(proc: subprocess.CompletedProcess) -> bool:
  return proc.returncode in (-9, 137) or 'RESOURCE_EXHAUSTED' in proc.stderr + proc.stdout


def run_entry(model: str, mode: str, cohort: int) -> dict:
  """One entry's row: seconds per round and per client, peak memory; or why there is none."""
  row = {'model': model, 'mode': mode, 'clients': cohort,
         'chunk_size': min(_CHUNK.value, cohort) if mode == 'chunked' else None}
  with tempfile.TemporaryDirectory() as tmp:
    json_out = os.path.join(tmp, 'entry.json')
    try:
      proc = subprocess.run(throughput_args(model, mode, cohort, json_out), capture_output=True,
                            text=True, timeout=_TIMEOUT.value)
    except subprocess.TimeoutExpired:
      return {**row, 'status': f'timeout after {_TIMEOUT.value} s'}
    if proc.returncode != 0 or not os.path.exists(json_out):
      status = 'out of memory' if _did_not_fit(proc) else 'failed'
      return {**row, 'status': status, 'error': (proc.stderr or proc.stdout)[-500:]}
    with open(json_out) as f:
      result = json.load(f)
  timed = result['results'][0]
  memory = timed.get('peak_device_memory_bytes', timed.get('peak_rss_bytes_process'))
  return {**row, 'status': 'ok', 'seconds_per_round': timed['seconds_per_round'],
          'seconds_per_client': timed['seconds_per_round'] / cohort,
          'compile_seconds': timed['compile_seconds'], 'peak_memory_bytes': memory,
          'memory_kind': 'device' if 'peak_device_memory_bytes' in timed else 'process RSS',
          'xla_temp_bytes': timed['xla_temp_bytes'], 'device': result['device']}


def sweep(models, modes, cohorts) -> list[dict]:
  rows = []
  for model in models:
    for mode in modes:
      last = None
      for cohort in cohorts:
        if last is not None and last['seconds_per_round'] * cohort / last['clients'] > _MAX_ROUND.value:
          rows.append({'model': model, 'mode': mode, 'clients': cohort,
                       'status': f'skipped: predicted > {_MAX_ROUND.value:g} s a round'})
          continue
        row = run_entry(model, mode, cohort)
        rows.append(row)
        print(format_row(row), flush=True)
        if row['status'] != 'ok':
          last = None
          break  # a larger cohort of this mode will not fit either
        last = row
  return rows


def format_row(row: dict) -> str:
  if row['status'] != 'ok':
    return f"{row['model']:>12} {row['mode']:>10} {row['clients']:>5}: {row['status']}"
  return (f"{row['model']:>12} {row['mode']:>10} {row['clients']:>5}: "
          f"{row['seconds_per_round']:8.3f} s/round {row['seconds_per_client']:7.4f} s/client "
          f"{row['peak_memory_bytes'] / 2**20:8.0f} MiB ({row['memory_kind']})")


def vmap_wins(rows: list[dict]) -> dict:
  """model -> the cohorts where a vmapped mode (whole or chunked) beats the sequential loop."""
  ok = {(r['model'], r['mode'], r['clients']): r['seconds_per_round'] for r in rows
        if r['status'] == 'ok'}
  wins = {}
  for (model, mode, cohort), seconds in ok.items():
    loop = ok.get((model, 'sequential', cohort))
    if mode != 'sequential' and loop is not None and seconds < loop:
      wins.setdefault(model, []).append({'mode': mode, 'clients': cohort,
                                         'speedup': loop / seconds})
  return wins


def plot(rows: list[dict], path: str, title: str) -> None:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
  lines = {}
  for r in rows:
    if r['status'] == 'ok':
      lines.setdefault((r['model'], r['mode']), []).append(r)
  for (model, mode), pts in sorted(lines.items()):
    pts.sort(key=lambda r: r['clients'])
    x = [r['clients'] for r in pts]
    style = {'sequential': 'o-', 'vmap': 's--', 'chunked': '^:'}[mode]
    label = f'{model} {mode}' + (f' ({pts[0]["chunk_size"]})' if mode == 'chunked' else '')
    ax_time.plot(x, [r['seconds_per_client'] for r in pts], style, label=label)
    ax_mem.plot(x, [r['peak_memory_bytes'] / 2**30 for r in pts], style, label=label)
  for ax, ylabel in ((ax_time, 'seconds per client'), (ax_mem, 'peak memory (GiB)')):
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xlabel('cohort size (clients per round)')
    ax.set_ylabel(ylabel)
    ax.grid(True, which='both', alpha=0.3)
  ax_time.legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  if len(argv) > 1:
    raise ValueError(f'unexpected arguments: {argv[1:]}')
  try:
    cohorts = sorted(int(c) for c in _COHORTS.value)
  except ValueError as e:
    raise ValueError(f'--cohorts={",".join(_COHORTS.value)}: a list of integers ({e})') from e
  unknown = sorted(set(_MODES.value) - set(_MODE_NAMES))
  if unknown:
    raise ValueError(f'--modes: unknown {unknown}; choose from {list(_MODE_NAMES)}')
  if not _OUT.value:
    raise ValueError('--out: a directory for cohort_scaling.json and cohort_scaling.png is needed')
  if _DRY_RUN.value:
    print(json.dumps({'models': _MODELS.value, 'modes': _MODES.value, 'cohorts': cohorts,
                      'chunk_size': _CHUNK.value, 'out': _OUT.value}))
    return
  rows = sweep(_MODELS.value, _MODES.value, cohorts)
  device = next((r['device'] for r in rows if 'device' in r), {})
  wins = vmap_wins(rows)
  os.makedirs(_OUT.value, exist_ok=True)
  setup = {'samples_per_client': _SAMPLES.value, 'batch_size': _BATCH.value,
           'epochs': _EPOCHS.value, 'rounds': _ROUNDS.value, 'chunk_size': _CHUNK.value,
           'method': 'dp2fedsam'}
  with open(os.path.join(_OUT.value, 'cohort_scaling.json'), 'w') as f:
    json.dump({'device': device, 'setup': setup, 'rows': rows, 'vmap_wins': wins}, f, indent=2)
  name = device.get('cpu_model') if device.get('platform') == 'cpu' else device.get('device_kind')
  plot(rows, os.path.join(_OUT.value, 'cohort_scaling.png'),
       f"DP2-FedSAM round cost vs cohort on {name} ({device.get('platform')}); "
       f"{_SAMPLES.value} samples/client, batch {_BATCH.value}, {_EPOCHS.value}+{_EPOCHS.value} epochs")
  print('\nmodel | mode | clients | s/round | s/client | peak memory MiB | status')
  for r in rows:
    if r['status'] == 'ok':
      print(f"{r['model']} | {r['mode']} | {r['clients']} | {r['seconds_per_round']:.3f} | "
            f"{r['seconds_per_client']:.4f} | {r['peak_memory_bytes'] / 2**20:.0f} | ok")
    else:
      print(f"{r['model']} | {r['mode']} | {r['clients']} | | | | {r['status']}")
  for model in _MODELS.value:
    won = wins.get(model)
    print(f'{model}: vmap beats the loop at ' + (
        ', '.join(f"{w['clients']} ({w['mode']}, {w['speedup']:.2f}x)" for w in won) if won
        else 'no cohort measured'))


if __name__ == '__main__':
  cli.run(main)
