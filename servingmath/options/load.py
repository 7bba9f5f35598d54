"""The load and scheduler options of ``explain`` and ``simulate``: arrival rate or concurrency, a
trace or preset, length and gap CVs, the token budget and chunked prefill.

``add_dynamics_arguments`` declares them; ``resolve_workload`` turns them into a ``Workload``
(and the ``Trace`` behind it, if any).
"""

from __future__ import annotations

import argparse
import math

import perfmodel as pm
from perfmodel.dynamics import Trace, Workload, load_trace, lockstep_share, workload_from_trace

from ..errors import UsageError
from .deployment import add_length_arguments, positive
from .validators import nonnegative_float, positive_float, positive_int, workload_source


def add_dynamics_arguments(parser: argparse.ArgumentParser, *, lengths: bool = False) -> None:
    """Load and scheduler options; ``lengths`` adds --input-len/--output-len (simulate)."""
    g = parser.add_argument_group("load and scheduler")
    load = g.add_mutually_exclusive_group()
    load.add_argument(
        "--rate", type=positive_float, help="open-loop arrivals, requests/s (all replicas)"
    )
    load.add_argument(
        "--concurrency", type=positive_int, help="closed loop: requests kept in flight"
    )
    g.add_argument(
        "--workload",
        type=workload_source,
        help="trace CSV or preset: azure-code, azure-conv, sharegpt, arxiv, mooncake",
    )
    if lengths:
        add_length_arguments(g)
    g.add_argument(
        "--input-cv",
        type=nonnegative_float,
        default=0.0,
        help="prompt-length CV, lognormal (default 0)",
    )
    g.add_argument(
        "--output-cv",
        type=nonnegative_float,
        default=0.0,
        help="output-length CV, lognormal (default 0)",
    )
    g.add_argument(
        "--interarrival-cv", type=nonnegative_float, default=1.0, help="gap CV (1 = Poisson)"
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=8192,
        help="token budget per iteration",
    )
    g.add_argument("--max-num-seqs", type=positive_int, default=256, help="sequences per iteration")
    g.add_argument(
        "--chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="chunked prefill (default on)",
    )
    g.add_argument("--chunk-tokens", type=positive_int, help="largest prefill chunk per sequence")


def wants_dynamics(args: argparse.Namespace) -> bool:
    return args.rate is not None or args.concurrency is not None or args.workload is not None


def check_scheduler(args: argparse.Namespace) -> None:
    positive("--max-num-batched-tokens", args.max_num_batched_tokens)
    positive("--max-num-seqs", args.max_num_seqs)
    if args.chunk_tokens is not None:
        positive("--chunk-tokens", args.chunk_tokens)
    for flag in ("input_cv", "output_cv", "interarrival_cv"):
        v = getattr(args, flag)
        if not (math.isfinite(v) and v >= 0):
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 0, got {v}")


def resolve_workload(args: argparse.Namespace) -> tuple[Workload, Trace | None]:
    """The workload the options describe; a trace's moments when ``--workload`` is given."""
    if args.rate is not None:
        positive("--rate", args.rate)
    if args.concurrency is not None:
        positive("--concurrency", args.concurrency)
    trace = None
    if args.workload is not None:
        try:
            trace = load_trace(args.workload)
        except pm.CatalogError as exc:
            raise UsageError(str(exc)) from None
        if not trace.has_arrivals and args.rate is None and args.concurrency is None:
            raise UsageError(
                f"{args.workload} has lengths but no arrival times; add --rate R or --concurrency N"
            )
        w = workload_from_trace(
            trace, args.rate if args.rate is not None else (None if trace.has_arrivals else 1.0)
        )
    else:
        if args.rate is None and args.concurrency is None:
            raise UsageError("give a load: --rate R (requests/s) or --concurrency N")
        positive("--input-len", args.input_len)
        positive("--output-len", args.output_len)
        w = Workload(
            arrival_rate_per_s=args.rate or 0.0,
            interarrival_cv=args.interarrival_cv,
            prompt_tokens_mean=float(args.input_len),
            prompt_tokens_cv=args.input_cv,
            output_tokens_mean=float(args.output_len),
            output_tokens_cv=args.output_cv,
        )
    if args.concurrency is not None:
        w = Workload(
            arrival_rate_per_s=0.0,
            concurrency=float(args.concurrency),
            interarrival_cv=w.interarrival_cv,
            prompt_tokens_mean=w.prompt_tokens_mean,
            prompt_tokens_cv=w.prompt_tokens_cv,
            output_tokens_mean=w.output_tokens_mean,
            output_tokens_cv=w.output_tokens_cv,
        )
    longest = (
        int(trace.prompt_tokens.max()) if trace is not None else int(float(w.prompt_tokens_mean))
    )
    if not args.chunked_prefill and args.max_num_batched_tokens < longest:
        raise UsageError(
            f"--max-num-batched-tokens {args.max_num_batched_tokens} cannot hold a {longest}-token "
            "prompt without chunked prefill; raise it or use --chunked-prefill"
        )
    return w, trace


def is_lockstep(deployment: pm.Deployment, workload: Workload | None) -> bool:
    """Whether the load is a lockstep loop (``perfmodel.dynamics.lockstep_share``: a closed loop
    at fixed lengths on a prefill-first ``--engine``); its TTFT takes the lockstep runs' scale."""
    return workload is not None and float(lockstep_share(deployment, workload)) == 1.0


def load_workload(args) -> Workload | None:
    """The load the options describe (``resolve_workload``), None when no load was given."""
    if not wants_dynamics(args):
        return None
    check_scheduler(args)
    workload, _ = resolve_workload(args)
    return workload
