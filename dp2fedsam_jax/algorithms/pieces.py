"""The pieces methods compose, one small object per choice a MethodSpec makes (algorithms/specs.py):

    regularizer    NoRegularizer | BLUR | AdaptiveNorm | Proximal   (the shared phase's penalty)
    weight_mask    NoWeightMask | DSUWeightMask                     (the forward pass's theta * M)
    personal       NoPersonal | OwnHead | HeadOffset                (what stays on the client)
    upload_mask    NoUploadMask | RandKMask | TopKMask | DSUUploadMask  (Delta * mask, before clipping)
    postprocess    NoPostprocess | TopKOfClientUpload | TopKOfNoisedSum (top-k of noised values)
    evaluation     TestGlobal | TestPersonal | FineTune | FineTuneHead  (the model each client tests:
                                                                    the method's test-time protocol)

    server_step    None (config.server_optimizer) | a server_optimizer.ServerStep  (line 25)

Each slot has a base class here (Regularizer, WeightMask, PersonalPart, UploadMask, Postprocess,
Evaluation; ServerStep in server_optimizer.py) that says what a piece of it must do. The engine
(client.py, federated_round.py, state.py, evaluation.py) calls their methods and never asks which
one it holds, so a new method is a row of these objects, and a new choice is one more subclass, here
or in a user's file (docs/extending.md).
A piece's own hyperparameters are its dataclass fields, with the paper's defaults; `config_fields` names the
config entry that overrides each (`configured(piece, config)`, called once by MethodSpec.bind): a
(field, 'dotted.path') pair for the built-ins, whose fields config.py defines, or a registries.Knob,
which brings its config field (default: the piece's) and range with it.
All functions are pure and see one client. `received` is the shared part the client got this round;
`trainable` is its current value; the local update is trainable - received.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from dp2fedsam_jax import trees
from dp2fedsam_jax.errors import ConfigError
from dp2fedsam_jax.privacy import sparsify
from dp2fedsam_jax.protocol import NO_ADAPTATION, Adaptation
from dp2fedsam_jax.registries import Knob


def knob_pairs(piece) -> list[tuple[str, str]]:
  """(piece field, config path) of each entry of the piece's `config_fields`."""
  return [(k.attribute, k.path) if isinstance(k, Knob) else tuple(k)
          for k in getattr(piece, 'config_fields', ())]


def configured(piece, config):
  """`piece` with each field of its `config_fields` read from `config`: the run's override of the
  paper default (e.g. BLUR's lam from config.blur_lambda)."""
  overrides = {field: functools.reduce(getattr, path.split('.'), config)
               for field, path in knob_pairs(piece)}
  return dataclasses.replace(piece, **overrides) if overrides else piece


# ------------------------------------------------------------------ the slots' base classes


class Regularizer(abc.ABC):
  """Added to the shared phase's loss: a penalty on the local update theta - theta_received."""
  name: ClassVar[str] = 'regularizer'

  def at_clip_norm(self, clip_norm) -> 'Regularizer':
    """This penalty against the round's clip norm C (traced under adaptive clipping)."""
    del clip_norm
    return self

  @abc.abstractmethod
  def __call__(self, trainable, received, mask=None) -> jax.Array:
    """The scalar penalty; `mask` is the method's weight mask (None: none)."""


class WeightMask(abc.ABC):
  """The forward pass's theta * M (DP-pFedDSU); every forward pass goes through `forward`."""
  name: ClassVar[str] = 'weight_mask'

  def for_model(self, method: str, model) -> 'WeightMask':
    """This mask bound to a model's layers (or a ConfigError naming what does not fit)."""
    del method, model
    return self

  @abc.abstractmethod
  def __call__(self, shared):
    """The 0/1 mask over `shared` (None: no mask)."""

  @abc.abstractmethod
  def forward(self, shared):
    """The shared params the forward pass uses."""


