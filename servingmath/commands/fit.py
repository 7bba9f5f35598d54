"""``servingmath fit``: calibrate the budgets on measurements (NumPyro NUTS or SVI)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..errors import UsageError
from ..options.run_fill import ENGINES, add_run_fill_arguments
from ..options.validators import nonnegative_int, output_dir, output_file, positive_int
from ..progress import phases_for

HELP = "fit the efficiency posterior to measurements (NUTS, or SVI with --svi)"
"""Engines ``--engine`` names (the ones the bundled posterior has pooled end-to-end cells for)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        nargs="+",
        required=True,
        metavar="FILE",
        help="measurement files or folders (SCHEMA.md CSVs, vLLM/SGLang/GenAI-Perf JSON)",
    )
    parser.add_argument(
        "--out", required=True, type=output_file, help="where to write the posterior netCDF"
    )
    parser.add_argument(
        "--draws", type=positive_int, default=500, help="posterior draws per chain (default 500)"
    )
    parser.add_argument(
        "--warmup",
        type=nonnegative_int,
        default=500,
        help="NUTS warm-up steps per chain (default 500)",
    )
    parser.add_argument("--chains", type=positive_int, default=2, help="NUTS chains (default 2)")
    parser.add_argument(
        "--per-stratum",
        type=nonnegative_int,
        default=10,
        help="seeded stratified subsample: rows per source/scenario/op/gpu/metric cell "
        "(default 10; 0 = all rows)",
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument(
        "--svi", action="store_true", help="SVI (low-rank Gaussian guide) instead of NUTS"
    )
    parser.add_argument(
        "--svi-steps", type=positive_int, default=3000, help="SVI optimisation steps (default 3000)"
    )
    parser.add_argument(
        "--prior",
        nargs="?",
        const="",
        default=None,
        metavar="P",
        help="update posterior P (default: the bundled one) with a few measurements of "
        "a GPU instead of refitting everything",
    )
    parser.add_argument(
        "--hardware-csv",
        default=None,
        help="spec rows (columns of data/hardware.csv) of GPUs the catalog lacks",
    )
    parser.add_argument(
        "--from-population",
        action="store_true",
        help="with --prior: start the measured GPUs from the population, even if P fitted them",
    )
    add_run_fill_arguments(
        parser,
        engine_help="engine of the runs whose files do not name it (end-to-end rows need one)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="model of tool-output rows (replaces the served name the tool recorded)",
    )
    parser.add_argument(
        "--max-tree-depth",
        type=positive_int,
        default=None,
        metavar="D",
        help="with --prior: NUTS tree depth cap (default 8: at most 255 gradients a draw)",
    )
    parser.add_argument(
        "--plot",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write PNGs (posterior histograms; predicted vs measured on the fitted rows)",
    )


def check_arguments(args: argparse.Namespace) -> None:
    """Before any measurement is read: the posterior that --prior updates exists."""
    if args.prior is None:
        return
    from fitting import default_posterior_path

    path = Path(args.prior) if args.prior else default_posterior_path()
    if not path.is_file():
        raise UsageError(
            f"--prior {path}: no such file; pass a posterior netCDF written by `servingmath fit`"
            + (", or --prior alone for the bundled one" if args.prior else "")
        )


def run(args: argparse.Namespace) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)
    import fitting
    from fitting import skipped_summary

    try:
        ids = None
        if args.hardware_csv:
            import perfmodel

            ids = list(perfmodel.hardware_ids()) + list(perfmodel.hardware_ids(args.hardware_csv))
        result = fitting.load_measurements(
            args.data,
            hardware_ids=ids,
            gpu=args.gpu,
            tp=args.tp,
            model=args.model,
            engine=args.engine,
            stream_interval=args.stream_interval,
        )
    except (fitting.MeasurementFormatError, ValueError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    if args.prior is not None:
        return _update(args, result)
    t0 = time.perf_counter()
    from fitting import user_hardware

    try:
        with user_hardware(args.hardware_csv):
            fr = fitting.fit_table(
                result.table,
                per_stratum=args.per_stratum,
                seed=args.seed,
                draws=args.draws,
                warmup=args.warmup,
                chains=args.chains,
                svi=args.svi,
                svi_steps=args.svi_steps,
                progress=phases_for(args).enabled,
            )
    except ValueError as exc:
        raise UsageError(f"{exc}") from None
    attrs = fr.posterior.idata.attrs
    attrs["command"] = "servingmath fit --data " + " ".join(args.data)
    out = fitting.save_posterior(fr.posterior, args.out)
    print(
        f"{attrs['method']}: {attrs['fit_rows']} rows of {attrs['table_rows']} ({attrs['subsample']}), "
        f"{fr.posterior.num_draws} draws in {time.perf_counter() - t0:.0f} s -> {out}"
    )
    for reason, n in skipped_summary(list(fr.prepared.skipped) + list(result.skipped)).items():
        print(f"  skipped {n} rows: {reason}")
    if fr.diagnostics is not None:
        print(fr.diagnostics.report())
    else:
        print(
            "diagnostics: SVI draws are independent (no R-hat/ESS); check held-out coverage with "
            "servingmath validate"
        )
    if args.plot:
        from fitting import write_plots

        for path in write_plots(
            fr.posterior, args.plot, table=result.table, hardware_csv=args.hardware_csv
        ):
            print(f"  wrote {path}")
    return 0


def _update(args: argparse.Namespace, result) -> int:
    """``--prior``: condition a fitted posterior on a few rows of one GPU (``fitting._update.update_posterior``)."""
    import fitting
    from fitting import (
        E2E_SCENARIOS,
        MAX_TREE_DEPTH,
        skipped_summary,
        update_posterior,
        update_report,
    )

    table = result.table
    no_engine = table["scenario"].isin(E2E_SCENARIOS) & (table["engine"] == "")
    if no_engine.any():
        raise UsageError(
            f"{int(no_engine.sum())} end-to-end rows do not name their engine; "
            f"pass --engine {'|'.join(ENGINES)}"
        )
    try:
        prior = fitting.load_posterior(args.prior or None)
    except fitting.PosteriorError as exc:
        raise UsageError(f"--prior: {exc}") from None
    t0 = time.perf_counter()
    try:
        post, prep = update_posterior(
            prior,
            table,
            from_population=args.from_population,
            draws=args.draws,
            warmup=args.warmup,
            chains=args.chains,
            seed=args.seed,
            hardware_csv=args.hardware_csv,
            max_tree_depth=args.max_tree_depth or MAX_TREE_DEPTH,
        )
    except ValueError as exc:
        raise UsageError(f"{exc}") from None
    attrs = post.idata.attrs
    attrs["command"] = (
        "servingmath fit --prior " + (args.prior or "") + " --data " + " ".join(args.data)
    )
    if args.hardware_csv:
        attrs["hardware_csv"] = str(args.hardware_csv)
    out = fitting.save_posterior(post, args.out)
    print(
        f"update of {prior.path}: {attrs['update_rows']} rows of GPU {attrs['update_gpus']}, "
        f"{post.num_draws} draws in {time.perf_counter() - t0:.0f} s -> {out}"
    )
    if attrs["serving_rows_available"] > attrs["update_serving_rows"]:
        print(
            f"  end-to-end rows: a seeded {attrs['update_serving_rows']} of "
            f"{attrs['serving_rows_available']} (each run is a closed-loop solve per NUTS step)"
        )
    for reason, n in skipped_summary(list(prep.skipped) + list(result.skipped)).items():
        print(f"  skipped {n} rows: {reason}")
    if attrs["divergences"]:
        print(
            f"WARNING: {attrs['divergences']} divergent transitions; raise --warmup or check the rows"
        )
    report = update_report(
        prior,
        post,
        prep.table,
        from_population=args.from_population,
        hardware_csv=args.hardware_csv,
        seed=args.seed,
    )
    print(render_update_report(report))
    if args.plot:
        from fitting import write_plots

        for path in write_plots(
            post, args.plot, table=result.table, hardware_csv=args.hardware_csv
        ):
            print(f"  wrote {path}")
    return 0


def _interval(x, unit: str) -> str:
    """``median [lo, hi]`` of an ``Interval`` in ``unit`` (seconds as s/ms/us)."""
    from ..reports.render import human_seconds

    if unit == "s":
        return f"{human_seconds(x.median)} [{human_seconds(x.lo)}, {human_seconds(x.hi)}]"

    def num(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"

    return f"{num(x.median)} [{num(x.lo)}, {num(x.hi)}]" + (f" {unit}" if unit else "")


def render_update_report(report) -> str:
    """The text of a ``fitting._update_report.UpdateReport``: reference points, then efficiencies."""
    lines = []
    if report.points:
        lines.append(
            f"how many runs are enough: 90 % predictive intervals of {report.gpu} "
            f"({report.model}, TP {report.tp}, {report.engine or report.source}, closed loop, "
            f"{report.input_len:.0f} in / {report.output_len:.0f} out tokens) on "
            f"{report.serving_rows} end-to-end rows"
        )
        rows = [("reference", "prior (spec sheet, population)", "updated", "width hi/lo")]
        rows += [
            (
                p.label,
                _interval(p.before, p.unit),
                _interval(p.after, p.unit),
                f"{p.before.width:.2f}x -> {p.after.width:.2f}x",
            )
            for p in report.points
        ]
        lines += _columns(rows)
        w = report.widest
        lines.append(
            f"  widest after the update: {w.label} ({w.after.width:.2f}x); "
            f"a run there would narrow it most"
        )
    else:
        lines.append(f"no end-to-end run of {report.gpu}: no reference predictions")
    lines.append(f"efficiencies of {report.gpu}: median [90 % interval]")
    rows = [("parameter", "prior", "updated")]
    rows += [
        (
            p.name,
            _interval(p.before, "s" if p.name.endswith("_s") else ""),
            _interval(p.after, "s" if p.name.endswith("_s") else ""),
        )
        for p in report.parameters
    ]
    lines += _columns(rows)
    if report.biases:
        lines.append(
            f"end-to-end biases of {report.gpu}: measured / step and load models with the "
            f"engine's offsets, median [90 % interval]"
        )
        rows = [("group", "prior", "updated")]
        rows += [(p.name, _interval(p.before, "x"), _interval(p.after, "x")) for p in report.biases]
        lines += _columns(rows)
    return "\n".join(lines)


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
