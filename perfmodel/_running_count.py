"""The running count's restoring force away from its mean (the seat wait's nonlinear diffusion).

The running count N drifts back to its mean n at the rate the departures N / (E[O] TPOT(N))
outgrow the arrivals; the drift's slope is (1 - g(N)) / (E[O] TPOT(N)), g = N TPOT'(N) / TPOT the
slot-feedback gain.  The OU (Gaussian) law freezes that slope at n.  But g and TPOT grow with N,
and past the roofline's kink (where decode turns from memory- to compute-bound, e.g. Llama-2-70B
on four A100s near 105 sequences) g jumps: the force weakens towards the seats and N's right
tail, where the seats fill, is fatter than the Gaussian's.  ``running_stiffness`` is that slope relative
to its value at n, on a grid from n to the seats c; ``_queueing.diffusion_seat_wait`` integrates
the stationary density exp(-U), U'' = k / V, over it.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._types import Array

STIFFNESS_NODES = 16
"""Equally spaced points from the running count's mean to the seats."""
AVERAGE_NODES = 8
"""Gauss-Hermite nodes of the decode batch's spread in ``averaged_gain``."""
AVERAGE_ROUNDS = 3
"""Rounds of the averaged gain's fixed point (the spread widens as 1 / (1 - g_bar))."""
_Z, _W = np.polynomial.hermite_e.hermegauss(AVERAGE_NODES)
_W = _W / _W.sum()


def _tau_and_slope(decode_s: Callable[[Array], Array], x_d: Array) -> tuple[Array, Array]:
    return jax.jvp(decode_s, (x_d,), (jnp.ones_like(x_d),))


class Feedback(eqx.Module):
    """The slot feedback at the steady state: decode batch ``n_d``, gap ``tpot_s``, gain g and
    prefill share u = lambda E[Delta], with the decode-only iteration time tau and its slope at
    n_d (``at_mean``).

    Unchunked, TPOT(N) = tau(N) / (1 - u), so the gap moves by d tau / (1 - u); chunked, only the
    decode-only iterations (about 1 - u of them) move with tau (those carrying a chunk are
    compute-bound already), by (1 - u) d tau.  Then at decode batch N
    g(N) = (g TPOT + w (N tau'(N) - n_d tau'(n_d))) / TPOT(N) and the force's slope relative to
    the mean's is k(N) / k(n_d) = (1 - g(N)) / (1 - g) * TPOT / TPOT(N) (``stiffness``).
    """

    n_d: Array
    tpot_s: Array
    gain: Array
    prefill_share: Array
    tau_s: Array
    tau_slope: Array
    chunked: bool = eqx.field(static=True)
    gain_max: float = eqx.field(static=True)

    @classmethod
    def at_mean(cls, decode_s, n_d, tpot_s, gain, prefill_share, chunked, gain_max):
        n_d = jnp.asarray(n_d)
        tau, slope = _tau_and_slope(decode_s, n_d[..., None])
        return cls(
            n_d,
            jnp.asarray(tpot_s),
            jnp.asarray(gain),
            jnp.asarray(prefill_share),
            tau[..., 0],
            slope[..., 0],
            chunked,
            gain_max,
        )

    def stiffness(self, x_d: Array, tau_x: Array, slope_x: Array) -> Array:
        """k(N) / k(n_d) at decode batches ``x_d`` (last axis), tau and tau' there given."""

        def lift(a):
            return a[..., None]

        u, tpot, gain = lift(self.prefill_share), lift(self.tpot_s), lift(self.gain)
        w = 1.0 - u if self.chunked else 1.0 / (1.0 - u)
        tpot_x = tpot + w * (tau_x - lift(self.tau_s))
        moved = x_d * slope_x - lift(self.n_d * self.tau_slope)
        g_x = jnp.clip((gain * tpot + w * moved) / tpot_x, 0.0, self.gain_max)
        return (1.0 - g_x) / (1.0 - gain) * tpot / tpot_x


def running_stiffness(decode_s: Callable[[Array], Array], fb: Feedback, n_run, seats) -> Array:
    """k(N) / k(n) at ``STIFFNESS_NODES`` equally spaced running counts N in [n_run, seats]
    (last axis); ``decode_s(n)`` is a decode-only iteration's seconds at decode batch n
    (elementwise).  N's decode batch is N - (n_run - n_d): the requests in their own prefill
    do not decode."""
    t = jnp.linspace(0.0, 1.0, STIFFNESS_NODES)
    n_run = jnp.asarray(n_run)[..., None]
    x_d = jnp.maximum(fb.n_d[..., None] + (jnp.asarray(seats)[..., None] - n_run) * t, 0.0)
    return fb.stiffness(x_d, *_tau_and_slope(decode_s, x_d))


def averaged_gain(decode_s: Callable[[Array], Array], fb: Feedback, spread) -> tuple[Array, Array]:
    """The slot-feedback gain and the iteration time averaged over the decode batch's spread.

    N ~ n_d + sd Z (Gauss-Hermite), sd = sqrt(``spread``) / (1 - g_bar): the restoring force
    averaged over it, 1 - g_bar = (1 - g) E[k(N) / k(n_d)], solved in ``AVERAGE_ROUNDS``; and
    the Jensen excess E[tau(N)] - tau(n_d) >= 0 of a convex roofline (0 on a straight one), at
    the last round's spread.  Returns (g_bar, excess seconds).
    """
    z, w = jnp.asarray(_Z), jnp.asarray(_W)
    root = jnp.sqrt(jnp.maximum(jnp.asarray(spread), 0.0))

    def round_(_, state):
        g_bar, _ = state
        x_d = jnp.maximum(fb.n_d[..., None] + (root / (1.0 - g_bar))[..., None] * z, 0.0)
        tau_x, slope_x = _tau_and_slope(decode_s, x_d)
        k = fb.stiffness(x_d, tau_x, slope_x)
        g_new = jnp.clip(1.0 - (1.0 - fb.gain) * jnp.sum(w * k, axis=-1), 0.0, fb.gain_max)
        return g_new, jnp.sum(w * tau_x, axis=-1) - fb.tau_s

    start = (jnp.broadcast_to(fb.gain, root.shape), jnp.zeros_like(root))
    return jax.lax.fori_loop(0, AVERAGE_ROUNDS, round_, start)
