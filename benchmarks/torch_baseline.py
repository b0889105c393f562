"""A PyTorch CPU baseline of one DP²-FedSAM round: the same model (the CIFAR CNN or a char LSTM),
clients one after another.

Per client, as `dp2fedsam_jax.client` does it: features of the client's data computed once with the
received extractor; `personal_epochs` of SGD (momentum) on the personal head over cached features; then
`shared_epochs` of SAM on the extractor with the new head fixed (eps = rho g/||g|| on the same batch,
gradient at phi + eps, SGD step with momentum); Delta = phi_i - phi clipped to global L2 norm C.
The server adds N(0, sigma^2 C^2) to the sum and averages. Batches are real examples only (a partial
last batch is smaller), which is what a PyTorch user would write. The char LSTMs predict the next id
at every position (cross-entropy over all B x T targets, pad id 0 ignored).

Needs the [bench] extra (torch, CPU wheel).
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch
from torch import nn


class CifarCNN(nn.Module):
  """dp2fedsam_jax's cifar_cnn in PyTorch: 667,402 params at 10 classes."""

  def __init__(self, num_classes: int = 10):
    super().__init__()
    self.extractor = nn.Sequential(
        nn.Conv2d(3, 64, 3), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(64, 128, 3), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(128, 256, 3), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(), nn.Linear(256 * 2 * 2, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU())
    self.head = nn.Linear(128, num_classes)


class _LastOutput(nn.Module):
  """nn.LSTM's output sequence without its (h, c) state."""

  def __init__(self, lstm: nn.LSTM):
    super().__init__()
    self.lstm = lstm

  def forward(self, x):
    return self.lstm(x)[0]


class CharLSTM(nn.Module):
  """dp2fedsam_jax's char_lstm (hidden (256, 256)) / char_lstm_small ((128,)) in PyTorch.

  nn.LSTM keeps two bias vectors per layer (b_ih, b_hh) where flax keeps one: 4 * hidden more
  parameters per layer (822,570 vs 820,522 for char_lstm at 90 ids); the FLOPs are the same but for
  one vector add per gate.
  """

  def __init__(self, vocab: int = 90, hidden: tuple = (256, 256), embed_dim: int = 8):
    super().__init__()
    if len(set(hidden)) != 1:
      raise ValueError(f'hidden={hidden}: nn.LSTM stacks layers of one size')
    self.extractor = nn.Sequential(
        nn.Embedding(vocab, embed_dim),
        _LastOutput(nn.LSTM(embed_dim, hidden[0], num_layers=len(hidden), batch_first=True)))
    self.head = nn.Linear(hidden[-1], vocab)


MODELS = {'cifar_cnn': lambda vocab: CifarCNN(10),
          'char_lstm': lambda vocab: CharLSTM(vocab, (256, 256)),
          'char_lstm_small': lambda vocab: CharLSTM(vocab, (128,))}


def _token_loss(logits, y):
  """Mean cross-entropy over every target position but the pad id 0 ([B, T, V] vs [B, T])."""
  return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=0)


def _batches(n: int, batch_size: int, generator: torch.Generator):
  order = torch.randperm(n, generator=generator)
  return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def client_update(model: nn.Module, global_ext: dict, head_state: dict, x, y, *, batch_size: int,
                  personal_epochs: int, shared_epochs: int, lr_personal: float, lr_shared: float,
                  momentum: float, rho: float, generator: torch.Generator):
  """Returns (Delta as a list of tensors, the new head state dict)."""
  model.extractor.load_state_dict(global_ext)
  model.head.load_state_dict(head_state)
  loss_fn = _token_loss if y.dim() == 2 else nn.CrossEntropyLoss()
  with torch.no_grad():  # phi is fixed in the head phase: features once
    feats = model.extractor(x)
  opt = torch.optim.SGD(model.head.parameters(), lr=lr_personal, momentum=momentum)
  for _ in range(personal_epochs):
    for idx in _batches(len(x), batch_size, generator):
      opt.zero_grad()
      loss_fn(model.head(feats[idx]), y[idx]).backward()
      opt.step()

  params = list(model.extractor.parameters())
  for p in model.head.parameters():
    p.requires_grad_(False)
  opt = torch.optim.SGD(params, lr=lr_shared, momentum=momentum)
  for _ in range(shared_epochs):
    for idx in _batches(len(x), batch_size, generator):
      xb, yb = x[idx], y[idx]
      grads = torch.autograd.grad(loss_fn(model.head(model.extractor(xb)), yb), params)
      scale = rho / torch.sqrt(sum((g * g).sum() for g in grads)).clamp_min(1e-12)
      with torch.no_grad():
        eps = [g * scale for g in grads]
        for p, e in zip(params, eps):
          p.add_(e)
      opt.zero_grad()
      loss_fn(model.head(model.extractor(xb)), yb).backward()
      with torch.no_grad():
        for p, e in zip(params, eps):
          p.sub_(e)
      opt.step()
  for p in model.head.parameters():
    p.requires_grad_(True)
  with torch.no_grad():
    delta = [p.detach() - global_ext[k] for k, p in model.extractor.state_dict().items()]
  return delta, {k: v.clone() for k, v in model.head.state_dict().items()}


