"""How sharply a latency percentile swings with the load: the elasticity d ln p95 TTFT / d ln rate."""

from __future__ import annotations

import math
from collections.abc import Callable

import equinox as eqx

from ._serving import ServingMetrics
from ._workload import Workload

LOAD_ELASTICITY_STEP = 0.01
"""Relative rate step of the p95 TTFT load elasticity (central difference at rate x (1 +- step))."""


def ttft_p95_load_elasticity(
    metrics_at: Callable[[Workload], ServingMetrics],
    workload: Workload,
    metrics: ServingMetrics | None = None,
    step: float = LOAD_ELASTICITY_STEP,
) -> float | None:
    """d ln p95 TTFT / d ln arrival rate of an open-loop ``workload``, by a central difference.

    With p95 TTFT evaluated (``metrics_at``, e.g. ``serving_metrics`` at fixed specs) at the
    rates lambda (1 - step) and lambda (1 + step), the elasticity is
    ln(T+ / T-) / ln((1 + step) / (1 - step)): a p95 that grows as lambda^k gives k.  It is about
    1-5 at moderate load and tens to hundreds near the running slots' saturation, where a 1 %
    load error moves the p95 by half or more.

    None where it is not defined: a closed loop (``workload.concurrency`` > 0: no rate to
    perturb), an overloaded load (``metrics.stable`` false: the p95 is infinite), or a step that
    overloads or leaves a non-positive p95.  ``metrics``: ``metrics_at(workload)`` when the caller
    has it already.
    """
    m = metrics_at(workload) if metrics is None else metrics
    if not (bool(m.stable) and float(workload.concurrency) == 0.0):
        return None
    rate = workload.arrival_rate_per_s
    p95 = [
        float(
            metrics_at(eqx.tree_at(lambda w: w.arrival_rate_per_s, workload, rate * k)).ttft_s.p95
        )
        for k in (1.0 - step, 1.0 + step)
    ]
    if not all(math.isfinite(p) and p > 0 for p in p95):
        return None
    return math.log(p95[1] / p95[0]) / math.log((1 + step) / (1 - step))
