"""Options and reports for latency under load, shared by ``explain`` and ``simulate``.

``add_dynamics_arguments`` declares the workload and scheduler options; ``resolve_workload``
turns them into a ``Workload`` (and the ``Trace`` behind it, if any); ``dynamics_report`` is the
closed-form JSON block, ``simulation_report`` the same keys measured by the simulator.
"""

from __future__ import annotations

import argparse
import math

import equinox as eqx
import jax
import numpy as np

import perfmodel as pm
from fitting import predictive_quantiles
from optimize import cached_jit
from perfmodel.dynamics import (
    Trace,
    Workload,
    is_closed_loop,
    load_trace,
    serving_metrics,
    workload_from_trace,
)

from ._options import add_length_arguments, positive
from ._progress import Phases
from ._render import finite_or_none, latency_json
from ._types import nonnegative_float, positive_float, positive_int, workload_source
from .errors import UsageError

_serving_metrics = cached_jit(serving_metrics)
"""``serving_metrics`` whose traced program a second run loads instead of tracing."""


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


LOAD_STEP = 0.01
"""Relative rate step of the p95 TTFT load elasticity (central difference)."""
KNIFE_EDGE = 10.0
"""Elasticity above which the p95 tail is flagged as swinging with small load errors."""


def load_metrics(
    args, model, hardware, deployment, efficiency, workload: Workload, decode_cost=None
):
    """``serving_metrics`` of ``workload`` under the parsed scheduler options (--chunked-prefill,
    --chunk-tokens) and the features' ``decode_cost`` (a cached prefix, speculation; the
    workload then the one the prefill path serves: ``_features_cli.feature_load``), its traced
    program loaded from disk when an earlier run kept it."""
    return _serving_metrics(
        model,
        hardware,
        deployment,
        efficiency,
        workload,
        chunked_prefill=getattr(args, "chunked_prefill", True),
        chunk_tokens=getattr(args, "chunk_tokens", None),
        closed_loop=is_closed_loop(workload),  # static: decided before the leaves are traced
        decode_cost=decode_cost,
    )


INTERVAL_DRAWS = 64
"""Posterior draws the p95 intervals under load are taken over (the first of --draws)."""


def p95_intervals(
    args, model, hardware, deployment, draws, workload: Workload, decode_cost=None
) -> dict:
    """{"ttft_s", "tpot_s", "itl_s", "e2e_s"} -> {"p05", "p50", "p95"}: the 90 % posterior
    interval of each p95 latency (efficiencies and the engines' fitted offsets drawn together;
    an overloaded draw counts as inf, so an interval reaching overload is open, ``null``).

    Each draw runs the point estimate's own program (``load_metrics``: no second compile; ~1 ms
    a draw)."""
    host = jax.tree.map(np.asarray, draws)
    n = min(INTERVAL_DRAWS, int(jax.tree.leaves(host)[0].shape[0]))
    rows = []
    for i in range(n):
        m = load_metrics(
            args,
            model,
            hardware,
            deployment,
            jax.tree.map(lambda x, i=i: x[i], host),
            workload,
            decode_cost,
        )
        rows.append(
            [float(m.ttft_s.p95), float(m.tpot_s.p95), float(m.itl_s.p95), float(m.e2e_s.p95)]
        )
    p95 = np.asarray(rows)
    with np.errstate(divide="ignore"):
        log_p95 = np.log(np.where(np.isnan(p95), np.inf, p95))
    q = np.exp(predictive_quantiles(log_p95, (0.05, 0.5, 0.95)))
    return {
        name: {k: finite_or_none(v) for k, v in zip(("p05", "p50", "p95"), q[:, j])}
        for j, name in enumerate(("ttft_s", "tpot_s", "itl_s", "e2e_s"))
    }