class PersonalPart(abc.ABC):
  """What stays on each client; the server aggregates `shared_keys` of {'extractor', 'head'}."""
  name: ClassVar[str] = 'personal'
  shared_keys: ClassVar[tuple[str, ...]] = ('extractor', 'head')

  @abc.abstractmethod
  def split(self, params: dict) -> tuple[dict, dict]:
    """{'extractor', 'head'} -> (shared part, a client's initial personal part)."""

  @abc.abstractmethod
  def model_params(self, shared: dict, personal: dict) -> dict:
    """A client's full model {'extractor', 'head'} from the shared and its personal part."""


class UploadMask(abc.ABC):
  """Multiplies a client's update before clipping. `private`: computed from the client's own data
  (noise only on it would leak it)."""
  name: ClassVar[str] = 'upload_mask'
  private: ClassVar[bool] = False

  def round_mask(self, key, shared):
    """A mask drawn once per round from a public key (None: none)."""
    del key, shared
    return None

  @abc.abstractmethod
  def client_mask(self, delta, own_mask, round_mask):
    """What the client multiplies its update with (None: no mask)."""


class Postprocess:
  """Applied to noised values: a client's own noised upload, and the noised sum (each the identity
  unless overridden). `on_client_noise`: it sparsifies the client's own noised share (needs
  distributed noise; epsilon does not cover it); `reads_noise`: it needs noise to act on."""
  name: ClassVar[str] = 'postprocess'
  on_client_noise: ClassVar[bool] = False
  reads_noise: ClassVar[bool] = False

  def client(self, upload):
    return upload

  def server(self, total):
    return total


class Evaluation(abc.ABC):
  """The model each client tests: the method's test-time protocol (protocol.py). `adapt_part` is
  what config.eval's adapt_part 'auto' trains ('none' | 'head' | 'full')."""
  name: ClassVar[str] = 'evaluation'
  adapt_part: ClassVar[str] = 'none'

  @abc.abstractmethod
  def adaptation(self, local_config) -> Adaptation:
    """What each client trains before testing (adaptation.py runs it, on copies)."""


def _norm(tree) -> jax.Array:
  # sqrt(x + tiny) keeps the gradient finite (zero) at a zero update, where the regularizers start.
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)) + 1e-24)


def _delta(trainable, received, mask=None):
  delta = jax.tree.map(jnp.subtract, trainable, received)
  return delta if mask is None else trees.apply_mask(delta, mask)


# ------------------------------------------------------------------ regularizers (shared phase)
# Each is added to the shared phase's loss on theta - theta_received. `at_clip_norm(clip_norm)` gives
# the penalty against the round's C (traced under adaptive clipping); lam is the piece's own field.


def _needed(clip_norm, regularizer):
  if clip_norm is None:
    raise ValueError(f'the {regularizer.name} regularizer penalises against the clip norm: pass the '
                     "round's C (make_client_update(..., clip_norm=mechanism.clip_norm)).")
  return clip_norm


@dataclasses.dataclass(frozen=True)
class NoRegularizer(Regularizer):
  lam: float = 0.0
  clip_norm: float = 0.0
  name = 'none'

  def at_clip_norm(self, clip_norm) -> 'NoRegularizer':
    del clip_norm
    return self

  def __call__(self, trainable, received, mask=None) -> jax.Array:
    del trainable, received, mask
    return jnp.zeros((), jnp.float32)


@dataclasses.dataclass(frozen=True)
class BLUR(Regularizer):
  """BLUR (Cheng et al., 2022): penalise only the part of ||Delta|| that clipping would cut off, so
  updates inside the ball are untouched and larger ones are pulled back to it."""
  lam: float = 1.0
  clip_norm: float = 0.0
  name = 'blur'
  config_fields = (('lam', 'blur_lambda'),)

  def at_clip_norm(self, clip_norm) -> 'BLUR':
    return dataclasses.replace(self, clip_norm=_needed(clip_norm, self))

  def __call__(self, trainable, received, mask=None) -> jax.Array:
    del mask
    excess = jax.nn.relu(_norm(_delta(trainable, received)) - self.clip_norm)
    return 0.5 * self.lam * jnp.square(excess)


