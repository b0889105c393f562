r"""Your own dataset and partition, from your own file: striped images, clients of skewed sizes.

    python3 -m experiments.train --config=experiments/extending/own_dataset.py --workdir=/tmp/own_data

Importing this file registers the dataset `stripes` (`register_dataset`: a loader returning an
ArrayDataset) and the partition `size_skew` (`register_partition`: the clients' example indices);
`config.dataset` and `config.partition` then take them like built-ins. Only public names of
`dp2fedsam_jax` are used (docs/extending.md).
"""

import numpy as np

from dp2fedsam_jax import ArrayDataset, base_config, register_dataset, register_partition

SIDE, NUM_CLASSES = 12, 4
# Fixed normalisation constants (never measured on the examples): mid-grey, a broad spread.
MEAN, STD = (0.5,), (0.35,)


def _pattern(label: int) -> np.ndarray:
  """Class `label`'s clean image: horizontal, vertical or diagonal stripes, or a checkerboard."""
  rows, cols = np.indices((SIDE, SIDE))
  stripes = (rows // 2, cols // 2, (rows + cols) // 2, rows // 2 + cols // 2)[label]
  return np.where(stripes % 2 == 0, 230.0, 25.0)


def load_stripes(data_dir=None, split: str = 'train', num_examples: int = 600) -> ArrayDataset:
  """`num_examples` 12x12 grey images of 4 stripe patterns plus pixel noise; made in memory, so
  `data_dir` is unused. The two splits draw independent noise."""
  del data_dir
  rng = np.random.default_rng(0 if split == 'train' else 1)
  y = rng.permutation(np.arange(num_examples) % NUM_CLASSES).astype(np.int32)
  clean = np.stack([_pattern(label) for label in range(NUM_CLASSES)])[y]
  x = np.clip(clean + rng.normal(0.0, 60.0, clean.shape), 0, 255).astype(np.uint8)[..., None]
  return ArrayDataset(x=x, y=y, num_classes=NUM_CLASSES, mean=MEAN, std=STD)


def size_skew(dataset, num_clients: int, rng: np.random.Generator, **_) -> list[np.ndarray]:
  """Shuffled examples dealt in shares proportional to 1, 1/2, ..., 1/num_clients (Zipf sizes),
  each client at least 2 examples: labels stay mixed, sizes are far apart."""
  n = len(dataset.y)
  weights = 1.0 / np.arange(1, num_clients + 1)
  sizes = 2 + np.floor(weights / weights.sum() * (n - 2 * num_clients)).astype(int)
  order = rng.permutation(n)
  return np.split(order[:sizes.sum()], np.cumsum(sizes)[:-1])


register_dataset('stripes', load_stripes, shape=(NUM_CLASSES, (SIDE, SIDE, 1)),
                 description='12x12 stripe patterns of 4 classes plus noise (experiments/extending)')
register_partition('size_skew', size_skew,
                   description='mixed labels, Zipf client sizes 1, 1/2, ..., 1/N (experiments/extending)')


def get_config():
  """Three rounds of DP-FedAvg with an MLP on 8 clients of the stripes, skewed in size."""
  c = base_config()
  c.method, c.model = 'dp_fedavg', 'mlp'
  c.dataset, c.partition, c.num_clients = 'stripes', 'size_skew', 8
  c.sampling_rate, c.num_rounds, c.eval_every = 0.5, 3, 3
  c.local.update(shared_epochs=1, batch_size=16, lr_shared=0.05)
  c.dp.clip_norm, c.dp.noise_multiplier = 1.0, 1.0
  return c
