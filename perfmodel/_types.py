"""Array type aliases, defined once for every module: ``Array`` for what a budget returns (a JAX
array), ``ArrayLike`` for what it accepts (JAX's: arrays, NumPy arrays and Python scalars).

The public budget functions state their shapes with jaxtyping: every real-valued argument is a
``BatchLike`` (a number or an array of numbers, shape ``*batch``), the arguments broadcast
against each other by NumPy's rules, and the result is a ``BatchArray`` of their broadcast shape.
So one call prices a whole grid of prompt lengths, batch sizes or configurations, and ``vmap``
over posterior draws adds a leading axis.  The annotations are documentation for readers and
type checkers; ``tests/test_budget_shapes.py`` holds the functions to them."""

from __future__ import annotations

import jax.numpy as jnp
import jaxtyping
from jax.typing import ArrayLike

__all__ = ["Array", "ArrayLike", "BatchArray", "BatchLike"]

Array = jnp.ndarray

BatchLike = jaxtyping.Float[jaxtyping.ArrayLike, "*batch"]
"""A real number or an array of them; a budget's ``BatchLike`` arguments broadcast together."""

BatchArray = jaxtyping.Float[jaxtyping.Array, "*batch"]
"""A budget's result: the broadcast shape of its ``BatchLike`` arguments."""
