"""``servingmath explain``: the budget sheet of one deployment."""

from __future__ import annotations

import argparse
import json
import math

from perfmodel import System, served_model_id

from ..errors import UsageError
from ..evaluation.features import feature_load, feature_report
from ..evaluation.load import dynamics_report, load_metrics
from ..evaluation.sheet import sheet_intervals, sheet_report
from ..options.deployment import (
    add_deployment_arguments,
    add_length_arguments,
    check_checkpoint_weight,
    positive,
    require_fit,
    require_mtp,
    resolve_deployment,
)
from ..options.features import add_feature_arguments, validate_feature_arguments
from ..options.load import add_dynamics_arguments, is_lockstep, load_workload
from ..options.posterior import add_posterior_arguments, resolve_efficiency
from ..reports.features import render_features
from ..reports.load import render_dynamics
from ..reports.sheet import render_sheet

HELP = "the budget sheet of one deployment: memory, compute, bandwidth, communication"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_deployment_arguments(parser)
    add_feature_arguments(parser)
    add_length_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_dynamics_arguments(parser)
    add_posterior_arguments(parser)


def check_arguments(args: argparse.Namespace) -> None:
    """Feature options that need no budget, before the posterior loads or anything compiles."""
    check_checkpoint_weight(args)
    validate_feature_arguments(args, float(args.input_len))
    if args.spec_draft and args.spec_draft.lower() == "mtp":
        require_mtp(args.model)


def run(args: argparse.Namespace) -> int:
    positive("--input-len", args.input_len)
    positive("--output-len", args.output_len)
    model, hardware, deployment = resolve_deployment(
        args, max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs
    )
    total = args.input_len + args.output_len
    if total > args.max_model_len:
        raise UsageError(
            f"--input-len + --output-len = {total} exceeds --max-model-len {args.max_model_len}; "
            "raise --max-model-len or shorten the request"
        )
    require_fit(model, hardware, deployment, float(total))
    load = load_workload(args)
    efficiency, draws, source = resolve_efficiency(
        args, hardware, args.weight_dtype, lockstep=is_lockstep(deployment, load)
    )
    system = System(model, hardware, deployment, efficiency)
    report = sheet_report(system, float(args.input_len), float(args.output_len))
    report["efficiency_source"] = source
    checkpoint = served_model_id(args.model, model.name)
    if checkpoint != model.name:  # a checkpoint read as the catalog architecture it shares
        report["checkpoint"] = checkpoint
    if draws is not None:
        report["intervals"] = sheet_intervals(
            model, hardware, deployment, draws, float(args.input_len), float(args.output_len)
        )
    if not all(math.isfinite(v) for v in report.values() if isinstance(v, float)):
        raise UsageError("the budget sheet came out non-finite; check the hardware row's numbers")
    served, cost = (None, None) if load is None else feature_load(args, system, load)
    # one evaluation of the load model serves the verdicts and the latency report
    metrics = None if load is None else load_metrics(args, system, served, cost)
    features = feature_report(
        args, system, load=load, served=served, decode_cost=cost, metrics=metrics
    )
    report.update(features)
    if load is not None:
        report.update(dynamics_report(args, system, served, draws, cost, metrics))
    print(
        json.dumps(report, indent=2)
        if args.json
        else render_sheet(report) + "\n" + render_features(features) + render_dynamics(report)
    )
    return 0
