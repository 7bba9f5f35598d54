"""Serving metrics under load: TTFT, TPOT and E2E (mean, p50, p95, p99), utilisation, tokens/s.

Composes the mixed-iteration step time (``_batching``) with closed-form queueing (``_queueing``)
for an iteration-level engine (Orca; vLLM; Sarathi-Serve chunked prefill):

1. Decode batch, by Little's law: n_d = lambda (E[O] - 1) TPOT, capped by ``seat_capacity``.
2. TPOT: every iteration decodes each running sequence once; a prompt P adds Delta(P) seconds of
   prefill work to the iterations it rides in (chunked: a mixture of decode-only and
   prefill-carrying iterations) or its own prefill-only iteration (unchunked), solved jointly
   with (1) by fixed-point iteration (``_steady_state``).
3. TTFT = residual of the running iteration + queue wait + own prefill.  The prefill path is a
   G/G/1 queue (Kingman); the running slots a diffusion of the running count with the TPOT
   feedback (``_serving_tail``); a long prompt ahead delays every short one behind it through
   E[S^2] (head-of-line blocking).
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
import numpy as np

from ._batching import DecodeCost, EngineConfig
from ._closed_loop import closed_loop_metrics
from ._memory import max_concurrent_requests
from ._queueing import replica_arrival_scv
from ._serving_tail import (  # noqa: F401  (re-exported: the dynamics layer's names)
    CORRECTIONS,
    OUTPUT_NODES,
    PROMPT_NODES,
    QUANTILES,
    LoadPoint,
    Percentiles,
    open_loop,
)
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec
from ._step import forward_step
from ._workload import Workload

Array = jnp.ndarray

QUEUEING_CODE = 4
"""``binding_budget`` code meaning "queueing": index of "queueing" after ``BINDING_BUDGETS``."""

KV_BOUND_SHARE = 0.99
"""Share of the seats the KV cache holds that the mean decode batch must fill for memory
capacity to be the binding budget (a batch that fills them cannot grow)."""


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


def _binding(model, hardware, deployment, efficiency, workload, out, temperature, cached=0.0):
    s = out["steady"]
    ctx_d = workload.prompt_tokens_mean + workload.output_tokens_mean / 2.0
    prefill_per_iter = out["rate"] * workload.prompt_tokens_mean * s.tpot
    step = forward_step(
        model,
        hardware,
        deployment,
        efficiency,
        prefill_tokens=prefill_per_iter,
        prefill_seqs=jnp.minimum(prefill_per_iter, 1.0),
        decode_seqs=s.n_d,
        decode_context=ctx_d + cached,
        temperature=temperature,
    )
    time_code = jnp.argmax(jnp.stack([step.compute_s, step.memory_s, step.comm_s]), axis=0) + 1
    kv_seats = max_concurrent_requests(model, hardware, deployment, ctx_d, temperature)
    kv_bound = s.n_d >= KV_BOUND_SHARE * jnp.minimum(kv_seats, deployment.max_num_seqs) - 1e-9
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
    decode_cost: DecodeCost | None = None,
    means_only: bool = False,
    closed_loop: bool | None = None,
    quadrature_nodes: tuple[int, int] = (PROMPT_NODES, OUTPUT_NODES),
) -> ServingMetrics:
    """TTFT/TPOT/E2E percentiles, utilisation and throughput of ``deployment`` under ``workload``.

    Args:
        model, hardware, deployment, efficiency: the static budgets (``perfmodel``).
        workload: offered load on all replicas; ``concurrency > 0`` is a closed loop
            (``_closed_loop``: N requests in flight, never overloaded).
        chunked_prefill: Sarathi-style chunked prefill (True) or prefill-only iterations.
        chunk_tokens: cap on one sequence's prefill chunk (None = the token budget).
        temperature: smoothing of the hard min/max laws (0 = exact).
        decode_cost: ``DecodeCost`` of a decode iteration (a cached prefix read by every decode,
            with ``workload`` prompts then the uncached tokens; speculative draft + verify with E
            tokens per iteration).  None = plain decoding.
        means_only: skip the percentile quadrature (p50/p95/p99 come back NaN, the means and
            every other field as usual): for callers that read means only (calibration rows).
        closed_loop: force the closed (True) or open (False) loop; None decides from
            ``workload.concurrency`` (a traced concurrency, e.g. under ``vmap``, means closed).
        quadrature_nodes: equal-probability (prompt, output) length nodes of the open loop's
            quadrature; fewer is the same physics, cheaper and coarser in the length tails.

    Returns:
        ``ServingMetrics``; compiled once per (static options, shapes) with ``eqx.filter_jit``,
        and usable inside ``jit``, ``vmap`` and ``grad`` (finite gradients in the continuous
        leaves, also at the kinks and under overload).
    """
    # a concrete open-loop workload skips tracing the closed-loop rate solve; the test is made on
    # the leaf itself (numpy), since inside a jit trace every jnp op is staged, even on constants
    concurrency = workload.concurrency
    if closed_loop is not None:
        closed_loop = bool(closed_loop)
    elif isinstance(concurrency, jax.core.Tracer):
        closed_loop = True
    else:
        closed_loop = bool(np.any(np.asarray(concurrency) > 0))
    return _serving_metrics(
        model,
        hardware,
        deployment,
        efficiency,
        workload,
        chunked_prefill,
        chunk_tokens,
        temperature,
        closed_loop,
        DecodeCost() if decode_cost is None else decode_cost,
        means_only,
        (int(quadrature_nodes[0]), int(quadrature_nodes[1])),
    )


@eqx.filter_jit
def _serving_metrics(
    model,
    hardware,
    deployment,
    efficiency,
    workload,
    chunked_prefill,
    chunk_tokens,
    temperature,
    closed_loop,
    decode_cost,
    means_only,
    quadrature_nodes,
):
    return _serving_metrics_impl(
        model,
        hardware,
        deployment,
        efficiency,
        workload,
        chunked_prefill=chunked_prefill,
        chunk_tokens=chunk_tokens,
        temperature=temperature,
        closed_loop=closed_loop,
        decode_cost=decode_cost,
        means_only=means_only,
        quadrature_nodes=quadrature_nodes,
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
    decode_cost: DecodeCost | None = None,
    means_only: bool = False,
    quadrature_nodes: tuple[int, int] = (PROMPT_NODES, OUTPUT_NODES),
) -> ServingMetrics:
    config = EngineConfig(
        chunked_prefill=chunked_prefill,
        chunk_tokens=float("inf") if chunk_tokens is None else chunk_tokens,
    )
    replicas = jnp.maximum(deployment.replicas, 1.0)
    ca2 = replica_arrival_scv(workload.interarrival_cv, replicas)

    point = LoadPoint(
        model=model,
        hardware=hardware,
        deployment=deployment,
        efficiency=efficiency,
        workload=workload,
        config=config,
        cost=DecodeCost() if decode_cost is None else decode_cost,
        ca2=ca2,
        corrections=corrections,
        temperature=temperature,
        nodes=quadrature_nodes,
    )

    def run(rate, means_only=means_only):
        return open_loop(point, rate, means_only)

    rate_open = workload.arrival_rate_per_s / replicas
    if not closed_loop:
        return _finish(point, replicas, run(rate_open))
    return _closed_loop_serving(
        model, hardware, deployment, efficiency, workload, point.cost, temperature
    )


def _percentiles(summary: Array) -> Percentiles:
    """(mean, p50, p90, p95, p99) of ``closed_loop_metrics`` as a ``Percentiles``."""
    return Percentiles(mean=summary[0], p50=summary[1], p95=summary[3], p99=summary[4])


def _closed_loop_serving(model, hardware, deployment, efficiency, workload, cost, temperature):
    """``ServingMetrics`` of a closed loop (``_closed_loop``: never overloaded, always stable).

    ``utilization`` is the running-seat occupancy n / seats; ``binding_budget`` is "queueing"
    when requests wait for a seat, "memory capacity" when the KV cache (not ``max_num_seqs``)
    sets the seats and they are full, else the budget binding the mean iteration."""
    cached = cost.cached_prompt_tokens
    uncached = eqx.tree_at(
        lambda w: w.prompt_tokens_mean,
        workload,
        jnp.maximum(workload.prompt_tokens_mean - cached, 1.0),
    )
    m = closed_loop_metrics(
        model, hardware, deployment, efficiency, uncached, tokens_per_decode=cost.tokens_per_step()
    )
    s = m.state
    seats_kv = max_concurrent_requests(
        model,
        hardware,
        deployment,
        workload.prompt_tokens_mean + workload.output_tokens_mean,
        temperature,
    )
    seats = jnp.minimum(seats_kv, deployment.max_num_seqs)
    step = forward_step(
        model,
        hardware,
        deployment,
        efficiency,
        prefill_tokens=s.prefill_tokens_per_iteration,
        prefill_seqs=s.prompts_per_iteration,
        decode_seqs=s.decode_batch,
        decode_context=workload.prompt_tokens_mean + workload.output_tokens_mean / 2.0,
    )
    time_code = jnp.argmax(jnp.stack([step.compute_s, step.memory_s, step.comm_s]), axis=0) + 1
    kv_bound = (seats_kv < deployment.max_num_seqs) & (s.admitted >= seats - 1e-9)
    code = jnp.where(s.waiting > 0, QUEUEING_CODE, jnp.where(kv_bound, 0, time_code))
    return ServingMetrics(
        ttft_s=_percentiles(m.ttft_s),
        tpot_s=_percentiles(m.tpot_s),
        e2e_s=_percentiles(m.e2e_s),
        utilization=s.admitted / jnp.maximum(seats, 1e-9),
        stable=jnp.asarray(True),
        output_tokens_per_s=m.output_tokens_per_s,
        decode_batch=s.decode_batch,
        binding_budget=code,
    )


def _finish(point, replicas, out):
    workload = point.workload
    rate = out["rate"]
    offered = rate * out["accepted"] * workload.output_tokens_mean  # rejected prompts: no tokens
    tokens = replicas * jnp.where(out["stable"], offered, jnp.minimum(offered, out["capacity"]))
    return ServingMetrics(
        ttft_s=out["ttft"],
        tpot_s=out["tpot"],
        e2e_s=out["e2e"],
        utilization=out["utilization"],
        stable=out["stable"],
        output_tokens_per_s=tokens,
        decode_batch=out["steady"].n_d,
        binding_budget=_binding(
            point.model,
            point.hardware,
            point.deployment,
            point.efficiency,
            workload,
            out,
            point.temperature,
            point.cost.cached_prompt_tokens,
        ),
    )
