r"""Populations of any size: seconds per round and memory against the number of clients N.

    python -m benchmarks.population --num_clients=1000,10000,100000,1000000 \
        --out=benchmarks/results/cpu-2core-epyc-quiet/population

Each N runs in a process of its own (its peak RSS is its own): a synthetic population whose client
sizes are log-normal (mean `--mean_examples`, sigma `--size_sigma`; at least 1 training example),
4x4x2 uint8 images (32 bytes) with 4 classes, 10 % of each client's examples (rounded half-up) held
out for testing, an expected cohort of `--cohort` clients (Poisson, q = cohort / N, drawn by
`--poisson_draw`: 'gaps' by default, O(cohort) random numbers a round, not one per client), DP2-FedSAM
(personal heads for every client: N x the head's parameters) on the `mlp` model, a local budget of
`--max_examples` examples per client (a larger client's random subset drawn by `--subset_draw`:
'floyd' by default, O(max_examples) work per client, not O(largest client)) and an evaluation of a
fixed sample of `--eval_clients`.

Records num_clients, total_examples, data_bytes (the ragged arrays), padded_data_bytes (what the
stacked [N, max, ...] layout needed), peak_rss_mib, setup_seconds (data + state), compile_seconds,
seconds_per_round (median over the rounds after the first, compiled ahead), eval_seconds.
Writes `<out>/population.json` and `<out>/population.png`.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags
import numpy as np

from dp2fedsam_jax import cli

_NUM_CLIENTS = flags.DEFINE_list('num_clients', ['1000', '10000', '100000', '1000000'],
                                 'Population sizes, each in its own process.')
_MEAN = flags.DEFINE_float('mean_examples', 20.0, 'Mean examples per client (log-normal).')
_SIGMA = flags.DEFINE_float('size_sigma', 1.0, 'Sigma of log(client size).')
_COHORT = flags.DEFINE_integer('cohort', 100, 'Expected clients per round (q = cohort / N).')
_MAX_EXAMPLES = flags.DEFINE_integer('max_examples', 64, 'config.local.max_examples.')
_EVAL_CLIENTS = flags.DEFINE_integer('eval_clients', 1000, 'config.eval_clients.')
_ROUNDS = flags.DEFINE_integer('rounds', 6, 'Rounds timed (the first is dropped from the median).')
_POISSON_DRAW = flags.DEFINE_enum('poisson_draw', 'gaps', ['gaps', 'per_client'],
                                  'config.dp.poisson_draw: how the Poisson cohort is drawn.')
_SUBSET_DRAW = flags.DEFINE_enum('subset_draw', 'floyd', ['floyd', 'argsort'],
                                 'config.local.subset_draw: how a client over the budget picks.')
_OUT = flags.DEFINE_string('out', None, 'Directory for population.json and .png.')
_ONE = flags.DEFINE_integer('one', None, 'Internal: run a single N and write --json_out.')
_JSON_OUT = flags.DEFINE_string('json_out', None, 'Internal: where --one writes its record.')

SHAPE, CLASSES = (4, 4, 2), 4


def client_sizes(num_clients: int, mean: float, sigma: float, rng) -> np.ndarray:
  """Log-normal sizes with the given mean (mu = log(mean) - sigma^2 / 2), each >= 2 (1 train)."""
  sizes = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, num_clients)
  return np.maximum(np.rint(sizes), 2).astype(np.int64)


def synthetic_population(num_clients: int, mean: float, sigma: float, seed: int = 0):
  from dp2fedsam_jax.data import from_flat_arrays  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  sizes = client_sizes(num_clients, mean, sigma, rng)
  test = np.floor(0.1 * sizes + 0.5).astype(np.int64)
  train = sizes - test

  def split(counts):
    total = int(counts.sum())
    return (rng.integers(0, 256, (total, *SHAPE), dtype=np.uint8),
            rng.integers(0, CLASSES, total).astype(np.int32), np.r_[0, np.cumsum(counts)])

  (tx, ty, to), (ex, ey, eo) = split(train), split(test)
  return from_flat_arrays(train_x=tx, train_y=ty, train_offsets=to, test_x=ex, test_y=ey,
                          test_offsets=eo, num_classes=CLASSES, mean=(0.5,) * SHAPE[-1],
                          std=(0.25,) * SHAPE[-1])


def run_one(num_clients: int) -> dict:
  """Builds and times one population (in this process)."""
  # pylint: disable=import-outside-toplevel
  import jax
  from dp2fedsam_jax.algorithms import get_method
  from dp2fedsam_jax.config import base_config
  from dp2fedsam_jax.data import padded_bytes
  from dp2fedsam_jax.evaluation import eval_client_ids, make_evaluate
  from dp2fedsam_jax.local import LocalConfig
  from dp2fedsam_jax.models import get_model
  from dp2fedsam_jax.privacy.mechanism import DPMechanism
  from dp2fedsam_jax.federated_round import make_round_step, round_config_from
  from dp2fedsam_jax.state import init_state

  c = base_config()
  c.method, c.model, c.num_clients, c.executor = 'dp2fedsam', 'mlp', num_clients, 'sequential'
  c.sampling_rate = min(1.0, _COHORT.value / num_clients)
  c.local.personal_epochs = c.local.shared_epochs = 1
  c.local.max_examples, c.eval_clients = _MAX_EXAMPLES.value, _EVAL_CLIENTS.value
  c.local.subset_draw = _SUBSET_DRAW.value
  c.dp.noise_multiplier, c.dp.poisson_draw = 1.0, _POISSON_DRAW.value
  spec = get_method(c.method)

  start = time.perf_counter()
  data = synthetic_population(num_clients, _MEAN.value, _SIGMA.value)
  model = get_model(c.model, CLASSES, SHAPE, hidden=16)
  state = init_state(spec, model, jax.random.key(0), num_clients)
  jax.block_until_ready((data, state))
  setup = time.perf_counter() - start

  local_config = LocalConfig.from_config(c)
  rc = round_config_from(c, DPMechanism.from_config(c, num_clients, spec))
  root = jax.random.key(1)
  start = time.perf_counter()
  step = jax.jit(make_round_step(spec, model, local_config, rc), donate_argnums=0)
  step = step.lower(state, data, root).compile()
  evaluate = jax.jit(make_evaluate(spec, model, local_config, client_ids=eval_client_ids(
      num_clients, c.eval_clients, c.seed)))
  evaluate = evaluate.lower(state, data, root).compile()
  compile_seconds = time.perf_counter() - start

  times, cohorts = [], []
  for _ in range(_ROUNDS.value):
    start = time.perf_counter()
    state, metrics = step(state, data, root)
    cohorts.append(int(jax.device_get(metrics['cohort_size'])))
    times.append(time.perf_counter() - start)
  start = time.perf_counter()
  accuracy = float(jax.device_get(evaluate(state, data, root)['test_accuracy']))
  eval_seconds = time.perf_counter() - start

  example = int(np.prod(SHAPE)) + 4  # image + int32 label
  counts = np.diff(np.asarray(data.train_offsets))
  return {
      'num_clients': num_clients, 'total_examples': data.total_examples,
      'data_bytes': data.nbytes,
      'padded_data_bytes': (padded_bytes(data.train_offsets, example)[0]
                            + padded_bytes(data.test_offsets, example)[0]),
      'max_client_train': int(counts.max()), 'median_client_train': float(np.median(counts)),
      'clients_over_budget': int(np.sum(counts > _MAX_EXAMPLES.value)),
      'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      'setup_seconds': setup, 'compile_seconds': compile_seconds,
      'seconds_per_round': statistics.median(times[1:]) if len(times) > 1 else times[0],
      'round_seconds': times, 'cohort_sizes': cohorts,
      'eval_seconds': eval_seconds, 'eval_clients': _EVAL_CLIENTS.value, 'test_accuracy': accuracy,
      'method': c.method, 'model': 'mlp(hidden=16)', 'max_examples': _MAX_EXAMPLES.value,
      'mean_examples': _MEAN.value, 'size_sigma': _SIGMA.value, 'expected_cohort': _COHORT.value,
      'executor': c.executor, 'poisson_draw': c.dp.poisson_draw,
      'subset_draw': c.local.subset_draw, 'jax': jax.__version__,
  }


def plot(records: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  n = [r['num_clients'] for r in records]
  fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
  a.plot(n, [r['seconds_per_round'] for r in records], 'o-', label='median')
  a.plot(n, [min(r['round_seconds'][1:] or r['round_seconds']) for r in records], 's--', label='min')
  a.legend()
  a.set(xscale='log', xlabel='clients N', ylabel='s / round (median)',
        title=f'expected cohort {records[0]["expected_cohort"]}')
  a.set_ylim(bottom=0)
  b.plot(n, [r['peak_rss_mib'] for r in records], 'o-', label='peak RSS')
  b.plot(n, [r['data_bytes'] / 2**20 for r in records], 's-', label='ragged data')
  b.plot(n, [r['padded_data_bytes'] / 2**20 for r in records], 'x--', label='padded [N, max] data')
  b.set(xscale='log', yscale='log', xlabel='clients N', ylabel='MiB', title='memory')
  b.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def main(argv):
  del argv
  if _ONE.value is not None:
    with open(_JSON_OUT.value, 'w') as f:
      json.dump(run_one(_ONE.value), f)
    return
  records = []
  passthrough = [f'--mean_examples={_MEAN.value}', f'--size_sigma={_SIGMA.value}',
                 f'--cohort={_COHORT.value}', f'--max_examples={_MAX_EXAMPLES.value}',
                 f'--eval_clients={_EVAL_CLIENTS.value}', f'--rounds={_ROUNDS.value}',
                 f'--poisson_draw={_POISSON_DRAW.value}', f'--subset_draw={_SUBSET_DRAW.value}']
  for n in (int(v) for v in _NUM_CLIENTS.value):
    with tempfile.TemporaryDirectory() as tmp:
      out = os.path.join(tmp, 'one.json')
      subprocess.run([sys.executable, '-m', 'benchmarks.population', f'--one={n}',
                      f'--json_out={out}', *passthrough], check=True)
      with open(out) as f:
        records.append(json.load(f))
    r = records[-1]
    print(f'N={n:>8d}  examples={r["total_examples"]:>9d}  data={r["data_bytes"] / 2**20:8.1f} MiB '
          f'(padded {r["padded_data_bytes"] / 2**20:9.1f})  rss={r["peak_rss_mib"]:7.0f} MiB  '
          f'setup={r["setup_seconds"]:6.1f} s  {r["seconds_per_round"]:.3f} s/round  '
          f'eval={r["eval_seconds"]:.2f} s', flush=True)
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    with open(os.path.join(_OUT.value, 'population.json'), 'w') as f:
      json.dump({'machine': f'{platform.machine()} {os.cpu_count()} cores', 'records': records}, f,
                indent=1)
    plot(records, os.path.join(_OUT.value, 'population.png'))


if __name__ == '__main__':
  cli.run(main)
