"""The character LSTM of the Shakespeare task (McMahan et al. 2017; TFF's and fedjax's reference model),
without its output layer: the extractor that DP²-FedSAM shares; the personal head is the Dense over the
vocabulary, applied at every time step (registry.py).

`char_lstm`: embedding 8, two LSTM layers of 256 -> 820,522 parameters with the head at 90 ids (fedjax's
`create_lstm_model` and google-research/federated's `create_recurrent_reference_model` give the same
count: Embed 720 + LSTM 271,360 + LSTM 525,312 + Dense 23,130). fedjax applies a tanh after each LSTM's
output; TFF's Keras model does not, and neither does this one. `char_lstm_small` (CPU runs): embedding
8, one LSTM of 128 -> 82,474 parameters.

Each layer is a `FusedLSTM` (cell 'fused', the default): the parameters of flax's `OptimizedLSTMCell`
(same names, shapes and initial values, so checkpoints load either way) computed as an LSTM kernel
would: the input projection of all time steps as one GEMM before the scan (for the first layer, of
the embedding table: (E @ Wi)[ids]), one [B, H] x [H, 4H] GEMM and the gate update per step, and a
custom backward pass whose reverse scan carries only dh, dc (one GEMM a step), with dWh one GEMM
over all steps after it. The same function and gradients as `OptimizedLSTMCell` under `nn.RNN` to
float32 rounding (tests/test_char_lstm.py). Cells 'optimized' and 'lstm' are flax's cells scanned by
`nn.RNN`; docs/datasets.md has the speed of each.
"""

from __future__ import annotations

import functools
from typing import Sequence

import flax.linen as nn
from flax.linen.recurrent import DenseParams
import jax
import jax.numpy as jnp

CELLS = ('fused', 'optimized', 'lstm')


def _forward(xs, wh, table=None, unroll=1, residuals=True):
  """The recurrence from zero state: xs [T, B, 4H] every step's input projection + bias (gates in
  (i, f, o, g) order), or with `table` [V, 4H] token ids [T, B] whose rows of the table are the
  projections (gathered step by step: no [T, B, 4H] array); wh [H, 4H]. Returns hs [T, B, H] and,
  with `residuals`, what the backward pass needs: every step's c_{t-1} and gate activations."""
  hidden = wh.shape[0]
  zeros = jnp.zeros(xs.shape[1:2] + (hidden,), wh.dtype)

  def step(carry, x):
    c_prev, h = carry
    z = (x if table is None else table[x]) + h @ wh
    act = jnp.concatenate([jax.nn.sigmoid(z[..., :3 * hidden]), jnp.tanh(z[..., 3 * hidden:])], -1)
    i, f, o, g = jnp.split(act, 4, axis=-1)
    c = f * c_prev + i * g
    h = o * jnp.tanh(c)
    return (c, h), (h, c_prev, act) if residuals else h

  _, ys = jax.lax.scan(step, (zeros, zeros), xs, unroll=unroll)
  return (ys[0], ys[1:]) if residuals else (ys, None)


def _backward(wh, hs, c_prevs, acts, dhs, unroll):
  """dz [T, B, 4H] (the cotangent of every step's pre-activations) and dWh. The reverse scan carries
  dh, dc: one [B, 4H] x [4H, H] GEMM a step; dWh is one GEMM over all steps after it (XLA's own
  transpose of the scan accumulates dWh and dWi inside the loop)."""
  zeros = jnp.zeros_like(hs[0])
  wh_t = wh.T

  def step(carry, inputs):
    dh_next, dc_next = carry
    dh_out, c_prev, act = inputs
    i, f, o, g = jnp.split(act, 4, axis=-1)
    tc = jnp.tanh(f * c_prev + i * g)
    dh = dh_out + dh_next
    dc = dc_next + dh * o * (1 - tc * tc)
    sig = act[..., :-g.shape[-1]]
    dsig = jnp.concatenate([dc * g, dc * c_prev, dh * tc], -1) * sig * (1 - sig)
    dz = jnp.concatenate([dsig, dc * i * (1 - g * g)], -1)
    return (dz @ wh_t, dc * f), dz

  _, dz = jax.lax.scan(step, (zeros, zeros), (dhs, c_prevs, acts), reverse=True, unroll=unroll)
  h_prev = jnp.concatenate([zeros[None], hs[:-1]])
  return dz, jnp.einsum('tbh,tbg->hg', h_prev, dz)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def lstm_recurrence(xproj, wh, unroll=1):
  """The LSTM over time from zero state, given every step's input projection: xproj [T, B, 4H]
  (gates (i, f, o, g)) -> hs [T, B, H]. `unroll`: time steps per scan iteration."""
  return _forward(xproj, wh, unroll=unroll, residuals=False)[0]


