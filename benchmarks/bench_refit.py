"""The bundled posterior is reproducible: a short NUTS refit on its data and settings agrees with it.

    python benchmarks/bench_refit.py          # one chain of 80 + 80 draws (~2 min on 2 cores)
    python benchmarks/bench_refit.py --quick  # a smoke run: 2 rows per stratum, 10 + 10 draws

Refits ``fitting.fit_bundled``'s data (every bundled measurement file, its ``PER_STRATUM``
subsample and ``SEED``) with one short chain and compares the well-identified efficiencies of
three GPUs with ``data/posteriors/default.nc``: |mean difference| against 4 x the combined Monte
Carlo standard error (+ 1e-3).  A disagreement means the bundled file is stale (the data, the
step model or the priors changed since it was fitted): refit it with ``python -m
fitting.fit_bundled``.  Exit status 1 when any parameter disagrees (not in ``--quick``, whose
chain is too short to judge).
"""

from __future__ import annotations

import argparse
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import arviz as az
import numpy as np

import fitting
from fitting import fit_bundled
from servingmath.cli import enable_compile_cache

CHECKED_PARAMETERS = (
    "compute_fraction_max",
    "bandwidth_fraction",
    "elementwise_bandwidth_fraction",
)
CHECKED_GPUS = ("a100-sxm-80gb", "h100-sxm", "a40")
MCSE_MULTIPLE = 4.0
"""A refit agrees when |mean difference| <= MCSE_MULTIPLE x the combined MCSE + ABSOLUTE_SLACK."""
ABSOLUTE_SLACK = 1e-3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rows per stratum, 10 + 10 draws")
    args = ap.parse_args()
    enable_compile_cache()  # a second run loads its compiled programs
    t0 = time.time()
    bundled = fitting.load_posterior()
    table = fitting.load_measurements(fitting.bundled_measurements()).table
    per_stratum, draws = (2, 10) if args.quick else (fit_bundled.PER_STRATUM, 80)
    short = fitting.fit_table(
        table,
        per_stratum=per_stratum,
        seed=fit_bundled.SEED,
        draws=draws,
        warmup=draws,
        chains=1,
        serving=False,
    )
    same_layout = short.prepared.gpus == bundled.gpus and (
        bundled.cells[: len(short.prepared.cells)] == short.prepared.cells
    )
    print(f"refit: {per_stratum} rows per stratum, {draws} + {draws} draws, 1 chain")
    print("| parameter | gpu | refit mean | bundled mean | |diff| / MCSE | agrees |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    disagree = 0
    for name in CHECKED_PARAMETERS:
        for gpu in CHECKED_GPUS:
            a = short.posterior.idata.posterior[name].sel(gpu=gpu)
            b = bundled.idata.posterior[name].sel(gpu=gpu)
            mcse = np.hypot(
                float(az.mcse(a.to_dataset())[name]), float(az.mcse(b.to_dataset())[name])
            )
            diff = abs(float(a.mean()) - float(b.mean()))
            ok = diff <= MCSE_MULTIPLE * mcse + ABSOLUTE_SLACK
            disagree += not ok
            print(
                f"| {name} | {gpu} | {float(a.mean()):.4f} | {float(b.mean()):.4f} "
                f"| {diff / max(mcse, 1e-12):.1f} | {'yes' if ok else 'NO'} |"
            )
    print(f"same GPUs and cells as the bundled file: {'yes' if same_layout else 'NO'}")
    print(f"{time.time() - t0:.0f} s")
    if args.quick:
        return 0
    return 0 if (disagree == 0 and same_layout) else 1


if __name__ == "__main__":
    sys.exit(main())
