r"""Everything the speed issues ask of a GPU or TPU machine, in one command (benchmarks/accelerator.sh).

    python -m benchmarks.accelerator [--out=DIR] [--smoke] [--steps=...] [--budget_seconds=300]

DIR defaults to benchmarks/results/<device>-<UTC date> (e.g. nvidia-h200-2026-11-30). The default
steps, in this order (the most wanted first), each written under DIR as it finishes, with
summary.json rewritten after every step:
  conv_sweep    the CIFAR CNN round (DP2-FedSAM, 45 examples, 2+2 epochs) under conv_impl xla and
                im2col, vmap at cohorts 16, 50, 500 and sequential at 50, then the fastest lowering
                at cohort 50 in bf16 and f32 matmul precision (benchmarks.conv_sweep); conv_sweep.json;
  pfl           pfl-research's CIFAR-10 setup as FedAvg, DP-FedAvg and DP2-FedSAM, 300 of its
                1,500 rounds timed, its minutes projected (benchmarks.pfl_cifar10); pfl_cifar10.json;
  agreement     one round of the default experiment under vmap and under sequential, compared by
                relative differences (bounds below); agreement.json;
  paper_regime  the wall time of a 200-round paper-regime run (experiments/configs/
                fmnist_paper_regime.py, DP2-FedSAM, executor auto); paper_regime/ is its workdir;
  scaling       cost against the cohort (benchmarks.cohort_scaling): cifar_cnn vmapped, 1,000
                clients in one round (with the sweep's 16-500: where the cohort stops fitting);
                cohort_scaling.{json,png};
  masks         DP-pFedDSU's weight mask made by the radix select and by lax.top_k, one client and
                vmapped (benchmarks.sparsify_masks): which one sparsify should use on this
                backend; sparsify_masks.json.
On request: speedups (cifar_cnn, conv_impl auto, vmap and sequential at 16, 50, 100, 500) and
lstm_speedups (the Shakespeare round, char_lstm, cohorts 10-500): both ran on an H200 on 2026-11-26
(results/gpu-h200/).

Sized for one H100/H200 in about 6 minutes, estimated from results/gpu-h200 (compiles of 8-18 s a
CIFAR-CNN round, 0.1 s a vmapped round of 50, 1.0 s of 500): conv_sweep ~165 s (10 compiles), pfl
~65 s, agreement ~45 s, paper_regime ~75 s: ~350 s; scaling (~35 s) and masks (~20 s, estimated:
24 small compiles) run only if the others took less. A step that would start after
--budget_seconds (300) is skipped and recorded as such, so a slower device loses the last steps,
not the first, and the run ends within about 6 minutes. A step
that fails (a dataset missing on the machine) is recorded in summary.json's `failed` and the next
one runs; the command then exits with an error.
--smoke runs every step at toy sizes (a few clients, one or two rounds): what CI runs on its CPU to
keep the command working end to end. On a CPU the full sizes take hours (benchmarks/README.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
import time

from absl import flags
import jax
import numpy as np

from dp2fedsam_jax import cli, executors
from dp2fedsam_jax.federated_round import make_round_step
from dp2fedsam_jax.train import build_experiment
from experiments.configs import default

_OUT = flags.DEFINE_string('out', None, 'Directory for every result file (default: '
                           'benchmarks/results/<device>-<UTC date>).')
_SMOKE = flags.DEFINE_bool('smoke', False, 'Toy sizes (CI on CPU): the same steps, minutes not hours.')
STEP_NAMES = ('conv_sweep', 'pfl', 'agreement', 'paper_regime', 'scaling', 'masks', 'speedups',
              'lstm_speedups')
DEFAULT_STEPS = ('conv_sweep', 'pfl', 'agreement', 'paper_regime', 'scaling', 'masks')
_STEPS = flags.DEFINE_list('steps', list(DEFAULT_STEPS), f'Which steps to run, in order: {STEP_NAMES}.')
_BUDGET = flags.DEFINE_float('budget_seconds', 300.0, 'Full sizes: skip the steps that would start '
                             'after this many seconds (0: no limit). Smoke runs have none.')

# The executors agree when these relative differences after one round stay below the bounds. They
# differ only in the order of float32 reductions (batched vs single GEMMs), but the default
# experiment's first round trains each client 2+2 epochs from a random init at rates where pre-clip
# updates reach norms ~5 against C = 0.1, which amplifies rounding. Measured on the 2-core CPU
# (default config, round 1): mean update norm 2.8e-4 (5.1172 vs 5.1158), train loss 4.1e-4, the
# model's step 1.9e-4 of its size. So: 1e-3 on the metrics (the 5.7072 vs 5.7062 was 1.8e-4),
# 1e-2 on the step (the noise, the same draw in both, is most of it) -- room for other hardware,
# while a real divergence (a client dropped or trained twice, another key) moves a metric by
# ~1/cohort = 5e-2 or more (tests/test_benchmark.py: a perturbed round fails).
METRIC_RTOL = 1e-3
STEP_RTOL = 1e-2
AGREEMENT_KEYS = ('mean_update_norm', 'train_loss', 'clipped_fraction')


def relative_difference(a: float, b: float) -> float:
  """|a - b| / max(|a|, |b|) (0 where both are 0)."""
  scale = max(abs(a), abs(b))
  return 0.0 if scale == 0 else abs(a - b) / scale


def _norm(tree) -> float:
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64)))
                           for x in jax.tree.leaves(tree))))


def compare_rounds(start, first: tuple, second: tuple) -> dict:
  """The shared params before a round and (state, metrics) after it under two executors -> the
  relative differences, the bounds and whether they hold. The model is compared by its step:
  ||phi_a - phi_b|| / ||phi_a - phi_start||."""
  (state_a, metrics_a), (state_b, metrics_b) = first, second
  diffs = {k: relative_difference(float(metrics_a[k]), float(metrics_b[k])) for k in AGREEMENT_KEYS}
  step = _norm(jax.tree.map(lambda a, s: np.asarray(a, np.float64) - s, state_a.shared, start))
  diffs['model_step'] = _norm(jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b,
                                           state_a.shared, state_b.shared)) / max(step, 1e-30)
  same_cohort = int(metrics_a['cohort_size']) == int(metrics_b['cohort_size'])
  agree = (same_cohort and all(diffs[k] <= METRIC_RTOL for k in AGREEMENT_KEYS)
           and diffs['model_step'] <= STEP_RTOL)
  return {'relative_differences': diffs, 'metric_rtol': METRIC_RTOL, 'step_rtol': STEP_RTOL,
          'same_cohort': same_cohort, 'agree': bool(agree),
          'values': {k: [float(metrics_a[k]), float(metrics_b[k])] for k in AGREEMENT_KEYS}}


def one_round(config, executor: str):
  """(shared params before, (state, metrics) after) the first round of `config` under `executor`."""
  exp = build_experiment(config)
  rc = dataclasses.replace(exp.round_config, executor=executors.from_name(executor))
  step = jax.jit(make_round_step(exp.spec, exp.model, exp.local_config, rc))
  state = exp.init_state()
  start = jax.device_get(state.shared)
  return start, jax.device_get(step(state, exp.data, exp.root_key))


def agreement(out: str, smoke: bool) -> dict:
  config = default.get_config()
  if smoke:  # ~5 clients of an MLP, a fixed sigma (calibration is a PLD search)
    config.sampling_rate, config.model = 0.005, 'mlp'
    config.dp.target_epsilon, config.dp.noise_multiplier = None, 1.0
  start, vmapped = one_round(config, 'vmap')
  result = compare_rounds(start, vmapped, one_round(config, 'sequential')[1])
  result['config'] = 'experiments/configs/default.py' + (' (smoke: mlp, q=0.005, sigma=1)'
                                                          if smoke else '')
  _write(out, 'agreement.json', result)
  return result


# The steps' own processes see the environment as it was given: this process only asks its GPU
# backend not to reserve most of the device's memory up front (JAX's default), which would leave
# the benchmarks it starts a quarter of it.
_CHILD_ENV = dict(os.environ)
_PREALLOCATE = 'XLA_PYTHON_CLIENT_PREALLOCATE'


def _run(cmd: list[str], what: str) -> float:
  print(f'\n== {what}: {" ".join(cmd)}', flush=True)
  start = time.perf_counter()
  subprocess.run(cmd, check=True, env=_CHILD_ENV)
  return time.perf_counter() - start


def _write(out: str, name: str, obj) -> None:
  with open(os.path.join(out, name), 'w') as f:
    json.dump(obj, f, indent=2)


def scaling(out: str, smoke: bool) -> dict:
  # Full size: the one cohort the sweep does not time, all of pfl-research's 1,000 users at once.
  sizes = (['--models=mlp', '--cohorts=1,2', '--modes=sequential,vmap', '--samples_per_client=8',
            '--batch_size=4', '--epochs=1'] if smoke else
           ['--models=cifar_cnn', '--cohorts=1000', '--modes=vmap', '--max_round_seconds=60'])
  _run([sys.executable, '-m', 'benchmarks.cohort_scaling', f'--out={out}', *sizes],
       'cost against the cohort')
  with open(os.path.join(out, 'cohort_scaling.json')) as f:
    result = json.load(f)
  keys = ('model', 'mode', 'clients', 'status', 'seconds_per_client', 'peak_memory_bytes')
  return {'vmap_wins': result['vmap_wins'],
          'rows': [{k: r[k] for k in keys if k in r} for r in result['rows']]}


def masks(out: str, smoke: bool) -> dict:
  sizes = ['--sizes=64', '--keep=0.5', '--cohort=2', '--repeats=1'] if smoke else []
  _run([sys.executable, '-m', 'benchmarks.sparsify_masks', f'--out={out}', *sizes],
       "DP-pFedDSU's weight mask: radix select against top_k")
  with open(os.path.join(out, 'sparsify_masks.json')) as f:
    rows = json.load(f)['rows']
  seconds = {(r['size'], r['keep'], r['batch'], r['way']): r['seconds'] for r in rows}
  return {f'{size} x {keep}, {batch}': seconds[(size, keep, batch, 'top_k_scatter')] / radix
          for (size, keep, batch, way), radix in seconds.items() if way == 'radix_select'}


def speedups(out: str, smoke: bool) -> dict:
  sizes = (['--model=mlp', '--clients=2', '--samples_per_client=8', '--batch_size=4',
            '--personal_epochs=1', '--shared_epochs=1', '--matmul_size=64'] if smoke else
           ['--model=cifar_cnn', '--clients=16,50,100,500'])
  return _speedups(os.path.join(out, 'speedups.json'), sizes, 'vmap over sequential')


def lstm_speedups(out: str, smoke: bool) -> dict:
  # Smoke: rows of 8 ids and no FLOP count (its compilations), so CI adds seconds.
  sizes = (['--model=char_lstm_small', '--clients=2', '--samples_per_client=4', '--batch_size=2',
            '--seq_len=8', '--noflops', '--matmul_size=0'] if smoke else
           ['--model=char_lstm', '--clients=10,50,100,500', '--samples_per_client=16',
            '--batch_size=8'])
  return _speedups(os.path.join(out, 'lstm_speedups.json'),
                   ['--personal_epochs=1', '--shared_epochs=1', *sizes], 'vmap over sequential, char_lstm')


def _speedups(path: str, sizes: list[str], what: str) -> dict:
  """client_throughput's vmap and sequential lines -> {cohort: sequential s / vmap s}."""
  _run([sys.executable, '-m', 'benchmarks.client_throughput', '--modes=vmap,sequential',
        '--rounds=2', '--notorch', f'--json_out={path}', *sizes], what)
  with open(path) as f:
    rows = json.load(f)['results']
  seconds = {(r['mode'], r['clients']): r['seconds_per_round'] for r in rows}
  return {str(c): seconds[('sequential', c)] / seconds[('vmap', c)]
          for (mode, c) in seconds if mode == 'vmap' and ('sequential', c) in seconds}