def dynamics_report(
    args,
    model,
    hardware,
    deployment,
    efficiency,
    workload: Workload,
    draws=None,
    decode_cost=None,
    metrics=None,
) -> dict:
    """Closed-form latency under load as JSON-ready keys (``null`` = infinite: overloaded).

    ``utilization``, ``stable``, ``seat_occupancy``, ``queue_bound`` and ``kv_bound`` are the
    ``ServingMetrics`` fields of those names (README, Glossary); the budget that limits capacity
    is the sheet's ``binding_budget``, which a load does not change.

    ``ttft_p95_load_elasticity`` = d ln p95 TTFT / d ln rate (central difference at +-1 %; null
    in closed loop, when overloaded, or when +1 % overloads): about 1-5 at moderate load, tens
    to hundreds near the running slots' saturation, where a 1 % load error moves the p95 by half
    or more (docs/benchmarks-history.md, the queueing section).  ``metrics``: the
    ``load_metrics`` of ``workload`` when the caller has them already."""

    def at(w):
        return load_metrics(args, model, hardware, deployment, efficiency, w, decode_cost)

    m = at(workload) if metrics is None else metrics
    elasticity = None
    if bool(m.stable) and float(workload.concurrency) == 0.0:
        rate = workload.arrival_rate_per_s
        p95 = [
            float(at(eqx.tree_at(lambda w: w.arrival_rate_per_s, workload, rate * k)).ttft_s.p95)
            for k in (1.0 - LOAD_STEP, 1.0 + LOAD_STEP)
        ]
        if all(math.isfinite(p) and p > 0 for p in p95):
            elasticity = math.log(p95[1] / p95[0]) / math.log((1 + LOAD_STEP) / (1 - LOAD_STEP))
    return {
        "ttft_s": latency_json(m.ttft_s),
        "tpot_s": latency_json(m.tpot_s),
        "itl_s": latency_json(m.itl_s),
        "e2e_s": latency_json(m.e2e_s),
        "utilization": float(m.utilization),
        "stable": bool(m.stable),
        "seat_occupancy": float(m.seat_occupancy),
        "queue_bound": bool(m.queue_bound),
        "kv_bound": bool(m.kv_bound),
        "output_tokens_per_s": float(m.output_tokens_per_s),
        "decode_batch": float(m.decode_batch),
        "ttft_p95_load_elasticity": elasticity,
        "engine_scales": engine_scales_report(args, efficiency),
        "p95_intervals": (
            None
            if draws is None
            else p95_intervals(args, model, hardware, deployment, draws, workload, decode_cost)
        ),
    }


def simulation_progress(phases: Phases, total: int):
    """A ``progress(finished, total)`` callback updating the command's progress line
    (``_progress``: on a terminal only, never under ``--json``) for runs of 2,000+ requests."""
    if not phases.enabled or total < 2000:
        return None

    def show(done: int, n: int) -> None:
        phases(f"simulated {done:,}/{n:,} requests")

    return show


def rescale_arrivals(trace: Trace, rate: float) -> Trace:
    """Time-scale a timed trace to ``rate`` requests/s (keeps its burstiness)."""
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    scale = (len(trace) - 1) / (rate * span) if span > 0 else 1.0
    return Trace(
        trace.arrival_s * scale,
        trace.prompt_tokens,
        trace.output_tokens,
        trace.name,
        trace.block_hashes,
        trace.hash_block_tokens,
    )


def simulation_report(result, summary: dict) -> dict:
    """The simulator's measurements (``perfmodel.simulator.summarize``) as JSON-ready keys.

    ``busy_fraction`` is the share of wall time the engines run iterations (the simulator does
    not know the capacity that ``utilization`` divides by); ``stable`` is ``queue_stable``: the
    backlog grew by under 5 % of arrivals over the run's second half (null: too short to tell).
    """
    return {
        "ttft_s": latency_json(summary["ttft_s"]),
        "tpot_s": latency_json(summary["tpot_s"]),
        "itl_s": latency_json(summary["itl_s"]),
        "e2e_s": latency_json(summary["e2e_s"]),
        "busy_fraction": summary["busy_fraction"],
        "stable": summary["stable"],
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "decode_batch": summary["decode_batch"],
        "requests": summary["requests"],
        "preemptions": summary["preemptions"],
    }


