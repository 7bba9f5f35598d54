"""The frontier's values: every swept point in every draw (``ParetoSweep``), the non-dominated
set (``non_dominated``), and its points with posterior medians and 90 % intervals
(``ParetoPoint``, ``ParetoResult``).  Host-side numpy; the sweep itself is ``_pareto.sweep``.

A point is on the frontier when no other point has at least its tokens/s per user and its
tokens/s per GPU and more of one (posterior medians, both maximised).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import equinox as eqx
import numpy as np

from perfmodel import Array

from ._grid import GPU, KV, MNBT, MOE, PP, SEQS, TP, WEIGHT, Grid, layout_degrees

INTERVAL_QUANTILES = (0.05, 0.95)
"""Every reported interval: the 5th to 95th posterior percentile (90 % of the mass)."""

SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1.0e6


class ParetoSweep(eqx.Module):
    """Every (configuration, concurrency) point in every draw; rows follow ``configs``.

    Attributes:
        configs: index rows (``KNOBS`` order), shape (points, len(KNOBS)); the concurrency is
            ``grid.max_num_seqs[configs[:, SEQS]]``.
        fits: one sequence of the workload fits in the KV cache, (points,).
        num_gpus: TP x PP, (points,).
        cost_per_hour: $/hour of the TP x PP group, (points,).
        output_tokens_per_s: generated tokens/s of the engine, (points, draws).
        tpot_s, ttft_s: mean time per output token and to the first token, (points, draws).
        tpot_p95_s, ttft_p95_s: their p95 (the SLO filter reads them), (points, draws).
    """

    configs: Array
    fits: Array
    num_gpus: Array
    cost_per_hour: Array
    output_tokens_per_s: Array
    tpot_s: Array
    ttft_s: Array
    tpot_p95_s: Array
    ttft_p95_s: Array

    @property
    def tokens_per_s_per_gpu(self) -> Array:
        return self.output_tokens_per_s / self.num_gpus[:, None]

    @property
    def tokens_per_s_per_user(self) -> Array:
        return 1.0 / self.tpot_s

    @property
    def cost_per_million_tokens(self) -> Array:
        """$ per million output tokens, (points, draws)."""
        tokens_per_hour = SECONDS_PER_HOUR * self.output_tokens_per_s
        return self.cost_per_hour[:, None] * TOKENS_PER_MILLION / tokens_per_hour


def non_dominated(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mask of the points no other point beats on both axes (maximising x and y): a point is
    dropped when another is >= on both and > on one, and of equal points only the first is kept.
    O(n log n): sort by x descending (y descending within ties), keep each point whose y beats
    every y seen so far."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    order = np.lexsort((np.arange(len(x)), -y, -x))
    keep = np.zeros(len(x), dtype=bool)
    best = -np.inf
    for i in order:
        if y[i] > best:
            keep[i], best = True, y[i]
    return keep


@dataclasses.dataclass(frozen=True)
class ParetoPoint:
    """One point of a frontier: its configuration and posterior medians with 90 % intervals
    (``(lo, hi)``, the ``INTERVAL_QUANTILES``)."""

    gpu: str
    tp: int
    pp: int
    moe_layout: str
    ep: int
    attention_dp: int
    weight_dtype: str
    kv_dtype: str
    concurrency: int
    max_num_batched_tokens: int
    num_gpus: int
    tokens_per_s_per_gpu: float
    tokens_per_s_per_gpu_interval: tuple[float, float]
    tokens_per_s_per_user: float
    tokens_per_s_per_user_interval: tuple[float, float]
    ttft_seconds: float
    ttft_seconds_interval: tuple[float, float]
    tpot_seconds: float
    tpot_seconds_interval: tuple[float, float]
    cost_per_hour: float
    cost_per_million_tokens: float
    cost_per_million_tokens_interval: tuple[float, float]
    slo_probability: float

    def to_json(self) -> dict:
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }


@dataclasses.dataclass(frozen=True)
class ParetoResult:
    """The sweep, which points are eligible, and the frontiers.

    Attributes:
        model: the model's name.
        gpus: candidate hardware ids (``GPU`` index order).
        concurrencies: the swept clients in flight.
        input_len, output_len: mean prompt and output tokens of the workload.
        slo_p95_s: the (TTFT, TPOT) p95 bounds in seconds (``inf``: none).
        confidence: the share of draws a point must meet them in.
        grid: the sweep's grid.
        sweep: every point in every draw (numpy leaves).
        slo_probability: share of draws meeting the p95 SLOs, per point (1 without SLOs).
        eligible: fits, and meets the SLOs with the confidence, per point.
        frontier: the non-dominated eligible points over every GPU, by tokens/s per user.
        frontier_by_gpu: the same within each GPU.
    """

    model: str
    gpus: tuple[str, ...]
    concurrencies: tuple[int, ...]
    input_len: float
    output_len: float
    slo_p95_s: tuple[float, float]
    confidence: float
    grid: Grid
    sweep: ParetoSweep
    slo_probability: np.ndarray
    eligible: np.ndarray
    frontier: tuple[ParetoPoint, ...]
    frontier_by_gpu: Mapping[str, tuple[ParetoPoint, ...]]

    def to_json(self) -> dict:
        """One JSON-ready object (finite numbers only)."""
        return {
            "model": self.model,
            "gpus": list(self.gpus),
            "concurrency": list(self.concurrencies),
            "input_len": self.input_len,
            "output_len": self.output_len,
            "slo_ttft_p95_s": self.slo_p95_s[0] if math.isfinite(self.slo_p95_s[0]) else None,
            "slo_tpot_p95_s": self.slo_p95_s[1] if math.isfinite(self.slo_p95_s[1]) else None,
            "confidence": self.confidence,
            "num_draws": int(self.sweep.output_tokens_per_s.shape[1]),
            "interval_quantiles": list(INTERVAL_QUANTILES),
            "load_model": "perfmodel.serving_metrics (closed loop at concurrency N)",
            "tokens_per_s_per_user": "1 / mean TPOT",
            "points_evaluated": len(self.eligible),
            "points_fitting": int(np.sum(self.sweep.fits)),
            "points_eligible": int(np.sum(self.eligible)),
            "frontier": [p.to_json() for p in self.frontier],
            "frontier_by_gpu": {
                g: [p.to_json() for p in pts] for g, pts in self.frontier_by_gpu.items()
            },
        }


def _median_interval(values: np.ndarray) -> tuple[float, tuple[float, float]]:
    lo, hi = np.quantile(values, INTERVAL_QUANTILES)
    return float(np.median(values)), (float(lo), float(hi))


def _point(result_sweep: ParetoSweep, grid: Grid, gpus, i: int, prob: float) -> ParetoPoint:
    s, c = result_sweep, np.asarray(result_sweep.configs[i])
    thr, thr_i = _median_interval(s.tokens_per_s_per_gpu[i])
    user, user_i = _median_interval(s.tokens_per_s_per_user[i])
    ttft, ttft_i = _median_interval(s.ttft_s[i])
    tpot, tpot_i = _median_interval(s.tpot_s[i])
    cost, cost_i = _median_interval(s.cost_per_million_tokens[i])
    layout = grid.moe_layouts[c[MOE]]
    ep, attention_dp = layout_degrees(layout, grid.tp[c[TP]])
    return ParetoPoint(
        gpu=gpus[c[GPU]],
        tp=grid.tp[c[TP]],
        pp=grid.pp[c[PP]],
        moe_layout=layout,
        ep=ep,
        attention_dp=attention_dp,
        weight_dtype=grid.weight_dtypes[c[WEIGHT]],
        kv_dtype=grid.kv_dtypes[c[KV]],
        concurrency=grid.max_num_seqs[c[SEQS]],
        max_num_batched_tokens=grid.max_num_batched_tokens[c[MNBT]],
        num_gpus=int(s.num_gpus[i]),
        tokens_per_s_per_gpu=thr,
        tokens_per_s_per_gpu_interval=thr_i,
        tokens_per_s_per_user=user,
        tokens_per_s_per_user_interval=user_i,
        ttft_seconds=ttft,
        ttft_seconds_interval=ttft_i,
        tpot_seconds=tpot,
        tpot_seconds_interval=tpot_i,
        cost_per_hour=float(s.cost_per_hour[i]),
        cost_per_million_tokens=cost,
        cost_per_million_tokens_interval=cost_i,
        slo_probability=float(prob),
    )


def frontier_points(
    sweep_np: ParetoSweep, grid: Grid, gpus, eligible: np.ndarray, prob: np.ndarray
) -> tuple[ParetoPoint, ...]:
    """The non-dominated points among ``eligible`` (posterior medians), by tokens/s per user."""
    rows = np.flatnonzero(eligible)
    x = np.median(sweep_np.tokens_per_s_per_user[rows], axis=1)
    y = np.median(sweep_np.tokens_per_s_per_gpu[rows], axis=1)
    keep = non_dominated(x, y)
    chosen = rows[keep][np.argsort(x[keep], kind="stable")]
    return tuple(_point(sweep_np, grid, gpus, int(i), prob[i]) for i in chosen)
