"""``servingmath simulate``: run the continuous-batching simulator and report measured latency."""

from __future__ import annotations

import argparse
import json

from perfmodel import System
from perfmodel.dynamics import workload_from_trace
from perfmodel.simulator import engine_summary, simulate

from ..evaluation.features import feature_report
from ..evaluation.load import engine_scales_report
from ..evaluation.simulated import (
    prefix_caching,
    requests_to_simulate,
    require_served,
    simulate_disagg,
    simulated_features,
    speculation_of,
    trace_reuse,
)
from ..options.calibration import add_calibration_arguments, simulation_efficiency
from ..options.deployment import (
    add_deployment_arguments,
    check_checkpoint_weight,
    positive,
    require_fit,
    require_mtp,
    resolve_deployment,
)
from ..options.features import add_feature_arguments, validate_feature_arguments
from ..options.load import add_dynamics_arguments, check_scheduler, is_lockstep, resolve_workload
from ..options.validators import nonnegative_int, positive_int
from ..progress import phases_for, simulation_progress
from ..reports.features import render_features
from ..reports.load import simulation_report
from ..reports.simulated import rejection_report, render_simulated, render_simulation

HELP = "simulate a continuous-batching engine request by request: TTFT, TPOT, E2E percentiles"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_deployment_arguments(parser)
    add_feature_arguments(parser)
    add_dynamics_arguments(parser, lengths=True)
    parser.add_argument(
        "--requests", type=positive_int, default=2000, help="requests to simulate (default 2000)"
    )
    parser.add_argument(
        "--seed",
        type=nonnegative_int,
        default=0,
        help="random seed for sampled requests, acceptance and posterior draws (default 0)",
    )
    add_calibration_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def check_arguments(args: argparse.Namespace) -> None:
    """Before the posterior loads or anything compiles: --spec-draft mtp needs MTP layers."""
    check_checkpoint_weight(args)
    if args.spec_draft and args.spec_draft.lower() == "mtp":
        require_mtp(args.model)


def run(args: argparse.Namespace) -> int:
    positive("--requests", args.requests)
    check_scheduler(args)
    model, hardware, deployment = resolve_deployment(
        args, max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs
    )
    workload, trace = resolve_workload(args)
    longest = (
        int(trace.prompt_tokens.max() + trace.output_tokens.max())
        if trace is not None
        else (args.input_len + args.output_len)
    )
    require_fit(model, hardware, deployment, float(min(longest, args.max_model_len)))
    validate_feature_arguments(
        args, float(workload.prompt_tokens_mean)
    )  # before loading a posterior
    efficiency, source = simulation_efficiency(
        args, hardware, lockstep=is_lockstep(deployment, workload)
    )
    requests, concurrency = requests_to_simulate(args, workload, trace, args.concurrency or 0)
    if trace is not None and requests.has_arrivals and concurrency == 0 and len(requests) > 2:
        workload = workload_from_trace(requests)  # the closed form sees the simulated requests
    measured = trace_reuse(requests if trace is not None else None, model, hardware, deployment)
    system = System(model, hardware, deployment, efficiency)
    features = feature_report(args, system, workload, trace_reuse=measured)
    block = round(float(deployment.block_size_tokens))
    prefix = prefix_caching(args, requests, block)
    speculation = speculation_of(args, features)
    phases = phases_for(args)
    result = simulate(
        system,
        requests,
        num_requests=args.requests,
        seed=args.seed,
        concurrency=concurrency,
        chunked_prefill=args.chunked_prefill,
        chunk_tokens=args.chunk_tokens,
        progress=simulation_progress(phases, args.requests) if speculation is None else None,
        prefix=prefix,
        speculation=speculation,
    )
    phases.done()
    require_served(result, args.max_model_len)
    report = {
        "efficiency_source": source,
        **simulation_report(result, engine_summary(result, efficiency)),
    }
    report["engine_scales"] = engine_scales_report(args, efficiency)
    report.update(rejection_report(result, requests, args.max_model_len))
    report.update(features)
    simulated = (
        simulated_features(result, prefix, args, efficiency) if (prefix or speculation) else {}
    )
    if measured is not None:
        simulated["trace_reuse_replay"] = measured
    if args.disagg:
        simulated["disaggregation"] = simulate_disagg(
            args, system, requests, concurrency, prefix, speculation
        )
    if simulated:
        report["simulated"] = simulated
    text = render_simulation(report) + "\n" + render_features(features)
    if simulated:
        text += "\n" + render_simulated(simulated)
    print(json.dumps(report, indent=2) if args.json else text)
    return 0
