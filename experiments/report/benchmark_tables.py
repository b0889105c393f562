"""benchmarks/README.md's numbers, generated from the committed JSON under benchmarks/results/: each
table with the machine it ran on and the file it came from. The benchmark scripts write the JSON;
nothing here times anything."""

from __future__ import annotations

import json
import os
import statistics

RESULTS = os.path.join('benchmarks', 'results')
TORCH_MODES = {'torch_sequential_2t': 'PyTorch loop, 2 threads',
               'torch_sequential_1t': 'PyTorch loop, 1 thread'}


def _load(repo: str, name: str) -> dict:
  with open(os.path.join(repo, RESULTS, name)) as f:
    return json.load(f)


def _by_mode(record: dict) -> dict:
  """{(mode, clients): result} of a client_throughput record."""
  return {(r['mode'], r['clients']): r for r in record['results']}


def _by_mode_alone(record: dict) -> dict:
  """{mode: result} of a client_throughput record measured at one cohort."""
  return {m: r for (m, _), r in _by_mode(record).items()}


def _json_line(*names: str) -> str:
  return 'JSON: ' + ', '.join(f'`results/{n}`' for n in names) + '.'


def _machine(device: dict, torch: str | None = None) -> str:
  """'**CPU: 2-core AMD EPYC** (jax 0.10.2, matmul peak 208 GFLOP/s)' from a record's device."""
  if device.get('platform') == 'gpu':
    name = f"**GPU: {device['device_count'] if device.get('device_count', 1) > 1 else 'one'} " \
           f"{device['device_kind']}**"
  else:
    name = f"**CPU: {device.get('host_cpus', 2)}-core {device['cpu_model']}**"
  facts = [f"jax {device['jax_version']}"] if device.get('jax_version') else []
  facts += [f'torch {torch}'] if torch else []
  if device.get('platform') == 'cpu' and device.get('matmul_peak_gflops'):
    facts.append(f"matmul peak {device['matmul_peak_gflops']:.0f} GFLOP/s")
  if device.get('load_1min') is not None:
    facts.append(f"1-minute load {device['load_1min']:.2f} at the start")
  return f"{name} ({', '.join(facts)})" if facts else name


def _bytes(size: float) -> str:
  """MiB to three figures, GiB from 1 GiB on."""
  mib = size / 2 ** 20
  if mib >= 1024:
    return f'{mib / 1024:.1f} GiB'
  return f'{mib:.1f} MiB' if mib < 100 else f'{mib:.0f} MiB'


def search_lines(repo: str) -> list[str]:
  """A search as one compiled program against one process per trial."""
  name = 'cpu-2core-2026-12-07/search_throughput.json'
  r = _load(repo, name)
  modes, accuracy = r['modes'], r['test_accuracy']
  gap = max(abs(a - b) for a, b in zip(accuracy['one_program'], accuracy['one_process_per_trial']))
  space = ', '.join(f'`{k}` {lo:g}-{hi:g}' for k, (lo, hi) in r['space'].items())
  return [f"{r['K']} trials of {r['method']} on {r['dataset']} (`{r['model']}`, {r['num_clients']} "
          f"clients, q = {r['sampling_rate']:g}, {r['rounds']} rounds), drawn log-uniform over {space}, "
          f"each at its own training seed. {_machine(r['device'])}:", '',
          '| mode | seconds | trials / hour |', '|---|---|---|',
          f"| one program (`dp2fedsam_jax/search_program.py`) | {modes['one_program']['seconds']:,.0f} | "
          f"{modes['one_program']['trials_per_hour']:.0f} |",
          f"| one process per trial (`python3 -m experiments.train`) | "
          f"{modes['one_process_per_trial']['seconds']:,.0f} | "
          f"{modes['one_process_per_trial']['trials_per_hour']:.0f} |", '',
          f"Speed-up {r['speedup']:.2f}×. Final test accuracies agree to {gap:.3f} (largest relative "
          f"difference {r['max_rel_diff']:.2f}). " + _json_line(name)]


