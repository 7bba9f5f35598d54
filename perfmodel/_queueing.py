"""Closed-form queueing, differentiable: waits, their tails, and quantiles of sums.

* M/G/1 mean wait, Pollaczek-Khinchine: W = lambda E[S^2] / (2 (1 - rho)), rho = lambda E[S]
  (Kleinrock, *Queueing Systems* vol. 1, 1975, eq. 5.101).
* G/G/1, Kingman (1961): W ~ rho / (1 - rho) * (c_a^2 + c_s^2) / 2 * E[S]; exact for M/G/1.
* G/G/c, Allen-Cunneen (Allen 1990): W ~ P_wait / (c (1 - rho)) * (c_a^2 + c_s^2) / 2 * E[S],
  with Sakasegawa's (1977) P_wait ~ rho^(sqrt(2 (c + 1)) - 1), smooth in c.
* Many servers whose speed falls with their load (running slots of an iteration-level engine):
  the diffusion of Halfin & Whitt (1981) with a general variance V of the busy count,
  beta = (c - n) / sqrt(V), P(wait) = phi(beta) / (phi(beta) + beta Phi(beta)),
  E[W | wait] = V / ((c - n) lambda) (the excess over c is a reflected Brownian motion); with
  a restoring force that weakens from n to c, the stationary density exp(-U) by quadrature.
* Tail: P(W > t) ~ rho exp(-t / W_cond), W_cond = W / rho (exponential given a wait; exact for
  M/M/1, the heavy-traffic limit for G/G/1, Kingman 1962).

Overload (rho >= 1) is a value: the waits are ``inf`` and nothing here returns NaN (the inputs are
masked with the jax-md double ``where`` so gradients stay finite in the branch not taken).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtr, ndtri

from ._floors import (
    COUNT_VARIANCE_FLOOR,
    LOG_VARIANCE_FLOOR,
    POSITIVE_FLOOR,
    PROBABILITY_FLOOR,
    TIME_FLOOR_S,
)
from ._types import Array, ArrayLike

_RHO_SAFE = 0.5
"""Stand-in utilisation inside masked (overloaded) branches; never reported."""

QUANTILE_BRACKET_SIGMAS = 6.0
"""Upper end of a lognormal mixture's quantile bracket: every component's mu + 6 sigma (a 1e-9
tail), so the bisection starts with the quantile inside it."""

SERIES_BELOW_CORRELATIONS = 1.0e-3
"""Windows shorter than this many correlation times use the series 1 - y / 3 of the OU window
factor (the closed form loses its digits to cancellation there)."""

MAX_WAIT_SHIFT_SHARE = 0.99
"""Largest share of the conditional wait W_cond that its deterministic shift d may take (the
exponential tail beyond it keeps a positive mean W_cond - d)."""


def _masked(rho: ArrayLike) -> tuple[Array, Array]:
    rho = jnp.asarray(rho)
    stable = rho < 1.0
    return stable, jnp.where(stable, rho, _RHO_SAFE)


def mg1_wait_s(
    rate_per_s: ArrayLike, service_mean_s: ArrayLike, service_second_moment_s2: ArrayLike
) -> Array:
    """Pollaczek-Khinchine mean wait in queue of M/G/1 (inf when rho >= 1).

    M/D/1 with S = D: W = rho D / (2 (1 - rho)); M/M/1: W = rho E[S] / (1 - rho).
    """
    stable, rho = _masked(jnp.asarray(rate_per_s) * service_mean_s)
    w = jnp.asarray(rate_per_s) * service_second_moment_s2 / (2.0 * (1.0 - rho))
    return jnp.where(stable, w, jnp.inf)


def kingman_wait_s(
    rho: ArrayLike, ca2: ArrayLike, cs2: ArrayLike, service_mean_s: ArrayLike
) -> Array:
    """Kingman's G/G/1 mean wait: rho / (1 - rho) * (c_a^2 + c_s^2) / 2 * E[S] (inf when rho >= 1)."""
    stable, r = _masked(rho)
    w = r / (1.0 - r) * (jnp.asarray(ca2) + cs2) / 2.0 * service_mean_s
    return jnp.where(stable, w, jnp.inf)


def ggc_wait_probability(rho: ArrayLike, servers: ArrayLike) -> Array:
    """Sakasegawa's approximation of Erlang C, P(wait) ~ rho^(sqrt(2 (c + 1)) - 1), for 0 <= rho < 1."""
    r = jnp.clip(jnp.asarray(rho), PROBABILITY_FLOOR, 1.0)
    return jnp.power(r, jnp.sqrt(2.0 * (jnp.asarray(servers) + 1.0)) - 1.0)


