"""A disaggregated system under a ``Workload``: percentiles of the split system beside
``serving_metrics``' colocated ones (``disaggregation_percentiles``), from the two pools' tails.

Prefill pool: one server per replica with no decodes, FCFS, each iteration packing the prompts
waiting at its start as far as the token budget B holds them, one more costing m = T(2 prompts)
- T(1) (D = T(1); m < D for short, bandwidth-bound prompts), of which a share f = min((B - P) / P,
1) fits (a whole prompt at 2,000 tokens of 8,192, a 192-token chunk at 8,000).  An arrival waits
out the residual R of the iteration in flight, E[R] = u D (1 + c^2) / 2 (busy fraction
u = min(lambda D, 1)), and the queued prompts ahead at q = D + (m - D) f each; by Little
(Pollaczek-Khinchine) W = E[R] / (1 - lambda q), with Kingman's (c_a^2 + c^2) for (1 + c^2) for
one replica's share of the stream.  Its prefill ends with its iteration, which also carries the
prompts arriving during R: + lambda E[R] m f.  No fitted terms: the colocated engine's
``CORRECTIONS`` were fitted with decodes in the iterations.  Its tail is the M/G/1
Cramer-Lundberg approximation P(W > t) ~ C exp(-theta t), lambda (E[exp(theta S)] - 1) = theta,
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

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri

from ._batching import DecodeCost, decode_iteration_s
from ._disagg import (
    DECODE_POOL_ENTRY_STEPS,
    DEFAULT_ORCHESTRATION_S,
    DEFAULT_TRANSFER_LATENCY_S,
    _decode_fixed_point,
    kv_transfer_s,
)
from ._floors import COUNT_FLOOR, POSITIVE_FLOOR, TIME_FLOOR_S
from ._memory import max_concurrent_requests
from ._queueing import (
    diffusion_seat_wait,
    replica_arrival_scv,
    wait_quantile_s,
    window_mean_variance_factor,
)
from ._serving_tail import PERCENTILE_QUANTILES, Percentiles
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec, System
from ._step import prefill_step
from ._types import Array, ArrayLike

LUNDBERG_BISECTIONS = 80
"""Bisection steps for the Lundberg exponent (then one Newton step carries the gradient)."""

GAIN_MAX = 0.9
"""Cap on the decode pool's TPOT feedback gain g (the variance factor 1 / (1 - g)^2 <= 100)."""

DETERMINISTIC_SCV = 1e-9
"""Service with a squared CV below this is deterministic (ln E[exp(x S / D)] = x; the gamma
form divides by it)."""

RHO_MARGIN = 1e-6
"""The Lundberg solve takes rho in [1e-6, 1 - 1e-6] (an empty or saturated pool has no root)."""

ROOT_MARGIN = 1e-12
"""The bracket's upper end stops this far (relative) below the gamma MGF's pole at x = 1 / c2."""

ROOT_LOWER = 1e-9
"""The bracket's lower end: the exponent theta D is positive (x = 0 is the trivial root)."""


def _log_mgf(x, c2):
    """ln E[exp(x S / D)] of Gamma service with mean D and squared CV c2 (c2 -> 0: x)."""
    small = c2 < DETERMINISTIC_SCV
    c = jnp.where(small, 1.0, c2)
    return jnp.where(small, x, -jnp.log1p(-x * c) / c)


def lundberg_tail(rho, c2):
    """(theta D, C) of P(W > t) ~ C exp(-theta t) for M/G/1 with Gamma service, 0 < rho < 1."""
    rho = jnp.clip(jnp.asarray(rho, dtype=float), RHO_MARGIN, 1.0 - RHO_MARGIN)
    c2 = jnp.asarray(c2, dtype=float)

    def f(x):
        return rho * jnp.expm1(_log_mgf(x, c2)) - x

    hi0 = jnp.where(
        c2 < DETERMINISTIC_SCV, 2.0 * jnp.log(1.0 / rho) / rho + 2.0, (1.0 - ROOT_MARGIN) / c2
    )

    def body(_, b):
        lo, hi = b
        mid = 0.5 * (lo + hi)
        pos = f(mid) > 0.0
        return jnp.where(pos, lo, mid), jnp.where(pos, mid, hi)

    lo0 = jnp.full_like(rho, ROOT_LOWER)
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
    w = jnp.maximum(jnp.asarray(mean_wait_s, dtype=float), TIME_FLOOR_S)
    c2 = jnp.square(jnp.asarray(service_cv, dtype=float))
    rho = 2.0 * w / (service_s * (1.0 + c2) + 2.0 * w)
    x, c = lundberg_tail(rho, c2)
    theta = x / service_s
    qs = [jnp.maximum(jnp.log(c / (1.0 - q)), 0.0) / theta for q in quantiles]
    return jnp.stack([w] + qs)


