"""Held-out calibration benchmark: random 20 % split and leave-one-GPU-out.

    python benchmarks/bench_calibration.py                      # both splits, NUTS
    python benchmarks/bench_calibration.py --split random       # just the random split
    python benchmarks/bench_calibration.py --gpus a40 l40s      # chosen held-out GPUs
    python benchmarks/bench_calibration.py --split residuals    # bundled posterior's residuals
    python benchmarks/bench_calibration.py --split source       # end-to-end rows, leave one lab out
    python benchmarks/bench_calibration.py --save-dir D         # also write each fit to D/<split>.nc
    python benchmarks/bench_calibration.py --load-dir D         # re-score those fits (no refit)
    python benchmarks/bench_calibration.py --quick              # a40 left out, tiny fit (smoke)

Random split: rows shuffled (seeded), 20 % held out; the fit sees a stratified subsample of the
other 80 % (the bundled settings), the score uses the held-out rows (seeded stratified subsample
above ``--max-rows``).  Leave-one-GPU-out: every row of one GPU is held out; the fit never sees it,
and it is predicted from its spec sheet and the pooled (population) efficiencies.
Leave-one-source-out: the end-to-end rows of one lab are held out of the end-to-end (cut) stage,
which alone sees end-to-end rows, and predicted (``fitting._holdout``; the same split as
``bench_e2e_holdout.py --split source``), reported per scenario, metric, engine and GPU.
Targets: median APE <= 8 % in-sample-GPU, <= 20 % leave-one-GPU-out, 90 % coverage in
[85 %, 95 %]; end-to-end rows of an unseen lab <= 15 % (static batch, saturated) and <= 20 %
(serving TTFT/TPOT/E2E), 90 % coverage in [80 %, 95 %].
"""

from __future__ import annotations

import argparse
import json
import time

import numpyro

from fitting.fit_bundled import CHAINS, DRAWS, PER_STRATUM, WARMUP

numpyro.set_host_device_count(CHAINS)  # one chain per core, as fit_bundled (before JAX starts)
import jax

jax.config.update("jax_enable_x64", True)

import fitting
from fitting import validate

DEFAULT_LOGO = ("a40", "l40s", "h200-sxm", "a100-sxm-80gb", "h100-sxm")


def _fit(train, args, name: str):
    """The split's posterior: fitted (and saved to ``--save-dir``), or read from ``--load-dir``."""
    if args.load_dir:
        from fitting import load_posterior

        return FitLike(load_posterior(f"{args.load_dir}/{name}.nc"), None)
    fr = _fit_table(train, args)
    if args.save_dir:
        from fitting import save_posterior

        save_posterior(fr.posterior, f"{args.save_dir}/{name}.nc")
    return fr


class FitLike:
    """A loaded posterior in the shape of ``fitting.fit_table``'s result."""

    def __init__(self, posterior, diagnostics):
        self.posterior, self.diagnostics = posterior, diagnostics


def _fit_table(train, args):
    return fitting.fit_table(
        train,
        per_stratum=args.per_stratum,
        seed=args.seed,
        draws=args.draws,
        warmup=args.warmup,
        chains=args.chains,
        svi=args.svi,
        serving=not args.no_serving_stage,
    )


def _line(label: str, s: dict, seconds: float) -> str:
    if not s["n"]:
        return f"{label:<28} n=0"
    med = "overload" if s["median_ape"] is None else f"{100 * s['median_ape']:5.1f}%"
    mape = "-" if s["mape"] is None else f"{100 * s['mape']:5.1f}%"
    return (
        f"{label:<28} n={s['n']:>5}  median APE {med}  MAPE {mape}"
        f"  cov50 {100 * s['coverage_50']:4.0f}%  cov90 {100 * s['coverage_90']:4.0f}%  ({seconds:.0f} s)"
    )


