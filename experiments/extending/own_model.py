r"""Your own model, from your own file: a tiny CNN on the synthetic images, trained with DP²-FedSAM.

    python3 -m experiments.train --config=experiments/extending/own_model.py --workdir=/tmp/own_model

Importing this file registers the model (`register_model`); the binary executes the file before it
reads `get_config()`, so `config.model='tiny_cnn'` is validated, listed (`--list`) and benchmarked
(`python3 -m benchmarks.client_throughput --extension=experiments/extending/own_model.py
--model=tiny_cnn`) like a built-in. Only public names of `dp2fedsam_jax` are used (docs/extending.md).
"""

import flax.linen as nn
import jax

from dp2fedsam_jax import base_config, register_model


class TinyCNN(nn.Module):
  """The feature extractor: one 3x3 conv of 8 filters, a 2x2 average pool, Dense 32: features [B, 32].

  The package adds the head (a Dense of the dataset's classes on these features); a method with a
  personal head keeps that head on each client and shares this extractor.
  """
  features: int = 32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = nn.relu(nn.Conv(8, (3, 3), name='conv')(x))
    x = nn.avg_pool(x, (2, 2), strides=(2, 2))
    return nn.relu(nn.Dense(self.features, name='fc')(x.reshape(x.shape[0], -1)))


def build_tiny_cnn(conv_impl: str, features: int = 32) -> nn.Module:
  """An image model's builder: the package passes its convolution lowering first."""
  del conv_impl  # flax's own nn.Conv; models built from the package's Conv2D would use it
  return TinyCNN(features=features)


register_model('tiny_cnn', build_tiny_cnn, benchmark_input_shape=(8, 8, 1),
               description='a 3x3 conv of 8, an average pool and Dense 32 (experiments/extending)')


def get_config():
  """Three rounds of DP²-FedSAM on 8 synthetic clients with the tiny CNN (seconds on a CPU)."""
  c = base_config()
  c.method, c.model = 'dp2fedsam', 'tiny_cnn'
  c.dataset, c.partition, c.num_clients = 'synthetic', 'iid', 8
  c.sampling_rate, c.num_rounds, c.eval_every = 0.5, 3, 3
  c.local.update(personal_epochs=1, shared_epochs=1, batch_size=16, lr_personal=0.05, lr_shared=0.05)
  c.dp.clip_norm, c.dp.noise_multiplier = 1.0, 1.0
  return c