def prefill_pool_mean_wait_s(rate, service_s, packed_s, packed_share, service_cv, ca2):
    """Mean wait of one prefill replica (module docstring): u D (c_a^2 + c^2) / 2 / (1 - lambda q)
    + lambda E[R] m f, q = D + (m - D) f, u = min(lambda D, 1); inf at lambda q >= 1 (the packed
    capacity)."""
    c2 = jnp.square(jnp.asarray(service_cv, dtype=float))
    queued_s = service_s + (packed_s - service_s) * packed_share  # a queued prompt's work, q
    load = rate * queued_s
    ok = load < 1.0
    load = jnp.where(ok, load, 0.5)
    busy = jnp.minimum(rate * service_s, 1.0)
    ahead = busy * service_s * (ca2 + c2) / 2.0 / (1.0 - load)
    behind = rate * busy * service_s * (1.0 + c2) / 2.0 * packed_s * packed_share
    return jnp.where(ok, ahead + behind, jnp.inf)


def _slope_gain(step_of_batch, n_decode, tpot):
    """(tau'(1 + n), feedback gain g = n tau' / TPOT) of the decode pool."""
    slope = step_of_batch(n_decode + 2.0) - step_of_batch(n_decode + 1.0)
    return slope, jnp.clip(n_decode * slope / jnp.maximum(tpot, POSITIVE_FLOOR), 0.0, GAIN_MAX)


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


class SplitServing(eqx.Module):
    """A prefill pool and a decode pool under a ``Workload``; latencies ``inf`` when not stable.

    Attributes:
        ttft_s, tpot_s, e2e_s: percentiles, seconds; TPOT is the decode pool's, ``inf`` only
            when that pool is unstable (an overloaded prefill pool starves it, it does not slow
            it).
        utilization: the busier pool's: prefill lambda q (q a queued prompt's packed work), decode
            the seat residence at full seats, lambda (entry + (O - 1) TPOT(seats)) / seats.
        stable: utilization < 1 and a sequence fits in both pools.
        seats: sequences whose KV fits, the smaller of the two pools' (>= 1: fits).
        kv_transfer_s: the hand-off of a mean-length prompt's KV.
    """

    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    utilization: Array
    stable: Array
    seats: Array
    kv_transfer_s: Array


class DisaggregationPercentiles(eqx.Module):
    """Split vs colocated under a ``Workload`` with queueing percentiles (``serving_metrics``)."""

    colocated_ttft_s: Percentiles
    colocated_tpot_s: Percentiles
    colocated_e2e_s: Percentiles
    split_ttft_s: Percentiles
    split_tpot_s: Percentiles
    split_e2e_s: Percentiles
    kv_transfer_s: Array


def _summary(stacked: Array) -> Percentiles:
    """(mean, ``PERCENTILE_QUANTILES``...) on the first axis as a ``Percentiles``."""
    return Percentiles(*(stacked[i] for i in range(1 + len(PERCENTILE_QUANTILES))))


def _e2e_quantiles(ttft: Array, decode: Array) -> Percentiles:
    """Percentiles of TTFT + decode time from their (mean, quantiles...) stacks, independent
    parts: means and medians add, upper quantiles add their excess over the mean in quadrature
    (normal sum)."""
    ok = jnp.all(jnp.isfinite(ttft)) & jnp.all(jnp.isfinite(decode))
    t, d = jnp.where(ok, ttft, 0.0), jnp.where(ok, decode, 0.0)  # inf - inf never reaches a grad
    excess = jnp.sqrt(jnp.square(t[2:] - t[0]) + jnp.square(d[2:] - d[0]))
    out = jnp.concatenate([t[:2] + d[:2], t[0] + d[0] + excess])
    return _summary(jnp.where(ok, out, jnp.inf))