def allen_cunneen_wait_s(
    rho: ArrayLike, servers: ArrayLike, ca2: ArrayLike, cs2: ArrayLike, service_mean_s: ArrayLike
) -> Array:
    """Allen-Cunneen G/G/c mean wait, rho = lambda E[S] / c (inf when rho >= 1)."""
    stable, r = _masked(rho)
    c = jnp.maximum(jnp.asarray(servers), 1.0)
    w = (
        ggc_wait_probability(r, c)
        / (c * (1.0 - r))
        * (jnp.asarray(ca2) + cs2)
        / 2.0
        * service_mean_s
    )
    return jnp.where(stable, w, jnp.inf)


def diffusion_seat_wait(
    busy_mean: ArrayLike,
    busy_var: ArrayLike,
    servers: ArrayLike,
    rate_per_s: ArrayLike,
    stiffness: ArrayLike | None = None,
) -> tuple[Array, Array]:
    """(P(wait), E[W | wait]) of a many-server queue from the diffusion of its busy count
    (Halfin & Whitt 1981, with the busy count's variance V in place of the Poisson n):
    beta = (c - n) / sqrt(V), P = phi(beta) / (phi(beta) + beta Phi(beta)),
    E[W | wait] = V / ((c - n) lambda).  Overload (n >= c): (1, inf).

    M/M/c anchor: V = n = lambda / mu gives Halfin-Whitt's square-root-staffing P(wait).

    ``stiffness`` (last axis: equally spaced points from n to c) is the drift's slope relative
    to its value at n, k(x).  The stationary density is then exp(-U), U(x) = int_n^x K / V,
    K(x) = int_n^x k: Gaussian below n, integrated (trapezoid) from n to c, and above c the
    excess drains at the drift's value there, (c - n) k_bar (mean k), an exponential tail of
    mass exp(-U(c)) V / ((c - n) k_bar); E[W | wait] = V / ((c - n) k_bar lambda).  With k = 1
    both equal the closed forms above (up to the quadrature).
    """
    n = jnp.asarray(busy_mean)
    c = jnp.asarray(servers)
    stable = n < c
    gap = jnp.where(stable, c - n, 1.0)
    v = jnp.maximum(jnp.asarray(busy_var), COUNT_VARIANCE_FLOOR)
    beta = gap / jnp.sqrt(v)
    if stiffness is None:
        phi = jnp.exp(-0.5 * jnp.square(beta)) / jnp.sqrt(2.0 * jnp.pi)
        p = phi / (phi + beta * ndtr(beta))
        k_mean = 1.0
    else:
        k = jnp.asarray(stiffness)
        dt = 1.0 / (k.shape[-1] - 1)  # steps of the unit interval n -> c
        force = _cumulative_trapezoid(k, dt)  # K / (c - n)
        k_mean = force[..., -1]
        # U in units of the standard deviation: beta^2 int_0^t K(s) / (c - n) ds
        potential = jnp.square(beta)[..., None] * _cumulative_trapezoid(force, dt)
        density = jnp.exp(-potential)
        # masses in units of sqrt(V): below n 1 / 2 * sqrt(2 pi), n -> c beta int_0^1 e^-U,
        # above c e^-U(c) / (beta k_bar)
        above = density[..., -1] / (beta * k_mean)
        below = jnp.sqrt(jnp.pi / 2.0) + beta * _cumulative_trapezoid(density, dt)[..., -1]
        p = above / (above + below)
    w_cond = v / (gap * k_mean * jnp.maximum(jnp.asarray(rate_per_s), POSITIVE_FLOOR))
    return jnp.where(stable, p, 1.0), jnp.where(stable, w_cond, jnp.inf)


def _cumulative_trapezoid(y: Array, dx: float) -> Array:
    """Running trapezoid integral of ``y`` (last axis, step ``dx``), starting at 0."""
    steps = (y[..., 1:] + y[..., :-1]) * (dx / 2.0)
    return jnp.concatenate([jnp.zeros_like(y[..., :1]), jnp.cumsum(steps, axis=-1)], axis=-1)


