"""dp2fedsam_jax: differentially private, personalized federated learning in JAX/Flax."""

__version__ = '0.2.0'

# The public extension API (api.py: register_method, register_model, register_dataset,
# register_partition, MethodSpec and the piece classes, ...; docs/extending.md), imported on first
# use so that `import dp2fedsam_jax.config` stays free of JAX (config files and launchers rely on it).
__all__ = [
    'register_method', 'register_model', 'register_dataset', 'register_partition', 'listing',
    'METHODS', 'MODELS', 'DATASETS', 'PARTITIONS', 'KNOBS', 'Registry', 'RegistrationError',
    'MethodSpec', 'Knob', 'Regularizer', 'WeightMask', 'PersonalPart', 'UploadMask', 'Postprocess',
    'Evaluation', 'ServerStep', 'OptaxStep', 'Adaptation', 'SGD', 'SAM', 'ASAM',
    'NoRegularizer', 'BLUR', 'AdaptiveNorm', 'Proximal', 'NoWeightMask', 'DSUWeightMask',
    'NoPersonal', 'OwnHead', 'HeadOffset', 'NoUploadMask', 'RandKMask', 'TopKMask', 'DSUUploadMask',
    'NoPostprocess', 'TopKOfClientUpload', 'TopKOfNoisedSum', 'TestGlobal', 'TestPersonal',
    'FineTune', 'FineTuneHead', 'SGDStep', 'MomentumStep', 'AdamStep', 'YogiStep', 'AdagradStep',
    'ModelBuilder', 'SplitModel', 'DatasetSource', 'ArrayDataset', 'Partition', 'synthetic',
    'base_config', 'validate_config', 'ConfigError', 'build_experiment', 'train_and_evaluate',
]


def __getattr__(name: str):
  if name in __all__:
    from dp2fedsam_jax import api  # pylint: disable=import-outside-toplevel
    return getattr(api, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted(list(globals()) + __all__)
