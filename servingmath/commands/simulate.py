"""``servingmath simulate``: run the continuous-batching simulator and report measured latency."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import perfmodel as pm
from perfmodel.dynamics import Trace
from perfmodel.simulator import simulate, summarize

from .._dynamics_cli import (
    add_dynamics_arguments,
    check_scheduler,
    progress_printer,
    rescale_arrivals,
    resolve_workload,
    simulation_report,
)
from .._features_cli import add_feature_arguments, feature_report, render_features
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
    result = simulate(
        model, hardware, deployment, pm.Efficiency(), requests,
        num_requests=args.requests, seed=args.seed, concurrency=concurrency,
        chunked_prefill=args.chunked_prefill, chunk_tokens=args.chunk_tokens,
        progress=progress_printer(args.requests),
    )
    if args.requests >= 2000:
        print(file=sys.stderr)
    if not np.isfinite(result.finish_s).all():
        raise UsageError(
            "some requests never fit in the KV cache; raise --gpu-memory-utilization or --tp, "
            "or lower --max-model-len"
        )
    report = simulation_report(result, summarize(result))
    report.update(features)
    print(json.dumps(report, indent=2) if args.json else _render(report) + "\n" + render_features(features))
    return 0