def modulated_wait_s(w_kingman, rho, rate_var_rel, corr_s):
    """Extra queue wait from a server whose speed c(t) drifts slowly (a Markov-modulated queue).

    Chunked prefill: the prefill server gets the budget the decodes leave, so its speed follows
    the decode batch N(t) (Var c / c^2 = ``rate_var_rel`` = (d ln c / dN)^2 Var N, correlation
    time ``corr_s`` = E[O] TPOT / (1 - g), the running count's OU time).  Two limits:

    * fast drift (Brownian heavy traffic, Harrison 1985): the capacity adds 2 Var(c) tau to the
      work's variance rate, W = Var(c) tau / (c^2 (1 - rho));
    * slow drift (quasi-static: the queue settles at each speed): E[W(rho / (1 + x))] - W to
      second order in x = dc / c is W Var(x) / (1 - rho)^2 for Kingman's W = K rho / (1 - rho);

    joined harmonically (the smaller limit governs)."""
    fast = rate_var_rel * corr_s / (1.0 - rho)
    slow = w_kingman * rate_var_rel / jnp.square(1.0 - rho)
    return fast * slow / jnp.maximum(fast + slow, POSITIVE_FLOOR)


def replica_arrival_scv(interarrival_cv: ArrayLike, replicas: ArrayLike) -> Array:
    """Squared CV of one replica's arrivals when a stream of squared CV c_a^2 is split at random
    over r replicas (Bernoulli thinning with p = 1/r, as in Whitt 1983, the Queueing Network
    Analyzer): p c_a^2 + 1 - p = 1 - 1/r + c_a^2 / r (r >= 1)."""
    r = jnp.maximum(jnp.asarray(replicas, dtype=float), 1.0)
    return 1.0 - 1.0 / r + jnp.square(jnp.asarray(interarrival_cv)) / r


def mg1_conditional_wait_scv(rho: ArrayLike, m1: ArrayLike, m2: ArrayLike, m3: ArrayLike) -> Array:
    """Squared CV of an M/G/1 wait given that there is one, from the service moments E[S^k] = m_k
    (Takacs 1962: E[W^2] = 2 E[W]^2 + lambda E[S^3] / (3 (1 - rho))):
    2 rho - 1 + 4 (1 - rho) m1 m3 / (3 m2^2).  M/M/1: 1; M/D/1: (1 + 2 rho) / 3."""
    rho = jnp.asarray(rho)
    return 2.0 * rho - 1.0 + 4.0 * (1.0 - rho) * m1 * m3 / (3.0 * jnp.square(m2))


def window_mean_variance_factor(window_over_correlation: ArrayLike) -> Array:
    """Var of the mean of a stationary Ornstein-Uhlenbeck process over a window of length y
    correlation times, as a fraction of its variance: 2 (y - 1 + exp(-y)) / y^2 (1 at y -> 0)."""
    y = jnp.maximum(jnp.asarray(window_over_correlation), 0.0)
    short = y < SERIES_BELOW_CORRELATIONS
    ys = jnp.where(short, 1.0, y)
    return jnp.where(short, 1.0 - y / 3.0, 2.0 * (ys + jnp.expm1(-ys)) / jnp.square(ys))


def wait_quantile_s(wait_probability: ArrayLike, wait_mean_s: ArrayLike, q: ArrayLike) -> Array:
    """q-quantile of W with P(W > t) = p exp(-t / W_cond), W_cond = W / p: W_cond ln(p / (1 - q))^+."""
    p = jnp.clip(jnp.asarray(wait_probability), PROBABILITY_FLOOR, 1.0)
    w_cond = jnp.asarray(wait_mean_s) / p
    return w_cond * jnp.maximum(jnp.log(p / (1.0 - jnp.asarray(q))), 0.0)


def lognormal_nodes(mean: ArrayLike, cv: ArrayLike, count: int) -> Array:
    """``count`` equal-probability nodes of the lognormal (mean, cv): quantiles at (k + 1/2) / count."""
    sigma = jnp.sqrt(jnp.log1p(jnp.square(jnp.asarray(cv))))
    mu = jnp.log(jnp.asarray(mean)) - sigma**2 / 2.0
    z = ndtri((jnp.arange(count, dtype=float) + 0.5) / count)
    return jnp.exp(mu[..., None] + sigma[..., None] * z)


def solve_quantile(
    cdf: Callable[[Array], Array], q: ArrayLike, lo: ArrayLike, hi: ArrayLike, iters: int = 60
) -> Array:
    """t with cdf(t) = q, by bisection on [lo, hi]; the gradient is the implicit one,
    dt/dtheta = -(dF/dtheta) / (dF/dt), attached with one zero-valued Newton step."""
    lo = jax.lax.stop_gradient(jnp.asarray(lo, dtype=float))
    hi = jax.lax.stop_gradient(jnp.asarray(hi, dtype=float))

    def body(_, bounds):
        a, b = bounds
        mid = 0.5 * (a + b)
        below = jax.lax.stop_gradient(cdf(mid)) < q
        return jnp.where(below, mid, a), jnp.where(below, b, mid)

    a, b = jax.lax.fori_loop(0, iters, body, (lo, hi))
    t = jax.lax.stop_gradient(0.5 * (a + b))
    f, df = jax.jvp(cdf, (t,), (jnp.ones_like(t),))
    df = jax.lax.stop_gradient(df)
    ok = df > 0
    return t - jnp.where(ok, (f - jax.lax.stop_gradient(f)) / jnp.where(ok, df, 1.0), 0.0)