@dataclasses.dataclass(frozen=True)
class AdaptiveNorm(Regularizer):
  """DP-pFedDSU eq. (10): (lam/2) | ||(theta - theta0) * M|| - C |."""
  lam: float = 0.2
  clip_norm: float = 0.0
  name = 'adaptive_norm'
  config_fields = (('lam', 'dsu.lam'),)

  def at_clip_norm(self, clip_norm) -> 'AdaptiveNorm':
    return dataclasses.replace(self, clip_norm=_needed(clip_norm, self))

  def __call__(self, trainable, received, mask=None) -> jax.Array:
    return 0.5 * self.lam * jnp.abs(_norm(_delta(trainable, received, mask)) - self.clip_norm)


@dataclasses.dataclass(frozen=True)
class Proximal(Regularizer):
  """Mean-regularized multi-task learning as the CENTAUR reference code writes it:
  lam ||theta - theta_mean||^2 (no 1/2)."""
  lam: float = 0.1
  clip_norm: float = 0.0
  name = 'proximal'
  config_fields = (('lam', 'pmtl_lambda'),)

  def at_clip_norm(self, clip_norm) -> 'Proximal':
    del clip_norm
    return self

  def __call__(self, trainable, received, mask=None) -> jax.Array:
    del mask
    return self.lam * jnp.square(_norm(_delta(trainable, received)))


def kernel_layer_paths(model) -> tuple[tuple[str, ...], ...]:
  """Paths (in the extractor's params) of the layers with a kernel, in forward-pass order.

  Found by intercepting module calls during an abstract forward pass, so it works for any flax
  extractor without a per-model list.
  """
  params = jax.eval_shape(lambda: model.init(jax.random.key(0)))['extractor']
  paths: list[tuple[str, ...]] = []

  def record(next_fun, args, kwargs, context):
    path = tuple(context.module.path)
    node = params
    for part in path:
      node = node.get(part, {}) if isinstance(node, dict) else {}
    if context.method_name == '__call__' and isinstance(node, dict) and 'kernel' in node:
      if path not in paths:
        paths.append(path)
    return next_fun(*args, **kwargs)

  x = jax.ShapeDtypeStruct((1, *model.input_shape), jnp.float32)
  with nn.intercept_methods(record):
    jax.eval_shape(model.features, params, x)
  return tuple(paths)


def dsu_mask(shared, layer_paths, masked_layers: int, keep_fraction: float):
  """DP-pFedDSU eqs. (6), (8): in the last `masked_layers` kernel layers of the extractor, keep the
  `keep_fraction` of largest-magnitude entries of each kernel; biases and every other layer are
  kept whole (TopKAST / DSU sparsify weights, not biases)."""
  masked = set(layer_paths[-masked_layers:]) if masked_layers > 0 else set()

  def build(tree, path):
    if isinstance(tree, dict):
      return {k: build(v, path + (k,)) for k, v in tree.items()}
    if path[:-1] in masked and path[-1] == 'kernel':
      return sparsify.leafwise_topk_mask(jax.lax.stop_gradient(tree), keep_fraction)
    return jnp.ones(tree.shape, jnp.float32)

  return {k: (build(v, ()) if k == 'extractor' else trees.ones_like(v)) for k, v in shared.items()}


# ------------------------------------------------------------------ forward-pass weight masks
# Every forward pass of a method with a weight mask goes through `forward(shared)`: the head phase,
# the shared phase, evaluation and fine-tuning all see the same network theta * M
# (dp-pfeddsu.txt eq. 7). `for_model` binds the mask to a model's layers.


@dataclasses.dataclass(frozen=True)
class NoWeightMask(WeightMask):
  name = 'none'

  def for_model(self, method: str, model) -> 'NoWeightMask':
    del method, model
    return self

  def __call__(self, shared):
    """The 0/1 mask over `shared` (None: no mask)."""
    del shared
    return None

  def forward(self, shared):
    return shared


