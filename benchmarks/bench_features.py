"""Figures for the serving features: closed forms against the simulator, and where each pays.

    PYTHONPATH=. python benchmarks/bench_features.py [--quick] [--grid] [--json OUT.json]

Prints one markdown table per feature.  Every number is computed here from the bundled catalogs
(Llama-3.1 8B/70B/405B on h100-sxm, default ``Efficiency``), the Mooncake trace and synthetic
workloads with fixed seeds; nothing is measured on hardware.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np

from benchmarks._feature_grids import (
    LONG_LEN,
    disagg_grid,
    markdown_table,
    prefix_grid,
    spec_grid,
)
from perfmodel import (
    Deployment,
    Efficiency,
    GiB,
    System,
    features as ft,
    load_hardware,
    load_model,
    model_context_tokens,
    prefill_step,
)
from perfmodel.dynamics import Trace
from perfmodel.simulator import (
    MOONCAKE_BLOCK_TOKENS,
    load_mooncake_trace,
    replay_reused_tokens,
    shared_prefix_requests,
    simulate,
    simulate_disaggregated,
    simulate_prefix_cache,
    simulate_speculative,
)

H100 = load_hardware("h100-sxm")
EFF = Efficiency()
L8 = load_model("meta-llama/Llama-3.1-8B")
L8_CONTEXT_TOKENS = model_context_tokens("meta-llama/Llama-3.1-8B")


_table = markdown_table


def prefix(quick):
    rows, rec = [], []
    n = 3000 if quick else 10000
    for cap in (300, 1000, 3000):
        reqs = shared_prefix_requests(
            n,
            arrival_rate_per_s=10.0,
            shared_fraction=0.5,
            prefix_tokens=320,
            prompt_tokens=400,
            output_tokens=100,
            block_size_tokens=16,
            num_prefixes=20,
            seed=3,
        )
        reused = replay_reused_tokens(reqs, cap, 16)
        shared = np.array([bool(r.block_hashes) and r.block_hashes[0][0] == "prefix" for r in reqs])
        sim = float((reused[shared] > 0).mean())
        che = float(ft.che_hit_rate(10.0 * 0.5 / 20, 20.0, 20.0, 10.0 * (500 - 160) / 16, cap))
        rows.append((cap, f"{sim:.3f}", f"{che:.3f}", f"{che - sim:+.3f}"))
        rec.append({"capacity_blocks": cap, "lru_replay": sim, "che": che})
    out = [
        _table(
            "Prefix cache: LRU hit rate, block-level replay vs Che (20 prefixes, 50% shared)",
            ("cache blocks", "replay", "Che", "diff"),
            rows,
        )
    ]

    trace = load_mooncake_trace()[: (3000 if quick else len(load_mooncake_trace()))]
    prompt = sum(r.prompt_tokens for r in trace)
    mrows = []
    for cap in (1000, 10000, 100000, 10**8):
        frac = float(replay_reused_tokens(trace, cap, MOONCAKE_BLOCK_TOKENS).sum() / prompt)
        mrows.append((cap, f"{cap * MOONCAKE_BLOCK_TOKENS / 1e6:.1f} M", f"{frac:.3f}"))
        rec.append({"mooncake_capacity_blocks": cap, "reused_prompt_fraction": frac})
    out.append(
        _table(
            f"Mooncake conversation trace ({len(trace)} requests): share of prompt tokens reused",
            ("cache blocks (512 tok)", "tokens", "reused fraction"),
            mrows,
        )
    )

    crows = []
    engine_trace = load_mooncake_trace()[:800]
    total = sum(r.prompt_tokens for r in engine_trace)
    keep = slice(80, 760)
    # the trace's prompts reach ~100k tokens: at the default max_model_len (8,192) the engine
    # would reject about half of them (vLLM refuses a prompt longer than its context)
    long_context = Deployment.create(tp=4, max_model_len=float(L8_CONTEXT_TOKENS))
    for cap in (0, 2000, 10000):
        sim, reused = simulate_prefix_cache(
            System(L8, H100, long_context, EFF),
            engine_trace,
            capacity_blocks=cap,
            block_size_tokens=MOONCAKE_BLOCK_TOKENS,
        )
        crows.append(
            (
                cap,
                f"{cap * MOONCAKE_BLOCK_TOKENS / 1e6:.1f} M",
                f"{reused.sum() / total:.3f}",
                f"{np.mean(sim.ttft_s[keep]):.2f}",
                f"{np.percentile(sim.ttft_s[keep], 95):.2f}",
                f"{np.percentile(sim.e2e_s[keep], 95):.1f}",
            )
        )
        rec.append(
            {
                "engine_mooncake_capacity_blocks": cap,
                "reused": float(reused.sum() / total),
                "ttft_mean_s": float(np.mean(sim.ttft_s[keep])),
            }
        )
    out.append(
        _table(
            "Mooncake trace through the engine (first 800 requests, ~4.5 min, mean prompt 13.8k), "
            f"Llama-3.1-8B TP4 on h100-sxm, max model len {L8_CONTEXT_TOKENS:,}",
            ("cache blocks", "tokens", "reused", "TTFT mean s", "TTFT p95 s", "E2E p95 s"),
            crows,
        )
    )

    srows = []
    dep = Deployment.create()
    for share in (0.0, 0.5, 0.9):
        reqs = shared_prefix_requests(
            200,
            arrival_rate_per_s=1.0,
            shared_fraction=share,
            prefix_tokens=3000,
            prompt_tokens=4000,
            output_tokens=50,
            block_size_tokens=16,
            seed=2,
        )
        sim, _ = simulate_prefix_cache(System(L8, H100, dep, EFF), reqs, capacity_blocks=10**6)
        cf = ft.prefix_reuse(
            System(L8, H100, dep, EFF),
            prompt_tokens=4000.0,
            output_tokens=50.0,
            shared_fraction=share,
            prefix_tokens=3000.0,
            arrival_rate_per_s=1.0,
        )
        srows.append(
            (
                share,
                f"{float(cf.effective_prefill_tokens):.0f}",
                f"{float(cf.prefill_speedup):.2f}x",
                f"{float(cf.prefill_s) * 1e3:.1f}",
                f"{np.mean(sim.ttft_s) * 1e3:.1f}",
            )
        )
        rec.append(
            {
                "shared_fraction": share,
                "closed_ttft_s": float(cf.prefill_s),
                "sim_ttft_s": float(np.mean(sim.ttft_s)),
            }
        )
    out.append(
        _table(
            "Shared system prompt (3000 of 4000 tokens), Llama-3.1-8B, 1 req/s",
            (
                "shared",
                "effective prefill",
                "prefill speedup",
                "closed TTFT ms",
                "sim mean TTFT ms",
            ),
            srows,
        )
    )
    return out, rec


def speculative(quick):
    rows, rec = [], []
    dep = Deployment.create()
    n = 32 if quick else 64
    trace = Trace(np.zeros(n), np.full(n, 1000), np.full(n, 400))
    for batch in (1, 8, 64, 256):
        for alpha in (0.3, 0.6, 0.8):
            cf = ft.speculative_decode(
                System(L8, H100, dep, EFF),
                batch_size=float(batch),
                context_tokens=1200.0,
                draft_tokens=4.0,
                acceptance=alpha,
            )
            sim = ""
            if batch <= 8:
                s = simulate_speculative(
                    System(L8, H100, dep, EFF),
                    trace,
                    draft_tokens=4,
                    acceptance=alpha,
                    concurrency=batch,
                    seed=1,
                )
                sim = f"{np.nanmean(s.tpot_s) * 1e3:.2f}"
            rows.append(
                (
                    batch,
                    alpha,
                    f"{float(cf.speedup):.2f}",
                    f"{float(cf.breakeven_acceptance):.2f}",
                    f"{float(cf.tpot_s) * 1e3:.2f}",
                    sim,
                )
            )
            rec.append(
                {"batch": batch, "alpha": alpha, "speedup": float(cf.speedup), "sim_tpot_s": sim}
            )
    drows = []
    big, draft, tp4 = (
        load_model("meta-llama/Llama-3.1-70B"),
        load_model("meta-llama/Llama-3.2-1B-Instruct"),
        Deployment.create(tp=4),
    )
    for batch in (1, 64, 512):
        for alpha in (0.3, 0.7):
            cf = ft.speculative_decode(
                System(big, H100, tp4, EFF),
                batch_size=float(batch),
                context_tokens=2000.0,
                draft_tokens=4.0,
                acceptance=alpha,
                draft_model=draft,
            )
            drows.append(
                (
                    batch,
                    alpha,
                    f"{float(cf.speedup):.2f}",
                    f"{float(cf.breakeven_acceptance):.2f}",
                    f"{float(cf.draft_s) * 1e3:.1f}",
                    f"{float(cf.verify_s) / float(cf.target_step_s):.2f}",
                    f"{float(cf.net_gain_s) * 1e3:+.1f}",
                )
            )
            rec.append(
                {"draft": draft.name, "batch": batch, "alpha": alpha, "speedup": float(cf.speedup)}
            )
    return [
        _table(
            "Speculative decoding, Llama-3.1-8B + MTP head, k = 4 (sim: closed loop, sampled acceptance)",
            ("batch", "alpha", "speedup", "break-even alpha", "closed TPOT ms", "sim TPOT ms"),
            rows,
        ),
        _table(
            "Speculative decoding, Llama-3.1-70B TP4 + Llama-3.2-1B draft, k = 4, context 2000",
            (
                "batch",
                "alpha",
                "speedup",
                "break-even alpha",
                "draft ms",
                "verify / plain step",
                "net gain ms/step",
            ),
            drows,
        ),
    ], rec


def parallel(quick):
    rows, rec = [], []
    for name, gpus in (
        ("meta-llama/Llama-3.1-8B", 8),
        ("meta-llama/Llama-3.1-70B", 8),
        ("meta-llama/Llama-3.1-405B", 16),
    ):
        m = load_model(name)
        opts = sorted(
            ft.parallelism_options(System(m, H100, Deployment.create(), EFF), gpus, 2000.0, 500.0),
            key=lambda o: -o.tokens_per_s,
        )
        for o in opts[:3]:
            rows.append(
                (
                    name.split("/")[1],
                    gpus,
                    o.tp,
                    o.pp,
                    o.replicas,
                    f"{o.tokens_per_s:,.0f}",
                    f"{o.tpot_s_batch1 * 1e3:.1f}",
                )
            )
        rec.append({"model": name, "best": opts[0]._asdict()})
    return [
        _table(
            "Parallelism on h100-sxm (2000 in / 500 out): top 3 splits by decode tokens/s",
            ("model", "GPUs", "TP", "PP", "replicas", "tokens/s", "batch-1 TPOT ms"),
            rows,
        )
    ], rec


def disagg(quick):
    rows, rec = [], []
    n = 500 if quick else 1500
    for prompt in (200, 2000, 8000):
        co = Deployment.create(replicas=8, max_model_len=LONG_LEN)
        rate = 0.3 * 8 / float(prefill_step(System(L8, H100, co, EFF), float(prompt)).total_s)
        pools = {
            "prefill": (H100, Deployment.create(replicas=4, max_model_len=LONG_LEN)),
            "decode": (H100, Deployment.create(replicas=4, max_model_len=LONG_LEN)),
        }
        cf = ft.disaggregation(
            L8,
            EFF,
            colocated=(H100, co),
            prompt_tokens=float(prompt),
            output_tokens=256.0,
            arrival_rate_per_s=rate,
            **pools,
        )
        arrival = np.cumsum(np.random.default_rng(0).exponential(1.0 / rate, n))
        tr = Trace(arrival, np.full(n, prompt), np.full(n, 256))
        keep = slice(n // 10, int(0.9 * n))
        s = simulate_disaggregated(L8, EFF, tr, **pools)
        c = simulate(System(L8, H100, co, EFF), tr)
        sim_net = float(np.mean(c.e2e_s[keep]) - np.mean(s.e2e_s[keep]))
        rows.append(
            (
                prompt,
                f"{rate:.1f}",
                f"{float(cf.prefill_interference):.2f}",
                f"{float(cf.kv_transfer_s) * 1e3:.2f}",
                f"{float(cf.net_s) * 1e3:+.0f}",
                f"{sim_net * 1e3:+.0f}",
                f"{float(cf.colocated_e2e_s):.2f} / {np.mean(c.e2e_s[keep]):.2f}",
                f"{float(cf.split_e2e_s):.2f} / {np.mean(s.e2e_s[keep]):.2f}",
            )
        )
        rec.append({"prompt": prompt, "closed_net_s": float(cf.net_s), "sim_net_s": sim_net})
    return [
        _table(
            "Disaggregation 4:4 vs 8 colocated, Llama-3.1-8B, 256 output tokens, prefill load 0.3",
            (
                "prompt",
                "req/s",
                "interference",
                "KV hand-off ms",
                "closed net ms",
                "sim net ms",
                "colocated E2E s closed/sim",
                "split E2E s closed/sim",
            ),
            rows,
        )
    ], rec


def host(quick):
    rows, rec = [], []
    m = load_model("meta-llama/Llama-3.1-70B")
    for seq in (640.0, 2500.0, 8000.0):
        for bw in (64e9, 16e9):
            dep = Deployment.create(tp=2, host_kv_bytes=256 * GiB, host_kv_bytes_per_s=bw)
            h = ft.host_tier(System(m, H100, dep, EFF), sequence_tokens=seq)
            rows.append(
                (
                    int(seq),
                    f"{bw / 1e9:.0f}",
                    f"{float(h.hbm_sequences):.0f}",
                    f"{float(h.host_sequences_used):.0f}",
                    f"{float(h.tokens_per_s_hbm_only):,.0f}",
                    f"{float(h.tokens_per_s_with_host):,.0f}",
                    f"{100 * float(h.gain_fraction):+.0f}%",
                )
            )
            rec.append({"sequence_tokens": seq, "bw": bw, "gain_fraction": float(h.gain_fraction)})
    return [
        _table(
            "Host KV tier, Llama-3.1-70B TP2 on h100-sxm, 256 GiB host per GPU",
            (
                "seq tokens",
                "host GB/s",
                "HBM seqs",
                "host seqs used",
                "tok/s HBM",
                "tok/s +host",
                "gain",
            ),
            rows,
        )
    ], rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller traces (about a minute)")
    ap.add_argument("--json", help="also write the numbers to this JSON file")
    ap.add_argument(
        "--grid",
        action="store_true",
        help="add the agreement grids (agreement_grid = disaggregation, prefix_grid, spec_grid)",
    )
    ap.add_argument(
        "--only", nargs="+", help="run only these sections (e.g. prefix_grid spec_grid)"
    )
    ap.add_argument("--requests", type=int, help="requests per seed per grid point (override)")
    args = ap.parse_args()
    record = {}
    basic = [
        ("prefix", prefix),
        ("speculative", speculative),
        ("parallel", parallel),
        ("disaggregation", disagg),
        ("host_tier", host),
    ]
    grids = [
        (name, functools.partial(fn, requests=args.requests))
        for name, fn in (
            ("agreement_grid", disagg_grid),
            ("prefix_grid", prefix_grid),
            ("spec_grid", spec_grid),
        )
    ]
    sections = basic + grids if args.grid else basic
    if args.only:
        sections = [(n, f) for n, f in basic + grids if n in args.only]
    for name, fn in sections:
        t0 = time.perf_counter()
        tables, record[name] = fn(args.quick)
        print("\n\n".join(tables))
        print(f"\n({name}: {time.perf_counter() - t0:.1f} s)\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(record, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
