"""The search model against the one load model it stands in for, configuration by configuration.

The optimiser's search evaluates ``optimize.slo_metrics`` (step budgets + an M/G/1 wait: ~3 us
per evaluation) and the verdict re-checks its best few with ``perfmodel.dynamics.serving_metrics``
(~0.7 ms).  A verdict can only correct the candidates the search hands it, so the two must agree
on which configurations meet an SLO.  For every colocated configuration of a few problems (dense
8B/70B, a MoE, chat and long-prompt workloads), at replica counts around the fewest the load
model needs, and for a few posterior draws, this prints the median and 10-90 % range of the
ratio search / load model of p95 TTFT, p95 TPOT and utilisation, and the share of
(configuration, replicas, draw) points where both say the same about each SLO.

    python benchmarks/bench_search_agreement.py            # 4 problems, 8 draws (~4 min)
    python benchmarks/bench_search_agreement.py --quick    # 1 problem, 2 draws (smoke)
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np

from optimize import (
    Grid,
    Workload,
    colocated_verdict_metrics,
    draw_metrics,
    make_problem,
    one_hot_weights,
)
from perfmodel import load_model
from servingmath.cli import enable_compile_cache

PROBLEMS = (
    # (model, gpu, rate, prompt, output, ttft SLO, tpot SLO)
    ("meta-llama/Llama-3.1-8B", "h100-sxm", 20.0, 1024.0, 256.0, 1.0, 0.05),
    ("meta-llama/Llama-3.1-8B", "a100-sxm-80gb", 4.0, 8192.0, 256.0, 3.0, 0.05),
    ("meta-llama/Llama-3.1-70B", "h100-sxm", 4.0, 2000.0, 200.0, 2.0, 0.05),
    ("mistralai/Mixtral-8x7B-v0.1", "h100-sxm", 8.0, 1024.0, 512.0, 1.5, 0.04),
)
GRID = Grid(
    num_gpus=1,
    tp=(1, 2, 4, 8),
    pp=(1, 2),
    kv_dtypes=("bf16", "fp8"),
    weight_dtypes=("bf16", "fp8"),
    max_num_batched_tokens=(2048, 8192),
    max_num_seqs=(256,),
    max_replicas=64,
)


def _problem(spec, draws: int):
    name, gpu, rate, prompt, output, ttft, tpot = spec
    wl = Workload(
        arrival_rate_per_s=rate,
        prompt_tokens_mean=prompt,
        output_tokens_mean=output,
        output_tokens_cv=1.0,
    )
    return make_problem(
        load_model(name),
        (gpu,),
        wl,
        slo_ttft_p95_s=ttft,
        slo_tpot_p95_s=tpot,
        grid=GRID,
        num_draws=draws,
    )


def _search_model(problem, configs, replicas):
    return jax.jit(
        jax.vmap(lambda c, r: draw_metrics(problem, one_hot_weights(c, problem.grid), r))
    )(configs, replicas)


def compare(problem, replicas_per_config: int = 3):
    """(ratios of p95 TTFT, p95 TPOT, utilisation; agreement on TTFT ok, TPOT ok, stable) over
    every finite point of every fitting configuration at 1, 2, 4 ... replicas."""
    configs = problem.grid.all_configs(problem.model)
    reps = 2.0 ** np.arange(replicas_per_config)
    c = np.repeat(configs, len(reps), axis=0)
    r = np.tile(reps, len(configs))
    fast = jax.tree_util.tree_map(
        np.asarray, _search_model(problem, jnp.asarray(c), jnp.asarray(r))
    )
    full = jax.tree_util.tree_map(
        np.asarray, colocated_verdict_metrics(problem, jnp.asarray(c), jnp.asarray(r))
    )
    fits = (full.concurrent_requests >= 1) & (full.utilization < 1) & (fast.utilization < 1)
    ratios = {
        "ttft_p95": fast.ttft_p95_s[fits] / full.ttft_p95_s[fits],
        "tpot_p95": fast.tpot_p95_s[fits] / full.tpot_p95_s[fits],
        "utilization": fast.utilization[fits] / full.utilization[fits],
    }
    ok = full.concurrent_requests >= 1
    agree = {
        "ttft_ok": np.mean(
            (fast.ttft_p95_s <= problem.slo_ttft_p95_s)
            == (full.ttft_p95_s <= problem.slo_ttft_p95_s),
            where=ok,
        ),
        "tpot_ok": np.mean(
            (fast.tpot_p95_s <= problem.slo_tpot_p95_s)
            == (full.tpot_p95_s <= problem.slo_tpot_p95_s),
            where=ok,
        ),
        "stable": np.mean((fast.utilization < 1) == (full.utilization < 1), where=ok),
    }
    return ratios, agree, int(np.sum(fits))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="one problem, two draws (smoke run)")
    args = ap.parse_args()
    enable_compile_cache()  # a second run loads its compiled programs
    problems = PROBLEMS[:1] if args.quick else PROBLEMS
    draws = 2 if args.quick else args.draws
    print(
        "| problem | points | p95 TTFT search/full | p95 TPOT search/full | utilisation "
        "| agree TTFT / TPOT / stable |"
    )
    print("| --- | ---: | --- | --- | --- | --- |")
    pooled = {"ttft_p95": [], "tpot_p95": [], "utilization": []}
    t0 = time.perf_counter()
    for spec in problems:
        ratios, agree, n = compare(_problem(spec, draws))
        cells = []
        for k, seen in pooled.items():
            seen.append(ratios[k])
            q = np.percentile(ratios[k], [50, 10, 90]) if n else [np.nan] * 3
            cells.append(f"{q[0]:.2f} ({q[1]:.2f}-{q[2]:.2f})")
        label = f"{spec[0].split('/')[-1]} {spec[1]} {spec[2]:g}/s {spec[3]:g}/{spec[4]:g}"
        shares = " / ".join(f"{100 * agree[k]:.0f} %" for k in ("ttft_ok", "tpot_ok", "stable"))
        print(f"| {label} | {n} | " + " | ".join(cells) + f" | {shares} |")
    cells = []
    for k, v in pooled.items():
        q = np.percentile(np.concatenate(v), [50, 10, 90])
        cells.append(f"{q[0]:.2f} ({q[1]:.2f}-{q[2]:.2f})")
    print("| **pooled** | | " + " | ".join(cells) + " | |")
    print(f"({time.perf_counter() - t0:.0f} s, {draws} draws per configuration)")


if __name__ == "__main__":
    main()
