"""``servingmath forecast``: GPUs to buy or rent per period, with 50/80/95 % intervals."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import UsageError
from ..options.forecast import add_forecast_arguments
from ..options.grid import check_checkpoint_weights, check_moe_layout_argument
from ..options.outputs import check_output_paths, close_figures, write_report
from ..options.problem import problem_from_args, resolve_common, resolve_workload
from ..options.speculation import check_speculation_arguments
from ..progress import Phases, run_with_phases
from ..reports import provenance
from ..reports.forecast import FAN_CAPTION, forecast_report, json_ready, render, write_csv

HELP = "GPUs per type and period for a demand forecast, intervals from demand x posterior"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_forecast_arguments(parser)


def check_arguments(args: argparse.Namespace) -> None:
    """Before the demand and the posterior load: --report is writable, --spec-draft mtp names a
    model with MTP layers."""
    check_speculation_arguments(args)
    check_moe_layout_argument(args)
    check_checkpoint_weights(args)
    check_output_paths(args, files=("report",))


def run(args: argparse.Namespace) -> int:
    return run_with_phases(args, _run)


def _run(args: argparse.Namespace, phases: Phases) -> int:
    from optimize import DemandError, cheapest_per_gpu, forecast_gpus, read_demand

    try:
        demand = read_demand(args.demand)
    except DemandError as exc:
        raise UsageError(str(exc)) from None
    except UnicodeDecodeError:
        raise UsageError(
            f"{args.demand}: not a UTF-8 text file; --demand takes a CSV "
            "period,requests_per_s[,requests_per_s_sd]"
        ) from None
    phases("loading the posterior")
    model, gpus, hardware, efficiency = resolve_common(args)
    peak = max(p.requests_per_s for p in demand) or 1.0
    args.rate = peak
    workload = resolve_workload(args, rate=peak)
    problem = problem_from_args(args, model, gpus, workload, efficiency, hardware)
    phases("searching configurations at the peak demand (compiling first)")
    configs = cheapest_per_gpu(problem, gpus)
    if not configs:
        raise UsageError(
            "no candidate GPU meets the SLO at the peak demand even with "
            f"{args.max_replicas} replicas; relax --ttft-p95/--tpot-p95 or add GPUs"
        )
    phases(f"replicas per posterior draw for {len(demand)} periods")
    periods = forecast_gpus(problem, configs, demand, seed=args.seed)
    result = forecast_report(problem, gpus, configs, periods)
    result["question"] = provenance.question(
        args, model.name, gpus, workload, demand_csv=args.demand
    )
    result["assumptions"] = provenance.assumptions(args, gpus, hardware)
    phases.done()
    result = json_ready(result)
    if args.report:
        from optimize.plots import fan_figure

        from ..reports.pages import forecast_page

        figure = fan_figure(result)
        write_report(args.report, forecast_page(result, [(FAN_CAPTION, figure)]))
        close_figures([figure])
        print(f"report: {args.report}", file=sys.stderr)
    if args.csv_out:
        write_csv(args.csv_out, result)
    figures = []
    if args.png:
        figures.append(_fan_chart(args.png, result))
    if args.plot:
        from optimize.plots import NAMES

        figures.append(_fan_chart(os.path.join(args.plot, NAMES["fan"]), result))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(render(result))
    for path in figures:
        print(f"fan chart: {path}", file=sys.stderr)
    return 0


def _fan_chart(path: str, result: dict):
    from optimize.plots import fan_chart

    return fan_chart(result, path)
