"""Simulator speed: 10,000 requests of a real trace (target <= 5 s on 2 CPU cores).

    PYTHONPATH=. python benchmarks/bench_simulator.py [--requests N] [--trace azure-conv]
    PYTHONPATH=. python benchmarks/bench_simulator.py --quick   # 500 requests (smoke)

Prints wall time (excluding the one-off jit compile, reported separately), iterations, and the
measured percentiles.  The trace is replayed at its own arrival times.
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

from perfmodel import Deployment, Efficiency, System, load_hardware, load_model
from perfmodel.dynamics import Trace, load_trace
from perfmodel.simulator import simulate, summarize


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--model", default="meta-llama/Llama-3.1-8B")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--quick", action="store_true", help="500 requests (smoke)")
    args = ap.parse_args()
    if args.quick:
        args.requests = 500
    model, gpu, eff = load_model(args.model), load_hardware(args.gpu), Efficiency()
    dep = Deployment.create(tp=1)
    full = load_trace(args.trace)
    n = min(args.requests, len(full))
    trace = Trace(full.arrival_s[:n], full.prompt_tokens[:n], full.output_tokens[:n], args.trace)
    t = time.perf_counter()
    simulate(
        System(model, gpu, dep, eff),
        Trace(trace.arrival_s[:20], trace.prompt_tokens[:20], trace.output_tokens[:20]),
    )
    compile_s = time.perf_counter() - t
    for chunked in (True, False):
        t = time.perf_counter()
        r = simulate(System(model, gpu, dep, eff), trace, chunked_prefill=chunked)
        wall = time.perf_counter() - t
        s = summarize(r)
        print(
            f"{args.trace} {n} requests, chunked={chunked}: {wall:.2f} s wall "
            f"({r.iterations:,} iterations, {wall / r.iterations * 1e6:.1f} us each; "
            f"warm-up compile {compile_s:.1f} s) | TTFT p50 {s['ttft_s']['p50']:.3f} s "
            f"p95 {s['ttft_s']['p95']:.3f} s | TPOT p50 {s['tpot_s']['p50'] * 1e3:.1f} ms "
            f"p95 {s['tpot_s']['p95'] * 1e3:.1f} ms | {s['output_tokens_per_s']:.0f} tok/s"
        )


if __name__ == "__main__":
    main()
