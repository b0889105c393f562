"""dp2fedsam_jax: differentially private, personalized federated learning in JAX/Flax."""

__version__ = '0.2.0'
