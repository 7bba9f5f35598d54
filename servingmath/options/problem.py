"""The search problem ``optimize``, ``fleet``, ``forecast`` and ``pareto`` pose: model, candidate
GPUs, load, SLOs, confidence, posterior, prices and the dtypes to consider.

``add_problem_arguments`` declares them; ``resolve_common`` / ``resolve_workload`` load what they
name and ``problem_from_args`` builds ``optimize.make_problem``'s problem (its knob grid from
``grid``, its speculation from ``speculation``), each raising ``UsageError`` with a one-line fix
for anything a user can get wrong.
"""

from __future__ import annotations

import argparse
import math

import perfmodel as pm
from perfmodel import CatalogError
from perfmodel.dynamics import DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS

from ..errors import UsageError
from .deployment import add_scheduler_argument
from .grid import grid_from_args
from .posterior import add_engine_argument
from .speculation import speculation_from_args
from .validators import (
    assignments,
    finite_float,
    fraction,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    probability,
    workload_source,
)


def add_problem_arguments(
    parser: argparse.ArgumentParser, *, workload: bool = True, prefix: bool = True
) -> None:
    """--model, --gpus, SLOs, confidence, posterior, prices (the load, when ``workload``; a
    shared prefix, when ``prefix``)."""
    parser.add_argument("--model", required=True, help="Hugging Face id or config.json path")
    parser.add_argument("--gpus", required=True, help="candidate hardware ids, comma-separated")
    if workload:
        parser.add_argument("--rate", type=positive_float, help="arrival rate, requests/s")
        parser.add_argument(
            "--workload",
            type=workload_source,
            help="trace file or preset (rate, lengths, burstiness)",
        )
    parser.add_argument(
        "--input-len",
        type=positive_float,
        help=f"mean prompt tokens (default {DEFAULT_PROMPT_TOKENS})",
    )
    parser.add_argument(
        "--output-len",
        type=positive_float,
        help=f"mean output tokens (default {DEFAULT_OUTPUT_TOKENS})",
    )
    parser.add_argument(
        "--output-cv", type=nonnegative_float, default=1.0, help="output-length CV (default 1)"
    )
    if prefix:
        parser.add_argument(
            "--prefix-reuse",
            type=fraction,
            metavar="FRACTION",
            help="share of requests that open with one shared prefix, served from a prefix "
            "cache (with --prefix-len; colocated engines without speculation)",
        )
        parser.add_argument(
            "--prefix-len",
            type=positive_float,
            metavar="N",
            help="shared prefix length, tokens (with --prefix-reuse)",
        )
    parser.add_argument(
        "--ttft-p95",
        "--slo-ttft-p95",
        dest="ttft_p95",
        type=positive_float,
        help="p95 time-to-first-token bound, seconds",
    )
    parser.add_argument(
        "--tpot-p95",
        "--slo-tpot-p95",
        dest="tpot_p95",
        type=positive_float,
        help="p95 time-per-output-token bound, seconds",
    )
    parser.add_argument(
        "--itl-p95",
        "--slo-itl-p95",
        dest="itl_p95",
        type=positive_float,
        help="p95 inter-token latency bound, seconds (one gap between consecutive tokens of a "
        "request, over gaps: a gap that carries a prefill chunk counts in full)",
    )
    parser.add_argument(
        "--confidence",
        type=probability,
        default=0.9,
        help="probability over the posterior that the SLO holds (default 0.9)",
    )
    parser.add_argument("--posterior", help="fitted posterior (.nc); default: the bundled one")
    add_engine_argument(parser)
    add_scheduler_argument(parser)
    parser.add_argument(
        "--prior", action="store_true", help="use spec-sheet prior draws, no posterior"
    )
    parser.add_argument(
        "--draws", type=positive_int, default=200, help="posterior draws (default 200)"
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="PRNG seed (default 0)")
    parser.add_argument("--prices", help="prices CSV (columns gpu,price_per_gpu_hour)")
    parser.add_argument("--hardware-csv", help="hardware CSV with your own rows")
    parser.add_argument(
        "--quality-penalty",
        type=assignments(finite_float),
        default="",
        help="cost surcharge per dtype, e.g. int4=0.1,fp8=0.02 (fractions)",
    )
    parser.add_argument(
        "--kv-dtypes",
        default="bf16,fp8",
        help="KV-cache dtypes to consider (default bf16,fp8; also int8,int4)",
    )
    parser.add_argument(
        "--weight-dtypes",
        default="bf16,fp8",
        help="weight dtypes to consider (default bf16,fp8; also int4)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def problem_from_args(
    args: argparse.Namespace,
    model,
    gpus,
    workload,
    efficiency,
    hardware,
    *,
    speculation: dict | None = None,
):
    """``optimize.make_problem`` with the SLOs, confidence, knob grid, quality penalty, prefix,
    pools' KV hand-off bandwidth and speculation the command line gives (``speculation``:
    ``speculation_from_args`` already read, else read here)."""
    from optimize import make_problem

    if speculation is None:
        speculation = speculation_from_args(args, model)
    share, length = getattr(args, "prefix_reuse", None), getattr(args, "prefix_len", None)
    if (share is None) != (length is None):
        raise UsageError("--prefix-reuse and --prefix-len go together; pass both or neither")
    if length is not None and length > float(workload.prompt_tokens_mean):
        raise UsageError(
            f"--prefix-len {length:.0f} is longer than the {float(workload.prompt_tokens_mean):.0f}"
            "-token mean prompt; pass a prefix no longer than the prompt"
        )
    try:
        return make_problem(
            model,
            gpus,
            workload,
            slo_ttft_p95_s=args.ttft_p95,
            slo_tpot_p95_s=args.tpot_p95,
            slo_itl_p95_s=getattr(args, "itl_p95", None),
            max_model_len=getattr(args, "max_model_len", None),
            confidence=args.confidence,
            grid=grid_from_args(args, len(gpus), args.max_replicas, model),
            efficiency=efficiency,
            hardware=hardware,
            quality_penalty=args.quality_penalty,
            prefix_reuse=share,
            prefix_tokens=length,
            transfer_bytes_per_s=getattr(args, "transfer_bw", None),
            **speculation,
        )
    except (ValueError, CatalogError) as exc:
        raise UsageError(str(exc)) from None