@dataclasses.dataclass(frozen=True)
class DSUWeightMask(WeightMask):
  """DP-pFedDSU's theta * M, M from the current weights (the last kernel layers of the extractor)."""
  layer_paths: tuple = ()          # kernel layers of the extractor in forward order (for_model)
  masked_layers: int = 4           # the last k kernel layers of the extractor are masked
  keep_fraction: float = 0.05      # S: fraction of weights kept in each masked layer
  name = 'dsu'
  config_fields = (('masked_layers', 'dsu.masked_layers'), ('keep_fraction', 'dsu.keep_fraction'))

  def for_model(self, method: str, model) -> 'DSUWeightMask':
    if model.input_dtype != 'float32':
      # DSU masks whole conv/dense layers; an LSTM layer is eight gate kernels, and masking the last
      # few of them (one gate's) is not the paper's method.
      raise ConfigError(f'config.method={method!r} masks the last conv/dense layers (DP-pFedDSU); '
                        f'config.model={model.name!r} is recurrent: use an image model, or another method.')
    return dataclasses.replace(self, layer_paths=kernel_layer_paths(model))

  def __call__(self, shared):
    return dsu_mask(shared, self.layer_paths, self.masked_layers, self.keep_fraction)

  def forward(self, shared):
    return trees.apply_mask(shared, self(shared))


# ------------------------------------------------------------------ the personal part
# What stays on each client, what the server aggregates (`shared_keys` of the model's
# {'extractor', 'head'}), and how a client's model is put together from the two.


@dataclasses.dataclass(frozen=True)
class NoPersonal(PersonalPart):
  """One global model: everything is shared."""
  name = 'none'
  shared_keys = ('extractor', 'head')

  def split(self, params: dict) -> tuple[dict, dict]:
    return {k: params[k] for k in self.shared_keys}, {}

  def model_params(self, shared: dict, personal: dict) -> dict:
    return {**shared, **personal}


@dataclasses.dataclass(frozen=True)
class OwnHead(PersonalPart):
  """The extractor is shared; each client keeps its own head."""
  name = 'head'
  shared_keys = ('extractor',)

  def split(self, params: dict) -> tuple[dict, dict]:
    return {k: params[k] for k in self.shared_keys}, {'head': params['head']}

  def model_params(self, shared: dict, personal: dict) -> dict:
    return {**shared, **personal}


@dataclasses.dataclass(frozen=True)
class HeadOffset(PersonalPart):
  """PPSGD: the whole model is shared; each client adds its own correction to the head."""
  name = 'head_offset'
  shared_keys = ('extractor', 'head')

  def split(self, params: dict) -> tuple[dict, dict]:
    # Starts at zero: the client's model starts as the global one.
    return ({k: params[k] for k in self.shared_keys},
            {'head_offset': jax.tree.map(jnp.zeros_like, params['head'])})

  def model_params(self, shared: dict, personal: dict) -> dict:
    return {**shared, 'head': jax.tree.map(jnp.add, shared['head'], personal['head_offset'])}


# ------------------------------------------------------------------ upload masks (before clipping)
# `round_mask(key, shared)`: a mask drawn once per round from a public key (None if none);
# `client_mask(delta, own_mask, round_mask)`: what a client multiplies its update with (None:
# no mask); `private`: computed from the client's own data (so noise only on it leaks it).


@dataclasses.dataclass(frozen=True)
class NoUploadMask(UploadMask):
  name = 'none'
  private = False

  def round_mask(self, key, shared):
    del key, shared
    return None

  def client_mask(self, delta, own_mask, round_mask):
    del delta, own_mask, round_mask
    return None


@dataclasses.dataclass(frozen=True)
class RandKMask(NoUploadMask):
  """Fed-SMP-randk: one rand-k mask per round from its own key, never from data (public)."""
  keep_fraction: float = 0.4  # p: fraction of coordinates kept
  name = 'randk'
  config_fields = (('keep_fraction', 'keep_fraction'),)

  def round_mask(self, key, shared):
    return sparsify.randk_mask(key, shared, self.keep_fraction)

  def client_mask(self, delta, own_mask, round_mask):
    return round_mask


