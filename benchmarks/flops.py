"""FLOPs of one client's local work, from XLA's cost analysis of the real client function.

XLA's cost analysis counts the body of a while loop (every `lax.scan`, `lax.map`, the round's chunk
loop) once, whatever its trip count, so the cost of a compiled round says little. Here the real
`make_client_update` is compiled with every loop of trip count 1 (one batch of data, at most one
epoch per phase), and the differences between such variants give the cost of one step of each
phase; the client's cost is then assembled from the step counts it really executes (padded steps
included: they are computed and masked, so the hardware does them).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from dp2fedsam_jax.client import make_client_update
from dp2fedsam_jax.models.layers import Conv2D
from dp2fedsam_jax.state import init_state


def cost_flops(fn, *args) -> float:
  """XLA's FLOP count of fn(*args), compiled for the CPU backend whatever the default one is.

  XLA:GPU's cost analysis leaves out convolutions that run as cuDNN calls: on the H200
  (results/gpu-h200/speedups.json) it gave 0.60 GFLOP for a CIFAR-CNN client that the CPU counts
  at 24.44 (98 % of its matmul FLOPs are convolutions), so its GFLOP/s were ~40x too low. The work
  of a client does not depend on where it runs, so it is counted where XLA counts all of it.
  """
  # Shapes only: an array already on the accelerator would pin the program there.
  args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if isinstance(a, jax.Array) else a,
                      args)
  try:
    cpu = jax.devices('cpu')[0]
  except RuntimeError:  # JAX_PLATFORMS without cpu: the default backend's count, as before
    cpu = None
  with jax.default_device(cpu):
    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older JAX: one dict per program
    analysis = analysis[0]
  return float(analysis.get('flops', 0.0))


@dataclasses.dataclass(frozen=True)
class ClientFlops:
  features: float    # the extractor's forward pass over the client's padded data, once (head phase)
  head_step: float   # one SGD step of the head on cached features
  body_step: float   # one step of the shared phase (SAM: two gradients)
  overhead: float    # the update Delta, once
  head_steps: int    # personal_epochs * steps per epoch
  body_steps: int

  @property
  def personal_phase(self) -> float:
    return self.features + self.head_steps * self.head_step

  @property
  def body_phase(self) -> float:
    return self.body_steps * self.body_step

  @property
  def total(self) -> float:
    return self.personal_phase + self.body_phase + self.overhead


def client_flops(spec, model, local_config, samples: int, normalize, target_mask=None) -> ClientFlops:
  """FLOPs one client executes in a round, for `samples` examples per client.

  Token models (int inputs [T]) have a target per position (y [batch, T]) and `target_mask` (the
  data's `loss_mask`); their recurrence is a `lax.scan` over T, counted once: see `sequence_flops`.
  """
  batch = local_config.batch_size
  steps_per_epoch = math.ceil(samples / batch)
  shape = model.input_shape
  state = jax.eval_shape(lambda k: init_state(spec, model, k, 1), jax.random.key(0))
  shared = state.shared
  personal = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), state.personal)
  x = jax.ShapeDtypeStruct((batch, *shape), jnp.uint8)
  tokens = model.input_dtype == 'int32'
  y = jax.ShapeDtypeStruct((batch, *shape) if tokens else (batch,), jnp.int32)
  mask_kwargs = {} if target_mask is None else {'target_mask': target_mask}
  count = jnp.int32(batch)

  def variant(personal_epochs: int, shared_epochs: int) -> float:
    lc = dataclasses.replace(local_config, personal_epochs=personal_epochs, shared_epochs=shared_epochs)
    update = make_client_update(spec, model, lc, normalize, **mask_kwargs)
    def run(*args):  # both outputs, or XLA drops the head phase as dead code
      result = update(*args, jnp.int32(0))
      return result.delta, result.personal
    return cost_flops(run, shared, personal, x, y, count, jax.random.key(0))

  base = variant(0, 0)
  body_step = variant(0, 1) - base if local_config.shared_epochs else 0.0
  features = head_step = 0.0
  if spec.personal_phase and local_config.personal_epochs:
    features_b = cost_flops(lambda p, a: model.features(p['extractor'], normalize(a)), shared, x)
    head_step = variant(1, 0) - base - features_b
    features = features_b * steps_per_epoch  # the padded data: steps_per_epoch * batch examples
  head_steps = local_config.personal_epochs * steps_per_epoch if spec.personal_phase else 0
  return ClientFlops(features, head_step, body_step, base, head_steps,
                     local_config.shared_epochs * steps_per_epoch)


def sequence_flops(count_at_length, seq_len: int) -> ClientFlops:
  """A recurrent model's client FLOPs at sequence length `seq_len`, from counts at lengths 2 and 3.

  XLA counts a scan body once, so the scan over time cannot be counted at length T directly, and a
  full unroll of T = 80 compiles for minutes. With `count_at_length(t)` the count of a model of
  length t unrolled t steps (one scan iteration: counted exactly), the cost of a step in the middle
  is F(3) - F(2) (per-position embedding, cells, head and loss), the rest (per-parameter optimizer and
  norm work) does not grow with T: F(T) = F(2) + (T - 2) (F(3) - F(2)). In the unrolled model XLA
  also simplifies the first steps' zero carry, which the scan executes, so the direct count of an
  unrolled T = 5 is 1-3 % above this (tests/test_benchmark.py); the scanned model runs full steps.
  """
  if seq_len < 2:
    return count_at_length(seq_len)
  two, three = count_at_length(2), count_at_length(3)
  affine = lambda a, b: a + (seq_len - 2) * (b - a)
  return ClientFlops(*(affine(getattr(two, f), getattr(three, f))
                       for f in ('features', 'head_step', 'body_step', 'overhead')),
                     head_steps=two.head_steps, body_steps=two.body_steps)


def layer_matmul_flops(model, batch: int = 1) -> dict[str, float]:
  """Forward multiply-add FLOPs (2 per MAC) per layer for `batch` examples, from the traced shapes.

  A training step costs about 3x this (forward, input gradient, weight gradient); the conv/dense
  split is what matters for where the time goes.
  """
  out: dict[str, float] = {}

  def record(next_fun, args, kwargs, context):
    y = next_fun(*args, **kwargs)
    module = context.module
    if context.method_name == '__call__' and isinstance(module, (Conv2D, nn.Dense)):
      kernel = module.variables['params']['kernel']  # HWIO or [in, out]: fan-in x out
      name = '/'.join(module.scope.path) or 'head'
      kind = 'conv' if isinstance(module, Conv2D) else 'dense'
      out[f'{kind}:{name}'] = 2.0 * math.prod(y.shape[:-1]) * math.prod(kernel.shape)
    return y

  params = jax.eval_shape(model.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((batch, *model.input_shape), model.input_dtype)
  with nn.intercept_methods(record):
    jax.eval_shape(model.apply, params, x)
  return out
