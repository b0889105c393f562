"""Method specs: every method as a composition of the engine's shared pieces."""

from dp2fedsam_jax.algorithms.specs import get_method, METHODS, MethodSpec, register

__all__ = ['get_method', 'METHODS', 'MethodSpec', 'register']
