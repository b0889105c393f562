"""The public extension API: what a researcher's own file imports to add a method, model, dataset or
partition without editing the package (docs/extending.md; experiments/extending/ has one file each).

    from dp2fedsam_jax import MethodSpec, register_method, ServerStep, Knob

Each `register_*` adds a name to the registry the package's own entries sit in (registries.Registry),
so the name is accepted by validate_config (with a did-you-mean on a typo), listed by
`python3 -m experiments.train --list`, and benchmarked like a built-in
(`python3 -m benchmarks.client_throughput --extension=<file> --model=<name>`). A name that exists
raises RegistrationError unless `replace=True`. Register at import time of a config file: the binary
executes the file (--config=<file>) before it reads the config, so `get_config()` sees the names.

Everything here is re-exported by `dp2fedsam_jax` itself, which imports this module on first use.
The package lists the same names in its own `__all__` (tests/test_extending.py holds the two equal):
it must answer `from dp2fedsam_jax import config` without importing JAX.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import numpy as np

from dp2fedsam_jax.algorithms.pieces import (BLUR, AdaptiveNorm, DSUUploadMask, DSUWeightMask,
                                             Evaluation, FineTune, FineTuneHead, HeadOffset,
                                             NoPersonal, NoPostprocess, NoRegularizer, NoUploadMask,
                                             NoWeightMask, OwnHead, PersonalPart, Postprocess,
                                             Proximal, RandKMask, Regularizer, TestGlobal,
                                             TestPersonal, TopKMask, TopKOfClientUpload,
                                             TopKOfNoisedSum, UploadMask, WeightMask)
from dp2fedsam_jax.algorithms.specs import METHODS, MethodSpec, register as _register_spec
from dp2fedsam_jax.config import ConfigError, base_config, validate_config
from dp2fedsam_jax.data.arrays import ArrayDataset
from dp2fedsam_jax.data.partition import PARTITIONS, Partition
from dp2fedsam_jax.data.sources import DATASETS, DatasetSource, synthetic
from dp2fedsam_jax.local import ASAM, SAM, SGD
from dp2fedsam_jax.models.registry import MODELS, ModelBuilder, SplitModel
from dp2fedsam_jax.protocol import Adaptation
from dp2fedsam_jax.registries import KNOBS, Knob, RegistrationError, Registry
from dp2fedsam_jax.server_optimizer import (AdagradStep, AdamStep, MomentumStep, OptaxStep, SGDStep,
                                            ServerStep, YogiStep)
from dp2fedsam_jax.train import build_experiment, train_and_evaluate

__all__ = [
    # registration
    'register_method', 'register_model', 'register_dataset', 'register_partition', 'listing',
    'METHODS', 'MODELS', 'DATASETS', 'PARTITIONS', 'KNOBS', 'Registry', 'RegistrationError',
    # a method and its pieces (one base class per slot, then the package's pieces)
    'MethodSpec', 'Knob', 'Regularizer', 'WeightMask', 'PersonalPart', 'UploadMask', 'Postprocess',
    'Evaluation', 'ServerStep', 'OptaxStep', 'Adaptation', 'SGD', 'SAM', 'ASAM',
    'NoRegularizer', 'BLUR', 'AdaptiveNorm', 'Proximal', 'NoWeightMask', 'DSUWeightMask',
    'NoPersonal', 'OwnHead', 'HeadOffset', 'NoUploadMask', 'RandKMask', 'TopKMask', 'DSUUploadMask',
    'NoPostprocess', 'TopKOfClientUpload', 'TopKOfNoisedSum', 'TestGlobal', 'TestPersonal',
    'FineTune', 'FineTuneHead', 'SGDStep', 'MomentumStep', 'AdamStep', 'YogiStep', 'AdagradStep',
    # models and data
    'ModelBuilder', 'SplitModel', 'DatasetSource', 'ArrayDataset', 'Partition', 'synthetic',
    # running
    'base_config', 'validate_config', 'ConfigError', 'build_experiment', 'train_and_evaluate',
]


def register_method(spec: MethodSpec, *, description: str = '', replace: bool = False) -> MethodSpec:
  """Registers a method: `spec`, a MethodSpec of pieces (its own or the package's), under spec.name.

  Each registries.Knob in a piece's `config_fields` becomes a config field: base_config() holds it
  at the piece's default and validate_config checks its range, so `--config.<path>=...` sets it.

  Args:
    spec: the method. Its `paper` line is its description in `--list` unless `description` is given.
    description: one line for `--list`.
    replace: replace a method of the same name instead of raising RegistrationError.

  Returns:
    `spec`.
  """
  package_fields = base_config()
  for knob, _, owner in spec.knobs():
    if knob.path not in KNOBS and _has_path(package_fields, knob.path):
      raise RegistrationError(f'{owner}: config.{knob.path} is a field of the package\'s config; '
                              'give the knob a path of its own.')
  return _register_spec(spec, description=description, replace=replace)


def _has_path(config, path: str) -> bool:
  node = config
  for part in path.split('.'):
    if not hasattr(node, 'keys') or part not in node:
      return False
    node = node[part]
  return True


def register_model(name: str, build: Callable[..., nn.Module], *, input_kind: str = 'image',
                   benchmark_input_shape: Sequence[int] = (28, 28, 1), description: str = '',
                   replace: bool = False) -> Callable[..., nn.Module]:
  """Registers a model: `build` makes its feature extractor; the package adds the head.

  Args:
    name: the name config.model takes.
    build: `build(conv_impl, **model_kwargs)` for an image model (conv_impl is 'xla' or 'im2col', for
      extractors built from models.Conv2D; others ignore it), `build(vocab_size, **model_kwargs)` for
      a token model; returns a flax module mapping float32 images [B, H, W, C] (int32 ids [B, T]) to
      features [B, F] ([B, T, F]). The head is a Dense layer of the dataset's classes on them; which
      part a method shares is the method's choice (its `personal` piece).
    input_kind: 'image' or 'tokens'; validate_config pairs it with the dataset's.
    benchmark_input_shape: the input the benchmarks time it on (a run takes the dataset's).
    description: one line for `--list`.
    replace: replace a model of the same name instead of raising RegistrationError.

  Returns:
    `build`.
  """
  MODELS.register(name, ModelBuilder(build, input_kind, tuple(benchmark_input_shape)),
                  description=description, replace=replace)
  return build


def register_dataset(name: str, load: Callable[..., Any], *, input_kind: str = 'image',
                     shape: tuple[int, Sequence[int]] | None = None, has_writers: bool = False,
                     description: str = '', replace: bool = False) -> Callable[..., Any]:
  """Registers a dataset.

  Args:
    name: the name config.dataset takes.
    load: `load(data_dir=..., split=...)` -> ArrayDataset (uint8 images [n, H, W, C], int32 labels,
      num_classes, the normalisation mean and std; `writers` if it has them) for split 'train' (what
      config.partition splits over clients; each client's share is then split 90/10 into its own
      train and test rows). `data_dir` is config.data_dir (None: the dataset's default place).
    input_kind: 'image' (token datasets: see data/shakespeare.py's TokenDataset).
    shape: (num_classes, (H, W, C)), so --dry_run sizes the model without loading; None: it loads.
    has_writers: its examples carry their writer, so partitions that need writers take it.
    description: one line for `--list`.
    replace: replace a dataset of the same name instead of raising RegistrationError.

  Returns:
    `load`.
  """
  if shape is not None:
    shape = (int(shape[0]), tuple(int(d) for d in shape[1]))
  DATASETS.register(name, DatasetSource(load, input_kind, shape, has_writers),
                    description=description, replace=replace)
  return load


def register_partition(name: str, split: Callable[..., Sequence[np.ndarray]], *,
                       needs_writers: bool = False, description: str = '',
                       replace: bool = False) -> Callable[..., Sequence[np.ndarray]]:
  """Registers a partition: how a dataset's training examples are split over the clients.

  Args:
    name: the name config.partition takes.
    split: `split(dataset, num_clients, rng, **options)` -> num_clients int index arrays into the
      dataset's examples (disjoint, none empty). `dataset` has `.y` and `.writers`; `rng` is a numpy
      Generator seeded from config.seed (the only randomness to use); `options` are
      config.classes_per_client and config.dirichlet_alpha by name (take what you use, `**_` the rest).
    needs_writers: it splits by writer (only datasets registered with has_writers take it).
    description: one line for `--list`.
    replace: replace a partition of the same name instead of raising RegistrationError.

  Returns:
    `split`.
  """
  PARTITIONS.register(name, Partition(split, needs_writers), description=description,
                      replace=replace)
  return split


def listing() -> str:
  """What `python3 -m experiments.train --list` prints: every method (one line each, with its
  description), model, dataset and partition, those a user's file registered included."""
  sections = []
  for title, registry in (('methods', METHODS), ('models', MODELS), ('datasets', DATASETS),
                          ('partitions', PARTITIONS)):
    lines = registry.listing(
        {'tfds:<name>': 'any TFDS image classification dataset (the [tfds] extra)'}
        if registry is DATASETS else None)
    sections.append(f'{title} ({len(lines)}):\n' + '\n'.join(f'  {line}' for line in lines))
  return '\n\n'.join(sections)