def conv_sweep(out: str, smoke: bool) -> dict:
  # Smoke: pfl-research's smaller CNN on a few examples, no FLOP count (its compilations).
  sizes = (['--model=pfl_cifar_cnn', '--vmap_cohorts=2', '--sequential_cohorts=2',
            '--precision_cohort=2', '--extra_precisions=bfloat16', '--samples_per_client=4',
            '--batch_size=2', '--personal_epochs=1', '--shared_epochs=1', '--rounds=1',
            '--matmul_size=64', '--noflops'] if smoke else
           ['--model=cifar_cnn', '--vmap_cohorts=16,50,500', '--sequential_cohorts=50',
            '--precision_cohort=50', '--extra_precisions=bfloat16,float32', '--rounds=2'])
  _run([sys.executable, '-m', 'benchmarks.conv_sweep', f'--out={out}', '--impls=xla,im2col', *sizes],
       'conv lowering sweep')
  with open(os.path.join(out, 'conv_sweep.json')) as f:
    return json.load(f)['summary']


def pfl(out: str, smoke: bool) -> dict:
  sizes = (['--rounds=2', '--users=4', '--cohort=2', '--examples_per_user=4', '--batch_size=2',
            '--noise_multiplier=1.0'] if smoke else ['--rounds=300'])
  _run([sys.executable, '-m', 'benchmarks.pfl_cifar10', f'--out={out}', *sizes],
       "pfl-research's CIFAR-10 setup")
  with open(os.path.join(out, 'pfl_cifar10.json')) as f:
    result = json.load(f)
  keys = ('executor', 'setup_minutes', 'setup_minutes_projected', 'client_updates_per_second',
          'compile_seconds', 'rounds')
  return {'results': {r['method']: {k: r[k] for k in keys} for r in result['results']},
          'pfl_research': result['pfl_research']}


