"""``servingmath explain``: the budget sheet of one deployment."""

from __future__ import annotations

import argparse
import json
import math

import jax
import jax.numpy as jnp

import perfmodel as pm
from optimize import cached_jit

from .._dynamics_cli import (
    add_dynamics_arguments,
    dynamics_report,
    load_metrics,
    load_workload,
    render_dynamics,
)
from .._features_cli import (
    add_feature_arguments,
    feature_load,
    feature_report,
    render_features,
    validate_feature_arguments,
)
from .._options import (
    add_deployment_arguments,
    add_length_arguments,
    positive,
    require_fit,
    require_mtp,
    resolve_deployment,
)
from .._posterior_cli import add_posterior_arguments, quantiles, resolve_efficiency
from .._render import human_bytes, human_seconds, table
from ..errors import UsageError

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
    validate_feature_arguments(args, float(args.input_len))
    if args.spec_draft and args.spec_draft.lower() == "mtp":
        require_mtp(args.model)


INTERVAL_KEYS = (
    "prefill_s",
    "decode_step_s_batch1",
    "decode_step_s_max_batch",
    "decode_tokens_per_s_max",
)
"""Sheet values reported with a posterior interval."""


# One compiled program per sheet evaluation: run op by op, the sheet and its gradient dispatch
# ~270 small XLA compiles (~35 ms each, each under the persistent cache's threshold, so every
# run paid them again); compiled whole, they are three programs the compile cache keeps, and
# their traces are kept beside it (``cached_jit``), so a second run neither traces nor compiles.
_budget_sheet = cached_jit(pm.budget_sheet)
_decode_elasticities = cached_jit(pm.decode_elasticities)


@cached_jit
def _sheets_over_draws(model, hardware, deployment, draws, input_len, output_len):
    return jax.vmap(
        lambda e: pm.budget_sheet(model, hardware, deployment, e, input_len, output_len)
    )(draws)


def sheet_intervals(model, hardware, deployment, draws, input_len, output_len) -> dict:
    """p05/p50/p95 over posterior draws of the sheet's time and throughput values."""
    sheets = _sheets_over_draws(
        model, hardware, deployment, draws, jnp.asarray(input_len), jnp.asarray(output_len)
    )
    return {key: quantiles(getattr(sheets, key)) for key in INTERVAL_KEYS}


def sheet_report(
    model: pm.ModelSpec,
    hardware: pm.HardwareSpec,
    deployment: pm.Deployment,
    efficiency: pm.Efficiency,
    input_len: float,
    output_len: float,
) -> dict:
    """The static budget sheet as a JSON-ready dict (keys listed in the README's command table)."""
    lengths = jnp.asarray(float(input_len)), jnp.asarray(float(output_len))
    sheet = _budget_sheet(model, hardware, deployment, efficiency, *lengths)
    elasticities = _decode_elasticities(model, hardware, deployment, efficiency, *lengths)
    return {
        "model": model.name,
        "gpu": hardware.name,
        "tp": int(deployment.tp),
        "pp": int(deployment.pp),
        "replicas": int(deployment.replicas),
        "input_len": int(input_len),
        "output_len": int(output_len),
        "kv_bytes_per_token": float(sheet.kv_bytes_per_token),
        "weight_bytes_per_gpu": float(sheet.weight_bytes_per_gpu),
        "kv_capacity_tokens": float(sheet.kv_capacity_tokens),
        "max_concurrent_requests": int(sheet.max_concurrent_requests),
        "max_decode_batch": int(sheet.max_decode_batch),
        "prefill_s": float(sheet.prefill_s),
        "decode_step_s_batch1": float(sheet.decode_step_s_batch1),
        "decode_step_s_max_batch": float(sheet.decode_step_s_max_batch),
        "decode_tokens_per_s_max": float(sheet.decode_tokens_per_s_max),
        "binding_budget": pm.BINDING_BUDGETS[int(sheet.binding_budget)],
        "elasticities": {
            name: round(float(e), 4) for name, e in zip(pm.HARDWARE_BUDGETS, elasticities)
        },
    }


def _with_interval(report: dict, key: str, fmt) -> str:
    value = fmt(report[key])
    band = report.get("intervals", {}).get(key)
    return f"{value}   (90%: {fmt(band['p05'])} .. {fmt(band['p95'])})" if band else value


def _render(report: dict) -> str:
    rate = lambda x: f"{x:,.0f}"
    rows = [
        ("KV bytes per token (all layers)", human_bytes(report["kv_bytes_per_token"])),
        ("weights per GPU", human_bytes(report["weight_bytes_per_gpu"])),
        ("KV capacity (group)", f"{report['kv_capacity_tokens']:,.0f} tokens"),
        ("max concurrent requests", f"{report['max_concurrent_requests']:,}"),
        ("decode batch at max", f"{report['max_decode_batch']:,}"),
        ("prefill, one prompt", _with_interval(report, "prefill_s", human_seconds)),
        ("decode step, batch 1", _with_interval(report, "decode_step_s_batch1", human_seconds)),
        (
            "decode step, max batch",
            _with_interval(report, "decode_step_s_max_batch", human_seconds),
        ),
        ("decode tokens/s at max", _with_interval(report, "decode_tokens_per_s_max", rate)),
        ("binding budget", report["binding_budget"]),
    ]
    head = (
        f"{report['model']} on {report['tp'] * report['pp']}x {report['gpu']} "
        f"(TP {report['tp']}, PP {report['pp']}), prompt {report['input_len']}, "
        f"output {report['output_len']}\nefficiencies: {report['efficiency_source']}"
    )
    el = [(f"  d log tokens/s / d log {k}", f"{v:+.3f}") for k, v in report["elasticities"].items()]
    return "\n".join([head, table(rows), "elasticities of decode throughput:", table(el)])


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
    efficiency, draws, source = resolve_efficiency(args, hardware, args.weight_dtype)
    report = sheet_report(
        model, hardware, deployment, efficiency, float(args.input_len), float(args.output_len)
    )
    report["efficiency_source"] = source
    if draws is not None:
        report["intervals"] = sheet_intervals(
            model, hardware, deployment, draws, float(args.input_len), float(args.output_len)
        )
    if not all(math.isfinite(v) for v in report.values() if isinstance(v, float)):
        raise UsageError("the budget sheet came out non-finite; check the hardware row's numbers")
    load = load_workload(args)
    served, cost = (
        (None, None)
        if load is None
        else feature_load(args, model, hardware, deployment, efficiency, load)
    )
    # one evaluation of the load model serves the verdicts and the latency report
    metrics = (
        None
        if load is None
        else load_metrics(args, model, hardware, deployment, efficiency, served, cost)
    )
    features = feature_report(
        args,
        model,
        hardware,
        deployment,
        efficiency,
        load=load,
        served=served,
        decode_cost=cost,
        metrics=metrics,
    )
    report.update(features)
    if load is not None:
        report.update(
            dynamics_report(
                args, model, hardware, deployment, efficiency, served, draws, cost, metrics
            )
        )
    print(
        json.dumps(report, indent=2)
        if args.json
        else _render(report) + "\n" + render_features(features) + render_dynamics(report)
    )
    return 0