def gpu_ids(args: argparse.Namespace) -> tuple[str, ...]:
    """The hardware ids of --gpus, each once (``UsageError`` when empty or repeated)."""
    gpus = tuple(g.strip() for g in args.gpus.split(",") if g.strip())
    if not gpus:
        raise UsageError("--gpus is empty; pass e.g. --gpus h100-sxm,a100-sxm-80gb")
    if len(set(gpus)) != len(gpus):
        raise UsageError(f"--gpus lists a GPU twice: {args.gpus}")
    return gpus


def check_slo_arguments(args: argparse.Namespace) -> None:
    """One-line ``UsageError`` for an SLO bound that is not a positive finite number of seconds
    and for a --max-model-len that is not a whole number of tokens >= 1 (before any work)."""
    itl = getattr(args, "itl_p95", None)
    for flag, v in (
        ("--ttft-p95", getattr(args, "ttft_p95", None)),
        ("--tpot-p95", getattr(args, "tpot_p95", None)),
        ("--itl-p95", itl),
    ):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise UsageError(f"{flag} must be a positive number of seconds, e.g. 0.1, got {v}")
    if itl is not None and getattr(args, "command", None) == "pareto":
        raise UsageError(
            "--itl-p95 does not filter the pareto frontier (it bounds optimize, fleet and "
            "forecast); filter with --tpot-p95"
        )
    length = getattr(args, "max_model_len", None)
    if length is not None and not (math.isfinite(length) and length >= 1 and length == int(length)):
        raise UsageError(
            f"--max-model-len must be a whole number of tokens >= 1, e.g. 32768, got {length}"
        )


