"""Feature extractors: each model minus its last Dense layer (the personal head).

The papers' CNNs, plus emnist_cnn_fedavg (McMahan et al.'s, 1,663,370 params at 10 classes) and
emnist_cnn_tff (TFF's, without dropout).
"""

from __future__ import annotations

import flax.linen as nn
import jax

from dp2fedsam_jax.models.layers import Conv2D, max_pool_2x2


class CifarCNNExtractor(nn.Module):
  """The paper's CIFAR-10 CNN without its last layer: features [B, 128]."""
  conv_impl: str = 'xla'
  pool_impl: str = 'reshape'

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for i, f in enumerate((64, 128, 256)):
      x = Conv2D(f, (3, 3), padding='VALID', impl=self.conv_impl, name=f'conv{i}')(x)
      # ReLU after the pool: same values (ReLU is monotone) on 4x fewer elements.
      x = nn.relu(max_pool_2x2(x, self.pool_impl))
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(256, name='fc0')(x))
    return nn.relu(nn.Dense(128, name='fc1')(x))


class EmnistCNNExtractor(nn.Module):
  """Two 5x5 conv blocks and Dense 512: features [B, 512]."""
  conv_impl: str = 'xla'
  pool_impl: str = 'reshape'

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for i, f in enumerate((32, 64)):
      x = Conv2D(f, (5, 5), padding='VALID', impl=self.conv_impl, name=f'conv{i}')(x)
      # relu(pool(x)) == pool(relu(x)); pooling first is cheaper.
      x = nn.relu(max_pool_2x2(x, self.pool_impl))
    x = x.reshape(x.shape[0], -1)
    return nn.relu(nn.Dense(512, name='fc0')(x))


class MLPExtractor(nn.Module):
  """Flatten + one hidden ReLU layer: features [B, hidden]."""
  hidden: int = 64

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape(x.shape[0], -1)
    return nn.relu(nn.Dense(self.hidden, name='fc0')(x))


class ConvConvDenseExtractor(nn.Module):
  """Two conv layers (32, 64 filters), 2x2 max pool(s), one Dense + ReLU: the EMNIST CNN variants.

  pool='each' pools after every conv (relu(pool(x)) == pool(relu(x))); pool='last' only after the
  second conv, as in TFF's EMNIST conv model (here without its dropout: the engine draws no dropout
  keys, and a deterministic model keeps clients' updates a pure function of their data and key).
  """
  kernel_size: int = 5
  padding: str = 'VALID'
  pool: str = 'each'
  dense: int = 512
  conv_impl: str = 'xla'
  pool_impl: str = 'reshape'

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.pool not in ('each', 'last'):
      raise ValueError(f"pool={self.pool!r} is unknown; choose 'each' or 'last'.")
    k = (self.kernel_size, self.kernel_size)
    for i, f in enumerate((32, 64)):
      x = Conv2D(f, k, padding=self.padding, impl=self.conv_impl, name=f'conv{i}')(x)
      if self.pool == 'each' or i == 1:
        x = max_pool_2x2(x, self.pool_impl)
      x = nn.relu(x)
    x = x.reshape(x.shape[0], -1)
    return nn.relu(nn.Dense(self.dense, name='fc0')(x))
