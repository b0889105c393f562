"""Convolution and pooling layers with a selectable lowering.

`Conv2D` has exactly the parameters of `flax.linen.Conv` ('kernel' HWIO, 'bias'), so
params and checkpoints are interchangeable between lowerings and with `nn.Conv`.

Why several lowerings (docs/performance.md): under `jax.vmap` with per-client kernels,
`lax.conv_general_dilated` becomes a grouped convolution, which XLA:CPU runs slowly
(CIFAR CNN, 8 clients x batch 10, loss+grad: ~0.8 s vs ~0.2 s for im2col on the 2-core
dev box); its backward pass is slow on CPU even without vmap. im2col (patches, then one
matmul) stays a (batched) matmul under vmap. For large forward-only batches (eval)
'xla' was ~2x faster on CPU; params are shared, so a second model can be used there.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

CONV_IMPLS = ('auto', 'im2col', 'xla')
_DIMS = ('NHWC', 'HWIO', 'NHWC')
_LOWERINGS = ('xla', 'im2col')


# What conv_impl='auto' lowers to, per backend: the one place this choice is made.
# cpu -> im2col: measured 17-18x faster than 'xla' on the 2-core EPYC (CIFAR CNN, cohort 5, vmap and
#   sequential; benchmarks/README.md, "Convolution lowering").
# gpu, tpu -> xla: not measured against im2col yet. The one GPU run (H200, 2026-11-26,
#   benchmarks/results/gpu-h200/speedups.json) timed 'xla' only; benchmarks/conv_sweep.py (a step of
#   benchmarks/accelerator.sh) times both, and this table changes only from its results.
AUTO_CONV_IMPL = {'cpu': 'im2col', 'gpu': 'xla', 'tpu': 'xla'}


def resolve_conv_impl(conv_impl: str, backend: str | None = None) -> str:
  """Maps 'auto' to the lowering of AUTO_CONV_IMPL for `backend` (default: JAX's default backend)."""
  if conv_impl not in CONV_IMPLS:
    raise ValueError(
        f'config.conv_impl={conv_impl!r} is unknown; choose one of {sorted(CONV_IMPLS)}')
  if conv_impl == 'auto':
    # A backend outside the table (a plugin) gets the native convolution.
    return AUTO_CONV_IMPL.get(backend or jax.default_backend(), 'xla')
  return conv_impl


def _pair(v) -> tuple[int, int]:
  if isinstance(v, int):
    return (v, v)
  v = tuple(int(a) for a in v)
  if len(v) != 2:
    raise ValueError(f'expected an int or a pair, got {v!r}')
  return v


def _explicit_pads(in_hw, kernel_hw, strides, padding) -> list[tuple[int, int]]:
  if isinstance(padding, str):
    if padding.upper() not in ('VALID', 'SAME'):
      raise ValueError(f"padding must be 'VALID', 'SAME' or pairs, got {padding!r}")
    return list(lax.padtype_to_pads(in_hw, kernel_hw, strides, padding.upper()))
  pads = [tuple(int(a) for a in p) for p in padding]
  if len(pads) != 2 or any(len(p) != 2 for p in pads):
    raise ValueError(f'explicit padding must be two (lo, hi) pairs, got {padding!r}')
  return pads


def im2col_patches(x: jax.Array, kernel_hw, strides=(1, 1), padding='VALID') -> jax.Array:
  """[B, H, W, C] -> [B, H', W', kh*kw*C], features ordered (kh, kw, C).

  Built from kh*kw strided slices: that order matches `kernel.reshape(kh*kw*C, O)` for
  an HWIO kernel, and the backward pass is pads and adds. On XLA:CPU this was 2-3x
  faster (forward+backward) than `lax.conv_general_dilated_patches`, which is itself a
  grouped convolution.
  """
  kh, kw = kernel_hw
  sh, sw = strides
  (plh, phh), (plw, phw) = _explicit_pads(x.shape[1:3], (kh, kw), strides, padding)
  if plh or phh or plw or phw:
    x = jnp.pad(x, ((0, 0), (plh, phh), (plw, phw), (0, 0)))
  h, w = x.shape[1], x.shape[2]
  oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
  if oh < 1 or ow < 1:
    raise ValueError(f'input {x.shape} (padded) is smaller than the {kh}x{kw} kernel')
  cols = [
      lax.slice(x, (0, i, j, 0),
                (x.shape[0], i + (oh - 1) * sh + 1, j + (ow - 1) * sw + 1, x.shape[3]),
                (1, sh, sw, 1))
      for i in range(kh) for j in range(kw)
  ]
  return cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)


