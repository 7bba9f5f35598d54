"""The requests ``simulate`` runs, and the serving features run inside its engine: the prefix cache (synthetic shared
prefixes or a trace's own block hashes), speculation, two disaggregated pools, and what the engine
measured of them.
"""

from __future__ import annotations

import numpy as np

import perfmodel as pm
from perfmodel import System, features as ft
from perfmodel.dynamics import Trace, poisson_arrivals, rescale_arrivals
from perfmodel.simulator import (
    PrefixCaching,
    SimResult,
    engine_summary,
    replay_trace_reuse,
    requests_from_workload,
    shared_prefix_caching,
    simulate_disaggregated,
    synthetic_prefix_hit_rate,
    synthetic_shared_requests,
)

from ..errors import UsageError
from ..options.calibration import simulation_efficiency
from ..options.deployment import require_fit
from ..options.disagg import disagg_pools, pool_efficiency
from ..reports.render import latency_json


def requests_to_simulate(args, workload, trace, concurrency: int) -> tuple[Trace, int]:
    """The requests to simulate (a trace's head, rescaled to --rate or given Poisson arrivals;
    else sampled from the workload) and the closed loop's clients (0: open loop)."""
    if trace is None:
        if concurrency == 0 and float(workload.concurrency) > 0:
            concurrency = round(float(workload.concurrency))
        return requests_from_workload(workload, args.requests, args.seed), concurrency
    sub = trace.head(min(args.requests, len(trace)))
    if concurrency == 0:
        if args.rate is not None and sub.has_arrivals:
            sub = rescale_arrivals(sub, args.rate)
        elif not sub.has_arrivals:
            sub = poisson_arrivals(sub, args.rate, args.seed)
    return sub, concurrency


def speculation_of(args, features: dict) -> pm.dynamics.DecodeCost | None:
    """The speculative ``DecodeCost`` the simulator runs for ``--spec-*`` (its acceptance as the
    feature report resolved it), or None without speculation."""
    spec = features.get("speculative")
    if not spec:
        return None
    draft = None if spec["draft"] == "mtp" else pm.load_model(args.spec_draft)
    return pm.dynamics.DecodeCost.speculation(int(args.spec_k), float(spec["acceptance"]), draft)


def require_served(result: SimResult, max_model_len: int) -> None:
    """A run that served nothing usable is an error with its fix, not a table of infinities."""
    if np.isinf(result.finish_s).any():
        raise UsageError(
            "some requests never fit in the KV cache; raise --gpu-memory-utilization or --tp, "
            "or lower --max-model-len"
        )
    if result.num_rejected == len(result.arrival_s):
        raise UsageError(
            f"every prompt is longer than --max-model-len {max_model_len}; raise --max-model-len"
        )


def prefix_caching(args, trace: Trace, block: int) -> PrefixCaching | None:
    """Synthetic shared-prefix chains (--prefix-reuse), else the trace's own block hashes."""
    if args.prefix_reuse is not None:
        return shared_prefix_caching(
            trace.prompt_tokens, args.prefix_reuse, int(args.prefix_len), block, args.seed + 2
        )
    if trace.block_hashes is not None:
        return PrefixCaching(trace.block_hashes, int(trace.hash_block_tokens))
    return None


def trace_reuse(trace: Trace | None, model, hardware, deployment) -> dict | None:
    """Measured reuse of a hashed trace (LRU replay, cache = one replica's KV) for the closed form."""
    if trace is None or trace.block_hashes is None:
        return None
    reused = replay_trace_reuse(
        trace, int(float(pm.kv_capacity_tokens(model, hardware, deployment)))
    )
    hit = reused > 0
    return {
        "shared_fraction": float(hit.mean()),
        "prefix_tokens": float(reused[hit].mean()) if hit.any() else 0.0,
        "reused_token_fraction": float(reused.sum() / trace.prompt_tokens.sum()),
    }


