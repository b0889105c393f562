"""Split models (shared extractor + personal head) and MODELS, the name -> model registry.

`get_model(name, num_classes, input_shape, conv_impl)`: image models cifar_cnn (667,402 params),
emnist_cnn, emnist_cnn_fedavg, emnist_cnn_tff, resnet18_gn, resnet20, mlp; token models
(input (T,) int ids, `SplitModel.input_dtype = 'int32'`) char_lstm, char_lstm_small.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from dp2fedsam_jax.models import char_lstm
from dp2fedsam_jax.models import cnn
from dp2fedsam_jax.models import resnet
from dp2fedsam_jax.models.layers import resolve_conv_impl
from dp2fedsam_jax.registries import RegistrationError, Registry


@dataclasses.dataclass(frozen=True)
class SplitModel:
  """A model as two linen modules, so extractor and head can be trained (and their
  params stacked, clipped, noised) separately, and features cached for head epochs.

  Params are the bare inner collections: {'extractor': {...}, 'head': {'kernel', 'bias'}}.
  """
  name: str
  # float32 images [B, H, W, C] -> features [B, F]; or int32 token ids [B, T] -> features [B, T, F]
  extractor: nn.Module
  head: nn.Module       # features [..., F] -> logits [..., num_classes]; a single nn.Dense (last axis)
  num_classes: int
  input_shape: tuple    # (H, W, C) for images, (T,) for token sequences
  conv_impl: str = 'xla'  # the resolved lowering, for logs; 'auto' never appears here
  input_dtype: str = 'float32'  # 'int32' for token models (the extractor embeds the ids)

  def init(self, key: jax.Array) -> dict:
    # One compiled program rather than op-by-op dispatch (slow for im2col's slices).
    return jax.jit(self._init)(key)

  def _init(self, key: jax.Array) -> dict:
    k_ext, k_head = jax.random.split(key)
    x = jnp.zeros((1, *self.input_shape), self.input_dtype)
    ext = self.extractor.init(k_ext, x)['params']
    feats = jax.eval_shape(self.extractor.apply, {'params': ext}, x)
    head = self.head.init(k_head, jnp.zeros(feats.shape, feats.dtype))['params']
    return {'extractor': ext, 'head': head}

  def features(self, extractor_params, x: jax.Array) -> jax.Array:
    return self.extractor.apply({'params': extractor_params}, x)

  def logits_from_features(self, head_params, features: jax.Array) -> jax.Array:
    return self.head.apply({'params': head_params}, features)

  def apply(self, params, x: jax.Array) -> jax.Array:
    return self.logits_from_features(params['head'], self.features(params['extractor'], x))

  def with_conv_impl(self, conv_impl: str) -> 'SplitModel':
    """The same model (same params) with another conv lowering, e.g. 'xla' for large
    forward-only batches on CPU, where it beat im2col."""
    impl = resolve_conv_impl(conv_impl)
    if 'conv_impl' not in {f.name for f in dataclasses.fields(self.extractor)}:
      return dataclasses.replace(self, conv_impl=impl)  # no convolutions to lower
    return dataclasses.replace(self, extractor=self.extractor.clone(conv_impl=impl),
                               conv_impl=impl)

  @property
  def feature_dim(self) -> int:
    x = jax.ShapeDtypeStruct((1, *self.input_shape), self.input_dtype)
    shapes = jax.eval_shape(self.extractor.init_with_output, jax.random.key(0), x)
    return int(shapes[0].shape[-1])


def count_params(tree: Any) -> int:
  """Number of scalars in a pytree of arrays (or ShapeDtypeStructs)."""
  return int(sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree)))


def _cifar_cnn(conv_impl: str, pool_impl: str = 'reshape') -> nn.Module:
  return cnn.CifarCNNExtractor(conv_impl=conv_impl, pool_impl=pool_impl)


def _emnist_cnn(conv_impl: str, pool_impl: str = 'reshape') -> nn.Module:
  return cnn.EmnistCNNExtractor(conv_impl=conv_impl, pool_impl=pool_impl)


def _emnist_cnn_fedavg(conv_impl: str, pool_impl: str = 'reshape') -> nn.Module:
  # McMahan et al. 2017's CNN: 5x5 SAME convs; 1,663,370 params at 10 classes, 1,690,046 at 62.
  return cnn.ConvConvDenseExtractor(kernel_size=5, padding='SAME', pool='each', dense=512,
                                    conv_impl=conv_impl, pool_impl=pool_impl)


def _emnist_cnn_tff(conv_impl: str, pool_impl: str = 'reshape') -> nn.Module:
  # TFF's EMNIST conv model without dropout: 3x3 VALID convs, one pool, Dense 128;
  # 1,206,590 params at 62 classes.
  return cnn.ConvConvDenseExtractor(kernel_size=3, padding='VALID', pool='last', dense=128,
                                    conv_impl=conv_impl, pool_impl=pool_impl)


def _pfl_cifar_cnn(conv_impl: str, pool_impl: str = 'reshape') -> nn.Module:
  # pfl-research's CIFAR-10 benchmark CNN (apple/pfl-research, benchmarks/model/pytorch/cnn.py,
  # simple_cnn; benchmarks/image_classification/configs/baseline.yaml): conv 32 3x3, conv 64 3x3
  # (VALID), one 2x2 max pool, Dense 128, head 10; 1,626,442 params on 32x32x3. The same layers as
  # TFF's EMNIST model (both are the Keras MNIST CNN); without its two dropouts (as there).
  return _emnist_cnn_tff(conv_impl, pool_impl)


def _resnet18_gn(conv_impl: str, num_groups: int = 2) -> nn.Module:
  return resnet.ResNet18Extractor(num_groups=num_groups, conv_impl=conv_impl)


def _resnet20(conv_impl: str, num_groups: int = 2, shortcut: str = 'A') -> nn.Module:
  return resnet.ResNet20Extractor(num_groups=num_groups, shortcut=shortcut, conv_impl=conv_impl)


def _mlp(conv_impl: str, hidden: int = 64) -> nn.Module:
  del conv_impl  # no convolutions
  return cnn.MLPExtractor(hidden=hidden)


def _char_lstm(vocab_size: int, hidden: tuple = (256, 256), embed_dim: int = 8, cell: str = 'fused',
               unroll: int = 1) -> nn.Module:
  # McMahan et al. 2017 / TFF / fedjax: 820,522 params at 90 ids (char_lstm.py).
  return char_lstm.CharLSTMExtractor(vocab_size=vocab_size, embed_dim=embed_dim, hidden=tuple(hidden),
                                     cell=cell, unroll=unroll)


def _char_lstm_small(vocab_size: int, hidden: tuple = (128,), **kwargs) -> nn.Module:
  # One LSTM of 128 for CPU runs: 82,474 params at 90 ids.
  return _char_lstm(vocab_size, hidden=hidden, **kwargs)


@dataclasses.dataclass(frozen=True)
class ModelBuilder:
  """How a registered model's feature extractor is built (the head, a Dense of num_classes, is added).

  `build(conv_impl, **model_kwargs)` for an image model (`conv_impl`: the resolved convolution
  lowering, 'xla' or 'im2col', for extractors built from models.Conv2D; others ignore it), or
  `build(vocab_size, **model_kwargs)` for a token model; it returns a flax module mapping float32
  images [B, H, W, C] to features [B, F] (token ids [B, T] to [B, T, F]).
  """
  build: Callable[..., nn.Module]
  input_kind: str = 'image'  # 'image' | 'tokens'
  # The input the benchmarks time it on (benchmarks/client_throughput.py); a run takes the dataset's.
  benchmark_input_shape: tuple = (28, 28, 1)

  def __post_init__(self):
    if self.input_kind not in INPUT_KINDS:
      raise RegistrationError(f'input_kind={self.input_kind!r}: choose one of {list(INPUT_KINDS)}.')
    if not callable(self.build):
      raise RegistrationError(f'build={self.build!r} is not callable.')


INPUT_KINDS = ('image', 'tokens')
# Every model, the package's and those a user's file registers (api.register_model).
MODELS: Registry[ModelBuilder] = Registry('model', 'model')
_CIFAR, _EMNIST = (32, 32, 3), (28, 28, 1)
for _name, _build, _shape, _about in (
    ('cifar_cnn', _cifar_cnn, _CIFAR, 'the papers\' CIFAR-10 CNN (3x3 convs of 64/128/256, Dense 256, 128)'),
    ('emnist_cnn', _emnist_cnn, _EMNIST, 'two 5x5 conv blocks (32, 64) and Dense 512'),
    ('emnist_cnn_fedavg', _emnist_cnn_fedavg, _EMNIST, "McMahan et al. 2017's CNN (5x5 SAME, Dense 512)"),
    ('emnist_cnn_tff', _emnist_cnn_tff, _EMNIST, "TFF's EMNIST CNN without dropout (3x3, Dense 128)"),
    ('mlp', _mlp, _EMNIST, 'one hidden layer of 64 (tests and smoke runs)'),
    ('pfl_cifar_cnn', _pfl_cifar_cnn, _CIFAR, "pfl-research's CIFAR-10 benchmark CNN"),
    ('resnet18_gn', _resnet18_gn, _CIFAR, 'ResNet-18 with GroupNorm'),
    ('resnet20', _resnet20, _CIFAR, 'ResNet-20 (CIFAR) with GroupNorm, shortcut A'),
):
  MODELS.register(_name, ModelBuilder(_build, 'image', _shape), description=_about)
# Token models: input (T,) int ids, vocabulary = num_classes (the builder gets it as vocab_size).
MODELS.register('char_lstm', ModelBuilder(_char_lstm, 'tokens', (80,)),
                description='two LSTMs of 256 over 8-dim character embeddings (Shakespeare)')
MODELS.register('char_lstm_small', ModelBuilder(_char_lstm_small, 'tokens', (80,)),
                description='one LSTM of 128 (Shakespeare on a CPU)')


def model_names() -> list[str]:
  return MODELS.names()


def is_token_model(name: str) -> bool:
  """Whether model `name` takes int token ids [B, T] (and gives logits [B, T, num_classes])."""
  return name in MODELS and MODELS[name].input_kind == 'tokens'


def get_model(name: str, num_classes: int, input_shape: tuple, conv_impl: str = 'auto',
              **model_kwargs) -> SplitModel:
  """Builds a SplitModel by name.

  model_kwargs go to the builder: `hidden` for 'mlp'; `pool_impl` ('reshape' or
  'reduce_window') for the CNNs; `num_groups` (GroupNorm, default 2) for the ResNets and
  `shortcut` ('A' default, or 'B') for 'resnet20'; `hidden` (LSTM sizes), `embed_dim`, `cell`
  ('fused' default | 'optimized' | 'lstm', the same parameters) and `unroll` for the char LSTMs,
  whose input_shape is (T,) and whose vocabulary is num_classes.
  """
  if is_token_model(name):
    return _get_token_model(name, num_classes, input_shape, **model_kwargs)
  builder = MODELS.lookup(name)
  impl = resolve_conv_impl(conv_impl)
  input_shape = tuple(int(d) for d in input_shape)
  if len(input_shape) != 3 or min(input_shape) < 1:
    raise ValueError(f'input_shape must be (H, W, C) with positive sizes, got {input_shape}')
  if int(num_classes) < 1:
    raise ValueError(f'num_classes must be positive, got {num_classes}')
  try:
    extractor = builder.build(impl, **model_kwargs)
  except TypeError as e:
    raise ValueError(f'bad keyword arguments for model {name!r}: {model_kwargs}') from e
  model = SplitModel(name=name, extractor=extractor, head=nn.Dense(int(num_classes)),
                     num_classes=int(num_classes), input_shape=input_shape, conv_impl=impl)
  # Catch inputs too small for the conv/pool stack here, not as a shape error later.
  try:
    f = model.feature_dim
  except Exception as e:  # noqa: BLE001 - re-raised with context
    raise ValueError(f'model {name!r} cannot take inputs of shape {input_shape}: {e}') from e
  if f < 1:
    raise ValueError(f'model {name!r} cannot take inputs of shape {input_shape}: no features left')
  return model


def _get_token_model(name: str, num_classes: int, input_shape: tuple, **model_kwargs) -> SplitModel:
  input_shape = tuple(int(d) for d in input_shape)
  if len(input_shape) != 1 or input_shape[0] < 1:
    raise ValueError(f'model {name!r} takes token sequences: input_shape must be (T,) with T >= 1, got '
                     f'{input_shape}; use it with a token dataset (config.dataset=shakespeare).')
  if int(num_classes) < 2:
    raise ValueError(f'num_classes (the vocabulary) must be >= 2 for {name!r}, got {num_classes}')
  try:
    extractor = MODELS[name].build(int(num_classes), **model_kwargs)
  except TypeError as e:
    raise ValueError(f'bad keyword arguments for model {name!r}: {model_kwargs}') from e
  return SplitModel(name=name, extractor=extractor, head=nn.Dense(int(num_classes)),
                    num_classes=int(num_classes), input_shape=input_shape, input_dtype='int32')
