"""Smooth relaxations of the hard laws (max, min, ceil, step), in one place.

Each takes an explicit ``temperature``; at ``temperature == 0`` it *is* the hard formula, so
reported values stay exact while the optimiser differentiates a smooth surrogate (STYLE §5).
"""

from __future__ import annotations

import jax.numpy as jnp

from ._floors import POSITIVE_FLOOR
from ._types import Array, ArrayLike


def _safe_log(x: ArrayLike) -> Array:
    """log(x) with the jax-md double-where mask so gradients stay finite at x <= 0."""
    x = jnp.asarray(x)
    positive = x > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, x, 1.0)), jnp.log(POSITIVE_FLOOR))


def smooth_max(a: ArrayLike, b: ArrayLike, temperature: float = 0.0) -> Array:
    """max(a, b) for non-negative quantities; relaxed as a scale-free p-norm.

    ``(a^(1/t) + b^(1/t))^t`` (a log-sum-exp in log space) tends to max(a, b) as t -> 0 and is
    smooth for t > 0, whatever the magnitudes (seconds or microseconds).
    """
    if temperature == 0.0:
        return jnp.maximum(a, b)
    la, lb = _safe_log(a), _safe_log(b)
    return jnp.exp(temperature * jnp.logaddexp(la / temperature, lb / temperature))


def smooth_min(a: ArrayLike, b: ArrayLike, temperature: float = 0.0) -> Array:
    """min(a, b) for positive quantities; relaxed as the reciprocal of ``smooth_max`` of reciprocals."""
    if temperature == 0.0:
        return jnp.minimum(a, b)
    la, lb = _safe_log(a), _safe_log(b)
    return jnp.exp(-temperature * jnp.logaddexp(-la / temperature, -lb / temperature))


def smooth_ceil(x: ArrayLike, temperature: float = 0.0) -> Array:
    """ceil(x); relaxed to ``x + 1/2`` (the mean round-up of a uniformly placed residue)."""
    if temperature == 0.0:
        return jnp.ceil(x)
    return jnp.asarray(x) + 0.5


def smooth_floor(x: ArrayLike, temperature: float = 0.0) -> Array:
    """floor(x); relaxed to ``x - 1/2`` (mean round-down), clipped at 0 for non-negative x."""
    if temperature == 0.0:
        return jnp.floor(x)
    return jnp.maximum(jnp.asarray(x) - 0.5, 0.0)


def smooth_step(x: ArrayLike, temperature: float = 0.0) -> Array:
    """Heaviside step 1[x > 0]; relaxed to a logistic of width ``temperature``."""
    if temperature == 0.0:
        return jnp.where(jnp.asarray(x) > 0, 1.0, 0.0)
    return 1.0 / (1.0 + jnp.exp(-jnp.asarray(x) / temperature))