def _model_cell(config: dict) -> str:
  """'`char_lstm` (820,522 params; 16 rows of 80 ids, batch 8, 1+1 epochs)' from a record's config."""
  epochs = (f"{config.get('head_epochs', config.get('personal_epochs'))}+"
            f"{config.get('body_epochs', config.get('shared_epochs'))} epochs")
  data = (f"{config['samples_per_client']} rows of {config['seq_len']} ids" if 'seq_len' in config
          else f"{config['samples_per_client']} examples")
  return (f"`{config['model']}` ({config['num_params']:,} params; {data}, batch {config['batch_size']}, "
          f'{epochs})')


def vmap_gpu_lines(repo: str) -> list[str]:
  """vmapped against sequential clients on the GPU, per model and cohort."""
  names = ('gpu-h200/lstm_speedups.json', 'gpu-h200/speedups.json')
  records = [_load(repo, n) for n in names]
  lines = [_machine(records[0]['device']) + '. `executor=auto` picks vmap here.', '',
           '| model | cohort | vmap s/round | sequential s/round | vmap speed-up |',
           '|---|---|---|---|---|']
  for record in records:
    results = _by_mode(record)
    cohorts = sorted(c for m, c in results if m == 'vmap')
    for i, cohort in enumerate(cohorts):
      vmap, seq = (results[(m, cohort)]['seconds_per_round'] for m in ('vmap', 'sequential'))
      model = _model_cell(record['config']) if i == 0 else ''
      lines.append(f'| {model} | {cohort} | {vmap:.3f} | {seq:.3f} | {seq / vmap:.1f}× |')
  return lines + ['', _json_line(*names)]


def cpu_throughput_lines(repo: str) -> list[str]:
  """Every line of one client_throughput run on the CPU: JAX's executors and the PyTorch loop."""
  name = 'cpu-2core-epyc-quiet/cifar_dp2fedsam_c10_c50.json'
  record = _load(repo, name)
  torch = next((r.get('torch_version') for r in record['results'] if r.get('torch_version')), None)
  labels = {'vmap': 'JAX vmap', 'sequential': 'JAX sequential', **TORCH_MODES}
  lines = [f"{_machine(record['device'], torch)}. `executor=auto` picks sequential here. "
           f"{_model_cell(record['config'])}, `conv_impl={record['config']['conv_impl']}`:", '',
           '| line | cohort | s/round | clients/s | GFLOP/s | % of peak | XLA temp |',
           '|---|---|---|---|---|---|---|']
  order = {mode: i for i, mode in enumerate(labels)}  # JAX's lines by cohort, PyTorch's by threads

  def key(r):
    line = order[r['mode']]
    return (line >= 2, *((r['clients'], line) if line < 2 else (line, r['clients'])))

  for r in sorted(record['results'], key=key):
    temp = f"{r['xla_temp_bytes'] / 1e6:.0f} MB" if r.get('xla_temp_bytes') else ''
    lines.append(f"| {labels[r['mode']]} | {r['clients']} | {r['seconds_per_round']:.2f} | "
                 f"{r['clients_per_second']:.2f} | {r['gflops_per_second']:.1f} | "
                 f"{r['percent_of_matmul_peak']:.0f} | {temp} |")
  results, largest = _by_mode(record), max(r['clients'] for r in record['results'])
  ratio = (results[('sequential', largest)]['seconds_per_round']
           / results[('torch_sequential_2t', largest)]['seconds_per_round'])
  return lines + ['', f"Sequential JAX takes {ratio:.2f}× PyTorch's 2-thread time at cohort {largest}. "
                  + _json_line(name)]


def lstm_cpu_lines(repo: str) -> list[str]:
  """The Shakespeare LSTMs' round on the CPU: JAX's three executors and the PyTorch loop."""
  names = ('cpu-2core-epyc-quiet/lstm/char_lstm_small.json', 'cpu-2core-epyc-quiet/lstm/char_lstm.json')
  modes = ('sharded', 'sequential', 'vmap', 'torch_sequential_2t', 'torch_sequential_1t')
  lines = ['| model | JAX sharded | JAX sequential | JAX vmap | PyTorch 2 threads | PyTorch 1 thread | '
           'sharded × PyTorch 2 threads |', '|---|---|---|---|---|---|---|']
  for name in names:
    record = _load(repo, name)
    results = _by_mode_alone(record)
    seconds = [results[m]['seconds_per_round'] for m in modes]
    cells = [f'**{seconds[0]:.3f}**' if seconds[0] == min(seconds) else f'{seconds[0]:.3f}',
             *(f'{s:.3f}' for s in seconds[1:])]
    lines.append(f"| {_model_cell(record['config'])} | {' | '.join(cells)} | "
                 f'{seconds[0] / seconds[3]:.2f} |')
  return lines + ['', 'Seconds per round. ' + _json_line(*names)]


