"""``servingmath optimize``: the cheapest configuration meeting the SLO with stated confidence."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from perfmodel import CatalogError, served_model_id

from ..errors import UsageError
from ..options.grid import check_checkpoint_weights, check_moe_layout_argument
from ..options.optimize import add_optimize_arguments
from ..options.outputs import check_output_paths, close_figures, write_report, write_text
from ..options.problem import (
    check_slo_arguments,
    problem_from_args,
    resolve_common,
    resolve_workload,
)
from ..options.speculation import check_speculation_arguments, speculation_from_args
from ..progress import Phases, callback, run_with_phases
from ..reports import provenance
from ..reports.optimize import infeasible_message, optimize_figures, render

HELP = "cheapest deployment meeting p95 TTFT/TPOT SLOs with stated confidence (gradient search)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_optimize_arguments(parser)


def check_arguments(args: argparse.Namespace) -> None:
    """Before the posterior loads: --spec-draft mtp only for a model with MTP layers; --report
    and --emit are writable (re-checked here for callers that bypass the parser's types)."""
    check_slo_arguments(args)
    check_speculation_arguments(args)
    check_moe_layout_argument(args)
    check_checkpoint_weights(args)
    check_output_paths(args, files=("report",), folders=("emit",))


def run(args: argparse.Namespace) -> int:
    return run_with_phases(args, _run)


def _run(args: argparse.Namespace, phases: Phases) -> int:
    from optimize import recommend, require_peak_capacity

    phases("loading the posterior")
    model, gpus, hardware, efficiency = resolve_common(args)
    workload = resolve_workload(args)
    speculation = speculation_from_args(args, model)
    draft = speculation["spec_draft"]
    try:
        problem = problem_from_args(
            args,
            model,
            gpus,
            workload,
            efficiency,
            hardware,
            speculation=speculation,
        )
        require_peak_capacity(problem, gpus)
    except (ValueError, CatalogError) as exc:
        raise UsageError(str(exc)) from None
    served = served_model_id(args.model, model.name)
    rec = recommend(
        problem,
        gpus,
        served,
        verify=not args.no_verify,
        simulate_requests=args.simulate,
        draft_name=None if isinstance(draft, str) or draft is None else draft.name,
        progress=callback(phases),
    )
    out = rec.to_json()
    read_as = {"architecture": model.name} if served != model.name else {}
    out["question"] = provenance.question(args, served, gpus, workload, **read_as)
    out["assumptions"] = provenance.assumptions(args, gpus, hardware)
    figures = []
    if (args.plot or args.report) and out["feasible"]:
        phases("drawing the figures")
        figures = optimize_figures(problem, gpus, out)
    if args.report:
        from ..reports.pages import optimize_page

        write_report(args.report, optimize_page(out, [(c, f) for _, c, f in figures]))
    if args.plot:
        from optimize.plots import save_figure

        phases.done()
        for name, _, fig in figures:
            print(f"figure: {save_figure(fig, Path(args.plot) / name)}", file=sys.stderr)
        if not figures:
            print("no figures: nothing feasible to plot", file=sys.stderr)
    close_figures(f for _, _, f in figures)
    phases.done()
    if args.emit and out["feasible"]:
        from ..reports.launch import launch_files

        for name, text in launch_files(out).items():
            write_text(Path(args.emit) / name, text, executable=name.endswith(".sh"))
        print(f"launch files: {args.emit}", file=sys.stderr)
    if args.report and out["feasible"]:
        print(f"report: {args.report}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    if not out["feasible"]:
        print(f"servingmath: error: {infeasible_message(out, args, gpus)}", file=sys.stderr)
        return 2
    if not args.json:
        print(render(out, args))
    return 0
