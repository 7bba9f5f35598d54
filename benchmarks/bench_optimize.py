"""Proof of the gradient search against exhaustive enumeration of the same discrete grid.

Random instances (model x 3 candidate GPUs x workload x SLO x confidence x dtype quality
penalties); for each, the gradient search (``optimize.search``) and the referee
(``optimize.exhaustive_optimum``: every configuration x every replica count) use the same model
and the same posterior draws.  Prints the share of instances where the search reaches the
optimum's cost within 1 %, the count of infeasible answers reported feasible (re-checked exactly),
and the time of each (compiled once; static shapes).

    python benchmarks/bench_optimize.py --instances 200 --draws 200
    python benchmarks/bench_optimize.py --features --instances 30 --draws 200
    python benchmarks/bench_optimize.py --features --instances 30 --search-only   # time only
    python benchmarks/bench_optimize.py --quick   # 2 instances, 16 draws, small grid (smoke)

The default grid is the CLI's default knob space without pool splits or speculation: KV and
weight dtypes bf16/fp8, TP 1-8, PP 1-4, four token budgets, three prefill chunks (<= budget),
four sequence caps.  ``--features`` adds prefill:decode pool splits (1:1, 2:1, 1:2, prefill pool on
any candidate GPU) and MTP speculation (k = 0, 2, 4 at a random acceptance in [0.4, 0.9]) on a
smaller base grid (PP 1-2, bf16 weights, two budgets, two sequence caps) so that the referee can
still enumerate every point.
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np

from optimize import (
    KNOBS,
    Grid,
    SearchOptions,
    Workload,
    exhaustive_optimum,
    make_problem,
    meets_confidence,
    search,
    slo_probability,
)
from perfmodel import load_model

MODELS = (
    "meta-llama/Llama-3.1-8B",
    "Qwen/Qwen2.5-7B",
    "Qwen/Qwen2.5-32B",
    "meta-llama/Llama-3.1-70B",
    "mistralai/Mixtral-8x7B-v0.1",
    "Qwen/Qwen3-30B-A3B",
)
GPUS = (
    "h100-sxm",
    "a100-sxm-80gb",
    "l40s",
    "h200-sxm",
    "a100-pcie-80gb",
    "h100-pcie",
    "l4",
    "b200",
)


BASE_GRID = Grid(
    num_gpus=3,
    kv_dtypes=("bf16", "fp8"),
    weight_dtypes=("bf16", "fp8"),
    chunk_sizes=(512, 2048, 8192),
)
FEATURE_GRID = Grid(
    num_gpus=3,
    pp=(1, 2),
    kv_dtypes=("bf16", "fp8"),
    weight_dtypes=("bf16",),
    max_num_batched_tokens=(2048, 8192),
    max_num_seqs=(128, 256),
    chunk_sizes=(512, 2048, 8192),
    spec_k=(0, 2, 4),
    pool_ratios=((1, 1), (2, 1), (1, 2)),
)
QUICK_GRID = Grid(
    num_gpus=3,
    tp=(1, 2),
    pp=(1,),
    kv_dtypes=("bf16", "fp8"),
    weight_dtypes=("bf16",),
    max_num_batched_tokens=(2048,),
    max_num_seqs=(256,),
    chunk_sizes=(2048,),
)
"""``--quick``: TP 1-2 and the KV dtype on each of the three GPUs, so the referee enumerates
every point in seconds."""


def random_instance(
    rng: np.random.Generator,
    num_draws: int,
    seed: int,
    features: bool = False,
    long_prompts: bool = False,
    grid: Grid | None = None,
):
    """One random problem (fixed number of GPU candidates: static shapes across instances)."""
    model = load_model(MODELS[rng.integers(len(MODELS))])
    gpus = tuple(rng.choice(GPUS, size=3, replace=False))
    workload = Workload(
        arrival_rate_per_s=float(np.exp(rng.uniform(np.log(0.5), np.log(60.0)))),
        prompt_tokens_mean=float(rng.choice([256, 512, 1024, 2048, 4096, 8192])),
        output_tokens_mean=float(rng.choice([64, 128, 256, 512, 1024])),
        output_tokens_cv=float(rng.uniform(0.0, 1.5)),
    )
    ttft = None if rng.random() < 0.2 else float(np.exp(rng.uniform(np.log(0.1), np.log(5.0))))
    tpot = None if rng.random() < 0.2 else float(np.exp(rng.uniform(np.log(0.01), np.log(0.2))))
    if long_prompts:  # the regime where a pool split can pay: long prompts, tight TPOT
        workload = Workload(
            arrival_rate_per_s=float(np.exp(rng.uniform(np.log(2.0), np.log(30.0)))),
            prompt_tokens_mean=float(rng.choice([4096, 8192])),
            output_tokens_mean=float(rng.choice([128, 256])),
            output_tokens_cv=float(rng.uniform(0.0, 1.5)),
        )
        ttft = float(np.exp(rng.uniform(np.log(1.0), np.log(5.0))))
        tpot = float(np.exp(rng.uniform(np.log(0.01), np.log(0.03))))
    penalty = {d: float(rng.uniform(0.0, 0.3)) for d in ("fp8", "int8", "int4")}
    spec = (
        {"spec_draft": "mtp", "spec_acceptance": float(rng.uniform(0.4, 0.9))} if features else {}
    )
    return make_problem(
        model,
        gpus,
        workload,
        slo_ttft_p95_s=ttft,
        slo_tpot_p95_s=tpot,
        confidence=float(rng.choice([0.5, 0.8, 0.9, 0.95])),
        num_draws=num_draws,
        seed=seed,
        quality_penalty=penalty,
        grid=grid or (FEATURE_GRID if features else BASE_GRID),
        **spec,
    ), (model.name, gpus, ttft, tpot)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=200)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--pair-seeds", type=int, default=SearchOptions().pair_seeds)
    ap.add_argument("--starts", type=int, default=SearchOptions().num_starts)
    ap.add_argument("--seeds", type=int, default=SearchOptions().num_seeds)
    ap.add_argument("--only", type=int, nargs="*", help="run only these instance indices")
    ap.add_argument(
        "--features", action="store_true", help="pool splits and speculation in the grid"
    )
    ap.add_argument(
        "--long-prompts", action="store_true", help="4-8k prompts, 128-256 outputs, TPOT 10-30 ms"
    )
    ap.add_argument(
        "--search-only",
        action="store_true",
        help="time the search alone (no referee: seconds per answer, no accuracy figures)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="2 instances, 16 draws, a small grid (smoke)"
    )
    args = ap.parse_args(argv)
    grid = None
    if args.quick:
        args.instances, args.draws, grid = 2, 16, QUICK_GRID
    rng = np.random.default_rng(args.seed)
    options = SearchOptions(
        pair_seeds=args.pair_seeds, num_starts=args.starts, num_seeds=args.seeds
    )

    # compile both once, on an instance outside the count
    warm, _ = random_instance(
        np.random.default_rng(12345), args.draws, 0, args.features, args.long_prompts, grid
    )
    search(warm, options)
    if args.search_only:
        times = []
        for i in range(args.instances):
            problem, _ = random_instance(rng, args.draws, i, args.features, args.long_prompts, grid)
            t0 = time.perf_counter()
            search(problem, options._replace(seed=i))
            times.append(time.perf_counter() - t0)
        t = np.asarray(times)
        print(
            f"search only, {len(t)} instances, {args.draws} draws: seconds per answer mean "
            f"{t.mean():.3f}, max {t.max():.3f}"
        )
        return
    exhaustive_optimum(warm)

    within, false_feasible, both_infeasible, missed_feasible, split, spec = 0, 0, 0, 0, 0, 0
    t_search, t_grid = [], []
    for i in range(args.instances):
        problem, label = random_instance(rng, args.draws, i, args.features, args.long_prompts, grid)
        if args.only and i not in args.only:
            continue
        t0 = time.perf_counter()
        found = search(problem, options._replace(seed=i))
        t1 = time.perf_counter()
        ref = exhaustive_optimum(problem)
        t2 = time.perf_counter()
        t_search.append(t1 - t0)
        t_grid.append(t2 - t1)
        cost = float(found.cost_per_hour[0]) if len(found.configs) else np.inf
        if np.isfinite(cost):
            prob = float(
                slo_probability(problem, jnp.asarray(found.configs[0]), float(found.replicas[0]))
            )
            if not meets_confidence(prob, float(problem.confidence)):
                false_feasible += 1
                print(
                    f"[{i}] re-check probability {prob} < {float(problem.confidence)}", flush=True
                )
        if not np.isfinite(ref.cost_per_hour):
            both_infeasible += not np.isfinite(cost)
            within += not np.isfinite(cost)
            false_feasible += np.isfinite(cost)
            if np.isfinite(cost):
                print(
                    f"[{i}] grid infeasible, search {cost} {found.configs[0]} x{found.replicas[0]}",
                    flush=True,
                )
        elif cost <= ref.cost_per_hour * 1.01:
            within += 1
        elif not np.isfinite(cost):
            missed_feasible += 1
        if ref.config is not None:
            split += int(ref.config[KNOBS.index("pool_split")] > 0)
            spec += int(ref.config[KNOBS.index("spec_k")] > 0)
        if len(t_search) % 10 == 0:
            print(
                f"... {len(t_search)} done: within {within}, false feasible {false_feasible}, search "
                f"{np.mean(t_search):.3f} s, exhaustive {np.mean(t_grid):.3f} s",
                flush=True,
            )
        if args.verbose or (
            np.isfinite(ref.cost_per_hour) and not cost <= ref.cost_per_hour * 1.01
        ):
            print(
                f"[{i}] {label} search {cost:.3f} ({found.configs[0] if len(found.configs) else None} x{found.replicas[0] if len(found.configs) else 0}) "
                f"grid {ref.cost_per_hour:.3f} ({ref.config} x{ref.replicas})",
                flush=True,
            )
    n = len(t_search)
    ts, tg = np.asarray(t_search), np.asarray(t_grid)
    print(
        f"instances: {n} (draws {args.draws}, grid {ref.evaluated} configuration x replica points each)"
    )
    print(
        f"within 1% of the exhaustive optimum: {within}/{n} = {within / n:.1%} (both infeasible: {both_infeasible})"
    )
    print(
        f"infeasible reported feasible: {false_feasible}; feasible instances reported infeasible: {missed_feasible}"
    )
    print(f"exhaustive optimum is a pool split in {split}, speculative in {spec} of {n} instances")
    print(
        f"seconds per answer: search mean {ts.mean():.3f} max {ts.max():.3f}; "
        f"exhaustive mean {tg.mean():.3f}; speed-up {tg.sum() / ts.sum():.1f}x"
    )


if __name__ == "__main__":
    main()
