"""Verdicts: the seed's closing questions answered in sentences, each backed by the budgets.

KV-bound or queue-bound?  Decode bandwidth-limited?  Prefix reuse real?  Would PP solve it, or is
prefill/decode interference the issue?  Every sentence quotes the numbers it rests on (memory
budget, decode roofline, the Che prefix-cache hit rate, the colocated interference stretch of
``_disagg``).  Python-level (reports, not traced).
"""

from __future__ import annotations

import equinox as eqx

from ._disagg import disaggregation
from ._memory import max_concurrent_requests
from ._reuse import prefix_reuse
from ._sheet import decode_tokens_per_s_max
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec
from ._step import decode_step, prefill_step

HIGH_UTILIZATION = 0.8
"""Utilisation above which a resource is called the binding one (queues grow as 1 / (1 - rho))."""

REAL_PREFIX_SPEEDUP = 1.1
"""Mean prefill speedup from the prefix cache above which reuse is called real (10 %)."""

HARMFUL_INTERFERENCE = 1.2
"""Decode-gap stretch from colocated prefills above which interference is called the issue."""


def _pct(x: float) -> str:
    return f"{100.0 * x:.0f}%"


def _kv_or_queue(seats, cap, need, rho_prefill, rate):
    if seats < 1.0:
        return "KV-bound: not even one sequence's KV fits next to the weights on this deployment."
    kv_limited = seats < cap
    head = f"the KV cache holds {seats:.0f} sequences per replica" + (
        f", below max_num_seqs = {cap:.0f}" if kv_limited else f", above max_num_seqs = {cap:.0f}"
    )
    if rate is None:
        verdict = (
            "KV-bound at full load" if kv_limited else "not KV-bound (the sequence cap binds first)"
        )
        return f"{verdict}: {head}."
    if need == float("inf"):
        if rho_prefill >= 1.0:
            return f"queue-bound: prefill alone needs {_pct(rho_prefill)} of each replica, so the queue grows without bound; {head}."
        limit = "KV-bound" if kv_limited else "queue-bound"
        return f"{limit}: the offered load needs more running sequences than the {min(seats, cap):.0f} seats; {head}; the queue grows without bound."
    use = need / min(seats, cap)
    if kv_limited and use >= HIGH_UTILIZATION:
        return f"KV-bound: {head}, and {need:.0f} run at once ({_pct(use)} of the seats)."
    if rho_prefill >= HIGH_UTILIZATION:
        return (
            f"queue-bound: prefill keeps each replica {_pct(rho_prefill)} busy, so requests wait to "
            f"start; {head} and only {need:.0f} run at once."
        )
    return (
        f"neither: {head}, {need:.0f} run at once ({_pct(use)} of the seats) and prefill keeps a "
        f"replica {_pct(rho_prefill)} busy."
    )


def verdicts(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    *,
    prompt_tokens: float,
    output_tokens: float,
    arrival_rate_per_s: float | None = None,
    shared_fraction: float = 0.0,
    prefix_tokens: float = 0.0,
) -> dict[str, str]:
    """Four sentences: ``kv_or_queue``, ``decode_bandwidth``, ``prefix_reuse``, ``pp_or_interference``."""
    seq = prompt_tokens + output_tokens
    ctx = prompt_tokens + output_tokens / 2.0
    seats = float(max_concurrent_requests(model, hardware, deployment, seq))
    cap = float(deployment.max_num_seqs)
    batch = max(min(seats, cap), 1.0)
    out: dict[str, str] = {}

    need, rho_p, stretch = 0.0, 0.0, 1.0
    if arrival_rate_per_s is not None and seats >= 1.0:
        co = disaggregation(
            model,
            efficiency,
            colocated=(hardware, deployment),
            prefill=(hardware, deployment),
            decode=(hardware, deployment),
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            arrival_rate_per_s=arrival_rate_per_s,
        )
        rate_r = arrival_rate_per_s / float(deployment.replicas)
        need = rate_r * max(output_tokens - 1.0, 0.0) * float(co.colocated_tpot_s)
        alone = float(prefill_step(model, hardware, deployment, efficiency, prompt_tokens).total_s)
        rho_p = rate_r * alone
        stretch = float(co.prefill_interference)
    out["kv_or_queue"] = _kv_or_queue(seats, cap, need, rho_p, arrival_rate_per_s)

    step = decode_step(model, hardware, deployment, efficiency, batch, ctx)
    mem, comp = float(step.memory_s), float(step.compute_s)
    kind = "bandwidth-limited" if mem >= comp else "compute-limited"
    out["decode_bandwidth"] = (
        f"Decode is {kind}: at batch {batch:.0f} a step reads memory for {mem * 1e3:.2f} ms and "
        f"computes for {comp * 1e3:.2f} ms (step {float(step.total_s) * 1e3:.2f} ms incl. "
        f"{float(step.comm_s) * 1e3:.2f} ms communication)."
    )

    if shared_fraction > 0.0 and prefix_tokens > 0.0:
        r = prefix_reuse(
            model,
            hardware,
            deployment,
            efficiency,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            shared_fraction=shared_fraction,
            prefix_tokens=prefix_tokens,
            arrival_rate_per_s=arrival_rate_per_s or 1.0,
            live_requests=need,
        )
        real = float(r.prefill_speedup) >= REAL_PREFIX_SPEEDUP
        out["prefix_reuse"] = (
            f"Prefix reuse is {'real' if real else 'negligible'}: {_pct(shared_fraction)} of requests share "
            f"{prefix_tokens:.0f} tokens, {float(r.reusable_tokens):.0f} reusable in whole "
            f"{float(deployment.block_size_tokens):.0f}-token blocks, LRU hit rate {_pct(float(r.hit_rate))}; "
            f"effective prefill {float(r.effective_prefill_tokens):.0f} of {prompt_tokens:.0f} tokens, "
            f"prefill {float(r.prefill_speedup):.2f}x faster."
        )
    else:
        out["prefix_reuse"] = (
            "No prefix reuse: no shared prefix was given (unique prompts gain nothing)."
        )

    out["pp_or_interference"] = _pp_or_interference(
        model, hardware, deployment, efficiency, prompt_tokens, output_tokens, seats, cap, stretch
    )
    return out


def _pp_or_interference(model, hardware, deployment, efficiency, p, o, seats, cap, stretch):
    doubled_pp = eqx.tree_at(
        lambda d: (d.pp, d.microbatches), deployment, (deployment.pp * 2.0, deployment.pp * 2.0)
    )
    doubled_rep = eqx.tree_at(lambda d: d.replicas, deployment, deployment.replicas * 2.0)
    tps_pp = float(decode_tokens_per_s_max(model, hardware, doubled_pp, efficiency, p, o))
    tps_rep = (
        float(decode_tokens_per_s_max(model, hardware, doubled_rep, efficiency, p, o))
        if seats >= 1
        else 0.0
    )
    pp_seats = float(max_concurrent_requests(model, hardware, doubled_pp, p + o))
    compare = (
        f"doubling the GPUs as PP = {float(doubled_pp.pp):.0f} gives {tps_pp:.0f} decode tok/s "
        f"({pp_seats:.0f} KV seats per replica) against {tps_rep:.0f} from twice the replicas"
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