def conv2d(x: jax.Array, kernel: jax.Array, strides=(1, 1), padding='VALID',
           impl: str = 'xla', precision: Any = None) -> jax.Array:
  """NHWC x HWIO convolution without bias, lowered as `impl` says."""
  impl = resolve_conv_impl(impl) if impl == 'auto' else impl
  if impl not in _LOWERINGS:
    raise ValueError(f'conv impl {impl!r} is unknown; choose one of {sorted(CONV_IMPLS)}')
  strides = _pair(strides)
  kh, kw = kernel.shape[:2]
  pads = tuple(_explicit_pads(x.shape[1:3], (kh, kw), strides, padding))
  if any(n + lo + hi < k for n, (lo, hi), k in zip(x.shape[1:3], pads, (kh, kw))):
    raise ValueError(f'input {x.shape} (padded {pads}) is smaller than the {kh}x{kw} kernel')
  return _conv2d(x, kernel, strides, pads, impl, precision)


# Jitted so that eager calls (init, notebooks) compile one program per layer instead of
# one per slice; under an outer jit this is inlined.
@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _conv2d(x, kernel, strides, pads, impl, precision):
  kh, kw, cin, cout = kernel.shape
  if impl == 'xla':
    return lax.conv_general_dilated(x, kernel, strides, pads, dimension_numbers=_DIMS,
                                    precision=precision)
  if impl == 'im2col':
    patches = im2col_patches(x, (kh, kw), strides, pads)
    b, oh, ow, k = patches.shape
    # An explicit 2-D matmul measured a few % faster than einsum over (b, h, w); under
    # vmap with per-client kernels it becomes one batched matmul.
    y = jnp.dot(patches.reshape(b * oh * ow, k), kernel.reshape(k, cout), precision=precision)
    return y.reshape(b, oh, ow, cout)
  raise AssertionError(impl)


class Conv2D(nn.Module):
  """Drop-in for `nn.Conv` on NHWC inputs, with the same params and initialisers."""
  features: int
  kernel_size: int | Sequence[int] = (3, 3)
  strides: int | Sequence[int] = (1, 1)
  padding: str | Sequence[tuple[int, int]] = 'VALID'
  use_bias: bool = True
  impl: str = 'xla'
  precision: Any = None
  kernel_init: Any = nn.initializers.lecun_normal()
  bias_init: Any = nn.initializers.zeros_init()
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kh, kw = _pair(self.kernel_size)
    kernel = self.param('kernel', self.kernel_init, (kh, kw, x.shape[-1], self.features),
                        self.param_dtype)
    y = conv2d(x, kernel, self.strides, self.padding, self.impl, self.precision)
    if self.use_bias:
      bias = self.param('bias', self.bias_init, (self.features,), self.param_dtype)
      y = y + bias
    return y


POOL_IMPLS = ('reshape', 'reduce_window')


@functools.partial(jax.jit, static_argnums=1)
def max_pool_2x2(x: jax.Array, impl: str = 'reshape') -> jax.Array:
  """2x2 max pool, stride 2, VALID (odd trailing rows/cols are dropped).

  'reshape' (a max over a [B, H/2, 2, W/2, 2, C] view) has a plain elementwise backward;
  'reduce_window' (`nn.max_pool`) backpropagates through select_and_scatter, which is
  slow on XLA:CPU. They differ only in how a gradient is shared among exactly tied
  maxima (split evenly vs. all to one element).
  """
  if x.shape[1] < 2 or x.shape[2] < 2:
    raise ValueError(f'input {x.shape} is too small for a 2x2 max pool')
  if impl == 'reduce_window':
    return nn.max_pool(x, (2, 2), strides=(2, 2), padding='VALID')
  if impl != 'reshape':
    raise ValueError(f'pool impl {impl!r} is unknown; choose one of {list(POOL_IMPLS)}')
  b, h, w, c = x.shape
  h2, w2 = h // 2, w // 2
  if h != 2 * h2 or w != 2 * w2:
    x = x[:, :2 * h2, :2 * w2, :]
  return x.reshape(b, h2, 2, w2, 2, c).max(axis=(2, 4))