def split_serving(
    workload,
    *,
    prefill: System,
    decode: System,
    cost: DecodeCost | None = None,
    transfer_bytes_per_s: ArrayLike | None = None,
    transfer_latency_s: ArrayLike = DEFAULT_TRANSFER_LATENCY_S,
    orchestration_s: ArrayLike = DEFAULT_ORCHESTRATION_S,
) -> SplitServing:
    """Percentiles of TTFT, TPOT and E2E of a prefill + decode split (module docstring).

    The prefill pool's mean wait is the packing M/G/1 one (``prefill_pool_mean_wait_s``, no fitted
    terms), its tail Cramer-Lundberg with Gamma service of the prompt CV, each quantile added to
    the prefill time of the prompt at that quantile; then the hand-off of a mean-length prompt,
    the orchestration cost, the decode-pool entry step and the wait for a decode seat (many-server
    diffusion with the TPOT feedback, exponential tail).  The decode pool's TPOT is the
    interference-free Little's-law fixed point at the batch a request meets, spread by that
    batch's fluctuation over the request's life; under a speculative ``cost`` each iteration
    drafts and verifies (``decode_iteration_s``) and emits E tokens, so a token costs the
    iteration / E.  TTFT quantiles are sums of its parts' quantiles (an upper bound; exact for the
    fixed parts); E2E adds (E[O] - 1) TPOT, whose spread is independent of TTFT's
    (``_e2e_quantiles``).  Each pool is a ``System`` (the same model; its own GPU type,
    deployment and efficiency), the replicas of its ``Deployment`` the engines in that pool;
    ``transfer_bytes_per_s`` None: the prefill GPU's inter-node network.
    """
    from ._workload import lognormal_params

    cost = DecodeCost() if cost is None else cost
    model = prefill.model  # both pools serve it
    hw_p, dep_p, eff_p = prefill.hardware, prefill.deployment, prefill.efficiency
    hw_d, dep_d, eff_d = decode.hardware, decode.deployment, decode.efficiency
    mu, sigma = lognormal_params(workload.prompt_tokens_mean, workload.prompt_tokens_cv)
    prompts = jnp.stack(
        [workload.prompt_tokens_mean]
        + [jnp.exp(mu + sigma * ndtri(jnp.asarray(q))) for q in PERCENTILE_QUANTILES]
    )
    own = prefill_step(prefill, prompts).total_s
    p_mean = workload.prompt_tokens_mean
    packed_s = prefill_step(prefill, p_mean, 2.0).total_s - own[0]
    fits = jnp.clip((dep_p.max_num_batched_tokens - p_mean) / p_mean, 0.0, 1.0)
    replicas_p = jnp.maximum(dep_p.replicas, 1.0)
    rate_p = workload.arrival_rate_per_s / replicas_p
    ca2 = replica_arrival_scv(workload.interarrival_cv, replicas_p)
    seats_p = max_concurrent_requests(model, hw_p, dep_p, p_mean + 1.0)
    w_pre = prefill_pool_mean_wait_s(rate_p, own[0], packed_s, fits, workload.prompt_tokens_cv, ca2)
    rho_p = rate_p * (own[0] + (packed_s - own[0]) * fits)
    ok = (seats_p >= 1.0) & jnp.isfinite(w_pre)
    w_pre = jnp.where(ok, w_pre, own[0])  # an inf never reaches the tail's gradient
    pre_waits = prefill_pool_waits(w_pre, own[0], workload.prompt_tokens_cv, PERCENTILE_QUANTILES)
    pre_ttft = jnp.concatenate([(own[0] + w_pre)[None], own[1:] + pre_waits[1:]])
    bw = hw_p.internode_bytes_per_s if transfer_bytes_per_s is None else transfer_bytes_per_s
    t_kv = kv_transfer_s(model, dep_p, workload.prompt_tokens_mean, bw, transfer_latency_s)

    o_dec = jnp.maximum(workload.output_tokens_mean - 1.0, 0.0)
    ctx = workload.prompt_tokens_mean + o_dec / 2.0
    e_step = cost.tokens_per_step()

    def step_d(n):  # seconds per emitted token of a decode iteration at batch n
        t = decode_iteration_s(decode, cost, decode_seqs=n, decode_context=ctx)
        return t / e_step

    rate_d = workload.arrival_rate_per_s / jnp.maximum(dep_d.replicas, COUNT_FLOOR)
    n_d, tpot_d = _decode_fixed_point(step_d, rate_d, o_dec, 1.0)
    seats_d = max_concurrent_requests(
        decode.model, hw_d, dep_d, workload.prompt_tokens_mean + o_dec + 1.0
    )
    seats = jnp.minimum(seats_d, dep_d.max_num_seqs)
    seat_s = DECODE_POOL_ENTRY_STEPS * step_d(seats) + o_dec * step_d(seats)
    rho_d = rate_d * seat_s / jnp.maximum(seats, COUNT_FLOOR)
    utilization = jnp.maximum(rho_p, rho_d)
    decode_ok = (rho_d < 1.0) & (seats >= 1.0) & (n_d <= seats)
    stable = ok & (rho_p < 1.0) & decode_ok
    entry = DECODE_POOL_ENTRY_STEPS * tpot_d
    waits = decode_seat_waits(
        step_d,
        rate_d,
        n_d,
        tpot_d,
        entry + o_dec * tpot_d,
        seats,
        workload.interarrival_cv,
        workload.output_tokens_cv,
        PERCENTILE_QUANTILES,
    )
    # as the engines deliver them (``engine_scaled``): the prefill pool's first token, the decode
    # pool's gaps
    ttft = (pre_ttft + t_kv + orchestration_s + entry + waits) * eff_p.ttft_scale
    tpot_q = decode_tpot_quantiles(
        step_d, n_d, tpot_d, workload.interarrival_cv, PERCENTILE_QUANTILES
    )
    tpot_q = tpot_q * eff_d.tpot_scale
    e2e = _e2e_quantiles(jnp.where(stable, ttft, jnp.inf), o_dec * tpot_q)
    return SplitServing(
        ttft_s=_summary(jnp.where(stable, ttft, jnp.inf)),
        tpot_s=_summary(jnp.where(decode_ok, tpot_q, jnp.inf)),  # the decode pool's, as it runs
        e2e_s=e2e,
        utilization=utilization,
        stable=stable,
        seats=jnp.minimum(seats, seats_p),
        kv_transfer_s=t_kv,
    )


