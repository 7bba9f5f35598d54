"""Regenerate the bundled posterior ``data/posteriors/default.nc``.

    python -m fitting.fit_bundled            # NUTS, the documented settings below
    python -m fitting.fit_bundled --prior-only
    python -m fitting.fit_bundled --serving-stage-only   # keep the NUTS stage, refit the cut stage

Fits every file in ``data/measurements`` (``fitting.bundled_measurements()``) on a seeded
stratified subsample (``PER_STRATUM`` rows per source/scenario/op/gpu/metric cell), prints the
diagnostics (R-hat, bulk ESS, divergences) and writes the ArviZ netCDF.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

PER_STRATUM = 10
DRAWS = 1200
WARMUP = 600
CHAINS = 2
SEED = 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fitting.fit_bundled", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", default=None, help="output path (default: the bundled default.nc)")
    parser.add_argument(
        "--prior-only", action="store_true", help="write spec-sheet prior draws only"
    )
    parser.add_argument(
        "--serving-stage-only",
        action="store_true",
        help="keep the bundled NUTS stage and refit only the end-to-end (cut) stage",
    )
    parser.add_argument("--per-stratum", type=int, default=PER_STRATUM)
    parser.add_argument("--draws", type=int, default=DRAWS)
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--chains", type=int, default=CHAINS)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)

    import numpyro

    numpyro.set_host_device_count(args.chains)  # chains on separate cores (before JAX starts)
    import jax

    jax.config.update("jax_enable_x64", True)
    from . import _fit, _posterior

    t0 = time.perf_counter()
    table, ingest_skipped = _fit.read_tables(_fit.bundled_files())
    if args.serving_stage_only:
        return _refit_serving_stage(table, args, t0)
    result = _fit.fit_table(
        table,
        per_stratum=args.per_stratum,
        seed=args.seed,
        draws=args.draws,
        warmup=args.warmup,
        chains=args.chains,
        prior_only=args.prior_only,
    )
    attrs = result.posterior.idata.attrs
    attrs["command"] = "python -m fitting.fit_bundled" + (
        " --prior-only" if args.prior_only else ""
    )
    out = _posterior.save_posterior(
        result.posterior, args.out or _posterior.default_posterior_path()
    )
    print(
        f"{attrs['method']}: {attrs['fit_rows']} rows of {attrs['table_rows']} ({attrs['subsample']}), "
        f"{result.posterior.num_draws} draws, {time.perf_counter() - t0:.0f} s -> {out}"
    )
    for reason, n in _fit.skipped_summary(result.prepared.skipped + ingest_skipped).items():
        print(f"  skipped {n} subsample rows: {reason}")
    if result.diagnostics is not None:
        print(result.diagnostics.report())
    _print_overhead(attrs)
    return 0


def _print_overhead(attrs) -> None:
    """The cut stage's profiled host overhead and its profile log likelihood over the grid."""
    if "serving_step_overhead_s" in attrs:
        print(
            f"host overhead per iteration (profiled on the end-to-end rows): "
            f"{attrs['serving_step_overhead_s'] * 1e3:.3g} ms; profile {attrs['serving_overhead_profile']}"
        )


def _refit_serving_stage(table, args, t0: float) -> int:
    """The bundled posterior's NUTS stage with its end-to-end stage refitted on ``table``."""
    from . import _posterior, _serving_stage

    base = _posterior.load_posterior(None)
    nuts = _serving_stage.without_serving_stage(base.idata)
    idata, n = _serving_stage.add_serving_stage(nuts, table, seed=args.seed)
    idata.attrs["serving_stage_command"] = "python -m fitting.fit_bundled --serving-stage-only"
    target = Path(args.out or _posterior.default_posterior_path())
    # the loaded file stays open (netCDF reads lazily): write beside it, then replace it
    written = _posterior.save_posterior(
        _posterior.Posterior(idata), target.with_name(target.name + ".tmp")
    )
    base.idata.close()
    out = written.replace(target)
    print(f"cut stage refitted on {n} end-to-end rows, {time.perf_counter() - t0:.0f} s -> {out}")
    _print_overhead(idata.attrs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