def default_out(device) -> str:
  """benchmarks/results/<device kind, lower-case, dashes>-<UTC date>."""
  kind = re.sub(r'[^a-z0-9]+', '-', str(device.device_kind).lower()).strip('-') or device.platform
  if device.platform == 'cpu':
    kind = 'cpu'
  return os.path.join('benchmarks', 'results',
                      f'{kind}-{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}')


def paper_regime(out: str, smoke: bool) -> dict:
  workdir = os.path.join(out, 'paper_regime')
  arg = ':N=20' if smoke else ''
  # Smoke: a fixed sigma (calibrating for eps = 1 in one round is a slow PLD search at small sigma).
  extra = (['--config.num_rounds=1', '--config.eval_every=1', '--config.model=mlp',
            '--config.dp.target_epsilon=None', '--config.dp.noise_multiplier=1.0'] if smoke else [])
  seconds = _run([sys.executable, '-m', 'experiments.train',
                  f'--config=experiments/configs/fmnist_paper_regime.py{arg}', f'--workdir={workdir}',
                  '--config.executor=auto', *extra], 'paper-regime run')
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    last = [json.loads(line) for line in f if line.strip()][-1]
  with open(os.path.join(workdir, 'config.json')) as f:
    executor = json.load(f)['executor']
  return {'wall_seconds': seconds, 'rounds': last['round'], 'test_accuracy': last['test_accuracy'],
          'epsilon': last['epsilon'], 'executor': executor}


