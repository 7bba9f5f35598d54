"""Test-wide JAX settings: 64-bit floats (exact anchors) and strict dtype promotion."""

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