def lowering_lines(repo: str) -> list[str]:
  """One round per convolution lowering, vmapped and sequential."""
  names = {impl: f'cpu-2core-epyc-quiet/cifar_{impl}_c5.json' for impl in ('xla', 'im2col')}
  what = {'xla': '`xla` (`lax.conv_general_dilated`)', 'im2col': '`im2col` (patches + einsum)'}
  lines = ['| lowering | vmap s/round | sequential s/round | vmap GFLOP/s | sequential GFLOP/s |',
           '|---|---|---|---|---|']
  for impl, name in names.items():
    results = _by_mode_alone(_load(repo, name))
    vmap, seq = results['vmap'], results['sequential']
    lines.append(f"| {what[impl]} | {vmap['seconds_per_round']:.2f} | {seq['seconds_per_round']:.2f} | "
                 f"{vmap['gflops_per_second']:.1f} | {seq['gflops_per_second']:.1f} |")
  return lines + ['', _json_line(*names.values())]


def cohort_lines(repo: str) -> list[str]:
  """Seconds per client (peak memory) against the cohort, per model and executor; a cohort no line
  ran is named under the table with the reason."""
  name = 'cpu-2core-epyc-quiet/scaling/cohort_scaling.json'
  record = _load(repo, name)
  setup = record['setup']
  rows = {(r['model'], r['mode'], r['clients']): r for r in record['rows']}
  ran = sorted({c for (_, _, c), r in rows.items() if r['status'] == 'ok'})
  not_run = {c: r['status'] for (_, _, c), r in rows.items() if c not in ran}
  lines = [f"Seconds per client (peak RSS in MiB), {setup['method']}, {setup['samples_per_client']} "
           f"examples a client, {setup['epochs']}+{setup['epochs']} epochs; chunked = vmap over "
           f"sub-chunks of {setup['chunk_size']}.", '',
           '| model | executor | ' + ' | '.join(str(c) for c in ran) + ' |',
           '|---|---|' + '---|' * len(ran)]
  for model in dict.fromkeys(m for m, _, _ in rows):
    for i, mode in enumerate(dict.fromkeys(m for k, m, _ in rows if k == model)):
      cells = []
      for cohort in ran:
        r = rows.get((model, mode, cohort))
        cells.append('' if r is None else r['status'].split(':')[0] if r['status'] != 'ok' else
                     f"{r['seconds_per_client']:.3f} ({r['peak_memory_bytes'] / 2 ** 20:.0f})")
      lines.append(f"| {f'`{model}`' if i == 0 else ''} | {mode} | {' | '.join(cells)} |")
  reasons = sorted({r['status'] for (_, _, c), r in rows.items() if r['status'] != 'ok'})
  lines += ['', 'JSON and plot: `results/' + name + '`. ' + '; '.join(reasons).capitalize() + '.']
  if not_run:
    lines[-1] += f" No line ran at {', '.join(str(c) for c in sorted(not_run))} clients."
  return lines


def chunked_lines(repo: str) -> list[str]:
  """The 1,000-client cohort vmapped in chunks."""
  name = 'cpu-2core-epyc-quiet/cifar_c1000_chunk50.json'
  record = _load(repo, name)
  config, (r,) = record['config'], record['results']
  return [f"`{config['model']}`, {r['clients']:,} clients × {config['samples_per_client']} examples, "
          f"vmapped in chunks of {config['chunk_size']} under `lax.map`: {r['seconds_per_round']:.1f} s a "
          f"round, {r['gflops_per_second']:.1f} GFLOP/s, {r['xla_temp_bytes'] / 1e9:.1f} GB of XLA temp "
          f"memory, {r['compile_seconds']:.1f} s to compile. " + _json_line(name)]


