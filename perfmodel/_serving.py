"""Serving metrics under load: TTFT, TPOT, ITL and E2E percentiles, utilisation, tokens/s.

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
The words ``utilization``, ``stable``, ``seat_occupancy``, ``kv_bound``, ``queue_bound`` and
``binding_budget`` are defined once, on ``ServingMetrics`` (README, Glossary).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._batching import DecodeCost, EngineConfig
from ._closed_loop import closed_loop_metrics, closed_loop_state, loop_seats
from ._floors import COUNT_FLOOR, POSITIVE_FLOOR
from ._memory import max_concurrent_requests
from ._polling import PollWait, open_loop_busy_probability, poll_wait
from ._queueing import replica_arrival_scv
from ._serving_tail import (  # noqa: F401  (re-exported: the dynamics layer's names)
    CORRECTIONS,
    OUTPUT_NODES,
    PERCENTILE_QUANTILES,
    PROMPT_NODES,
    QUANTILES,
    LoadPoint,
    OpenLoop,
    Percentiles,
    open_loop,
)
from ._sheet import binding_budget
from ._specs import (
    Deployment,
    Efficiency,
    System,
    strongly_typed,
    without_names,
)
from ._types import Array
from ._workload import Workload

KV_BOUND_OCCUPANCY = 0.9
"""Seat occupancy at or above which a KV-limited replica is called KV-bound: at 90 % of the
seats the running count's fluctuations (about sqrt(n) sequences) reach the cap often, so
arrivals start to wait for KV blocks to free."""


def is_kv_bound(kv_seats: Array, deployment: Deployment, seat_occupancy: Array) -> Array:
    """KV-bound: the KV cache, not the sequence cap or the token budget, caps the running
    sequences (kv_seats < min(``max_num_seqs``, ``max_num_batched_tokens``)) and this load fills
    that cap (seat_occupancy >= ``KV_BOUND_OCCUPANCY``).

    Both conditions: a cache that could cap the batch but holds a few sequences is not what
    limits this load, and a full batch capped by ``max_num_seqs`` is bound by that setting.
    """
    caps = jnp.minimum(deployment.max_num_seqs, deployment.max_num_batched_tokens)
    return (kv_seats < caps) & (seat_occupancy >= KV_BOUND_OCCUPANCY)


class ServingMetrics(eqx.Module):
    """What a user feels under the workload; latencies are ``inf`` when ``stable`` is False.

    The latencies are the load model's times the engine's fitted end-to-end offsets
    (``engine_scaled``: ``Efficiency.ttft_scale`` / ``tpot_scale``, 1 for the physics alone).

    Attributes:
        ttft_s: time to first token.
        tpot_s: time per output token after the first (per-request mean gap).
        itl_s: inter-token latency, one gap between consecutive tokens of a request (over
            gaps, not requests: a gap that holds prefill work is one of them, not averaged
            away), per token under speculation.
        e2e_s: end-to-end latency.
        utilization: the share of one replica's serving capacity the load uses.  Open loop,
            the largest of three ratios of offered work to what a resource serves (lambda the
            offered rate per replica): the prefill server, rho_p = lambda E[prefill time]; the
            running seats, rho_s = lambda E[residence with every seat busy] / seats; whole
            iterations, rho_w = lambda E[O] / C, C the saturated output tokens/s of full
            iterations (``saturated_output_tokens_per_s``).  < 1 when stable; >= 1 it is the
            factor by which the load exceeds capacity.  Closed loop, X(N) / X(seats): the
            completion rate over that of the same loop with every seat held, in (0, 1] (N
            clients never offer more than the engine serves).
        stable: the queue stays finite.  Open loop: utilization < 1 and at least one sequence
            fits.  Closed loop: always True.
        seats: sequences one replica can run at once, min(KV seats, ``max_num_seqs``) (open
            loop also the token budget; KV seats at the mean decode context open loop, at
            P + O closed loop, as each loop's queueing prices them).
        seat_occupancy: mean running sequences / ``seats``, in [0, 1].  Open loop: Little's
            law n = lambda E[residence] over the seats; unstable, rho_s / utilization (the
            engine serves lambda / utilization).  Closed loop: admitted / seats, admitted =
            min(N / replicas, seats).
        output_tokens_per_s: generated tokens/s of all replicas; when overloaded, the saturated
            (full-iteration) capacity ``saturated_output_tokens_per_s``.
        decode_batch: mean sequences decoding per iteration (one replica).
        binding_budget: the budget that limits capacity at the workload's mean lengths, an
            index into ``BINDING_BUDGETS`` (``perfmodel.binding_budget``, the budget sheet's
            rule; the same with or without a load).
        queue_bound: requests queue for service.  Open loop: unstable, or the mean wait exceeds
            the mean own prefill time; closed loop: clients wait for a seat (N / replicas >
            seats).
        kv_bound: ``is_kv_bound``: the KV cache caps the running sequences and this load fills
            at least ``KV_BOUND_OCCUPANCY`` of them.
    """

    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    itl_s: Percentiles
    utilization: Array
    stable: Array
    seats: Array
    seat_occupancy: Array
    output_tokens_per_s: Array
    decode_batch: Array
    binding_budget: Array
    queue_bound: Array
    kv_bound: Array


def _binding(system: System, workload):
    return binding_budget(system, workload.prompt_tokens_mean, workload.output_tokens_mean)


def is_closed_loop(workload: Workload) -> bool:
    """Whether ``serving_metrics`` treats ``workload`` as a closed loop: ``concurrency > 0``, or a
    traced concurrency (e.g. under ``vmap``).  A concrete open-loop workload skips tracing the
    closed-loop rate solve; the test is made on the leaf itself (numpy), since inside a jit trace
    every jnp op is staged, even on constants."""
    concurrency = workload.concurrency
    if isinstance(concurrency, jax.core.Tracer):
        return True
    return bool(np.any(np.asarray(concurrency) > 0))


def serving_metrics(
    system: System,
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
    """TTFT/TPOT/ITL/E2E percentiles, utilisation and throughput of ``deployment`` under ``workload``.

    Args:
        system: the model, GPU, deployment and efficiencies served.
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
    closed_loop = is_closed_loop(workload) if closed_loop is None else bool(closed_loop)
    system, workload, decode_cost = strongly_typed(  # one program per structure, not per name
        without_names((system, workload, DecodeCost() if decode_cost is None else decode_cost))
    )
    return _serving_metrics(
        system,
        workload,
        chunked_prefill=chunked_prefill,
        chunk_tokens=chunk_tokens,
        temperature=temperature,
        closed_loop=closed_loop,
        decode_cost=decode_cost,
        means_only=means_only,
        quadrature_nodes=(int(quadrature_nodes[0]), int(quadrature_nodes[1])),
    )


@eqx.filter_jit
def _serving_metrics(system: System, workload: Workload, **options) -> ServingMetrics:
    """``serving_metrics``' compiled body (one program per static options and shapes): the load
    model with its fitted corrections under ``options`` (``serving_metrics_with_corrections``'
    keywords), as the engine delivers it (``engine_scaled``)."""
    physics = serving_metrics_with_corrections(system, workload, **options)
    return engine_scaled(physics, system.efficiency, options["closed_loop"])


def _scaled(p: Percentiles, factor: Array) -> Percentiles:
    """Every latency times ``factor``; an infinite one (overloaded) stays inf with a zero
    gradient (the product is taken on a finite stand-in, so no inf * 0 reaches a derivative)."""

    def scale(x):
        finite = jnp.isfinite(x)
        return jnp.where(finite, jnp.where(finite, x, 0.0) * factor, x)

    return jax.tree.map(scale, p)


def engine_scaled(m: ServingMetrics, efficiency: Efficiency, closed_loop: bool) -> ServingMetrics:
    """The load model's latencies as a serving engine delivers them to its clients.

    TTFT x ``efficiency.ttft_scale``, TPOT and each inter-token gap x ``tpot_scale`` (the
    engines' fitted discrepancy from the physics, Kennedy & O'Hagan 2001); E2E = TTFT +
    (O - 1) TPOT, so its mean becomes s_f TTFT + s_t (E2E - TTFT) and its percentiles move by
    the same ratio r; a closed loop of N clients then completes X' = X / r (Little's law
    N = X E[E2E]), so its throughput falls by r.  The open loop's throughput is the offered rate
    (unchanged).  Scales of 1 return the physics unchanged (the calibration's own rows)."""
    s_f, s_t = efficiency.ttft_scale, efficiency.tpot_scale
    finite = jnp.isfinite(m.e2e_s.mean) & (m.e2e_s.mean > 0.0)
    ttft = jnp.where(finite, m.ttft_s.mean, 0.0)
    e2e = jnp.where(finite, m.e2e_s.mean, 1.0)
    # exactly 1 at unit scales: (s_f - 1) TTFT + (s_t - 1) (E2E - TTFT) is the added mean E2E
    ratio = 1.0 + ((s_f - 1.0) * ttft + (s_t - 1.0) * (e2e - ttft)) / e2e
    tokens = m.output_tokens_per_s / ratio if closed_loop else m.output_tokens_per_s
    return dataclasses.replace(
        m,
        ttft_s=_scaled(m.ttft_s, s_f),
        tpot_s=_scaled(m.tpot_s, s_t),
        itl_s=_scaled(m.itl_s, s_t),
        e2e_s=_scaled(m.e2e_s, ratio),
        output_tokens_per_s=tokens,
    )


def serving_metrics_with_corrections(
    system: System,
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
    deployment = system.deployment
    config = EngineConfig(
        chunked_prefill=chunked_prefill,
        chunk_tokens=float("inf") if chunk_tokens is None else chunk_tokens,
    )
    replicas = jnp.maximum(deployment.replicas, 1.0)
    ca2 = replica_arrival_scv(workload.interarrival_cv, replicas)

    point = LoadPoint(
        system=system,
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
    return _closed_loop_serving(system, workload, point.cost)


def _percentiles(summary: Array) -> Percentiles:
    """(mean, p50, p90, p95, p99) of ``closed_loop_metrics`` as a ``Percentiles``."""
    return Percentiles(
        mean=summary[0], p50=summary[1], p90=summary[2], p95=summary[3], p99=summary[4]
    )


def _closed_loop_serving(system: System, workload, cost):
    """``ServingMetrics`` of a closed loop (``_closed_loop``: never overloaded, always stable).

    ``utilization`` = X(N) / X(seats): the loop's completion rate per replica over the rate of
    the same loop with every seat held (its capacity: more clients only wait for a seat);
    ``seat_occupancy`` = admitted / seats, n = min(N / replicas, seats).

    ``workload`` holds the prompts the prefill path serves, as the open loop's does: with a prefix
    cache, the uncached ones (``perfmodel.features.prefix_workload``).  The closed loop's steps
    do not read the cached prefix's KV (``cost.cached_prompt_tokens``): its TPOT leaves out that
    read (a few per cent at thousands of cached tokens)."""
    model, hardware, deployment = system.model, system.hardware, system.deployment
    uncached = workload
    m = closed_loop_metrics(system, uncached, tokens_per_decode=cost.tokens_per_step())
    s = m.state
    seats_kv, seats = loop_seats(model, hardware, deployment, uncached)
    occupancy = s.admitted / jnp.maximum(seats, COUNT_FLOOR)
    # capacity: the same loop with a client on every seat (its throughput cannot grow further)
    replicas = jnp.maximum(deployment.replicas, 1.0)
    full = eqx.tree_at(lambda w: w.concurrency, uncached, seats * replicas)
    capacity = closed_loop_state(
        system, full, tokens_per_decode=cost.tokens_per_step()
    ).completion_rate_per_s
    return ServingMetrics(
        ttft_s=_percentiles(m.ttft_s),
        tpot_s=_percentiles(m.tpot_s),
        e2e_s=_percentiles(m.e2e_s),
        itl_s=_percentiles(m.itl_s),
        # <= 1 up to the rounding of the two fixed-point solves
        utilization=jnp.minimum(
            s.completion_rate_per_s / jnp.maximum(capacity, POSITIVE_FLOOR), 1.0
        ),
        stable=jnp.asarray(True),
        seats=seats,
        seat_occupancy=occupancy,
        output_tokens_per_s=m.output_tokens_per_s,
        decode_batch=s.decode_batch,
        binding_budget=_binding(system, workload),
        queue_bound=s.waiting > 0,
        kv_bound=is_kv_bound(seats_kv, deployment, occupancy),
    )


def _with_poll_wait(p: Percentiles, poll: PollWait) -> Percentiles:
    """A latency with the scheduler's poll wait added: mean + E[W], each percentile by
    ``PollWait.quantile_s``."""
    quantiles = jnp.stack([p.p50, p.p90, p.p95, p.p99], axis=-1)
    q = poll.quantile_s(quantiles, p.mean, PERCENTILE_QUANTILES)
    return Percentiles(
        mean=p.mean + poll.mean_s, p50=q[..., 0], p90=q[..., 1], p95=q[..., 2], p99=q[..., 3]
    )


def _finish(point, replicas, out: OpenLoop):
    workload = point.workload
    deployment = point.system.deployment
    s = out.steady
    # rejected prompts: no tokens
    offered = out.rate_per_s * out.accepted_share * workload.output_tokens_mean
    tokens = replicas * jnp.where(out.stable, offered, jnp.minimum(offered, out.capacity_per_s))
    # the running count by Little's law over the seats the queueing model uses (KV seats at the
    # mean decode context, capped by max_num_seqs and the token budget); overloaded, the engine
    # serves lambda / utilization (its bottleneck at capacity), which holds rho_s / utilization
    # of the seats: all of them when the seats are the bottleneck, fewer when prefill or whole
    # iterations are
    running = out.running_mean / jnp.maximum(s.seats, COUNT_FLOOR)
    saturated = out.seat_load / jnp.maximum(out.utilization, POSITIVE_FLOOR)
    occupancy = jnp.clip(jnp.where(out.stable, running, saturated), 0.0, 1.0)
    kv_seats = max_concurrent_requests(
        point.system.model, point.system.hardware, deployment, s.ctx_d, point.temperature
    )
    # the scheduler's poll delays the first token and so the whole request (``_polling``)
    busy = open_loop_busy_probability(out.running_mean)
    # the poll counts iterations: a speculative one emits E tokens, so it lasts E x the TPOT
    iteration_s = out.tpot_s.mean * point.cost.tokens_per_step()
    poll = poll_wait(deployment.scheduler_polls, iteration_s, busy)
    return ServingMetrics(
        ttft_s=_with_poll_wait(out.ttft_s, poll),
        tpot_s=out.tpot_s,
        e2e_s=_with_poll_wait(out.e2e_s, poll),
        itl_s=out.itl_s,
        utilization=out.utilization,
        stable=out.stable,
        seats=s.seats,
        seat_occupancy=occupancy,
        output_tokens_per_s=tokens,
        decode_batch=s.n_d,
        binding_budget=_binding(point.system, workload),
        queue_bound=(~out.stable) | (out.wait_s > jnp.mean(s.own)),
        kv_bound=is_kv_bound(kv_seats, deployment, occupancy),
    )