def _recurrence_fwd(xproj, wh, unroll):
  hs, res = _forward(xproj, wh, unroll=unroll)
  return hs, (wh, hs, res)


def _recurrence_bwd(unroll, saved, dhs):
  wh, hs, (c_prevs, acts) = saved
  return _backward(wh, hs, c_prevs, acts, dhs, unroll)


lstm_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def lstm_from_table(table, ids, wh, unroll=1):
  """`lstm_recurrence` of the projections table[ids]: table [V, 4H], ids [T, B] -> hs [T, B, H]."""
  return _forward(ids, wh, table, unroll, residuals=False)[0]


def _table_fwd(table, ids, wh, unroll):
  hs, res = _forward(ids, wh, table, unroll)
  return hs, (table, ids, wh, hs, res)


def _table_bwd(unroll, saved, dhs):
  table, ids, wh, hs, (c_prevs, acts) = saved
  dz, dwh = _backward(wh, hs, c_prevs, acts, dhs, unroll)
  dtable = jax.ops.segment_sum(dz.reshape(-1, dz.shape[-1]), ids.reshape(-1), table.shape[0])
  return dtable, None, dwh


lstm_from_table.defvjp(_table_fwd, _table_bwd)


class FusedLSTM(nn.Module):
  """One LSTM layer, time-major [T, B, in] -> [T, B, H] from zero state, with OptimizedLSTMCell's
  parameters ('ii', 'if', 'ig', 'io': kernels [in, H]; 'hi', 'hf', 'hg', 'ho': kernels [H, H] and
  biases). Called with `ids` [T, B], x is an embedding table [V, in] and the input projection is
  the table's (x @ Wi + b)[ids]: a [V, in] GEMM and a gather of B rows a step, not a [T*B, in] GEMM
  of the rows and its [T, B, 4H] result."""
  features: int
  unroll: int = 1  # time steps per scan iteration (1 is fastest on CPU; larger for FLOP counts)

  @nn.compact
  def __call__(self, x: jax.Array, ids: jax.Array | None = None) -> jax.Array:
    cell = nn.OptimizedLSTMCell(self.features, parent=None)  # its initialisers, not copies
    ki, kh, h = {}, {}, jnp.zeros((self.features,), x.dtype)  # h: the recurrent kernels' input size
    for gate in ('i', 'f', 'g', 'o'):
      ki[gate], _ = DenseParams(self.features, use_bias=False, kernel_init=cell.kernel_init,
                                bias_init=cell.bias_init, name=f'i{gate}')(x)
      kh[gate] = DenseParams(self.features, use_bias=True, kernel_init=cell.recurrent_kernel_init,
                             bias_init=cell.bias_init, name=f'h{gate}')(h)
    order = ('i', 'f', 'o', 'g')  # the three sigmoid gates, then the tanh candidate
    wi = jnp.concatenate([ki[k] for k in order], -1)
    wh = jnp.concatenate([kh[k][0] for k in order], -1)
    b = jnp.concatenate([kh[k][1] for k in order], -1)
    if ids is not None:  # the table's projections, gathered per step
      return lstm_from_table(x @ wi + b, ids, wh, self.unroll)
    return lstm_recurrence(x @ wi + b, wh, self.unroll)  # every step's projection at once


class CharLSTMExtractor(nn.Module):
  """int token ids [B, T] -> features [B, T, hidden[-1]] (the last LSTM's output at every step)."""
  vocab_size: int
  embed_dim: int = 8
  hidden: Sequence[int] = (256, 256)
  # 'fused': FusedLSTM; 'optimized': nn.OptimizedLSTMCell, 'lstm': nn.LSTMCell, scanned by nn.RNN
  cell: str = 'fused'
  unroll: int = 1          # time steps per scan iteration

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    if self.cell not in CELLS:
      raise ValueError(f'cell={self.cell!r} is unknown; choose one of {list(CELLS)}.')
    embed = nn.Embed(self.vocab_size, self.embed_dim, name='embed')
    tokens = jnp.asarray(tokens, jnp.int32)
    if tokens.ndim != 2:
      raise ValueError(f'tokens must be [B, T] ids, got shape {tokens.shape}')
    if self.cell == 'fused':  # time-major inside: the first layer projects the embedding table
      x = FusedLSTM(int(self.hidden[0]), self.unroll, name='lstm0')(embed.embedding, ids=tokens.T)
      for i, features in enumerate(self.hidden[1:], 1):
        x = FusedLSTM(int(features), self.unroll, name=f'lstm{i}')(x)
      return jnp.swapaxes(x, 0, 1)
    x = embed(tokens)
    for i, features in enumerate(self.hidden):
      cell_class = nn.OptimizedLSTMCell if self.cell == 'optimized' else nn.LSTMCell
      x = nn.RNN(cell_class(int(features), name=f'lstm{i}'), unroll=self.unroll)(x)
    return x