def residual_table(table, posterior, per_cell: int, seed: int):
    """Median log residual log(measured / predicted median), its sd and the median APE of the
    posterior's point prediction, per source x noise group x GPU (where the error lives)."""
    import numpy as np

    from fitting import noise_key, predictive_log_draws, prepare, subsample

    rows = subsample(table[table["scenario"] != "serving"], per_cell, seed)
    prep = prepare(
        rows, gpus=posterior.gpus, cells=posterior.cells, noise_keys=posterior.noise_keys
    )
    med = np.median(predictive_log_draws(posterior, prep, 100, seed=seed, noise=False), axis=0)
    t = prep.table.assign(res=prep.log_value - med)
    t = t.assign(group=[noise_key(r) for _, r in t.iterrows()], ape=np.abs(np.expm1(-t["res"])))
    return t.groupby(["source", "group", "gpu"]).agg(
        n=("res", "size"),
        median_log_resid=("res", "median"),
        sd=("res", "std"),
        median_ape=("ape", "median"),
    )


def _leave_one_source_out(table, seed: int) -> int:
    """End-to-end rows, one lab held out at a time: n, median APE and 50/90 % coverage per held-out
    lab, scenario, metric, engine and GPU."""
    import pandas as pd

    from fitting import holdout_scores

    t0 = time.perf_counter()
    grouped, scored = holdout_scores(fitting.load_posterior(), table, by="source", seed=seed)
    with pd.option_context("display.width", 200, "display.max_rows", 1000):
        print(grouped.round(3).to_string(index=False))
    print(
        f"all {len(scored)} end-to-end rows: median APE {100 * scored.ape.median():.1f} %, "
        f"coverage 50 % {100 * scored.in50.mean():.0f} %, 90 % {100 * scored.in90.mean():.0f} % "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--split", choices=("random", "logo", "both", "residuals", "source"), default="both"
    )
    ap.add_argument("--gpus", nargs="*", default=list(DEFAULT_LOGO))
    ap.add_argument("--per-stratum", type=int, default=PER_STRATUM)
    ap.add_argument("--draws", type=int, default=DRAWS)
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--chains", type=int, default=CHAINS)
    ap.add_argument("--svi", action="store_true")
    ap.add_argument("--max-rows", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--save-dir", default=None, help="write each split's posterior here")
    ap.add_argument("--load-dir", default=None, help="re-score posteriors saved by --save-dir")
    ap.add_argument(
        "--no-serving-stage",
        action="store_true",
        help="skip the end-to-end (cut) stage of each fit: the kernel and step rows alone",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="leave a40 out (kernel rows only): 2 rows per stratum, 10 + 10 draws, one chain, "
        "no end-to-end stage, 100 rows scored",
    )
    args = ap.parse_args()
    if args.quick:
        args.split, args.gpus, args.per_stratum, args.max_rows = "logo", ["a40"], 2, 100
        args.draws, args.warmup, args.chains, args.no_serving_stage = 10, 10, 1, True

    table = fitting.load_measurements(fitting.bundled_measurements()).table
    if args.split == "residuals":
        import pandas as pd

        with pd.option_context("display.width", 200, "display.max_rows", 500):
            print(
                residual_table(table, fitting.load_posterior(), 30, args.seed).round(3).to_string()
            )
        return 0
    if args.split == "source":
        return _leave_one_source_out(table, args.seed)
    results = {}
    if args.split in ("random", "both"):
        t0 = time.perf_counter()
        shuffled = table.sample(frac=1.0, random_state=args.seed)
        cut = int(0.8 * len(shuffled))
        train, test = shuffled.iloc[:cut], shuffled.iloc[cut:]
        fr = _fit(train, args, "random_20")
        res = validate(fr.posterior, test, max_rows=args.max_rows, seed=args.seed + 1)
        results["random_20"] = res
        print(_line("random 20% held out", res, time.perf_counter() - t0))
        for scen, s in res["by_scenario"].items():
            print(_line(f"  {scen}", s, 0))
        if fr.diagnostics is not None:
            print("  " + fr.diagnostics.report().splitlines()[0])
    if args.split in ("logo", "both"):
        for gpu in args.gpus:
            t0 = time.perf_counter()
            train, test = table[table.gpu != gpu], table[table.gpu == gpu]
            fr = _fit(train, args, f"logo_{gpu}")
            assert gpu not in fr.posterior.gpus
            res = validate(fr.posterior, test, max_rows=args.max_rows, seed=args.seed + 1)
            results[f"logo_{gpu}"] = res
            print(_line(f"leave out {gpu}", res, time.perf_counter() - t0))
            for scen, s in res["by_scenario"].items():
                print(_line(f"  {scen}", s, 0))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