def load_workload(args) -> Workload | None:
    """The load the options describe (``resolve_workload``), None when no load was given."""
    if not wants_dynamics(args):
        return None
    check_scheduler(args)
    workload, _ = resolve_workload(args)
    return workload


def render_dynamics(report: dict) -> str:
    """Human lines for the keys of ``dynamics_report`` (empty string when absent)."""
    if "ttft_s" not in report:
        return ""
    from ._render import human_seconds, table

    def pct(p):
        return "  ".join(
            f"{k} {human_seconds(v) if v is not None else 'inf'}" for k, v in p.items()
        )

    rows = [
        ("TTFT", pct(report["ttft_s"])),
        ("TPOT", pct(report["tpot_s"])),
        ("ITL (over gaps)", pct(report["itl_s"])),
        ("E2E", pct(report["e2e_s"])),
        (
            "utilization",
            f"{report['utilization']:.2f}" + ("" if report["stable"] else "  OVERLOADED"),
        ),
        ("seat occupancy", f"{report['seat_occupancy']:.2f}"),
        ("queue-bound", "yes" if report["queue_bound"] else "no"),
        ("KV-bound", "yes" if report["kv_bound"] else "no"),
        ("output tokens/s", f"{report['output_tokens_per_s']:,.0f}"),
        ("mean decode batch", f"{report['decode_batch']:.1f}"),
    ]
    e = report.get("ttft_p95_load_elasticity")
    if e is not None:
        note = (
            f"  near slot saturation: a {LOAD_STEP:.0%} load error moves p95 TTFT by "
            f"{math.expm1(e * math.log1p(LOAD_STEP)):.0%}; plan with headroom"
            if e > KNIFE_EDGE
            else ""
        )
        rows.append(("p95 TTFT elasticity", f"{e:.1f} (d ln p95 / d ln rate){note}"))
    intervals = report.get("p95_intervals")
    if intervals:
        rows.append(("p95, 90% posterior", p95_interval_line(intervals)))
    rows.append(("engine offsets", engine_scales_line(report["engine_scales"])))
    return "\nunder load (closed form):\n" + table(rows)


def p95_interval_line(intervals: dict) -> str:
    """'TTFT 80 ms .. 1.2 s, TPOT ...': each p95's 90 % posterior interval."""
    from ._render import human_seconds

    def show(v):
        return human_seconds(v) if v is not None else "overloaded"

    names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "itl_s": "ITL", "e2e_s": "E2E"}
    return ", ".join(
        f"{label} {show(intervals[k]['p05'])} .. {show(intervals[k]['p95'])}"
        for k, label in names.items()
    )


def engine_scales_report(args, efficiency: pm.Efficiency) -> dict:
    """The engine whose fitted end-to-end offsets the answer reads and the (median) TTFT and TPOT
    scales they apply, as JSON keys (explain's and simulate's ``engine_scales``)."""
    return {
        "engine": getattr(args, "engine", None),
        "ttft": float(efficiency.ttft_scale),
        "tpot": float(efficiency.tpot_scale),
    }


def engine_scales_line(scales: dict) -> str:
    """What the fitted end-to-end offsets did to the closed form's TTFT and TPOT."""
    if scales["ttft"] == 1.0 and scales["tpot"] == 1.0:
        return "none: the physics alone (--prior, or a posterior without end-to-end runs)"
    whose = scales["engine"] or "pooled over vLLM, SGLang and TensorRT-LLM (--engine to pick)"
    return (
        f"TTFT x{scales['ttft']:.2f}, TPOT and ITL x{scales['tpot']:.2f}, as measured "
        f"serving runs differ from the physics ({whose}; posterior median)"
    )
