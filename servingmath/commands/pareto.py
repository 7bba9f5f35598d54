"""``servingmath pareto``: output tokens/s per GPU against tokens/s per user, with intervals."""

from __future__ import annotations

import argparse
import json
import sys

import equinox as eqx

import perfmodel as pm

from ..errors import UsageError
from ..options.load import is_lockstep
from ..options.outputs import check_output_paths, close_figures, write_report
from ..options.pareto import add_pareto_arguments, sweep_from_args
from ..options.problem import gpu_ids, resolve_common
from ..progress import Phases, run_with_phases
from ..reports import provenance
from ..reports.pareto import FRONTIER_CAPTION, render

HELP = (
    "throughput-interactivity frontier: output tokens/s per GPU vs tokens/s per user over TP, PP, "
    "dtypes and concurrency (closed loop), with 90% intervals and $ per million tokens"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_pareto_arguments(parser)


def check_arguments(args: argparse.Namespace) -> None:
    """Before the posterior loads: --report is writable, known GPUs and model, and the model
    fits on one of them."""
    from optimize import check_fits

    check_output_paths(args, files=("report",))
    workload, grid = sweep_from_args(args)
    gpus = gpu_ids(args)
    model = pm.load_model(args.model)
    hardware = [
        pm.load_hardware(g, prices_csv=args.prices, hardware_csv=args.hardware_csv) for g in gpus
    ]
    try:
        check_fits(model, gpus, hardware, grid, workload)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    return run_with_phases(args, _run)


def _run(args: argparse.Namespace, phases: Phases) -> int:
    from optimize import pareto_frontier, pareto_problem

    phases("loading the posterior")
    workload, grid = sweep_from_args(args)
    # the sweep's closed loops at fixed lengths run in lockstep on a prefill-first engine
    engine = pm.Deployment.create(prefill_first=pm.engine_prefill_first(args.engine))
    clients = eqx.tree_at(lambda w: w.concurrency, workload, 1.0)
    model, gpus, hardware, efficiency = resolve_common(args, lockstep=is_lockstep(engine, clients))
    try:
        problem = pareto_problem(
            model,
            gpus,
            workload,
            concurrencies=args.concurrency,
            kv_dtypes=grid.kv_dtypes,
            weight_dtypes=grid.weight_dtypes,
            moe_layouts=grid.moe_layouts,
            slo_ttft_p95_s=args.ttft_p95,
            slo_tpot_p95_s=args.tpot_p95,
            confidence=args.confidence,
            efficiency=efficiency,
            quality_penalty=args.quality_penalty,
            hardware=hardware,
            engine=args.engine,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    phases(f"sweeping configurations x {len(args.concurrency)} concurrencies x {args.draws} draws")
    result = pareto_frontier(problem, gpus, model.name)
    if args.plot:
        from optimize.plots import write_pareto_plot

        phases("drawing the figure")
        path = write_pareto_plot(result, args.plot)
        phases.done()
        print(f"figure: {path}", file=sys.stderr)
    phases.done()
    out = result.to_json()
    out["question"] = provenance.question(args, model.name, gpus, workload)
    # a closed loop has no arrival rate: the clients in flight set the load
    out["question"]["workload"]["arrival_rate_per_s"] = None
    out["question"]["concurrency"] = list(args.concurrency)
    out["assumptions"] = provenance.assumptions(args, gpus, hardware)
    if args.report:
        from optimize.plots import pareto_figure

        from ..reports.pages import pareto_page

        figure = pareto_figure(result)
        write_report(args.report, pareto_page(out, [(FRONTIER_CAPTION, figure)]))
        close_figures([figure])
        print(f"report: {args.report}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2, allow_nan=False))
    if not result.frontier:
        raise UsageError(
            f"no configuration meets the p95 SLOs with confidence {args.confidence}; "
            "relax --ttft-p95 / --tpot-p95 or lower --confidence"
        )
    if not args.json:
        print(render(result))
    return 0