@dataclasses.dataclass(frozen=True)
class TopKMask(NoUploadMask):
  """The top-k of the client's own update (private)."""
  keep_fraction: float = 0.4  # p: fraction of coordinates kept
  name = 'topk'
  private = True
  config_fields = (('keep_fraction', 'keep_fraction'),)

  def client_mask(self, delta, own_mask, round_mask):
    return sparsify.topk_mask(delta, self.keep_fraction)


@dataclasses.dataclass(frozen=True)
class DSUUploadMask(NoUploadMask):
  """DSU's M^tau, the client's final weight mask (private)."""
  name = 'dsu'
  private = True

  def client_mask(self, delta, own_mask, round_mask):
    return own_mask


# ------------------------------------------------------------------ post-processing of noised values
# `client(upload)`: applied to a client's own noised upload; `server(total)`: to the
# noised sum. `on_client_noise`: it sparsifies the client's own noised share (needs distributed
# noise, and epsilon does not cover the result).


@dataclasses.dataclass(frozen=True)
class NoPostprocess(Postprocess):
  name = 'none'
  on_client_noise = False
  reads_noise = False

  def client(self, upload):
    return upload

  def server(self, total):
    return total


@dataclasses.dataclass(frozen=True)
class TopKOfClientUpload(NoPostprocess):
  """DP-FedSAM-topk Option II: each client top-k's its own noised upload."""
  keep_fraction: float = 0.4  # p: fraction of coordinates kept
  name = 'topk_client'
  on_client_noise = True
  reads_noise = True
  config_fields = (('keep_fraction', 'keep_fraction'),)

  def client(self, upload):
    return sparsify.apply_mask(upload, sparsify.topk_mask(upload, self.keep_fraction))


@dataclasses.dataclass(frozen=True)
class TopKOfNoisedSum(NoPostprocess):
  """The server top-k's the noised sum: post-processing, covered by epsilon."""
  keep_fraction: float = 0.4  # p: fraction of coordinates kept
  name = 'topk_server'
  reads_noise = True
  config_fields = (('keep_fraction', 'keep_fraction'),)

  def server(self, total):
    return sparsify.apply_mask(total, sparsify.topk_mask(total, self.keep_fraction))


# ------------------------------------------------------------------ the model each client tests
# Each is its method's default test-time protocol (protocol.py): `adaptation(local_config)` is what
# each client trains before testing (adaptation.py trains it, on copies inside the evaluation, never
# touching the server state); `adapt_part` is what config.eval's adapt_part 'auto' trains.


@dataclasses.dataclass(frozen=True)
class TestGlobal(Evaluation):
  """The global model (with the client's personal part, if the method has one), as it is."""
  name = 'global'
  adapt_part = 'none'

  def adaptation(self, local_config) -> Adaptation:
    del local_config
    return NO_ADAPTATION


@dataclasses.dataclass(frozen=True)
class TestPersonal(TestGlobal):
  """The global shared part with the client's own personal part (head or head offset), as it is."""
  name = 'personal'
  adapt_part = 'head'


@dataclasses.dataclass(frozen=True)
class FineTune(TestGlobal):
  """A copy of the global model fine-tuned on the client's training data (-FT methods):
  local.finetune_epochs of SGD at the round's lr_shared."""
  name = 'finetune'
  adapt_part = 'full'

  def adaptation(self, local_config) -> Adaptation:
    return Adaptation('full', local_config.finetune_epochs, local_config.lr_shared,
                      local_config.lr_decay, own_weights=True)


@dataclasses.dataclass(frozen=True)
class FineTuneHead(TestGlobal):
  """The global model with its head fine-tuned on the client's data (DP-FedAvg-fb):
  local.finetune_epochs of SGD at the round's lr_personal."""
  name = 'finetune_head'
  adapt_part = 'head'

  def adaptation(self, local_config) -> Adaptation:
    return Adaptation('head', local_config.finetune_epochs, local_config.lr_personal,
                      local_config.lr_decay)
