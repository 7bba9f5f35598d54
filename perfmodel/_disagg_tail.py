"""Waiting-time tails of the two pools of a disaggregated system (used by ``_disagg``).

Prefill pool: one server of prompt work, FCFS.  Its mean wait comes from ``serving_metrics`` (which
knows batching and chunking); its tail is the M/G/1 Cramer-Lundberg approximation
P(W > t) ~ C exp(-theta t), lambda (E[exp(theta S)] - 1) = theta,
C = (1 - rho) / (lambda E[S exp(theta S)] - 1) (Asmussen, *Applied Probability and Queues*, 2003,
XIII.5), with Gamma service of CV c (the prompt CV): E[exp(theta S)] = (1 - theta D c^2)^(-1/c^2),
the M/D/1 exponent at c = 0 and M/M/1 (theta = mu - lambda, C = rho) at c = 1.  The exponential
tail with W / rho as its scale (Kingman) is the heavy-traffic limit of the same; at moderate load
with equal prompts it is too heavy (M/D/1 at rho = 0.3: p95 wait 1.28 D vs 1.07 D exact, 1.13 D
here).  rho is the one whose Pollaczek-Khinchine wait equals the mean wait given, so batching
that shortens the queue shortens the tail too.

Decode pool: the wait for a seat from the many-server diffusion of the busy count (Halfin & Whitt
1981; Whitt 2004 for G/G/c: variance n (c_a^2 + c_s^2) / 2) amplified by the TPOT feedback
1 / (1 - g)^2, g = n tau'(n) / tau(n), as ``_serving_tail`` does for a colocated engine's slots.
A request's TPOT is the step at the batch it meets, 1 + N; its spread is tau' times the sd of N
averaged over its life (N: variance n (1 + c_a^2) / 2 / (1 - g)^2, Ornstein-Uhlenbeck with
correlation time = its life / (1 - g), ``window_mean_variance_factor``), normal quantiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri

from ._queueing import diffusion_seat_wait, wait_quantile_s, window_mean_variance_factor

Array = jnp.ndarray

LUNDBERG_BISECTIONS = 80
"""Bisection steps for the Lundberg exponent (then one Newton step carries the gradient)."""

GAIN_MAX = 0.9
"""Cap on the decode pool's TPOT feedback gain g (the variance factor 1 / (1 - g)^2 <= 100)."""


def _log_mgf(x, c2):
    """ln E[exp(x S / D)] of Gamma service with mean D and squared CV c2 (c2 -> 0: x)."""
    small = c2 < 1e-9
    c = jnp.where(small, 1.0, c2)
    return jnp.where(small, x, -jnp.log1p(-x * c) / c)


def lundberg_tail(rho, c2):
    """(theta D, C) of P(W > t) ~ C exp(-theta t) for M/G/1 with Gamma service, 0 < rho < 1."""
    rho = jnp.clip(jnp.asarray(rho, dtype=float), 1e-6, 1.0 - 1e-6)
    c2 = jnp.asarray(c2, dtype=float)

    def f(x):
        return rho * jnp.expm1(_log_mgf(x, c2)) - x

    hi0 = jnp.where(c2 < 1e-9, 2.0 * jnp.log(1.0 / rho) / rho + 2.0, (1.0 - 1e-12) / c2)

    def body(_, b):
        lo, hi = b
        mid = 0.5 * (lo + hi)
        pos = f(mid) > 0.0
        return jnp.where(pos, lo, mid), jnp.where(pos, mid, hi)

    lo0 = jnp.full_like(rho, 1e-9)
    lo, hi = jax.lax.fori_loop(
        0, LUNDBERG_BISECTIONS, body, (lo0, jnp.broadcast_to(hi0, rho.shape))
    )
    xb = jax.lax.stop_gradient(0.5 * (lo + hi))
    dm = jnp.exp(_log_mgf(xb, c2)) / (1.0 - xb * c2)  # d/dx E[exp(x S / D)]
    x = xb - f(xb) / (rho * dm - 1.0)  # implicit-function gradient at the root
    dm = jnp.exp(_log_mgf(x, c2)) / (1.0 - x * c2)
    return x, (1.0 - rho) / (rho * dm - 1.0)


def prefill_pool_waits(mean_wait_s, service_s, service_cv, quantiles) -> Array:
    """(mean, quantiles...) of the prefill pool's wait: mean as given, Cramer-Lundberg tail at the
    Pollaczek-Khinchine-matched rho = 2 W / (D (1 + c^2) + 2 W)."""
    w = jnp.maximum(jnp.asarray(mean_wait_s, dtype=float), 1e-12)
    c2 = jnp.square(jnp.asarray(service_cv, dtype=float))
    rho = 2.0 * w / (service_s * (1.0 + c2) + 2.0 * w)
    x, c = lundberg_tail(rho, c2)
    theta = x / service_s
    qs = [jnp.maximum(jnp.log(c / (1.0 - q)), 0.0) / theta for q in quantiles]
    return jnp.stack([w] + qs)


def _slope_gain(step_of_batch, n_decode, tpot):
    """(tau'(1 + n), feedback gain g = n tau' / TPOT) of the decode pool."""
    slope = step_of_batch(n_decode + 2.0) - step_of_batch(n_decode + 1.0)
    return slope, jnp.clip(n_decode * slope / jnp.maximum(tpot, 1e-30), 0.0, GAIN_MAX)


def decode_tpot_quantiles(step_of_batch, n_decode, tpot, ca, quantiles) -> Array:
    """(mean, quantiles...) of a request's TPOT in the decode pool (module docstring)."""
    slope, gain = _slope_gain(step_of_batch, n_decode, tpot)
    var_n = n_decode * (1.0 + jnp.square(ca)) / 2.0 / jnp.square(1.0 - gain)
    sd = slope * jnp.sqrt(var_n * window_mean_variance_factor(1.0 - gain))
    return jnp.stack([tpot] + [tpot + ndtri(jnp.asarray(q)) * sd for q in quantiles])


def decode_seat_waits(step_of_batch, rate, n_decode, tpot, hold_s, seats, ca, cs, quantiles):
    """(mean, quantiles...) of the wait for a decode seat (module docstring); n = rate * hold
    (Little), hold = entry + (O - 1) TPOT."""
    _, gain = _slope_gain(step_of_batch, n_decode, tpot)
    busy = rate * hold_s
    var = busy * (jnp.square(ca) + jnp.square(cs)) / 2.0 / jnp.square(1.0 - gain)
    p_wait, w_cond = diffusion_seat_wait(busy, var, seats, rate)
    mean = p_wait * w_cond
    return jnp.stack([mean] + [wait_quantile_s(p_wait, mean, q) for q in quantiles])