def population_lines(repo: str) -> list[str]:
  """Seconds per round and memory against the population's size."""
  name = 'cpu-2core-epyc-shared/population/population.json'
  records = _load(repo, name)['records']
  powers = {10 ** k: f'10{"⁰¹²³⁴⁵⁶⁷⁸⁹"[k]}' for k in range(10)}
  lines = ['| N | examples | ragged data | padded [N, max] data | peak RSS | s/round |',
           '|---|---|---|---|---|---|']
  for r in records:
    size = powers.get(r['num_clients']) or f"{r['num_clients']:,}"
    lines.append(f"| {size} | {r['total_examples']:,} | "
                 f"{_bytes(r['data_bytes'])} | {_bytes(r['padded_data_bytes'])} | "
                 f"{r['peak_rss_mib']:,.0f} MiB | {r['seconds_per_round']:.3f} |")
  first, last = records[0], records[-1]
  return lines + ['', f"JSON and plot: `results/{name}`. A round at {last['num_clients']:,} clients "
                      f"costs {last['seconds_per_round'] / first['seconds_per_round']:.2f}× one at "
                      f"{first['num_clients']:,}."]


def shakespeare_eval_lines(repo: str) -> list[str]:
  """One full Shakespeare evaluation: the rows its blocks compute and its time per LSTM layer."""
  name = 'cpu-2core-epyc-quiet/lstm/shakespeare_eval.json'
  r = _load(repo, name)
  cells = r['cells']
  times = {k: statistics.median(v['seconds']) for k, v in cells.items()}
  return [f"All {r['clients']:,} roles, {r['real_test_rows']:,} test rows, of a fresh {r['method']} state "
          f"(each role's own head): the blocks compute {r['buffer_rows']:,} buffer rows, against "
          f"{r['padded_to_max_rows']:,} if every role were padded to the largest's {r['max_test']} rows. "
          f"Median of {len(cells['fused']['seconds'])} evaluations: {times['fused']:.2f} s with the fused "
          f"LSTM layer, {times['optimized']:.2f} s with flax's `OptimizedLSTMCell`. " + _json_line(name)]


def runs_at_a_time_lines(repo: str) -> list[str]:
  """Rounds an hour of a real run alone, pinned, or one per core."""
  names = {'Fashion-MNIST (1000, 5)': 'cpu-2core-epyc-quiet/runs_at_a_time.json',
           'Shakespeare (1,063 roles)': 'cpu-2core-epyc-quiet/runs_at_a_time_shakespeare.json'}
  modes = {'alone': 'alone (XLA over both cores)', 'alone_pinned': 'alone, pinned to one core',
           'together': 'one per core, unpinned', 'pinned': 'one per core, pinned (`taskset`)'}
  lines = ['| run | mode | round (s) | rounds an hour, machine | vs alone |', '|---|---|---|---|---|']
  losses = {}
  for run, name in names.items():
    record = _load(repo, name)
    for i, (mode, label) in enumerate(modes.items()):
      m = record['modes'][mode]
      lines.append(f"| {f'DP²-FedSAM, {run}' if i == 0 else ''} | {label} | "
                   f"{', '.join(f'{s:.2f}' for s in m['median_round_seconds'])} | "
                   f"{m['rounds_per_hour']:,.0f} | {m['throughput_vs_alone']:.2f}× |")
    losses[run] = (record['modes']['alone_pinned']['last_train_loss'][0],
                   record['modes']['alone']['last_train_loss'][0])
  gain = max(m['throughput_vs_alone'] for n in names.values() for m in _load(repo, n)['modes'].values())
  bits = '; '.join(f'{run} {pinned:.5f} and {alone:.5f}'
                   for run, (pinned, alone) in losses.items())
  return lines + ['', _json_line(*names.values()) + f' Two runs at a time gain at most '
                  f'{100 * (gain - 1):.0f} %. The last train loss pinned to one core and on two: {bits}.']


BLOCKS = {'bench-search': search_lines, 'bench-vmap-gpu': vmap_gpu_lines,
          'bench-cpu-throughput': cpu_throughput_lines, 'bench-lstm-cpu': lstm_cpu_lines,
          'bench-lowering': lowering_lines, 'bench-cohort': cohort_lines, 'bench-chunked': chunked_lines,
          'bench-population': population_lines, 'bench-shakespeare-eval': shakespeare_eval_lines,
          'bench-runs-at-a-time': runs_at_a_time_lines}


def benchmark_blocks(repo: str) -> dict:
  """{block name: its lines} of benchmarks/README.md."""
  return {name: lines(repo) for name, lines in BLOCKS.items()}
