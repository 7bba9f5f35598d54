"""New GPU in a few measurements: 10 rows of a held-out GPU vs its spec-sheet-only prediction.

    python benchmarks/bench_new_gpu.py                       # a40, l40s, h200-sxm; bundled prior
    python benchmarks/bench_new_gpu.py --gpus a40 --refit    # prior refitted without the GPU
    python benchmarks/bench_new_gpu.py --quick               # a40, one seed, tiny (smoke)

For each GPU: ``--n`` rows drawn (seeded, stratified over its op/scenario cells) are what a user
measured; the rest of its rows (up to ``--max-rows``) are scored.  "spec-sheet only" predicts the
GPU from its catalog row and the population (mu, tau) of the prior, as a GPU the fit never saw;
"updated" is ``servingmath fit --prior`` (``fitting._update.update_posterior``, started from the
population) on the ``--n`` rows.  By default the prior is the bundled posterior with the GPU's own
parameters removed (its population and source offsets still saw the GPU's rows); ``--refit`` fits
the prior without any of the GPU's rows (bundled settings, minutes per GPU) for a strict hold-out.
The user-side command is printed with each result.
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import fitting
from fitting import update_posterior, validate, without_gpu
from fitting.fit_bundled import CHAINS, DRAWS, PER_STRATUM, WARMUP


def _pick(rows, n: int, seed: int):
    """``n`` rows spread over the GPU's cells (one per cell in turn), seeded."""
    shuffled = rows.sample(frac=1.0, random_state=seed)
    rank = shuffled.groupby(["scenario", "op", "metric"], dropna=False, sort=False).cumcount()
    return (
        shuffled.assign(_rank=rank.to_numpy())
        .sort_values("_rank", kind="stable")
        .head(n)
        .drop(columns="_rank")
    )


def _cells(s: dict) -> str:
    med = "overload" if s["median_ape"] is None else f"{100 * s['median_ape']:7.1f}%"
    mape = "-" if s["mape"] is None else f"{100 * s['mape']:7.1f}%"
    return f"{s['n']:>5} {med} {mape} {100 * s['coverage_50']:6.0f}% {100 * s['coverage_90']:6.0f}%"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", nargs="+", default=["a40", "l40s", "h200-sxm"])
    ap.add_argument("--n", type=int, default=10, help="measurements the user gives (default 10)")
    ap.add_argument("--seeds", type=int, default=3, help="repeats with different row picks")
    ap.add_argument(
        "--max-rows", type=int, default=400, help="rows scored per GPU (seeded subsample)"
    )
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--refit", action="store_true", help="refit the prior without the GPU (slow)")
    ap.add_argument(
        "--score-draws", type=int, default=200, help="posterior predictive draws of the scoring"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a40, one seed, 50 rows scored, 20 + 20 NUTS draws, 20 scoring draws (smoke)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.gpus, args.seeds, args.max_rows = ["a40"], 1, 50
        args.draws = args.warmup = args.score_draws = 20

    table = fitting.load_measurements(fitting.bundled_measurements()).table
    bundled = fitting.load_posterior()
    print(
        f"{'gpu':<10} {'seed':>4} {'prior':<14} {'n':>5} {'medAPE':>8} {'MAPE':>8} {'cov50':>7} {'cov90':>7}  update s"
    )
    for gpu in args.gpus:
        rows = table[table["gpu"] == gpu]
        if args.refit:
            prior = fitting.fit_table(
                table[table["gpu"] != gpu],
                per_stratum=PER_STRATUM,
                seed=0,
                draws=DRAWS,
                warmup=WARMUP,
                chains=CHAINS,
            ).posterior
        else:
            prior = without_gpu(bundled, gpu)
        for seed in range(args.seeds):
            given = _pick(rows, args.n, seed)
            rest = rows.drop(given.index)
            rest = rest.sample(min(len(rest), args.max_rows), random_state=seed)
            t0 = time.perf_counter()
            updated, _ = update_posterior(
                prior,
                given,
                from_population=True,
                draws=args.draws,
                warmup=args.warmup,
                chains=2,
                seed=seed,
            )
            dt = time.perf_counter() - t0
            for label, post in (("spec-sheet", prior), ("updated", updated)):
                s = validate(post, rest, num_draws=args.score_draws, seed=seed, max_rows=None)
                print(
                    f"{gpu:<10} {seed:>4} {label:<14} {_cells(s)}"
                    + (f"  {dt:6.1f}" if label == "updated" else "")
                )
        print(
            f"  command: servingmath fit --data {gpu}_{args.n}rows.csv --prior --from-population "
            f"--out {gpu}.nc --draws {args.draws} --warmup {args.warmup}; "
            f"servingmath validate --posterior {gpu}.nc --data {gpu}_rest.csv"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
