"""Three user files that extend dp2fedsam_jax from outside the package (docs/extending.md)."""