def _node_cdf(t: Array, nodes: Array) -> Array:
    """CDF of equal-weight atoms, each spread uniformly over its half-gaps to the neighbours
    (a piecewise-linear interpolation of the empirical CDF, continuous in t and in the nodes)."""
    x = jnp.sort(nodes, axis=-1)
    left = jnp.concatenate([x[..., :1], 0.5 * (x[..., 1:] + x[..., :-1])], axis=-1)
    right = jnp.concatenate([0.5 * (x[..., 1:] + x[..., :-1]), x[..., -1:]], axis=-1)
    lo = jnp.minimum(left, x - 1e-9 * (1.0 + x))
    hi = jnp.maximum(right, x + 1e-9 * (1.0 + x))
    return jnp.mean(jnp.clip((t[..., None] - lo) / (hi - lo), 0.0, 1.0), axis=-1)


def wait_plus_quantile_s(
    nodes_s: Array,
    wait_probability: ArrayLike,
    wait_cond_s: ArrayLike,
    q: ArrayLike,
    wait_shift_s: ArrayLike = 0.0,
) -> Array:
    """q-quantile of W + X, X given by equal-probability ``nodes_s``, W independent with
    P(W = 0) = 1 - p and W | W > 0 ~ d + Exp(mean W_cond - d) (the tail law above; a shift
    d = ``wait_shift_s`` < W_cond makes it less variable, SCV (1 - d / W_cond)^2).  ``q`` may be
    an array of levels (broadcast against ``p`` and ``W_cond``); the nodes' leading axes
    broadcast ahead of it.

    F(t) = (1 - p) F_X(t) + p mean_k [1 - exp(-(t - x_k - d)^+ / (W_cond - d))].
    """
    q = jnp.asarray(q)
    p = jnp.clip(jnp.asarray(wait_probability), 0.0, 1.0)
    wc = jnp.maximum(jnp.asarray(wait_cond_s), TIME_FLOOR_S)
    shift = jnp.clip(jnp.asarray(wait_shift_s), 0.0, MAX_WAIT_SHIFT_SHARE * wc)
    x = nodes_s.reshape(nodes_s.shape[:-1] + (1,) * q.ndim + nodes_s.shape[-1:])
    x_w = x + shift[..., None]
    we = (wc - shift)[..., None]

    def cdf(t):
        lag = jnp.maximum(t[..., None] - x_w, 0.0)
        waited = jnp.mean(-jnp.expm1(-lag / we), axis=-1)
        return (1.0 - p) * _node_cdf(t, x) + p * waited

    hi = jnp.max(x, axis=-1) + wc * (jnp.log(1.0 / (1.0 - q)) + 2.0) + 1e-9
    return solve_quantile(cdf, q, jnp.zeros_like(hi), hi)


def lognormal_mixture_quantile(means: Array, variances: Array, q: ArrayLike) -> Array:
    """q-quantile of an equal-weight mixture of lognormals, each given by its mean and variance
    (last axis); ``q`` may be a 1-D array of levels."""
    q = jnp.asarray(q)
    extra = (1,) * q.ndim
    means = means.reshape(means.shape[:-1] + extra + means.shape[-1:])
    variances = variances.reshape(variances.shape[:-1] + extra + variances.shape[-1:])
    m = jnp.maximum(means, POSITIVE_FLOOR)
    s2 = jnp.log1p(jnp.maximum(variances, 0.0) / jnp.square(m))
    mu = jnp.log(m) - s2 / 2.0
    s = jnp.sqrt(jnp.maximum(s2, LOG_VARIANCE_FLOOR))

    def cdf(t):
        z = (jnp.log(jnp.maximum(t[..., None], POSITIVE_FLOOR)) - mu) / s
        return jnp.mean(ndtr(z), axis=-1)

    hi = jnp.max(jnp.exp(mu + QUANTILE_BRACKET_SIGMAS * s), axis=-1) * jnp.ones_like(q)
    return solve_quantile(cdf, q, jnp.zeros_like(hi), hi)