def run(cohort: int, samples_per_client: int, *, model: str = 'cifar_cnn', seq_len: int = 80,
        vocab: int = 90, batch_size: int = 10, personal_epochs: int = 2,
        shared_epochs: int = 2, rounds: int = 3, warmup: int = 1, threads: int | None = None,
        clip_norm: float = 0.1, noise_multiplier: float = 1.0, lr_personal: float = 0.005,
        lr_shared: float = 0.1, momentum: float = 0.7, rho: float = 0.1, seed: int = 0) -> dict:
  """Times `rounds` rounds (after `warmup`) of a cohort of `cohort` clients; returns a summary."""
  threads = threads or os.cpu_count()
  torch.set_num_threads(threads)
  torch.manual_seed(seed)
  rng = np.random.default_rng(seed)
  if model not in MODELS:
    raise ValueError(f'model={model!r}: the baseline has {sorted(MODELS)}')
  if model == 'cifar_cnn':  # synthetic CIFAR-shaped data, normalized like the JAX side's uint8 / 255
    pixels = rng.integers(0, 256, (cohort, samples_per_client, 3, 32, 32))
    xs = torch.from_numpy(pixels.astype(np.float32) / 255.0)
    ys = torch.from_numpy(rng.integers(0, 10, (cohort, samples_per_client)).astype(np.int64))
  else:  # token rows as the JAX side draws them: ids in [1, vocab), no pad
    shape = (cohort, samples_per_client, seq_len)
    xs = torch.from_numpy(rng.integers(1, vocab, shape).astype(np.int64))
    ys = torch.from_numpy(rng.integers(1, vocab, shape).astype(np.int64))
  model = MODELS[model](vocab)
  heads = [{k: v.clone() for k, v in model.head.state_dict().items()} for _ in range(cohort)]
  generator = torch.Generator().manual_seed(seed)
  times = []
  for r in range(warmup + rounds):
    start = time.perf_counter()
    global_ext = {k: v.clone() for k, v in model.extractor.state_dict().items()}
    total = [torch.zeros_like(v) for v in global_ext.values()]
    for i in range(cohort):
      delta, heads[i] = client_update(
          model, global_ext, heads[i], xs[i], ys[i], batch_size=batch_size,
          personal_epochs=personal_epochs, shared_epochs=shared_epochs, lr_personal=lr_personal,
          lr_shared=lr_shared, momentum=momentum, rho=rho, generator=generator)
      norm = torch.sqrt(sum((d * d).sum() for d in delta))
      factor = min(1.0, clip_norm / max(float(norm), 1e-12))
      for t, d in zip(total, delta):
        t.add_(d, alpha=factor)
    with torch.no_grad():
      new = {k: v + (t + torch.randn_like(t) * noise_multiplier * clip_norm) / cohort
             for (k, v), t in zip(global_ext.items(), total)}
    model.extractor.load_state_dict(new)
    if r >= warmup:
      times.append(time.perf_counter() - start)
  n_params = sum(p.numel() for p in model.parameters())
  return {'seconds_per_round': statistics.median(times), 'round_seconds': times,
          'threads': threads, 'num_params': n_params, 'torch_version': torch.__version__}
