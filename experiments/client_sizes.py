r"""How big the clients of a federation are: `python -m experiments.client_sizes --config=CONFIG --out=DIR`.

Builds the federation exactly as experiments.train does (config.dataset, partition, num_clients,
seed) and writes to --out:

  client_sizes.json   per split: clients, total examples, quantiles of examples per client, the
                      fraction of clients above the local budget (local.max_examples) and the
                      examples they leave out of a round, padded vs ragged bytes of the inputs (labels alike)
  client_sizes.png    histogram of training examples per client (log bins), the budget as a line

For Shakespeare an example is a row of 80 characters. Any config file and `--config.x=y` work:

  python -m experiments.client_sizes --config=experiments/configs/shakespeare.py \
      --out=experiments/results/shakespeare
"""

from __future__ import annotations

import json
import os

import numpy as np
from absl import flags
from ml_collections import config_flags

from dp2fedsam_jax import cli
from dp2fedsam_jax.data import make_federated_data, padded_bytes

FLAGS = flags.FLAGS
QUANTILES = (0, 10, 25, 50, 75, 90, 99, 100)


def split_summary(counts: np.ndarray, example_bytes: int, budget: int | None) -> dict:
  """Sizes of one split: `counts` holds each client's number of examples."""
  offsets = np.concatenate([[0], np.cumsum(counts)])
  padded, ragged = padded_bytes(offsets, example_bytes)
  above = counts > budget if budget is not None else np.zeros(counts.shape, bool)
  return {
      'clients': int(counts.size),
      'examples': int(counts.sum()),
      'clients_without_examples': int(np.sum(counts == 0)),
      'quantiles': {f'p{q}': float(np.percentile(counts, q)) for q in QUANTILES},
      'mean': float(counts.mean()),
      'budget': budget,
      'fraction_of_clients_above_budget': float(above.mean()),
      'fraction_of_examples_beyond_budget': (
          float(np.sum(np.maximum(counts - budget, 0)) / max(counts.sum(), 1))
          if budget is not None else 0.0),
      'padded_input_bytes': padded,
      'ragged_input_bytes': ragged,
  }


def summarize(config) -> dict:
  data = make_federated_data(
      dataset=config.dataset, num_clients=config.num_clients, partition=config.partition,
      classes_per_client=config.classes_per_client, dirichlet_alpha=config.dirichlet_alpha,
      seed=config.seed, data_dir=config.data_dir)
  example_bytes = int(np.prod(data.input_shape)) * data.train_x.dtype.itemsize
  budget = config.local.max_examples
  return {
      'dataset': config.dataset, 'partition': config.partition, 'num_clients': data.num_clients,
      'example_shape': list(data.input_shape),
      'train': split_summary(np.asarray(data.train_count), example_bytes, budget),
      'test': split_summary(np.asarray(data.test_count), example_bytes, None),
  }, np.asarray(data.train_count)


def plot(train_counts: np.ndarray, budget: int | None, title: str, path: str) -> None:
  import matplotlib  # the [report] extra
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  positive = train_counts[train_counts > 0]
  bins = np.unique(np.round(np.logspace(0, np.log10(positive.max() + 1), 30)).astype(int))
  fig, ax = plt.subplots(figsize=(6.4, 3.8))
  ax.hist(positive, bins=bins, color='tab:blue', edgecolor='white')
  ax.set_xscale('log')
  ax.set_xlabel('training examples per client (log scale)')
  ax.set_ylabel('clients')
  if budget is not None:
    share = np.mean(train_counts > budget)
    ax.axvline(budget, color='tab:red', linestyle='--',
               label=f'local.max_examples = {budget} ({share:.0%} of clients above)')
    ax.legend(loc='upper right', fontsize=8)
  ax.set_title(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  config = FLAGS.config
  summary, train_counts = summarize(config)
  os.makedirs(FLAGS.out, exist_ok=True)
  with open(os.path.join(FLAGS.out, 'client_sizes.json'), 'w') as f:
    json.dump(summary, f, indent=2, sort_keys=True)
  q = summary['train']['quantiles']
  title = (f"{config.dataset}: {summary['num_clients']} clients, {summary['train']['examples']} "
           f"training examples (median {q['p50']:.0f}, max {q['p100']:.0f})")
  plot(train_counts, config.local.max_examples, title, os.path.join(FLAGS.out, 'client_sizes.png'))
  print(json.dumps(summary, indent=2, sort_keys=True))


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', None, 'Config file (experiments/configs/*.py).',
                                  lock_config=True)
  flags.DEFINE_string('out', None, 'Directory for client_sizes.json and client_sizes.png.')
  flags.mark_flags_as_required(['config', 'out'])
  cli.run(main)
