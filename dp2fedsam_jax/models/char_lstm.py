"""The character LSTM of the Shakespeare task (McMahan et al. 2017; TFF's and fedjax's reference model),
without its output layer: the extractor that DP²-FedSAM shares; the personal head is the Dense over the
vocabulary, applied at every time step (registry.py).

`char_lstm`: embedding 8, two LSTM layers of 256 -> 820,522 parameters with the head at 90 ids (fedjax's
`create_lstm_model` and google-research/federated's `create_recurrent_reference_model` give the same
count: Embed 720 + LSTM 271,360 + LSTM 525,312 + Dense 23,130). fedjax applies a tanh after each LSTM's
output; TFF's Keras model does not, and neither does this one. `char_lstm_small` (CPU runs): embedding
8, one LSTM of 128 -> 82,474 parameters.

Each layer is flax's `OptimizedLSTMCell` (the four gates as one matmul over the input and one over
the carry) scanned over time by `nn.RNN` (`lax.scan`): the fastest of the choices measured on CPU
(docs/datasets.md: scan vs unrolled, fused vs per-gate cells).
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

CELLS = ('optimized', 'lstm')


class CharLSTMExtractor(nn.Module):
  """int token ids [B, T] -> features [B, T, hidden[-1]] (the last LSTM's output at every step)."""
  vocab_size: int
  embed_dim: int = 8
  hidden: Sequence[int] = (256, 256)
  cell: str = 'optimized'  # 'optimized': fused gates (nn.OptimizedLSTMCell); 'lstm': nn.LSTMCell
  unroll: int = 1          # time steps per scan iteration (nn.RNN's unroll)

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    if self.cell not in CELLS:
      raise ValueError(f'cell={self.cell!r} is unknown; choose one of {list(CELLS)}.')
    x = nn.Embed(self.vocab_size, self.embed_dim, name='embed')(jnp.asarray(tokens, jnp.int32))
    cell_class = nn.OptimizedLSTMCell if self.cell == 'optimized' else nn.LSTMCell
    for i, features in enumerate(self.hidden):
      x = nn.RNN(cell_class(int(features), name=f'lstm{i}'), unroll=self.unroll)(x)
    return x
