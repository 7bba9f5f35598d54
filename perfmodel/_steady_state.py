"""The steady state of an iteration-level engine under Poisson-like load (one replica).

Solves jointly, by damped fixed-point iteration, for the mean decode batch n_d (Little's law,
n_d = lambda (E[O] - 1) TPOT, capped by the running slots), the prefill server's utilisation
rho_p (time per prompt packed into full iterations while a backlog lasts, its own iterations
otherwise) and the mean gap TPOT = max(lumpy, spread): prompts alone in their iterations,
tau_d / (1 - lambda E[Delta]), or spread evenly, T(lambda E[P] TPOT prefill tokens, n_d) — by
Jensen each is a lower bound in the other regime.  All times are ``forward_step`` iterations
(``_batching.iteration_s``); chunked prefill follows Sarathi-Serve (Agrawal et al. OSDI 2024).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ._batching import iteration_s, prefill_budget_tokens, seat_capacity
from ._queueing import lognormal_nodes
from ._smooth import smooth_max, smooth_min

Array = jnp.ndarray

FIXED_POINT_ITERATIONS = 60
"""Damped iterations of the (n_d, rho_p, TPOT) fixed point; converged to < 1e-6 relative below rho = 0.95."""


class Steady(eqx.Module):
    """Steady state of one replica at one arrival rate (seconds, sequences)."""

    slope: Array  # d TPOT / d n_d
    n_d: Array
    tau_d: Array
    tpot: Array
    own: Array  # (K,) own prefill time at each prompt node
    busy: Array  # (K,) prefill-server time per prompt when backlogged
    delta2: Array  # E[Delta^2]
    rho_p: Array
    seats: Array


def prompt_nodes(mean, cv, count):
    """Equal-probability lognormal nodes rescaled to the exact mean (the nodes cut the far tail)."""
    x = lognormal_nodes(mean, cv, count)
    return x * (mean / jnp.mean(x))


def tail_ratio(nodes, mean, cv):
    """Var(X) / Var(nodes) >= 1: the far tail the nodes cut carries much of a lognormal's variance
    (cv = 2: about half), so second moments (Kingman's c_s^2, E[Delta^2]) are scaled by it."""
    node_var = jnp.var(nodes)
    true_var = jnp.square(jnp.asarray(cv) * mean)
    ok = node_var > 0
    return jnp.where(ok, true_var / jnp.where(ok, node_var, 1.0), 1.0)


def steady_state(model, hardware, deployment, efficiency, config, rate, p_nodes, o_mean, temperature, tail=1.0):
    """Fixed point of decode batch and TPOT at arrival rate ``rate`` (one replica)."""
    p_mean = jnp.mean(p_nodes)
    ctx_d = p_mean + o_mean / 2.0
    o_dec = jnp.maximum(o_mean - 1.0, 0.0)
    seats = seat_capacity(model, hardware, deployment, ctx_d, temperature)

    def T(**kw):
        return iteration_s(model, hardware, deployment, efficiency, temperature=temperature, **kw)

    def costs(n_d, rho_p):
        tau_d = T(decode_seqs=n_d, decode_context=ctx_d)
        p = p_nodes
        if config.chunked_prefill:
            budget = prefill_budget_tokens(deployment, config, n_d, temperature)
            small = T(prefill_tokens=p, prefill_seqs=1.0, decode_seqs=n_d, decode_context=ctx_d)
            chunk = T(
                prefill_tokens=budget, prefill_seqs=1.0,
                prefill_context=jnp.maximum(p - budget, 0.0) / 2.0,
                decode_seqs=n_d, decode_context=ctx_d,
            )
            fits = p <= budget
            own = jnp.where(fits, small, p / budget * chunk)
            delta = jnp.where(fits, small - tau_d, p / budget * (chunk - tau_d))
            full = T(prefill_tokens=budget, prefill_seqs=1.0, decode_seqs=n_d, decode_context=ctx_d)
            packed = p / budget * full
        else:
            b = deployment.max_num_batched_tokens
            own = T(prefill_tokens=p, prefill_seqs=1.0)
            # whole prompts packed FCFS: the next prompt that does not fit wastes on average
            # half a prompt of the budget (first-fit bin packing, no reordering)
            fill = jnp.clip(b - p_mean / 2.0, jnp.minimum(p_mean, b), b)
            packed = jnp.where(
                p <= fill, p / fill * T(prefill_tokens=fill, prefill_seqs=fill / p), own
            )
        # prefill-server time per prompt: packed into full iterations while a backlog lasts
        # (probability rho_p), its own iteration(s) otherwise
        busy = rho_p * packed + (1.0 - rho_p) * own
        if not config.chunked_prefill:
            delta = busy
        return tau_d, own, busy, delta

    def mean_gap(n_d, rho_p, tpot):
        """TPOT = max(lumpy, smooth): prompts alone in their iterations, tau_d / (1 - lambda E[Delta]),
        or spread evenly, T(lambda E[P] TPOT prefill tokens, n_d) (Jensen: each is a lower bound
        in the other regime)."""
        tau_d, own, busy, delta = costs(n_d, rho_p)
        extra = jnp.minimum(rate * jnp.mean(delta), 0.99)
        lumpy = tau_d / (1.0 - extra)
        if config.chunked_prefill:
            budget = prefill_budget_tokens(deployment, config, n_d, temperature)
            tokens = smooth_min(rate * p_mean * tpot, budget, temperature)  # full when overloaded
            spread = T(
                prefill_tokens=tokens, prefill_seqs=tokens / p_mean,
                decode_seqs=n_d, decode_context=ctx_d,
            )
            lumpy = smooth_max(lumpy, spread, temperature)
        return tau_d, own, busy, delta, lumpy

    def step(_, state):
        n_d, rho_p, tpot = state
        _, _, busy, _, gap = mean_gap(n_d, rho_p, tpot)
        rho_new = jnp.minimum(rate * jnp.mean(busy), 1.0)
        n_new = smooth_min(rate * o_dec * gap, seats, temperature)
        return 0.5 * (n_d + n_new), 0.5 * (rho_p + rho_new), 0.5 * (tpot + gap)

    zero = jnp.zeros_like(rate)
    n_d, rho_p, tpot = jax.lax.fori_loop(0, FIXED_POINT_ITERATIONS, step, (zero, zero, zero))
    tau_d, own, busy, delta, tpot = mean_gap(n_d, rho_p, tpot)
    # d TPOT / d n_d: how much a request's gaps move with the decode batch around it
    _, slope = jax.jvp(lambda n: mean_gap(n, rho_p, tpot)[4], (n_d,), (jnp.ones_like(n_d),))
    return Steady(
        slope=slope,
        n_d=n_d, tau_d=tau_d, tpot=tpot, own=own, busy=busy,
        delta2=jnp.mean(delta) ** 2 + jnp.var(delta) * tail,
        rho_p=rate * jnp.mean(busy), seats=seats,
    )
