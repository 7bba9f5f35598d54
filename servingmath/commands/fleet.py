"""``servingmath fleet``: a mix of GPU types serving request-size classes at least cost."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys

from perfmodel import CatalogError

from ..errors import UsageError
from ..options.grid import add_chunk_argument
from ..options.outputs import add_report_argument, check_output_paths, close_figures, write_report
from ..options.problem import (
    add_problem_arguments,
    gpu_ids,
    problem_from_args,
    resolve_common,
    resolve_workload,
)
from ..options.speculation import add_speculation_arguments, check_speculation_arguments
from ..options.validators import assignments, nonnegative_float, output_dir, positive_int
from ..progress import Phases, run_with_phases
from ..reports import provenance
from ..reports.fleet import fleet_report, infeasible_message, render
from ..reports.optimize import describe_short

HELP = "GPU-type mix for request-size classes under the SLO (gradient + exact milp check)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_problem_arguments(parser)
    add_speculation_arguments(parser)
    add_chunk_argument(parser, default=None)
    parser.add_argument("--classes", help="histogram CSV prompt_tokens,output_tokens,share")
    parser.add_argument(
        "--num-classes",
        type=positive_int,
        default=3,
        help="classes binned from --workload by prompt length (default 3)",
    )
    parser.add_argument(
        "--max-gpus",
        type=assignments(nonnegative_float),
        default="",
        help="availability per type, e.g. h100-sxm=64,l40s=16",
    )
    parser.add_argument(
        "--max-replicas", type=positive_int, default=64, help="largest replica count per class"
    )
    parser.add_argument(
        "--plot",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write PNGs into this directory (fleet_mix.png)",
    )
    add_report_argument(parser)


def read_classes(path: str):
    from optimize import RequestClass

    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(
            f"{path}: not a UTF-8 text file; --classes takes a CSV "
            "prompt_tokens,output_tokens,share"
        ) from None
    out = []
    for line, row in enumerate(rows, start=2):
        vals = []
        for field in ("prompt_tokens", "output_tokens", "share"):
            raw = (row.get(field) or "").strip()
            try:
                v = float(raw)
            except ValueError:
                raise UsageError(
                    f"{path}:{line}: field {field!r} = {raw!r} is not a number; "
                    "columns are prompt_tokens,output_tokens,share"
                ) from None
            if not (math.isfinite(v) and v > 0):
                raise UsageError(f"{path}:{line}: field {field!r} = {raw!r} must be positive")
            vals.append(v)
        out.append(RequestClass(*vals))
    if not out:
        raise UsageError(f"{path}: no classes; add prompt_tokens,output_tokens,share rows")
    total = sum(c.share for c in out)
    return [c._replace(share=c.share / total) for c in out]


def check_arguments(args: argparse.Namespace) -> None:
    """Before the posterior loads: --max-gpus names only --gpus, --classes reads, --report is
    writable, --spec-draft mtp names a model with MTP layers."""
    check_output_paths(args, files=("report",))
    check_speculation_arguments(args)
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

    from optimize import classes_from_trace, fleet_gradient, fleet_milp, fleet_problem
    from perfmodel.dynamics import load_trace

    phases("loading the posterior")
    model, gpus, hardware, efficiency = resolve_common(args)
    workload = resolve_workload(args)
    limits = args.max_gpus
    if args.classes:
        classes = read_classes(args.classes)
    elif args.workload:
        try:
            trace = load_trace(args.workload)
        except CatalogError as exc:
            raise UsageError(str(exc)) from None
        classes = classes_from_trace(
            trace.prompt_tokens, trace.output_tokens, max(1, args.num_classes)
        )
    else:
        classes = read_classes_default(workload)
    problem = problem_from_args(args, model, gpus, workload, efficiency, hardware)
    rate = float(workload.arrival_rate_per_s)
    max_gpus = np.asarray([limits.get(g, np.inf) for g in gpus])
    phases(f"pricing every configuration for {len(classes)} request classes (compiling first)")
    fp, configs = fleet_problem(problem, classes, rate, max_gpus)
    phases("solving the fleet mix (gradient, then the exact MILP)")
    plan = fleet_gradient(fp, seed=args.seed)
    exact = fleet_milp(fp)
    result = fleet_report(gpus, classes, fp, plan, exact)
    for c, entry in enumerate(result["classes"]):  # what each class runs on each usable type
        entry["configuration"] = {
            g: describe_short(problem, gpus, configs[c, j])
            for j, g in enumerate(gpus)
            if configs[c, j, 0] >= 0
        }
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
        caption = "Replicas per GPU type, stacked by request class, with each type's GPU count."
        write_report(args.report, fleet_page(result, [(caption, figure)]))
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


def read_classes_default(workload):
    from optimize import RequestClass

    return [
        RequestClass(float(workload.prompt_tokens_mean), float(workload.output_tokens_mean), 1.0)
    ]