def resolve_common(args: argparse.Namespace, *, lockstep: bool = False):
    """(model, gpu ids, loaded hardware, efficiency draws) with one-line errors for bad input;
    ``lockstep``: the load is a lockstep loop, whose TTFT takes the lockstep runs' scale."""
    from optimize import efficiency_draws_for

    if not 0.0 < args.confidence < 1.0:
        raise UsageError(
            f"--confidence {args.confidence} must be strictly between 0 and 1, e.g. 0.9"
        )
    check_slo_arguments(args)
    if args.draws < 1:
        raise UsageError(f"--draws must be at least 1, got {args.draws}")
    gpus = gpu_ids(args)
    try:
        model = pm.load_model(args.model)
        hardware = [
            pm.load_hardware(g, prices_csv=args.prices, hardware_csv=args.hardware_csv)
            for g in gpus
        ]
    except CatalogError as exc:
        raise UsageError(str(exc)) from None
    context = pm.model_context_tokens(args.model)
    length = getattr(args, "max_model_len", None)
    if length is not None and context is not None and length > context:
        raise UsageError(
            f"--max-model-len {int(length):,} exceeds {model.name}'s context of {context:,} "
            "tokens (its config.json), above which vLLM refuses to start; "
            f"lower --max-model-len to at most {context}"
        )
    for g, h in zip(gpus, hardware):
        if not math.isfinite(float(h.price_per_gpu_hour)):
            raise UsageError(
                f"no price for GPU {g!r}; pass --prices with a row gpu={g},price_per_gpu_hour=..."
            )
    posterior = None
    if not args.prior:
        import fitting

        from ..cli import posterior_cache_dir

        try:
            posterior = fitting.load_posterior(args.posterior, cache_dir=posterior_cache_dir())
        except (OSError, ValueError, fitting.PosteriorError) as exc:
            raise UsageError(
                f"cannot load posterior {args.posterior or '(bundled)'}: {exc}; "
                "pass --posterior FILE.nc or --prior"
            ) from None
    efficiency = efficiency_draws_for(
        gpus, args.draws, posterior=posterior, seed=args.seed, engine=args.engine, lockstep=lockstep
    )
    return model, gpus, hardware, efficiency


def resolve_workload(args: argparse.Namespace, rate: float | None = None):
    """Workload from --workload (trace) and/or --rate, --input-len, --output-len."""
    from perfmodel.dynamics import Workload, load_trace, workload_from_trace

    rate = args.rate if rate is None else rate
    if getattr(args, "workload", None):
        try:
            wl = workload_from_trace(load_trace(args.workload), arrival_rate_per_s=rate)
        except CatalogError as exc:
            raise UsageError(str(exc)) from None
        if not math.isfinite(float(wl.arrival_rate_per_s)):
            raise UsageError(f"trace {args.workload} has no timestamps; pass --rate R")
    else:
        if rate is None:
            raise UsageError("give the load: --rate R (requests/s) or --workload TRACE")
        wl = Workload(arrival_rate_per_s=rate, output_tokens_cv=args.output_cv)
    updates = {}
    if args.input_len is not None:
        updates["prompt_tokens_mean"] = args.input_len
    if args.output_len is not None:
        updates["output_tokens_mean"] = args.output_len
    for k, v in updates.items():
        if not (math.isfinite(v) and v >= 1):
            raise UsageError(
                f"--{k.split('_')[0].replace('prompt', 'input')}-len must be >= 1, got {v}"
            )
    fields = {f: getattr(wl, f) for f in wl.__dataclass_fields__}
    fields.update(updates)
    if not float(fields["arrival_rate_per_s"]) > 0:
        raise UsageError(f"--rate must be positive, got {fields['arrival_rate_per_s']}")
    return Workload(**fields)


def context_tokens(text: str) -> int:
    """--max-model-len: a whole number of tokens >= 1 (``argparse`` turns the error into one
    line and exit status 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise argparse.ArgumentTypeError(
            f"must be a whole number of tokens >= 1, e.g. 32768, got {text!r}"
        )
    return int(value)
