"""``servingmath fit``: calibrate the budgets on measurements (NumPyro NUTS or SVI)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..errors import UsageError
from ..options.fit import add_fit_arguments
from ..options.run_fill import ENGINES
from ..progress import phases_for
from ..reports.fit import render_fit, render_update, render_update_report

HELP = "fit the efficiency posterior to measurements (NUTS, or SVI with --svi)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fit_arguments(parser)


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
            scheduler_recv_interval=args.scheduler_recv_interval,
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
    skipped = skipped_summary(list(fr.prepared.skipped) + list(result.skipped))
    seconds = time.perf_counter() - t0
    print(render_fit(attrs, fr.posterior.num_draws, seconds, out, skipped, fr.diagnostics))
    _plots(args, fr.posterior, result.table)
    return 0


def _update(args: argparse.Namespace, result) -> int:
    """``--prior``: condition a fitted posterior on a few rows of one GPU (``fitting.update_posterior``)."""
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
    skipped = skipped_summary(list(prep.skipped) + list(result.skipped))
    seconds = time.perf_counter() - t0
    print(render_update(prior.path, attrs, post.num_draws, seconds, out, skipped))
    report = update_report(
        prior,
        post,
        prep.table,
        from_population=args.from_population,
        hardware_csv=args.hardware_csv,
        seed=args.seed,
    )
    print(render_update_report(report))
    _plots(args, post, result.table)
    return 0


def _plots(args: argparse.Namespace, posterior, table) -> None:
    """--plot: the posterior's PNGs, each path on a line."""
    if not args.plot:
        return
    from fitting import write_plots

    for path in write_plots(posterior, args.plot, table=table, hardware_csv=args.hardware_csv):
        print(f"  wrote {path}")
