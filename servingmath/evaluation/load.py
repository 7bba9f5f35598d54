"""Latency under load for ``explain`` and ``simulate``: the closed form (``serving_metrics``) at the
parsed scheduler options, its p95 posterior intervals and load elasticity, as JSON-ready keys.
"""

from __future__ import annotations

import jax
import numpy as np

import perfmodel as pm
from fitting import predictive_quantiles
from optimize import cached_jit
from perfmodel import System
from perfmodel.dynamics import (
    Workload,
    is_closed_loop,
    serving_metrics,
    ttft_p95_load_elasticity,
)

from ..reports.render import finite_or_none, latency_json

_serving_metrics = cached_jit(serving_metrics)
"""``serving_metrics`` whose traced program a second run loads instead of tracing."""


def load_metrics(args, system: System, workload: Workload, decode_cost=None):
    """``serving_metrics`` of ``workload`` under the parsed scheduler options (--chunked-prefill,
    --chunk-tokens) and the features' ``decode_cost`` (a cached prefix, speculation; the
    workload then the one the prefill path serves: ``evaluation.features.feature_load``), its traced
    program loaded from disk when an earlier run kept it."""
    return _serving_metrics(
        system,
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
            System(model, hardware, deployment, jax.tree.map(lambda x, i=i: x[i], host)),
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
    system: System,
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
        return load_metrics(args, system, w, decode_cost)

    m = at(workload) if metrics is None else metrics
    elasticity = ttft_p95_load_elasticity(at, workload, m)
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
        "engine_scales": engine_scales_report(args, system.efficiency),
        "p95_intervals": (
            None
            if draws is None
            else p95_intervals(
                args, system.model, system.hardware, system.deployment, draws, workload, decode_cost
            )
        ),
    }


def engine_scales_report(args, efficiency: pm.Efficiency) -> dict:
    """The engine whose fitted end-to-end offsets the answer reads and the (median) TTFT and TPOT
    scales they apply, as JSON keys (explain's and simulate's ``engine_scales``)."""
    return {
        "engine": getattr(args, "engine", None),
        "ttft": float(efficiency.ttft_scale),
        "tpot": float(efficiency.tpot_scale),
    }
