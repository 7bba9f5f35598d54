"""Serving metrics under load: TTFT, TPOT and E2E (mean, p50, p95, p99), utilisation, tokens/s.

Composes the mixed-iteration step time (``_batching``) with closed-form queueing (``_queueing``)
for an iteration-level engine (Orca; vLLM; Sarathi-Serve chunked prefill):

1. Decode batch, by Little's law: n_d = lambda (E[O] - 1) TPOT, capped by ``seat_capacity``.
2. TPOT: every iteration decodes each running sequence once; a prompt P adds Delta(P) seconds of
   prefill work to the iterations it rides in (chunked) or its own prefill-only iteration
   (unchunked), so the mean gap is TPOT = tau_d(n_d) / (1 - lambda E[Delta]), solved jointly with
   (1) by fixed-point iteration.  Per request, the prefill work landing in its (O - 1) gaps is
   compound-Poisson: Var(TPOT | O) = c_a^2 lambda TPOT E[Delta^2] / (O - 1).
3. TTFT = residual of the running iteration + queue wait + own prefill.  The prefill path is a
   G/G/1 queue whose backlogged server drains ``prefill_budget_tokens`` per full iteration
   (Kingman), plus a G/G/c queue for the c = seat_capacity running slots (Allen-Cunneen); the
   wait has the exponential tail P(W > t) = p exp(-t p / W); a long prompt ahead delays every
   short one behind it through E[S^2] (head-of-line blocking).
4. E2E = TTFT + (O - 1) TPOT.  Quantiles come from equal-probability nodes of the lognormal
   lengths convolved with the wait law (``wait_plus_quantile_s``).

Utilisation = max(prefill-server rho, seat rho, work rho = lambda E[O] / saturated tokens/s of a
full iteration, the batch-service view); at >= 1 the metrics are ``inf`` with
``stable = False``.  Arrival rate and burstiness are split evenly over ``deployment.replicas``.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ._batching import EngineConfig, saturated_output_tokens_per_s
from ._memory import max_concurrent_requests
from ._queueing import (
    allen_cunneen_wait_s,
    ggc_wait_probability,
    kingman_wait_s,
    lognormal_mixture_quantile,
    lognormal_nodes,
    solve_quantile,
    wait_plus_quantile_s,
)
from ._smooth import smooth_max
from ._steady_state import prompt_nodes, steady_state, tail_ratio
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec
from ._step import forward_step
from ._workload import Workload

Array = jnp.ndarray

QUANTILES: tuple[float, float, float] = (0.5, 0.95, 0.99)
"""Reported quantiles, in the order p50, p95, p99."""

PROMPT_NODES = 64
"""Equal-probability nodes of the prompt-length lognormal (p99 lies inside the last node)."""
OUTPUT_NODES = 32
"""Equal-probability nodes of the output-length lognormal."""
CORRECTIONS: tuple[float, float, float, float] = (0.0, 0.0, 30.0, 0.3)
"""Discrepancy terms against the simulator (Kennedy & O'Hagan 2001 style), in order:

* ``wait_cs2_gain`` a and ``wait_load_gain`` b: the queue wait (mean and tail) is scaled by
  1 + a c_s^2 + b rho (c_s^2 the prefill-service SCV, rho the utilisation).  Both 0: a least-squares
  fit (``benchmarks/fit_queueing_corrections.py``) moved them to (0.49, 0.02) but made the held-out
  pair's p95 TTFT worse (68 % -> 40 % of points within 15 %), so they are not used.
* ``tpot_batch_gain`` c: weight of the decode-batch fluctuation term of Var(TPOT | O),
  c (dTPOT/dn_d)^2 n_d o / (o + O - 1) (the batch a request shares drifts over its life);
* ``tpot_load_gain`` d: mean TPOT is scaled by 1 + d rho_slots^2 (the decode batch fluctuating
  against its cap at high load, which a mean-field fixed point misses).

c = 30, d = 0.3 were chosen by a scan (c in {0, 10, 30, 60, 120}, d in {0, 0.3}) on the
Llama-3.1-8B / h100-sxm half of the ``bench_queueing_vs_sim.py`` grid (10,000 requests a point):
p95 TPOT within 15 % went 53 % -> 73 % there and 33 % -> 40 % on the held-out
Llama-2-70b / a100-sxm-80gb TP4 half."""
QUEUEING_CODE = 4
"""``binding_budget`` code meaning "queueing": index of "queueing" after ``BINDING_BUDGETS``."""


class Percentiles(eqx.Module):
    """Summary of a latency distribution across requests, seconds."""

    mean: Array
    p50: Array
    p95: Array
    p99: Array


class ServingMetrics(eqx.Module):
    """What a user feels under the workload; latencies are ``inf`` when ``stable`` is False.

    Attributes:
        ttft_s: time to first token.
        tpot_s: time per output token after the first (per-request mean gap).
        e2e_s: end-to-end latency.
        utilization: max of the prefill-server and running-slot utilisations (>= 1: overload).
        stable: utilization < 1 and at least one request fits.
        output_tokens_per_s: generated tokens/s of all replicas; when overloaded, the saturated
            (full-iteration) capacity ``saturated_output_tokens_per_s``.
        decode_batch: mean sequences decoding per iteration (one replica).
        binding_budget: index into ``BINDING_BUDGETS + ("queueing",)``.
    """

    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    utilization: Array
    stable: Array
    output_tokens_per_s: Array
    decode_batch: Array
    binding_budget: Array


def _pct(mean, quantiles, stable):
    """``quantiles``: last axis is (p50, p95, p99)."""
    inf = jnp.inf
    quantiles = [quantiles[..., i] for i in range(3)]
    return Percentiles(
        mean=jnp.where(stable, mean, inf),
        p50=jnp.where(stable, quantiles[0], inf),
        p95=jnp.where(stable, quantiles[1], inf),
        p99=jnp.where(stable, quantiles[2], inf),
    )


def _open_loop(
    model, hardware, deployment, efficiency, workload, config, rate, ca2, temperature,
    quantiles=True, corrections=None,
):
    a, b, c, d = (jnp.asarray(CORRECTIONS) if corrections is None else corrections)
    p_nodes = prompt_nodes(workload.prompt_tokens_mean, workload.prompt_tokens_cv, PROMPT_NODES)
    tail = tail_ratio(p_nodes, workload.prompt_tokens_mean, workload.prompt_tokens_cv)
    o_nodes = lognormal_nodes(workload.output_tokens_mean, workload.output_tokens_cv, OUTPUT_NODES)
    o_mean = workload.output_tokens_mean
    s = steady_state(
        model, hardware, deployment, efficiency, config, rate, p_nodes, o_mean, temperature, tail
    )
    o_dec_nodes = jnp.maximum(o_nodes - 1.0, 0.0)

    # prefill server (G/G/1, Kingman) and running slots (G/G/c, Allen-Cunneen)
    busy_mean = jnp.mean(s.busy)
    cs2_p = jnp.var(s.busy) * tail / jnp.square(busy_mean)
    resid_time = jnp.mean(s.own) + jnp.mean(o_dec_nodes) * s.tpot
    resid_var = jnp.var(s.own) * tail + jnp.var(o_dec_nodes) * jnp.square(s.tpot)
    rho_s = rate * resid_time / jnp.maximum(s.seats, 1e-9)
    capacity = saturated_output_tokens_per_s(
        model, hardware, deployment, efficiency,
        workload.prompt_tokens_mean, workload.output_tokens_mean, temperature,
    )
    rho_w = rate * workload.output_tokens_mean / capacity
    utilization = smooth_max(smooth_max(s.rho_p, rho_s, temperature), rho_w, temperature)
    stable = (utilization < 1.0) & (s.seats >= 1.0)
    rho_p = jnp.where(stable, s.rho_p, 0.5)
    rho_s = jnp.where(stable, rho_s, 0.5)
    w_p = kingman_wait_s(rho_p, ca2, cs2_p, busy_mean)
    w_s = allen_cunneen_wait_s(rho_s, s.seats, ca2, resid_var / jnp.square(resid_time), resid_time)
    wait = (w_p + w_s) * (1.0 + a * cs2_p + b * utilization)
    p_wait = jnp.clip(jnp.maximum(rho_p, ggc_wait_probability(rho_s, s.seats)), 1e-9, 1.0)
    w_cond = wait / p_wait
    residual = -jnp.expm1(-s.n_d) * s.tau_d / 2.0
    tpot = s.tpot * (1.0 + d * jnp.square(jnp.minimum(rho_s, 1.0)))

    ttft_mean = residual + wait + jnp.mean(s.own)
    e2e_mean = ttft_mean + jnp.mean(o_dec_nodes) * tpot
    if not quantiles:  # means only (the closed-loop rate solve)
        return dict(e2e=_pct(e2e_mean, jnp.stack([e2e_mean] * 3, axis=-1), stable))
    ttft_nodes = residual + s.own
    e2e_nodes = (ttft_nodes[:, None] + o_dec_nodes[None, :] * tpot).reshape(-1)
    qs = jnp.asarray(QUANTILES)
    ttft_q = wait_plus_quantile_s(ttft_nodes, p_wait[..., None], w_cond[..., None], qs)
    e2e_q = wait_plus_quantile_s(e2e_nodes, p_wait[..., None], w_cond[..., None], qs)
    gaps = jnp.maximum(o_dec_nodes, 1.0)
    # compound-Poisson prefill work in the request's gaps, plus the decode batch it shares:
    # n_d is Poisson-like (M/G/infinity, variance n_d), averaged over the request's life against
    # a correlation time of one mean life (weight o / (o + gaps)); scaled by the fitted gain c
    o_bar = jnp.mean(o_dec_nodes)
    tpot_var = ca2 * rate * tpot * s.delta2 / gaps + c * jnp.square(s.slope) * s.n_d * o_bar / (
        o_bar + gaps
    )
    tpot_means = jnp.broadcast_to(tpot, gaps.shape)
    tpot_q = lognormal_mixture_quantile(tpot_means, tpot_var, qs)
    return dict(
        ttft=_pct(ttft_mean, ttft_q, stable),
        tpot=_pct(tpot, tpot_q, stable),
        e2e=_pct(e2e_mean, e2e_q, stable),
        utilization=utilization, stable=stable, steady=s, wait=wait, rate=rate, capacity=capacity,
    )


def _binding(model, hardware, deployment, efficiency, workload, out, temperature):
    s = out["steady"]
    ctx_d = workload.prompt_tokens_mean + workload.output_tokens_mean / 2.0
    prefill_per_iter = out["rate"] * workload.prompt_tokens_mean * s.tpot
    step = forward_step(
        model, hardware, deployment, efficiency,
        prefill_tokens=prefill_per_iter, prefill_seqs=jnp.minimum(prefill_per_iter, 1.0),
        decode_seqs=s.n_d, decode_context=ctx_d, temperature=temperature,
    )
    time_code = jnp.argmax(jnp.stack([step.compute_s, step.memory_s, step.comm_s]), axis=0) + 1
    kv_seats = max_concurrent_requests(model, hardware, deployment, ctx_d, temperature)
    kv_bound = s.n_d >= 0.99 * jnp.minimum(kv_seats, deployment.max_num_seqs) - 1e-9
    kv_bound = kv_bound & (kv_seats < deployment.max_num_seqs)
    queue_bound = (~out["stable"]) | (out["wait"] > jnp.mean(s.own))
    return jnp.where(queue_bound, QUEUEING_CODE, jnp.where(kv_bound, 0, time_code))


def serving_metrics(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    workload: Workload,
    *,
    chunked_prefill: bool = True,
    chunk_tokens: float | None = None,
    temperature: float = 0.0,
) -> ServingMetrics:
    """TTFT/TPOT/E2E percentiles, utilisation and throughput of ``deployment`` under ``workload``.

    Args:
        model, hardware, deployment, efficiency: the static budgets (``perfmodel``).
        workload: offered load on all replicas; ``concurrency > 0`` is a closed loop whose rate
            solves N = lambda E[E2E(lambda)] (Little's law, zero think time).
        chunked_prefill: Sarathi-style chunked prefill (True) or prefill-only iterations.
        chunk_tokens: cap on one sequence's prefill chunk (None = the token budget).
        temperature: smoothing of the hard min/max laws (0 = exact).

    Returns:
        ``ServingMetrics``; compiled once per (static options, shapes) with ``eqx.filter_jit``,
        and usable inside ``jit``, ``vmap`` and ``grad`` (finite gradients in the continuous
        leaves, also at the kinks and under overload).
    """
    try:  # a concrete open-loop workload skips tracing the closed-loop rate solve
        closed_loop = bool(jnp.any(jnp.asarray(workload.concurrency) > 0))
    except jax.errors.ConcretizationTypeError:
        closed_loop = True
    return _serving_metrics(
        model, hardware, deployment, efficiency, workload,
        chunked_prefill, chunk_tokens, temperature, closed_loop,
    )


@eqx.filter_jit
def _serving_metrics(
    model, hardware, deployment, efficiency, workload, chunked_prefill, chunk_tokens, temperature,
    closed_loop,
):
    return _serving_metrics_impl(
        model, hardware, deployment, efficiency, workload,
        chunked_prefill=chunked_prefill, chunk_tokens=chunk_tokens, temperature=temperature,
        closed_loop=closed_loop,
    )


def _serving_metrics_impl(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    workload: Workload,
    *,
    chunked_prefill: bool = True,
    chunk_tokens: float | None = None,
    temperature: float = 0.0,
    closed_loop: bool = True,
    corrections=None,
) -> ServingMetrics:
    config = EngineConfig(
        chunked_prefill=chunked_prefill,
        chunk_tokens=float("inf") if chunk_tokens is None else chunk_tokens,
    )
    replicas = jnp.maximum(deployment.replicas, 1.0)
    ca2 = 1.0 - 1.0 / replicas + jnp.square(workload.interarrival_cv) / replicas

    def run(rate, quantiles=True):
        return _open_loop(
            model, hardware, deployment, efficiency, workload, config, rate, ca2, temperature,
            quantiles, corrections,
        )

    rate_open = workload.arrival_rate_per_s / replicas
    if not closed_loop:
        return _finish(model, hardware, deployment, efficiency, workload, replicas, run(rate_open), temperature)
    # closed loop: per-replica N / replicas = rate * E[E2E(rate)]
    n_per = jnp.maximum(workload.concurrency, 0.0) / replicas
    closed = n_per > 0
    n_safe = jnp.where(closed, n_per, 1.0)
    e2e_idle = run(jnp.asarray(1e-12) * n_safe, False)["e2e"].mean

    def in_flight(rate):
        e2e = run(rate, False)["e2e"].mean
        return jnp.where(jnp.isfinite(e2e), rate * e2e, 2.0 * n_safe + 1.0)

    rate_closed = solve_quantile(in_flight, n_safe, 0.0, n_safe / e2e_idle, iters=48)
    rate = jnp.where(closed, rate_closed, rate_open)
    return _finish(model, hardware, deployment, efficiency, workload, replicas, run(rate), temperature)


def _finish(model, hardware, deployment, efficiency, workload, replicas, out, temperature):
    rate = out["rate"]
    offered = rate * workload.output_tokens_mean
    tokens = replicas * jnp.where(out["stable"], offered, jnp.minimum(offered, out["capacity"]))
    return ServingMetrics(
        ttft_s=out["ttft"],
        tpot_s=out["tpot"],
        e2e_s=out["e2e"],
        utilization=out["utilization"],
        stable=out["stable"],
        output_tokens_per_s=tokens,
        decode_batch=out["steady"].n_d,
        binding_budget=_binding(model, hardware, deployment, efficiency, workload, out, temperature),
    )