def simulated_features(
    result, prefix: PrefixCaching | None, args, efficiency: pm.Efficiency
) -> dict:
    """Hit rate, reuse and tokens per step as the engine measured them."""
    out: dict = {}
    if prefix is not None:
        prompt = result.prompt_tokens.astype(float)
        reused = np.where(result.rejected, 0.0, result.reused_tokens)
        served = ~result.rejected
        if args.prefix_reuse is not None:  # synthetic shared-prefix chains
            out["prefix_hit_rate"] = synthetic_prefix_hit_rate(
                prefix, result.prompt_tokens, reused, served
            )
            out["shared_requests"] = synthetic_shared_requests(prefix)
        else:  # a hashed trace: share of served requests that reused at least one block
            out["prefix_hit_rate"] = float((reused[served] > 0).mean()) if served.any() else 0.0
        out["prefix_reused_token_fraction"] = (
            float(reused.sum() / prompt[served].sum()) if served.any() else 0.0
        )
        out["effective_prefill_tokens"] = (
            float((prompt - reused)[served].mean()) if served.any() else 0.0
        )
        out["cache_block_tokens"] = int(prefix.hash_block_tokens)
    if result.spec_tokens_per_step is not None:
        out["spec_tokens_per_step"] = float(result.spec_tokens_per_step)
        out["spec_acceptance"] = (
            float(args.spec_acceptance) if args.spec_acceptance is not None else None
        )
        out["tpot_s"] = latency_json(engine_summary(result, efficiency)["tpot_s"])
    return out


def simulate_disagg(
    args,
    system: System,
    trace: Trace,
    concurrency: int,
    prefix,
    speculation,
) -> dict:
    """Two pools (prefill with the prefix cache, KV hand-off, decode with speculation); open loop."""
    model, hardware, efficiency = system.model, system.hardware, system.efficiency
    if concurrency or not trace.has_arrivals:
        raise UsageError(
            "--disagg in simulate needs timed arrivals; pass --rate R instead of --concurrency"
        )
    p_gpus, d_gpus, hw_p, hw_d, pre, dec, bw = disagg_pools(args, hardware, system.deployment)
    longest = float(
        min(int(trace.prompt_tokens.max() + trace.output_tokens.max()), args.max_model_len)
    )
    for hw, dep in ((hw_p, pre), (hw_d, dec)):
        require_fit(model, hw, dep, longest)

    def resolve(a, hw):  # the simulator's draw (--draw) of that GPU, as for the command's own
        return simulation_efficiency(a, hw)[0]

    eff_p = pool_efficiency(args, hardware, efficiency, hw_p, resolve)
    eff_d = pool_efficiency(args, hardware, efficiency, hw_d, resolve)
    r = simulate_disaggregated(
        model,
        eff_p,
        trace,
        prefill=(hw_p, pre),
        decode=(hw_d, dec),
        transfer_bytes_per_s=bw,
        seed=args.seed,
        prefix=prefix,
        speculation=speculation,
        decode_efficiency=eff_d,
    )
    if np.isinf(r.finish_s).any():
        raise UsageError(
            "some requests never fit in a disaggregated pool's KV cache; give the pools more GPUs"
        )
    s = engine_summary(r, eff_p, eff_d)
    served = ~r.rejected
    hand_off = np.asarray(
        ft.kv_transfer_s(model, pre, np.asarray(trace.prompt_tokens[served], dtype=float), bw)
    )
    out = {
        "prefill_gpus": p_gpus,
        "decode_gpus": d_gpus,
        "prefill_gpu": hw_p.name,
        "decode_gpu": hw_d.name,
        "ttft_s": latency_json(s["ttft_s"]),
        "tpot_s": latency_json(s["tpot_s"]),
        "e2e_s": latency_json(s["e2e_s"]),
        "kv_transfer_s": float(hand_off.mean()) if hand_off.size else 0.0,
        "output_tokens_per_s": s["output_tokens_per_s"],
        "preemptions": s["preemptions"],
        "rejected": s["rejected"],
    }
    if prefix is not None:
        reused = np.where(r.rejected, 0.0, r.reused_tokens)
        out["prefix_reused_token_fraction"] = float(
            reused.sum() / max(trace.prompt_tokens[served].sum(), 1)
        )
    if speculation is not None:
        out["spec_tokens_per_step"] = float(r.spec_tokens_per_step)
    return out
