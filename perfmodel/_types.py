"""Array type aliases, defined once for every module: ``Array`` for what a budget returns (a JAX
array), ``ArrayLike`` for what it accepts (JAX's: arrays, NumPy arrays and Python scalars)."""

from __future__ import annotations

import jax.numpy as jnp
from jax.typing import ArrayLike

__all__ = ["Array", "ArrayLike"]

Array = jnp.ndarray
