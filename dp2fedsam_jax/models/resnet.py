"""ResNet feature extractors with GroupNorm (the papers' backbones), minus their last Dense layer.

GroupNorm, not BatchNorm: batch statistics are per-client state that DP federated training cannot
share (and that vmap over clients would mix); GroupNorm has the same affine params (scale, bias
per channel), so the parameter counts equal the BatchNorm models' trainable counts.

Convolutions go through `layers.Conv2D`, so `conv_impl` ('xla' | 'im2col') applies as for the CNNs.
Convolutions have no bias (each is followed by a norm), as in torchvision.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from dp2fedsam_jax.models.layers import Conv2D

# torchvision's conv init: kaiming normal, fan_out, ReLU gain.
_CONV_INIT = nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')


def _pads(k: int) -> tuple[tuple[int, int], tuple[int, int]]:
  """Symmetric padding k // 2 (torchvision's), not XLA 'SAME' (asymmetric at stride 2)."""
  return ((k // 2, k // 2), (k // 2, k // 2))


class BasicBlock(nn.Module):
  """Two 3x3 conv + GroupNorm; the residual path is identity or (shortcut 'B') 1x1 conv + norm,
  or (shortcut 'A') parameter-free: subsample by the stride and zero-pad the new channels."""
  features: int
  strides: int = 1
  shortcut: str = 'B'
  num_groups: int = 2
  conv_impl: str = 'xla'

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    conv = lambda f, k, s, name: Conv2D(f, (k, k), strides=(s, s), padding=_pads(k), use_bias=False,
                                        impl=self.conv_impl, kernel_init=_CONV_INIT, name=name)
    norm = lambda name: nn.GroupNorm(num_groups=self.num_groups, epsilon=1e-5, name=name)
    y = nn.relu(norm('norm1')(conv(self.features, 3, self.strides, 'conv1')(x)))
    y = norm('norm2')(conv(self.features, 3, 1, 'conv2')(y))
    residual = x
    if self.strides != 1 or x.shape[-1] != self.features:
      if self.shortcut == 'B':
        residual = norm('downsample_norm')(conv(self.features, 1, self.strides, 'downsample_conv')(x))
      elif self.shortcut == 'A':
        residual = x[:, ::self.strides, ::self.strides, :]
        extra = self.features - x.shape[-1]
        residual = jnp.pad(residual, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))
      else:
        raise ValueError(f"shortcut={self.shortcut!r} is unknown; choose 'A' or 'B'.")
    return nn.relu(y + residual)


class ResNet18Extractor(nn.Module):
  """torchvision's ResNet-18 layout with GroupNorm: features [B, 512].

  Stem 7x7/2 conv 64 + norm + ReLU + 3x3/2 max pool; stages [2, 2, 2, 2] of BasicBlocks with
  64/128/256/512 channels (stride 2 from the second stage on, 1x1 conv + norm downsample);
  global average pool. 11,181,642 params with a 10-class head.
  """
  num_groups: int = 2
  conv_impl: str = 'xla'
  stage_sizes: Sequence[int] = (2, 2, 2, 2)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = Conv2D(64, (7, 7), strides=(2, 2), padding=_pads(7), use_bias=False, impl=self.conv_impl,
               kernel_init=_CONV_INIT, name='conv_stem')(x)
    x = nn.relu(nn.GroupNorm(num_groups=self.num_groups, epsilon=1e-5, name='norm_stem')(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=_pads(3))
    for stage, (blocks, features) in enumerate(zip(self.stage_sizes, (64, 128, 256, 512))):
      for b in range(blocks):
        x = BasicBlock(features, strides=2 if stage > 0 and b == 0 else 1, shortcut='B',
                       num_groups=self.num_groups, conv_impl=self.conv_impl,
                       name=f'stage{stage + 1}_block{b}')(x)
    return jnp.mean(x, axis=(1, 2))


class ResNet20Extractor(nn.Module):
  """He et al.'s CIFAR ResNet-20 with GroupNorm: features [B, 64].

  3x3 conv 16 + norm + ReLU; 3 stages x 3 BasicBlocks with 16/32/64 channels (stride 2 at the
  first block of stages 2 and 3); global average pool. The default shortcut is option A of the
  paper (parameter-free: subsample + zero channels), giving 269,722 params with a 10-class head;
  option 'B' (1x1 conv + norm) adds 2 x (conv + norm) params.
  """
  num_groups: int = 2
  shortcut: str = 'A'
  conv_impl: str = 'xla'

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = Conv2D(16, (3, 3), padding=_pads(3), use_bias=False, impl=self.conv_impl,
               kernel_init=_CONV_INIT, name='conv_stem')(x)
    x = nn.relu(nn.GroupNorm(num_groups=self.num_groups, epsilon=1e-5, name='norm_stem')(x))
    for stage, features in enumerate((16, 32, 64)):
      for b in range(3):
        x = BasicBlock(features, strides=2 if stage > 0 and b == 0 else 1, shortcut=self.shortcut,
                       num_groups=self.num_groups, conv_impl=self.conv_impl,
                       name=f'stage{stage + 1}_block{b}')(x)
    return jnp.mean(x, axis=(1, 2))
