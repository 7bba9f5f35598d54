"""``servingmath validate``: error and interval coverage of a posterior on measurements."""

from __future__ import annotations

import argparse
import json

from ..errors import UsageError
from ..options.run_fill import add_data_argument, add_run_fill_arguments
from ..options.validators import nonnegative_int, output_dir, positive_int
from ..progress import phases_for

HELP = "score a posterior on measurements: median/mean APE and 50/90% interval coverage"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--posterior", default=None, help="posterior netCDF (default: the bundled one)"
    )
    add_data_argument(parser)
    parser.add_argument(
        "--draws", type=positive_int, default=200, help="predictive draws per row (default 200)"
    )
    parser.add_argument(
        "--max-rows",
        type=positive_int,
        default=5000,
        help="score a seeded stratified subsample above this many rows (default 5000)",
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument(
        "--hardware-csv",
        default=None,
        help="spec rows (columns of data/hardware.csv) of GPUs the catalog lacks",
    )
    add_run_fill_arguments(parser, engine_help="engine of rows that do not name one")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plot",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write PNGs: predicted vs measured (log-log, 90%% intervals), per-parameter "
        "posteriors, residuals by scenario",
    )


def load_inputs(
    posterior_path: str | None, data: list[str], hardware_csv: str | None = None, **fills
):
    """(posterior, table, ingest-skipped rows), with library errors turned into ``UsageError``;
    ``hardware_csv`` adds its GPU ids to the catalog's, ``fills`` (gpu, tp, engine, stream interval, scheduler polls) fill what the
    files do not record."""
    import fitting

    try:
        posterior = fitting.load_posterior(posterior_path)
        ids = None
        if hardware_csv:
            import perfmodel

            ids = list(perfmodel.hardware_ids()) + list(perfmodel.hardware_ids(hardware_csv))
        result = fitting.load_measurements(data, hardware_ids=ids, **fills)
    except (fitting.PosteriorError, fitting.MeasurementFormatError, ValueError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    return posterior, result.table, list(result.skipped)


def run(args: argparse.Namespace) -> int:
    if args.draws < 2 or args.max_rows < 1:
        raise UsageError("--draws must be >= 2 and --max-rows >= 1; pass larger values")
    import jax

    jax.config.update("jax_enable_x64", True)
    from fitting import format_report, user_hardware, validate

    phases = phases_for(args)
    try:
        phases("reading the posterior and the measurements")
        posterior, table, skipped = load_inputs(
            args.posterior,
            args.data,
            args.hardware_csv,
            gpu=args.gpu,
            tp=args.tp,
            engine=args.engine,
            stream_interval=args.stream_interval,
            scheduler_recv_interval=args.scheduler_recv_interval,
        )
        phases(f"predicting {min(len(table), args.max_rows):,} rows x {args.draws} draws")
        with user_hardware(args.hardware_csv):
            result = validate(
                posterior,
                table,
                num_draws=args.draws,
                seed=args.seed,
                max_rows=args.max_rows,
                extra_skipped=skipped,
            )
    finally:
        phases.done()
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"posterior {posterior.path} ({posterior.idata.attrs.get('method', '?')}, "
            f"{posterior.num_draws} draws) on {len(table)} rows"
        )
        print(format_report(result))
    if args.plot:
        from fitting import write_plots

        paths = write_plots(
            posterior,
            args.plot,
            table=table,
            num_draws=args.draws,
            seed=args.seed,
            max_rows=args.max_rows,
            hardware_csv=args.hardware_csv,
        )
        if not args.json:
            for path in paths:
                print(f"wrote {path}")
    return 0
