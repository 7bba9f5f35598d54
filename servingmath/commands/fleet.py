"""``servingmath fleet``: a mix of GPU types serving request-size classes at least cost."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import UsageError
from ..options.fleet import add_fleet_arguments, classes_from_args, read_classes
from ..options.grid import check_checkpoint_weights, check_moe_layout_argument
from ..options.outputs import check_output_paths, close_figures, write_report
from ..options.problem import gpu_ids, problem_from_args, resolve_common, resolve_workload
from ..options.speculation import check_speculation_arguments
from ..progress import Phases, run_with_phases
from ..reports import provenance
from ..reports.fleet import MIX_CAPTION, fleet_report, infeasible_message, render

HELP = "GPU-type mix for request-size classes under the SLO (gradient + exact milp check)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fleet_arguments(parser)


def check_arguments(args: argparse.Namespace) -> None:
    """Before the posterior loads: --max-gpus names only --gpus, --classes reads, --report is
    writable, --spec-draft mtp names a model with MTP layers."""
    check_output_paths(args, files=("report",))
    check_speculation_arguments(args)
    check_moe_layout_argument(args)
    check_checkpoint_weights(args)
    gpus = gpu_ids(args)
    for g in args.max_gpus:
        if g not in gpus:
            raise UsageError(f"--max-gpus names {g!r}, which is not in --gpus {','.join(gpus)}")
    if args.classes:
        read_classes(args.classes)


def run(args: argparse.Namespace) -> int:
    return run_with_phases(args, _run)


def _run(args: argparse.Namespace, phases: Phases) -> int:
    import numpy as np

    from optimize import fleet_gradient, fleet_milp, fleet_problem

    phases("loading the posterior")
    model, gpus, hardware, efficiency = resolve_common(args)
    workload = resolve_workload(args)
    limits = args.max_gpus
    classes = classes_from_args(args, workload)
    problem = problem_from_args(args, model, gpus, workload, efficiency, hardware)
    rate = float(workload.arrival_rate_per_s)
    max_gpus = np.asarray([limits.get(g, np.inf) for g in gpus])
    phases(f"pricing every configuration for {len(classes)} request classes (compiling first)")
    fp, configs = fleet_problem(problem, classes, rate, max_gpus)
    phases("solving the fleet mix (gradient, then the exact MILP)")
    plan = fleet_gradient(fp, seed=args.seed)
    exact = fleet_milp(fp)
    result = fleet_report(problem, gpus, classes, fp, configs, plan, exact)
    result["question"] = provenance.question(
        args,
        model.name,
        gpus,
        workload,
        classes_csv=args.classes,
        max_gpus=dict(limits),
    )
    result["assumptions"] = provenance.assumptions(args, gpus, hardware)
    phases.done()
    if args.report:
        from optimize.plots import fleet_figure

        from ..reports.pages import fleet_page

        figure = fleet_figure(result)
        write_report(args.report, fleet_page(result, [(MIX_CAPTION, figure)]))
        close_figures([figure])
        if result["feasible"]:
            print(f"report: {args.report}", file=sys.stderr)
    if args.plot:
        import os

        from optimize.plots import NAMES, fleet_chart

        path = fleet_chart(result, os.path.join(args.plot, NAMES["fleet"]))
        print(f"figure: {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2))
    if not result["feasible"]:
        print(
            f"servingmath fleet: error: {infeasible_message(fp, classes, gpus, args)}",
            file=sys.stderr,
        )
        return 2
    if args.json:
        return 0
    print(render(result))
    return 0