def main(argv):
  if len(argv) > 1:
    raise ValueError(f'unexpected arguments: {argv[1:]}')
  unknown = sorted(set(_STEPS.value) - set(STEP_NAMES))
  if unknown:
    raise ValueError(f'--steps: unknown {unknown}')
  steps = {'conv_sweep': conv_sweep, 'pfl': pfl, 'scaling': scaling, 'masks': masks,
           'speedups': speedups, 'lstm_speedups': lstm_speedups, 'agreement': agreement,
           'paper_regime': paper_regime}
  os.environ[_PREALLOCATE] = 'false'  # before this process's backend starts (jax.devices)
  device = jax.devices()[0]
  out = _OUT.value or default_out(device)
  os.makedirs(out, exist_ok=True)
  print(f'== results under {out}', flush=True)
  summary = {'device': {'platform': device.platform, 'device_kind': device.device_kind,
                        'device_count': jax.device_count(), 'jax_version': jax.__version__},
             'smoke': _SMOKE.value,
             'started_utc': f'{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}',
             'load_before': [round(x, 2) for x in os.getloadavg()], 'step_seconds': {}, 'skipped': [],
             'failed': {}}
  budget = 0.0 if _SMOKE.value else _BUDGET.value  # a CI smoke run checks every step
  start = time.perf_counter()
  for name in _STEPS.value:
    if budget and time.perf_counter() - start >= budget:
      print(f'\n== {name}: skipped, {time.perf_counter() - start:.0f} s of the {budget:.0f} s budget '
            'spent', flush=True)
      summary['skipped'].append(name)
      continue
    step_start = time.perf_counter()
    try:
      summary[name] = steps[name](out, _SMOKE.value)
    except (subprocess.CalledProcessError, OSError, ValueError, RuntimeError) as e:
      # One step that fails (a dataset missing on the machine, a process out of memory) must not
      # cost the device time of the steps after it: recorded, and the run ends with an error.
      print(f'\n== {name} failed: {type(e).__name__}: {e}', flush=True)
      summary['failed'][name] = f'{type(e).__name__}: {e}'[:1000]
    summary['step_seconds'][name] = time.perf_counter() - step_start
    summary['total_seconds'] = time.perf_counter() - start
    _write(out, 'summary.json', summary)  # after every step: a run cut short keeps what it finished
  _write(out, 'summary.json', summary)
  print(f"\n== {device.device_kind} ({device.platform}), jax {jax.__version__}"
        + (' -- smoke sizes' if _SMOKE.value else ''))
  if 'scaling' in summary:
    for r in summary['scaling']['rows']:
      print(f"cohort {r['clients']}, {r['model']} {r['mode']}: " + (
          f"{r['seconds_per_client']:.4f} s a client, {r['peak_memory_bytes'] / 2**30:.1f} GiB"
          if r['status'] == 'ok' else r['status']))
    for model, wins in summary['scaling']['vmap_wins'].items():
      print(f'vmap beats the loop, {model}: ' + ', '.join(
          f"{w['clients']} clients ({w['mode']}, {w['speedup']:.2f}x)" for w in wins))
  if 'speedups' in summary:
    print('vmap over sequential: ' + ', '.join(f'{c} clients {s:.2f}x'
                                               for c, s in summary['speedups'].items()))
  if 'lstm_speedups' in summary:
    print('vmap over sequential, char_lstm: ' + ', '.join(
        f'{c} clients {s:.2f}x' for c, s in summary['lstm_speedups'].items()))
  if 'conv_sweep' in summary:
    s = summary['conv_sweep']
    for cohort, lines in s.get('vmap_over_best_sequential', {}).items():
      print(f'conv sweep, vmap over the best sequential line, {cohort} clients: '
            + ', '.join(f'{impl} {x:.2f}x' for impl, x in lines.items()))
    print(f"conv sweep: {s.get('goal')}: {s.get('goal_met')}; auto's lowering measured fastest "
          f"{s.get('auto_conv_impl_supported')}, now {s.get('auto_conv_impl_now')}")
  if 'pfl' in summary:
    low, high = summary['pfl']['pfl_research']['derived_client_updates_per_second']
    for method, r in summary['pfl']['results'].items():
      print(f"pfl-research's CIFAR-10 setup, {method} ({r['executor']}): {r['setup_minutes']:.2f} min"
            f"{' (projected from ' + str(r['rounds']) + ' rounds)' if r['setup_minutes_projected'] else ''}"
            f", {r['client_updates_per_second']:.0f} client updates/s (pfl-research: {low}-{high}/s on "
            'one A100, derived)')
  if 'agreement' in summary:
    a = summary['agreement']
    print('executors agree (metrics within {:g}, model step within {:g}): {} -- {}'.format(
        a['metric_rtol'], a['step_rtol'], a['agree'],
        ', '.join(f'{k} {v:.1e}' for k, v in a['relative_differences'].items())))
  if 'masks' in summary:
    print('radix select over top_k (time of top_k / time of the radix select): ' + ', '.join(
        f'{line} {x:.2f}x' for line, x in summary['masks'].items()))
  if 'paper_regime' in summary:
    p = summary['paper_regime']
    print(f"paper regime: {p['rounds']} rounds in {p['wall_seconds']:.0f} s ({p['executor']}), "
          f"accuracy {100 * p['test_accuracy']:.1f} %, eps {p['epsilon']:.3f}")
  if 'agreement' in summary and not summary['agreement']['agree']:
    raise SystemExit('error: the executors disagree beyond the bound (agreement.json)')
  if summary['failed']:
    raise SystemExit(f"error: steps {sorted(summary['failed'])} failed (summary.json)")


if __name__ == '__main__':
  cli.run(main)
