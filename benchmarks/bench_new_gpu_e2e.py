"""A new GPU from its own end-to-end runs: k benchmark runs vs the spec sheet.

    python benchmarks/bench_new_gpu_e2e.py            # h100-sxm, h200-sxm, b200 (InferenceMAX)
    python benchmarks/bench_new_gpu_e2e.py --mlperf   # and the MLPerf v4.1 GPUs
    python benchmarks/bench_new_gpu_e2e.py --quick    # one GPU, k in {0, 3}, one seed, tiny (smoke)

For each GPU with end-to-end rows, the GPU is treated as new.  The prior is the bundled posterior
with the GPU's own parameters removed (``fitting.without_gpu``: it is predicted from its
spec sheet and the population) and its end-to-end cut stage refitted without any of that GPU's
end-to-end rows (``fitting.without_serving_stage`` then ``add_serving_stage``, as
``fitting.holdout_scores`` does for a held-out GPU).  A "run" is one benchmark
invocation: the rows sharing (engine, model, TP, input and output length, concurrency, request
rate, scenario, and the GitHub Actions run id in ``notes`` where there is one;
``fitting._update.run_labels``, the unit the update's run effects pool).  Per seed the
GPU's runs are shuffled; the first k (k = 1, 3, 10, 30, nested) are what a user measured and
go to ``update_posterior(..., from_population=True)`` (``servingmath fit --prior``); the rows of
the runs after the largest k (at most ``--max-rows``, seeded) are scored by every k, k = 0 being
the prior itself (spec sheet and population, no update), with ``fitting.score_rows``
(median APE, 50/90 % interval coverage).  Target: <= 10 % median APE and 85-95 % 90 % coverage
after 10 runs.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np
import pandas as pd

import fitting
from fitting import (
    E2E_SCENARIOS,
    MAX_SERVING_ROWS,
    SERVING_ROWS_PER_CELL,
    add_serving_stage,
    run_labels,
    score_rows,
    update_posterior,
    without_gpu,
    without_serving_stage,
)
from servingmath.cli import enable_compile_cache

INFERENCEMAX = "data/measurements/inferencemax_nvidia.csv.gz"
MLPERF = "data/measurements/mlperf_v41.csv.gz"
E2E_FILES = ("data/measurements/aic_serving_h100.csv", INFERENCEMAX, MLPERF)
"""Every file with end-to-end rows: the cut stage of the prior is refitted on them (less the GPU's)."""
QUICK_PER_CELL = 10
"""End-to-end rows per cell of the cut stage's refit in ``--quick``: every cell still gets its
offset (>= ``MIN_ROWS``), from a few rows instead of up to ``SERVING_ROWS_PER_CELL`` (the refit
predicts each row through the load models)."""
TARGET_APE, TARGET_COVERAGE, TARGET_K = 0.10, (0.85, 0.95), 10
"""The target: median APE and 90 %-interval coverage after ``TARGET_K`` runs."""


def new_gpu_prior(
    bundled: fitting.Posterior, e2e: pd.DataFrame, gpu: str, per_cell: int = SERVING_ROWS_PER_CELL
) -> fitting.Posterior:
    """``bundled`` as if ``gpu`` were new: its parameters removed and the end-to-end cut stage
    refitted without its end-to-end rows (at most ``per_cell`` rows per cell)."""
    nuts = without_serving_stage(bundled.idata)
    idata, _ = add_serving_stage(nuts, e2e[e2e["gpu"] != gpu], per_cell=per_cell, seed=0)
    return without_gpu(fitting.Posterior(idata, bundled.path), gpu)


def _scores(prior, rows, num_draws: int, seed: int) -> pd.DataFrame:
    tab, ape, in50, in90, _ = score_rows(prior, rows, num_draws=num_draws, seed=seed)
    return tab.assign(ape=ape, in50=in50, in90=in90)


def _line(label: str, k: int, part: pd.DataFrame, seconds: str = "") -> str:
    if not len(part):
        return f"| {label} | {k} | 0 | | | | {seconds} |"
    return (
        f"| {label} | {k} | {len(part)} | {100 * part.ape.median():.1f} % "
        f"| {100 * part.in50.mean():.0f} % | {100 * part.in90.mean():.0f} % | {seconds} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", nargs="+", default=None, help="default: every GPU of the files")
    ap.add_argument("--mlperf", action="store_true", help="also the MLPerf v4.1 GPUs")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 3, 10, 30], help="runs given")
    ap.add_argument("--seeds", type=int, default=2, help="repeats with different run picks")
    ap.add_argument("--max-rows", type=int, default=2000, help="rows scored per GPU (seeded)")
    ap.add_argument("--score-draws", type=int, default=100, help="predictive draws per score")
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--chains", type=int, default=1)
    ap.add_argument("--max-tree-depth", type=int, default=6)
    ap.add_argument(
        "--max-serving-rows",
        type=int,
        default=MAX_SERVING_ROWS,
        help=f"end-to-end rows an update conditions on at most (default {MAX_SERVING_ROWS})",
    )
    ap.add_argument("--quick", action="store_true", help="h100-sxm, k in {0, 3}, 1 seed, tiny")
    ap.add_argument(
        "--save", metavar="CSV", help="also write every scored row (GPU, k, seed, APE) to CSV"
    )
    args = ap.parse_args(argv)
    per_cell, e2e_files = SERVING_ROWS_PER_CELL, E2E_FILES
    if args.quick:  # a smoke run: every step once, on the fewest rows and draws that run it
        args.gpus, args.ks, args.seeds, args.max_rows = ["h100-sxm"], [3], 1, 200
        args.draws = args.warmup = 10
        args.max_tree_depth, args.max_serving_rows = 3, 9
        args.score_draws = 20
        # the cut stage refitted on the InferenceMAX runs alone: closed-loop rows like the
        # scored ones, so the open-loop solve is never compiled
        per_cell, e2e_files = QUICK_PER_CELL, (INFERENCEMAX,)
    enable_compile_cache()
    ks = sorted(set(args.ks))
    e2e = fitting.load_measurements(list(e2e_files)).table
    e2e = e2e[e2e["scenario"].isin(E2E_SCENARIOS)]
    files = (INFERENCEMAX, MLPERF) if args.mlperf else (INFERENCEMAX,)
    sources = set(fitting.load_measurements(list(files)).table["source"])
    gpus = args.gpus or sorted(
        e2e.loc[e2e["source"].isin(sources), "gpu"].unique(),
        key=lambda g: (g not in ("h100-sxm", "h200-sxm", "b200"), g),
    )
    bundled = fitting.load_posterior()
    t_start = time.perf_counter()
    print(
        f"NUTS {args.draws} + {args.warmup} x {args.chains} chain(s), tree depth "
        f"{args.max_tree_depth}, <= {args.max_serving_rows} rows an update; {args.seeds} seed(s); <= {args.max_rows} rows scored per GPU, "
        f"{args.score_draws} predictive draws",
        flush=True,
    )
    print(
        "| GPU | k runs | n scored | median APE | 50 % cov. | 90 % cov. | update s |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        flush=True,
    )
    scored = []
    for gpu in gpus:
        rows = e2e[(e2e["gpu"] == gpu) & e2e["source"].isin(sources)]
        labels = run_labels(rows)
        runs = np.asarray(sorted(labels.unique()))
        usable = [k for k in ks if k < len(runs)]  # at least one run left to score
        prior = new_gpu_prior(bundled, e2e, gpu, per_cell)
        per_gpu = []
        for seed in range(args.seeds):
            order = np.random.default_rng(seed).permutation(runs)
            held = rows[labels.isin(order[max(usable, default=0) :])]
            held = held.sample(min(len(held), args.max_rows), random_state=seed)
            k0 = _scores(prior, held, args.score_draws, seed).assign(gpu=gpu, k=0, seed=seed)
            per_gpu.append(k0)
            for k in usable:
                t0 = time.perf_counter()
                updated, _ = update_posterior(
                    prior,
                    rows[labels.isin(order[:k])],
                    from_population=True,
                    draws=args.draws,
                    warmup=args.warmup,
                    chains=args.chains,
                    seed=seed,
                    max_tree_depth=args.max_tree_depth,
                    max_serving_rows=args.max_serving_rows,
                )
                dt = time.perf_counter() - t0
                part = _scores(updated, held, args.score_draws, seed)
                part = part.assign(gpu=gpu, k=k, seed=seed, s=dt)
                per_gpu.append(part)
                # each update compiles its own NUTS and predictive programs (their shapes); kept,
                # their code pages exhaust the kernel's memory-map limit (vm.max_map_count) within
                # the 18 updates of the full benchmark
                jax.clear_caches()
                print(
                    f"  {gpu} seed {seed} k {k}: {updated.idata.attrs['update_rows']} rows, "
                    f"update {dt:.0f} s, median APE {100 * part.ape.median():.1f} % "
                    f"({time.perf_counter() - t_start:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        per_gpu = pd.concat(per_gpu)
        for k, part in per_gpu.groupby("k"):
            secs = f"{part.s.mean():.0f}" if k else ""
            print(_line(f"{gpu} ({len(runs)} runs)", int(k), part, secs), flush=True)
        scored.append(per_gpu)
    scored = pd.concat(scored)
    if args.save:
        scored.to_csv(args.save, index=False)
    for k, part in scored.groupby("k"):
        print(_line("**pooled**", int(k), part), flush=True)
    at = scored[scored["k"] == TARGET_K]
    if len(at):
        ape, cov = at.ape.median(), at.in90.mean()
        met = ape <= TARGET_APE and TARGET_COVERAGE[0] <= cov <= TARGET_COVERAGE[1]
        verdict = "met" if met else "missed"
        print(
            f"target after {TARGET_K} runs: median APE <= {100 * TARGET_APE:.0f} % and 90 % "
            f"coverage {100 * TARGET_COVERAGE[0]:.0f}-{100 * TARGET_COVERAGE[1]:.0f} %: pooled "
            f"{100 * ape:.1f} %, {100 * cov:.0f} % -> {verdict}"
        )
    else:
        print(f"target after {TARGET_K} runs: not measured (k = {TARGET_K} not run)")
    by_metric = scored.groupby(["k", "metric"]).ape.median().unstack("metric")
    print("median APE by metric (pooled):")
    print((100 * by_metric).round(1).to_string())
    print(f"total {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
