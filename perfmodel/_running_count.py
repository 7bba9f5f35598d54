"""The running count's restoring force away from its mean (the seat wait's nonlinear diffusion).

The running count N drifts back to its mean n at the rate the departures N / (E[O] TPOT(N))
outgrow the arrivals; the drift's slope is (1 - g(N)) / (E[O] TPOT(N)), g = N TPOT'(N) / TPOT the
slot-feedback gain.  The OU (Gaussian) law freezes that slope at n.  But g and TPOT grow with N,
and past the roofline's kink (where decode turns from memory- to compute-bound, e.g. Llama-2-70B
on four A100s near 105 sequences) g jumps: the force weakens towards the seats and N's right
tail, where the seats fill, is fatter than the Gaussian's.  ``stiffness`` is that slope relative
to its value at n, on a grid from n to the seats c; ``_queueing.diffusion_seat_wait`` integrates
the stationary density exp(-U), U'' = k / V, over it.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jnp.ndarray

STIFFNESS_NODES = 16
"""Equally spaced points from the running count's mean to the seats."""


def running_stiffness(
    decode_s: Callable[[Array], Array],
    n_run,
    seats,
    n_d,
    tpot_s,
    gain,
    prefill_share,
    chunked: bool,
    gain_max: float,
) -> Array:
    """k(N) / k(n) at ``STIFFNESS_NODES`` equally spaced N in [n_run, seats] (last axis).

    ``decode_s(n)``: a decode-only iteration's seconds at decode batch n (elementwise);
    ``n_d``, ``tpot_s``, ``gain``: the steady decode batch, gap and gain at the mean;
    ``prefill_share`` u = lambda E[Delta].  Unchunked, TPOT(N) = tau(N) / (1 - u), so the gap
    moves by d tau / (1 - u); chunked, only the decode-only iterations (about 1 - u of them) move
    with tau (those carrying a chunk are compute-bound already), by (1 - u) d tau.  Then
    g(N) = (g TPOT + w (N tau'(N) - n_d tau'(n_d))) / TPOT(N) and
    k(N) / k(n) = (1 - g(N)) / (1 - g) * TPOT / TPOT(N).  N's decode batch is N - (n_run - n_d)
    (the requests in their own prefill do not decode).
    """
    t = jnp.linspace(0.0, 1.0, STIFFNESS_NODES)
    n_run, n_d = jnp.asarray(n_run)[..., None], jnp.asarray(n_d)[..., None]
    tpot, gain = jnp.asarray(tpot_s)[..., None], jnp.asarray(gain)[..., None]
    u = jnp.asarray(prefill_share)[..., None]
    x_d = jnp.maximum(n_run + (jnp.asarray(seats)[..., None] - n_run) * t - (n_run - n_d), 0.0)
    tau_x, dtau_x = jax.jvp(decode_s, (x_d,), (jnp.ones_like(x_d),))
    tau_0, dtau_0 = jax.jvp(decode_s, (n_d,), (jnp.ones_like(n_d),))
    w = 1.0 - u if chunked else 1.0 / (1.0 - u)
    tpot_x = tpot + w * (tau_x - tau_0)
    g_x = jnp.clip((gain * tpot + w * (x_d * dtau_x - n_d * dtau_0)) / tpot_x, 0.0, gain_max)
    return (1.0 - g_x) / (1.0 - gain) * tpot / tpot_x
