"""``servingmath simulate`` helpers: calibration options, the serving features run inside the
engine (prefix cache, speculation, two pools) and their report."""

from __future__ import annotations

import argparse

import jax
import numpy as np

import perfmodel as pm
from perfmodel import features as ft
from perfmodel.dynamics import Trace
from perfmodel.simulator import (
    PrefixCaching,
    engine_summary,
    replay_trace_reuse,
    shared_prefix_caching,
    simulate_disaggregated,
)

from ._disagg_cli import pool_efficiency
from ._features_cli import disagg_pools
from ._options import require_fit
from ._posterior_cli import add_engine_argument, resolve_efficiency
from ._render import human_seconds, latency_json
from ._types import nonnegative_int, positive_int
from .errors import UsageError


def add_calibration_arguments(parser: argparse.ArgumentParser) -> None:
    """--posterior, --prior, --draws, --draw (``--seed`` is simulate's own)."""
    g = parser.add_argument_group(
        "calibration",
        "the simulator's step times use ONE efficiency: the per-field median of --draws posterior "
        "draws for the deployment's GPU (as explain and optimize), or draw --draw I of them",
    )
    g.add_argument("--posterior", help="fitted posterior netCDF (default: the bundled one)")
    add_engine_argument(g)
    g.add_argument(
        "--prior",
        action="store_true",
        help="use the spec-sheet default efficiencies instead of a posterior",
    )
    g.add_argument(
        "--draws",
        type=positive_int,
        default=200,
        help="posterior draws the median is taken over (default 200)",
    )
    g.add_argument(
        "--draw",
        type=nonnegative_int,
        metavar="I",
        help="simulate at posterior draw I (0 <= I < --draws, drawn with --seed) instead of the median",
    )


def simulation_efficiency(args, hardware) -> tuple[pm.Efficiency, str]:
    """The efficiency the simulator runs at, and where it came from."""
    if args.draw is not None and args.prior:
        raise UsageError("--draw picks a posterior draw; drop --prior or --draw")
    median, draws, source = resolve_efficiency(args, hardware, args.weight_dtype)
    if args.draw is None:
        return median, source + (", median" if draws is not None else "")
    if not 0 <= args.draw < args.draws:
        raise UsageError(
            f"--draw must be in [0, {args.draws - 1}] (one of --draws {args.draws}), got {args.draw}"
        )
    return jax.tree.map(lambda x: x[args.draw], draws), f"{source}, draw {args.draw}"


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
    result, prefix: PrefixCaching | None, args, block: int, efficiency: pm.Efficiency
) -> dict:
    """Hit rate, reuse and tokens per step as the engine measured them."""
    out: dict = {}
    if prefix is not None:
        prompt = result.prompt_tokens.astype(float)
        reused = np.where(result.rejected, 0.0, result.reused_tokens)
        served = ~result.rejected
        if (
            args.prefix_reuse is not None
        ):  # only the common prefix can hit (unique blocks never recur)
            reusable = np.array(
                [
                    min(sum(1 for h in hs if h[0] == "prefix") * block, p - 1)
                    for hs, p in zip(prefix.block_hashes, result.prompt_tokens)
                ],
                dtype=float,
            )
            reusable[~served] = 0.0
            out["prefix_hit_rate"] = (
                float(np.minimum(reused, reusable).sum() / reusable.sum())
                if reusable.sum()
                else 0.0
            )
            out["shared_requests"] = int(
                sum(1 for hs in prefix.block_hashes if hs and hs[0][0] == "prefix")
            )
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
    model,
    hardware,
    deployment,
    efficiency,
    trace: Trace,
    concurrency: int,
    prefix,
    speculation,
) -> dict:
    """Two pools (prefill with the prefix cache, KV hand-off, decode with speculation); open loop."""
    if concurrency or not trace.has_arrivals:
        raise UsageError(
            "--disagg in simulate needs timed arrivals; pass --rate R instead of --concurrency"
        )
    p_gpus, d_gpus, hw_p, hw_d, pre, dec, bw = disagg_pools(args, hardware, deployment)
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


def render_simulated(sim: dict) -> str:
    lines = ["simulated features:"]
    if "prefix_hit_rate" in sim:
        lines.append(
            f"  prefix cache: hit rate {sim['prefix_hit_rate']:.2f}, effective prefill "
            f"{sim['effective_prefill_tokens']:,.0f} tokens "
            f"({100 * sim['prefix_reused_token_fraction']:.1f}% of prompt tokens reused)"
        )
    if "spec_tokens_per_step" in sim:
        tp = sim["tpot_s"]["p50"]
        lines.append(
            f"  speculative decoding: {sim['spec_tokens_per_step']:.2f} tokens/step, TPOT p50 "
            f"{human_seconds(tp) if tp is not None else 'n/a'}"
        )
    if "disaggregation" in sim:
        d = sim["disaggregation"]
        pct = lambda p: "  ".join(
            f"{k} {human_seconds(v) if v is not None else 'inf'}" for k, v in p.items()
        )
        extra = "".join(
            [
                f", prefix reuse {100 * d['prefix_reused_token_fraction']:.1f}%"
                if "prefix_reused_token_fraction" in d
                else "",
                f", {d['spec_tokens_per_step']:.2f} tokens/step"
                if "spec_tokens_per_step" in d
                else "",
            ]
        )
        lines += [
            (
                f"  disaggregation {d['prefill_gpus']}:{d['decode_gpus']}: KV hand-off "
                f"{d['kv_transfer_s'] * 1e3:.2f} ms{extra}"
            ),
            f"    TTFT {pct(d['ttft_s'])}",
            f"    TPOT {pct(d['tpot_s'])}",
            f"    E2E {pct(d['e2e_s'])}",
        ]
    return "\n".join(lines)