def disaggregation_percentiles(
    model: ModelSpec,
    efficiency: Efficiency,
    workload,
    *,
    colocated: tuple[HardwareSpec, Deployment],
    prefill: tuple[HardwareSpec, Deployment],
    decode: tuple[HardwareSpec, Deployment],
    transfer_bytes_per_s: ArrayLike | None = None,
    transfer_latency_s: ArrayLike = DEFAULT_TRANSFER_LATENCY_S,
    orchestration_s: ArrayLike = DEFAULT_ORCHESTRATION_S,
    prefill_efficiency: Efficiency | None = None,
    decode_efficiency: Efficiency | None = None,
) -> DisaggregationPercentiles:
    """Percentiles of TTFT, TPOT and E2E for both systems under ``workload``.

    ``efficiency`` drives the colocated engine; ``prefill_efficiency`` and ``decode_efficiency``
    (each None: ``efficiency``) the two pools, whose GPU types may differ, as in
    ``disaggregation``.  Colocated: ``serving_metrics`` as is; split: ``split_serving``.
    """
    from ._serving import serving_metrics  # the dynamics layer, imported where used

    hw_c, dep_c = colocated
    co = serving_metrics(System(model, hw_c, dep_c, efficiency), workload)
    eff_p = efficiency if prefill_efficiency is None else prefill_efficiency
    eff_d = efficiency if decode_efficiency is None else decode_efficiency
    split = split_serving(
        workload,
        prefill=System(model, *prefill, eff_p),
        decode=System(model, *decode, eff_d),
        transfer_bytes_per_s=transfer_bytes_per_s,
        transfer_latency_s=transfer_latency_s,
        orchestration_s=orchestration_s,
    )
    return DisaggregationPercentiles(
        colocated_ttft_s=co.ttft_s,
        colocated_tpot_s=co.tpot_s,
        colocated_e2e_s=co.e2e_s,
        split_ttft_s=split.ttft_s,
        split_tpot_s=split.tpot_s,
        split_e2e_s=split.e2e_s,
        kv_transfer_s=split.kv_transfer_s,
    )
