"""Verdicts: the seed's closing questions answered in sentences, each backed by the budgets.

KV-bound or queue-bound?  Decode bandwidth-limited?  Prefix reuse real?  Would PP solve it, or is
prefill/decode interference the issue?  Every sentence quotes the numbers it rests on (memory
budget, decode roofline, the Che prefix-cache hit rate, the colocated interference stretch of
``_disagg``).  Python-level (reports, not traced).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp

from ._disagg import colocated_disaggregation
from ._memory import max_concurrent_requests
from ._reuse import prefix_reuse
from ._serving import KV_BOUND_OCCUPANCY, ServingMetrics, serving_metrics
from ._sheet import decode_tokens_per_s_max
from ._specs import System
from ._step import decode_step
from ._workload import Workload

REAL_PREFIX_SPEEDUP = 1.1
"""Mean prefill speedup from the prefix cache above which reuse is called real (10 %)."""

HARMFUL_INTERFERENCE = 1.2
"""Decode-gap stretch from colocated prefills above which interference is called the issue."""


class VerdictBudgets(eqx.Module):
    """The budgets the verdicts quote, for one deployment at one prompt/output length.

    ``seats``: sequences of ``prompt + output`` tokens the KV cache holds per replica;
    ``decode_batch``: ``max(min(seats, max_num_seqs), 1)``; ``decode_*_s``: the decode step
    (memory, compute, communication, total) at that batch and the mid-output context
    ``prompt + output / 2``;
    ``pp_tokens_per_s`` / ``replica_tokens_per_s``: the decode ceiling with the GPUs doubled as
    pipeline stages or as replicas (0 where not one sequence fits); ``pp_seats``: the seats per
    replica at doubled PP.
    """

    seats: jax.Array
    decode_batch: jax.Array
    decode_memory_s: jax.Array
    decode_compute_s: jax.Array
    decode_comm_s: jax.Array
    decode_total_s: jax.Array
    pp_tokens_per_s: jax.Array
    replica_tokens_per_s: jax.Array
    pp_seats: jax.Array


def verdict_budgets(
    system: System,
    prompt_tokens,
    output_tokens,
) -> VerdictBudgets:
    """The verdicts' budgets as one pure function (jit it once instead of dozens of eager ops):
    ``max_concurrent_requests``, ``decode_step`` and ``decode_tokens_per_s_max`` of the deployment
    and of its two doublings."""
    model, hardware, deployment = system.model, system.hardware, system.deployment
    seats = max_concurrent_requests(model, hardware, deployment, prompt_tokens + output_tokens)
    batch = jnp.maximum(jnp.minimum(seats, deployment.max_num_seqs), 1.0)
    step = decode_step(system, batch, prompt_tokens + output_tokens / 2.0)
    doubled_pp = eqx.tree_at(
        lambda d: (d.pp, d.microbatches), deployment, (deployment.pp * 2.0, deployment.pp * 2.0)
    )
    doubled_rep = eqx.tree_at(lambda d: d.replicas, deployment, deployment.replicas * 2.0)
    tps_rep = decode_tokens_per_s_max(
        dataclasses.replace(system, deployment=doubled_rep), prompt_tokens, output_tokens
    )
    return VerdictBudgets(
        seats=seats,
        decode_batch=batch,
        decode_memory_s=step.memory_s,
        decode_compute_s=step.compute_s,
        decode_comm_s=step.comm_s,
        decode_total_s=step.total_s,
        pp_tokens_per_s=decode_tokens_per_s_max(
            dataclasses.replace(system, deployment=doubled_pp), prompt_tokens, output_tokens
        ),
        replica_tokens_per_s=jnp.where(seats >= 1.0, tps_rep, 0.0),
        pp_seats=max_concurrent_requests(
            model, hardware, doubled_pp, prompt_tokens + output_tokens
        ),
    )


def _percent(x: float) -> str:
    return f"{100.0 * x:.0f}%"


def _kv_or_queue(seats_at_full, cap, m: ServingMetrics | None):
    """KV-bound, queue-bound or neither, by ``ServingMetrics.kv_bound`` and ``queue_bound`` of
    the load (None: no load given, so only what caps the seats can be said)."""
    if seats_at_full < 1.0:
        return "KV-bound: not even one sequence's KV fits next to the weights on this deployment."
    if m is None:
        if seats_at_full < cap:
            return (
                f"KV-limited seats: the KV cache holds {seats_at_full:.0f} sequences per replica, "
                f"below max_num_seqs = {cap:.0f}; KV-bound only under a load that keeps "
                f"{_percent(KV_BOUND_OCCUPANCY)} of them running (give --rate or --concurrency)."
            )
        return (
            f"not KV-bound (the sequence cap binds first): the KV cache holds "
            f"{seats_at_full:.0f} sequences per replica, above max_num_seqs = {cap:.0f}."
        )
    seats = float(m.seats)
    occupancy = float(m.seat_occupancy)
    head = (
        f"{occupancy * seats:.0f} of {seats:.0f} seats per replica run ({_percent(occupancy)}; "
        f"seats: the sequences the KV cache holds, at most max_num_seqs = {cap:.0f})"
    )
    load = f"utilization {float(m.utilization):.2f}" + (
        "" if bool(m.stable) else ", the queue grows without bound"
    )
    if bool(m.kv_bound):
        return f"KV-bound: {head}; {load}."
    if bool(m.queue_bound):
        return f"queue-bound: requests wait for service ({load}); {head}."
    return f"neither: {head}; {load}."


def verdicts(
    system: System,
    *,
    prompt_tokens: float,
    output_tokens: float,
    arrival_rate_per_s: float | None = None,
    shared_fraction: float = 0.0,
    prefix_tokens: float = 0.0,
    workload: Workload | None = None,
    chunked_prefill: bool = True,
    chunk_tokens: float | None = None,
    metrics: ServingMetrics | None = None,
    prefill_interference: float | None = None,
    budgets: VerdictBudgets | None = None,
) -> dict[str, str]:
    """Four sentences: ``kv_or_queue``, ``decode_bandwidth``, ``prefix_reuse``, ``pp_or_interference``.

    The load is ``workload`` (open or closed loop; the scheduler options as
    ``serving_metrics`` takes them), else Poisson arrivals at ``arrival_rate_per_s`` with
    fixed lengths, else none.  ``kv_or_queue`` reads ``ServingMetrics.kv_bound``,
    ``queue_bound``, ``seat_occupancy`` and ``utilization`` of that load: the same numbers
    ``serving_metrics`` gives for it.  A caller that has already computed them passes them
    instead: ``metrics`` (``serving_metrics`` of ``workload`` with these scheduler options) and
    ``prefill_interference`` (``disaggregation``'s, with every pool this deployment, at these
    lengths and ``arrival_rate_per_s``) and ``budgets`` (``verdict_budgets`` at these lengths).
    """
    deployment = system.deployment
    if budgets is None:
        budgets = verdict_budgets(system, prompt_tokens, output_tokens)
    seats = float(budgets.seats)
    cap = float(deployment.max_num_seqs)
    out: dict[str, str] = {}

    if workload is None and arrival_rate_per_s is not None:
        workload = Workload(
            arrival_rate_per_s=arrival_rate_per_s,
            prompt_tokens_mean=prompt_tokens,
            output_tokens_mean=output_tokens,
        )
    m = None
    if workload is not None and seats >= 1.0:
        m = (
            metrics
            if metrics is not None
            else serving_metrics(
                system, workload, chunked_prefill=chunked_prefill, chunk_tokens=chunk_tokens
            )
        )
    out["kv_or_queue"] = _kv_or_queue(seats, cap, m)

    running = float(m.seat_occupancy * m.seats) if m is not None else 0.0
    stretch = 1.0
    if arrival_rate_per_s is not None and seats >= 1.0 and prefill_interference is not None:
        stretch = float(prefill_interference)
    elif arrival_rate_per_s is not None and seats >= 1.0:
        co = colocated_disaggregation(system, prompt_tokens, output_tokens, arrival_rate_per_s)
        stretch = float(co.prefill_interference)

    mem, comp = float(budgets.decode_memory_s), float(budgets.decode_compute_s)
    kind = "bandwidth-limited" if mem >= comp else "compute-limited"
    out["decode_bandwidth"] = (
        f"Decode is {kind}: at batch {float(budgets.decode_batch):.0f} a step reads memory for "
        f"{mem * 1e3:.2f} ms and computes for {comp * 1e3:.2f} ms (step "
        f"{float(budgets.decode_total_s) * 1e3:.2f} ms incl. "
        f"{float(budgets.decode_comm_s) * 1e3:.2f} ms communication)."
    )

    if shared_fraction > 0.0 and prefix_tokens > 0.0:
        r = prefix_reuse(
            system,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            shared_fraction=shared_fraction,
            prefix_tokens=prefix_tokens,
            arrival_rate_per_s=arrival_rate_per_s or 1.0,
            live_requests=running,
        )
        real = float(r.prefill_speedup) >= REAL_PREFIX_SPEEDUP
        out["prefix_reuse"] = (
            f"Prefix reuse is {'real' if real else 'negligible'}: {_percent(shared_fraction)} of requests share "
            f"{prefix_tokens:.0f} tokens, {float(r.reusable_tokens):.0f} reusable in whole "
            f"{float(deployment.block_size_tokens):.0f}-token blocks, LRU hit rate {_percent(float(r.hit_rate))}; "
            f"effective prefill {float(r.effective_prefill_tokens):.0f} of {prompt_tokens:.0f} tokens, "
            f"prefill {float(r.prefill_speedup):.2f}x faster."
        )
    else:
        out["prefix_reuse"] = (
            "No prefix reuse: no shared prefix was given (unique prompts gain nothing)."
        )

    out["pp_or_interference"] = _pp_or_interference(deployment, budgets, stretch)
    return out


def _pp_or_interference(deployment, budgets: VerdictBudgets, stretch: float) -> str:
    tps_pp = float(budgets.pp_tokens_per_s)
    tps_rep = float(budgets.replica_tokens_per_s)
    compare = (
        f"doubling the GPUs as PP = {float(deployment.pp) * 2.0:.0f} gives {tps_pp:.0f} decode "
        f"tok/s ({float(budgets.pp_seats):.0f} KV seats per replica) against {tps_rep:.0f} from "
        f"twice the replicas"
    )
    if stretch >= HARMFUL_INTERFERENCE:
        return (
            f"Interference is the issue: colocated prefills stretch decode gaps {stretch:.2f}x; PP would "
            f"not remove it ({compare}); disaggregation would."
        )
    if tps_pp > tps_rep:
        return f"PP would help: {compare}; prefill interference stretches decode gaps only {stretch:.2f}x."
    return (
        f"Neither: {compare}, and prefill interference stretches decode gaps only {stretch:.2f}x."
    )
