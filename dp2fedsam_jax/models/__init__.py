"""Models split into a shared feature extractor and a personal linear head."""

from dp2fedsam_jax.models.layers import (AUTO_CONV_IMPL, CONV_IMPLS, POOL_IMPLS, Conv2D, conv2d,
                                         im2col_patches, max_pool_2x2, resolve_conv_impl)
from dp2fedsam_jax.models.pretrained import CheckpointInit, read_params, restore_from_checkpoint, save_params
from dp2fedsam_jax.models.registry import SplitModel, count_params, get_model, model_names

__all__ = [
    'AUTO_CONV_IMPL',
    'CONV_IMPLS',
    'CheckpointInit',
    'POOL_IMPLS',
    'Conv2D',
    'SplitModel',
    'conv2d',
    'count_params',
    'get_model',
    'im2col_patches',
    'max_pool_2x2',
    'model_names',
    'read_params',
    'resolve_conv_impl',
    'restore_from_checkpoint',
    'save_params',
]
