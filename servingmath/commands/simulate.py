"""``servingmath simulate``: run the continuous-batching simulator and report measured latency."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import perfmodel as pm
from perfmodel import features as ft
from perfmodel.dynamics import Trace
from perfmodel.simulator import EngineHooks, SimResult, engine_limits, requests_from_workload, run_engine, \
    simulate, step_function, summarize
from perfmodel.simulator._disagg import simulate_disaggregated
from perfmodel.simulator._prefix_cache import BlockPrefixCache, TraceRequest, prefix_cache_hook
from perfmodel.simulator._simulate import decode_run_function
from perfmodel.simulator._speculative import accepted_tokens_sampler, speculative_step_function

from .._dynamics_cli import (
    add_dynamics_arguments,
    check_scheduler,
    progress_printer,
    rescale_arrivals,
    resolve_workload,
    simulation_report,
)
from .._features_cli import add_feature_arguments, disagg_pools, feature_report, render_features
from .._options import add_deployment_arguments, positive, require_fit, resolve_deployment
from .._render import human_seconds, table
from ..errors import UsageError

HELP = "simulate a continuous-batching engine request by request: TTFT, TPOT, E2E percentiles"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_deployment_arguments(parser)
    add_feature_arguments(parser)
    add_dynamics_arguments(parser, lengths=True)
    parser.add_argument("--requests", type=int, default=2000, help="requests to simulate (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _render(r: dict) -> str:
    rows = []
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        p = r[key]
        rows.append((label, "  ".join(
            f"{k} {human_seconds(v) if v is not None else 'inf'}" for k, v in p.items())))
    rows += [
        ("engine busy fraction", f"{r['utilization']:.2f}"),
        ("stable", str(r["stable"])),
        ("output tokens/s", f"{r['output_tokens_per_s']:,.0f}"),
        ("mean decode batch", f"{r['decode_batch']:.1f}"),
        ("requests (preemptions)", f"{r['requests']:,} ({r['preemptions']:,})"),
    ]
    return table(rows)


def run(args: argparse.Namespace) -> int:
    positive("--requests", args.requests)
    check_scheduler(args)
    model, hardware, deployment = resolve_deployment(
        args, max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs
    )
    workload, trace = resolve_workload(args)
    longest = int(trace.prompt_tokens.max() + trace.output_tokens.max()) if trace is not None else (
        args.input_len + args.output_len)
    require_fit(model, hardware, deployment, float(min(longest, args.max_model_len)))
    features = feature_report(args, model, hardware, deployment, pm.Efficiency(), workload)
    concurrency = args.concurrency or 0
    if trace is not None:
        n = min(args.requests, len(trace))
        sub = Trace(trace.arrival_s[:n], trace.prompt_tokens[:n], trace.output_tokens[:n], trace.name)
        if concurrency == 0:
            if args.rate is not None and sub.has_arrivals:
                sub = rescale_arrivals(sub, args.rate)
            elif not sub.has_arrivals:
                gaps = np.random.default_rng(args.seed).exponential(1.0 / args.rate, n)
                sub = Trace(np.cumsum(gaps) - gaps[0], sub.prompt_tokens, sub.output_tokens, sub.name)
        requests = sub
    else:
        requests = workload
    if isinstance(requests, Trace):
        trace_in = requests
    else:
        trace_in = requests_from_workload(requests, args.requests, args.seed)
        if concurrency == 0 and float(requests.concurrency) > 0:
            concurrency = int(round(float(requests.concurrency)))
    engine_features = args.prefix_reuse is not None or bool(args.spec_draft)
    simulated: dict = {}
    if engine_features:
        result, simulated = _simulate_features(args, model, hardware, deployment, trace_in, concurrency, features)
    else:
        result = simulate(
            model, hardware, deployment, pm.Efficiency(), requests,
            num_requests=args.requests, seed=args.seed, concurrency=concurrency,
            chunked_prefill=args.chunked_prefill, chunk_tokens=args.chunk_tokens,
            progress=progress_printer(args.requests),
        )
    if args.requests >= 2000 and not engine_features:
        print(file=sys.stderr)
    if not np.isfinite(result.finish_s).all():
        raise UsageError(
            "some requests never fit in the KV cache; raise --gpu-memory-utilization or --tp, "
            "or lower --max-model-len"
        )
    report = simulation_report(result, summarize(result))
    report.update(features)
    if args.disagg:
        simulated["disaggregation"] = _simulate_disagg(args, model, hardware, deployment, trace_in, concurrency)
    if simulated:
        report["simulated"] = simulated
    text = _render(report) + "\n" + render_features(features)
    if simulated:
        text += "\n" + _render_simulated(simulated)
    print(json.dumps(report, indent=2) if args.json else text)
    return 0


def _block_hashes(prompt: np.ndarray, shared: np.ndarray, prefix_tokens: int, block: int) -> list[tuple]:
    """Chained block identities: a shared request opens with the common prefix's full blocks
    (capped at its own full blocks), every other full block is unique to the request."""
    out = []
    for i, p in enumerate(prompt):
        full = int(p) // block
        head = min(prefix_tokens // block, full) if shared[i] else 0
        out.append(tuple([("prefix", j) for j in range(head)] + [("unique", i, j) for j in range(head, full)]))
    return out


def _simulate_features(args, model, hardware, deployment, trace: Trace, concurrency: int, features: dict):
    """Run the engine with the prefix-cache hook and/or sampled speculative acceptance, one
    engine per replica (its own cache), requests split as ``simulate`` splits them."""
    eff = pm.Efficiency()
    limits = engine_limits(model, hardware, deployment, args.chunked_prefill, args.chunk_tokens)
    block = limits.block_tokens
    n = len(trace)
    prompt = np.asarray(trace.prompt_tokens, dtype=np.int64)
    output = np.asarray(trace.output_tokens, dtype=np.int64)
    rng = np.random.default_rng(args.seed + 2)
    prefix = args.prefix_reuse is not None
    share = float(args.prefix_reuse) if prefix else 0.0
    shared = rng.random(n) < share
    prefix_len = int(args.prefix_len) if prefix else 0
    hashes = _block_hashes(prompt, shared, prefix_len, block) if prefix else None
    reused = np.zeros(n)
    spec = features.get("speculative")
    if spec:
        draft = None if spec["draft"] == "mtp" else pm.load_model(args.spec_draft)
        step_s = speculative_step_function(model, hardware, deployment, eff, int(args.spec_k), draft)
        decode_run = None
    else:
        step_s = step_function(model, hardware, deployment, eff)
        decode_run = decode_run_function(model, hardware, deployment, eff)
    emitted = [0, 0]  # tokens emitted, sequence-steps

    replicas = max(int(round(float(deployment.replicas))), 1)
    owner = np.random.default_rng(args.seed + 1).integers(0, replicas, n) if replicas > 1 else np.zeros(n, int)
    first, finish = np.full(n, np.nan), np.full(n, np.nan)
    preempted = np.zeros(n, np.int64)
    arrival = np.nan_to_num(np.asarray(trace.arrival_s, dtype=float), nan=0.0)
    iters, busy, dec_sum, dec_area = 0, 0.0, 0.0, 0.0
    for k in range(replicas):
        idx = np.flatnonzero(owner == k)
        if idx.size == 0:
            continue
        cached = decode_tokens = None
        if prefix:
            local = [TraceRequest(float(arrival[i]), int(prompt[i]), int(output[i]), hashes[i]) for i in idx]
            local_reused = np.zeros(idx.size)
            cached = prefix_cache_hook(local, BlockPrefixCache(limits.total_blocks), block, local_reused)
        if spec:
            sample = accepted_tokens_sampler(int(args.spec_k), float(spec["acceptance"]), args.seed + 3 + k)

            def decode_tokens(ids, sample=sample):
                e = sample(ids)
                emitted[0] += int(e.sum())
                emitted[1] += len(ids)
                return e

        cc = concurrency // replicas + (1 if k < concurrency % replicas else 0)
        R, it, b, ds, da = run_engine(
            step_s, arrival[idx], prompt[idx], output[idx], limits,
            EngineHooks(cached_prefix_tokens=cached, decode_tokens=decode_tokens), cc, None, decode_run,
        )
        first[idx], finish[idx], preempted[idx] = R.first, R.finish, R.preempted
        arrival[idx] = R.arrival
        if prefix:
            reused[idx] = local_reused
        iters, busy, dec_sum, dec_area = iters + it, busy + b, dec_sum + ds, dec_area + da
    done = finish[np.isfinite(finish)]
    result = SimResult(
        arrival_s=arrival, first_token_s=first, finish_s=finish, prompt_tokens=prompt, output_tokens=output,
        preemptions=preempted, iterations=iters, busy_s=busy,
        makespan_s=float(done.max() - arrival.min()) if done.size else 0.0,
        replicas=replicas, mean_decode_batch=dec_sum / max(iters, 1), decode_area_s=dec_area,
    )
    out: dict = {}
    if prefix:
        reusable = np.array([min(sum(1 for h in hs if h[0] == "prefix") * block, p - 1)
                             for hs, p in zip(hashes, prompt)], dtype=float)
        shared_reused = np.minimum(reused, reusable)  # only the common prefix can hit (unique blocks never recur)
        out["prefix_hit_rate"] = float(shared_reused.sum() / reusable.sum()) if reusable.sum() > 0 else 0.0
        out["prefix_reused_token_fraction"] = float(reused.sum() / prompt.sum())
        out["effective_prefill_tokens"] = float((prompt - reused).mean())
        out["shared_requests"] = int(shared.sum())
        out["cache_blocks"] = int(limits.total_blocks)
    if spec:
        out["spec_tokens_per_step"] = float(emitted[0] / emitted[1]) if emitted[1] else 1.0
        out["spec_acceptance"] = float(spec["acceptance"])
        tpot = summarize(result)["tpot_s"]
        out["tpot_s"] = {kk: (float(v) if np.isfinite(v) else None) for kk, v in tpot.items()}
    return result, out


def _simulate_disagg(args, model, hardware, deployment, trace: Trace, concurrency: int) -> dict:
    """Two pools (prefill, KV hand-off, decode) on the same requests; open loop only."""
    if concurrency or not trace.has_arrivals:
        raise UsageError("--disagg in simulate needs timed arrivals; pass --rate R instead of --concurrency")
    p_gpus, d_gpus, hw_p, hw_d, pre, dec, bw = disagg_pools(args, hardware, deployment)
    for hw, dep, flag in ((hw_p, pre, "--prefill-gpu"), (hw_d, dec, "--decode-gpu")):
        require_fit(model, hw, dep, float(min(int(trace.prompt_tokens.max() + trace.output_tokens.max()),
                                              args.max_model_len)))
    r = simulate_disaggregated(model, pm.Efficiency(), trace, prefill=(hw_p, pre), decode=(hw_d, dec),
                               transfer_bytes_per_s=bw, seed=args.seed)
    if not np.isfinite(r.finish_s).all():
        raise UsageError("some requests never fit in a disaggregated pool's KV cache; give the pools more GPUs")
    s = summarize(r)
    hand_off = np.asarray(ft.kv_transfer_s(model, pre, np.asarray(trace.prompt_tokens, dtype=float), bw))
    fin = lambda p: {k: (float(v) if np.isfinite(v) else None) for k, v in p.items()}  # noqa: E731
    return {
        "prefill_gpus": p_gpus, "decode_gpus": d_gpus, "prefill_gpu": hw_p.name, "decode_gpu": hw_d.name,
        "ttft_s": fin(s["ttft_s"]), "tpot_s": fin(s["tpot_s"]), "e2e_s": fin(s["e2e_s"]),
        "kv_transfer_s": float(hand_off.mean()), "output_tokens_per_s": s["output_tokens_per_s"],
        "preemptions": s["preemptions"],
        **({"note": "the two pools run the plain engine: prefix cache and speculation are simulated colocated only"}
           if args.prefix_reuse is not None or args.spec_draft else {}),
    }


def _render_simulated(sim: dict) -> str:
    lines = ["simulated features:"]
    if "prefix_hit_rate" in sim:
        lines.append(f"  prefix cache: hit rate {sim['prefix_hit_rate']:.2f}, effective prefill "
                     f"{sim['effective_prefill_tokens']:,.0f} tokens")
    if "spec_tokens_per_step" in sim:
        tp = sim["tpot_s"]["p50"]
        lines.append(f"  speculative decoding: {sim['spec_tokens_per_step']:.2f} tokens/step, TPOT p50 "
                     f"{human_seconds(tp) if tp is not None else 'n/a'}")
    if "disaggregation" in sim:
        d = sim["disaggregation"]
        pct = lambda p: "  ".join(  # noqa: E731
            f"{k} {human_seconds(v) if v is not None else 'inf'}" for k, v in p.items())
        lines += [f"  disaggregation {d['prefill_gpus']}:{d['decode_gpus']}: KV hand-off "
                  f"{d['kv_transfer_s'] * 1e3:.2f} ms",
                  f"    TTFT {pct(d['ttft_s'])}", f"    TPOT {pct(d['tpot_s'])}", f"    E2E {pct(d['e2e_s'])}"]
    return "\n".join(lines)
