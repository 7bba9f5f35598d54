"""Per-request records of a simulation and their summary (TTFT, TPOT, ITL, E2E percentiles)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .._floors import TIME_FLOOR_S


@dataclass(frozen=True)
class DecodeGaps:
    """The inter-token gaps of a run, per decode iteration: its end time (s), its duration (the
    gap every sequence decoding in it waited for this token, or this streamed chunk under
    speculation) and how many sequences decoded in it.  ITL over gaps is the durations'
    distribution weighted by sequences (a sequence that sat out an iteration, preempted or over
    the sequence cap, waited longer than the one gap counted for it)."""

    end_s: np.ndarray
    gap_s: np.ndarray
    sequences: np.ndarray

    @staticmethod
    def join(parts: list[DecodeGaps]) -> DecodeGaps:
        """One record of several engines' (replicas run side by side on the same clock)."""
        return DecodeGaps(
            *(
                np.concatenate([np.zeros(0)] + [getattr(p, f.name) for p in parts])
                for f in fields(DecodeGaps)
            )
        )


@dataclass(frozen=True)
class SimResult:
    """What one simulated run measured, per request (seconds; arrays of length N).

    ``tpot_s`` is (finish - first token) / (output - 1), NaN for one-token outputs.
    ``busy_s`` is the summed iteration time of all replicas, ``makespan_s`` first arrival to
    last finish, ``decode_area_s`` the sum over iterations of decode batch x iteration time
    (by Little's law, the sum over requests of time spent decoding).  ``output_tokens`` are the
    tokens served (capped at ``max_model_len``); ``rejected`` marks prompts longer than
    ``max_model_len`` (no latency: NaN times).  ``reused_tokens`` (prefix cache) and
    ``spec_tokens_per_step`` (speculation) are set when those features ran.  ``decode_gaps``:
    every decode iteration's duration and decoding sequences (``DecodeGaps``), for ITL.
    """

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    preemptions: np.ndarray
    iterations: int
    busy_s: float
    makespan_s: float
    replicas: int
    mean_decode_batch: float
    decode_area_s: float = 0.0
    rejected: np.ndarray | None = None
    reused_tokens: np.ndarray | None = None
    spec_tokens_per_step: float | None = None
    decode_gaps: DecodeGaps | None = None

    @property
    def num_rejected(self) -> int:
        return 0 if self.rejected is None else int(np.sum(self.rejected))

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        gaps = self.output_tokens - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(gaps > 0, (self.finish_s - self.first_token_s) / gaps, np.nan)


def _pct(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": float("nan"), "p50": float("nan"), "p95": float("nan"), "p99": float("nan")}
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def _itl(result: SimResult, keep: np.ndarray) -> dict[str, float]:
    """Mean and p50/p95/p99 over gaps of the decode iterations that ended while the kept
    requests were in the system (first kept arrival to last kept finish): each iteration's
    duration weighted by the sequences it decoded."""
    gaps, none = result.decode_gaps, _pct(np.zeros(0))
    if gaps is None or not len(keep) or not len(gaps.gap_s):
        return none
    finish = result.finish_s[keep]
    start, stop = result.arrival_s[keep].min(), finish[np.isfinite(finish)].max(initial=-np.inf)
    inside = (gaps.end_s >= start) & (gaps.end_s <= stop) & (gaps.sequences > 0)
    gap, weight = gaps.gap_s[inside], gaps.sequences[inside]
    if not weight.sum() > 0:
        return none
    # the smallest gap below which the given share of the sequence-weighted gaps lies
    p50, p95, p99 = np.quantile(gap, [0.5, 0.95, 0.99], weights=weight, method="inverted_cdf")
    mean = np.average(gap, weights=weight)
    return {"mean": float(mean), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def engine_summary(result: SimResult, efficiency, decode_efficiency=None) -> dict:
    """``summarize`` with TTFT and TPOT as the engine delivers them: ``efficiency``'s fitted
    end-to-end scales (``Efficiency.ttft_scale``; the decode pool's ``tpot_scale`` where a
    split's pools differ), as the closed forms' ``engine_scaled``."""
    decode = efficiency if decode_efficiency is None else decode_efficiency
    return summarize(
        result,
        ttft_scale=float(efficiency.ttft_scale),
        tpot_scale=float(decode.tpot_scale),
    )


def kept_requests(result: SimResult, warmup_fraction: float = 0.1) -> np.ndarray:
    """Ids of the requests a summary counts: by arrival, without the first ``warmup_fraction``
    (warm-up), the last 5 % (drain) and rejected prompts."""
    n = len(result.arrival_s)
    order = np.argsort(result.arrival_s, kind="stable")
    keep = order[int(warmup_fraction * n) : max(int(0.95 * n), int(warmup_fraction * n) + 1)]
    if result.rejected is not None:
        keep = keep[~result.rejected[keep]]
    return keep


STABLE_GROWTH_SHARE = 0.05
"""Largest backlog growth, as a share of arrivals, that a run called stable may show: the
requests in the system grew by under 5 % of the requests that arrived (completions kept pace
with at least 95 % of arrivals)."""

MIN_STABILITY_SAMPLES = 10
"""Fewest arrivals in the second half of the kept window that ``queue_stable`` judges from."""


def backlog_growth_share(result: SimResult, warmup_fraction: float = 0.1) -> float:
    """How fast the queue grew over the run: d n / d t over the arrival rate, in the second half
    of the kept window (``kept_requests`` by arrival; warm-up and drain excluded).

    n(t) = requests arrived by t - requests finished by t (rejected prompts never enter) is
    sampled at each arrival in the window; its least-squares slope over the window's arrival
    rate lambda is g.  A stable queue's n(t) wanders about its mean lambda E[E2E] (Little), so
    g -> 0; one offered rho > 1 times its capacity finishes lambda / rho, so g -> 1 - 1 / rho.
    NaN when the window has fewer than ``MIN_STABILITY_SAMPLES`` arrivals or no duration.
    """
    keep = kept_requests(result, warmup_fraction)
    times = np.sort(result.arrival_s[keep])
    times = times[len(times) // 2 :]
    if len(times) < MIN_STABILITY_SAMPLES or times[-1] <= times[0]:
        return float("nan")
    served = np.ones(len(result.arrival_s), dtype=bool)
    if result.rejected is not None:
        served = ~result.rejected
    arrivals = np.sort(result.arrival_s[served])
    finishes = np.sort(result.finish_s[served])
    n = np.searchsorted(arrivals, times, side="right") - np.searchsorted(
        finishes, times, side="right"
    )
    slope = np.polyfit(times - times[0], n.astype(float), 1)[0]
    rate = (len(times) - 1) / (times[-1] - times[0])
    return float(slope / rate)


def queue_stable(result: SimResult, warmup_fraction: float = 0.1) -> bool | None:
    """The run kept up with its arrivals: ``backlog_growth_share`` < ``STABLE_GROWTH_SHARE``
    (an overload by a factor above 1 / (1 - 0.05), about 5 %, reads unstable).  None when the
    run is too short to tell.  A closed loop (a request arrives as one finishes) holds n fixed
    and is always stable."""
    g = backlog_growth_share(result, warmup_fraction)
    return None if not np.isfinite(g) else bool(g < STABLE_GROWTH_SHARE)


def summarize(
    result: SimResult,
    warmup_fraction: float = 0.1,
    *,
    ttft_scale: float = 1.0,
    tpot_scale: float = 1.0,
) -> dict:
    """Percentiles over ``kept_requests`` (warm-up and drain dropped); ``busy_fraction`` = summed
    iteration time / (replicas * makespan), the share of wall time the engines run iterations
    (not ``ServingMetrics.utilization``, the offered load over capacity); ``stable`` =
    ``queue_stable``; output tokens/s.

    ``ttft_scale`` / ``tpot_scale`` (``Efficiency``'s, the engines' fitted end-to-end offsets,
    as ``perfmodel.dynamics.engine_scaled`` applies them to the closed forms) scale each
    request's TTFT and its decode time (TPOT, the gaps), E2E being their sum; the engine's
    schedule and throughput are the simulated ones."""
    n = len(result.arrival_s)
    keep = kept_requests(result, warmup_fraction)
    span = max(result.makespan_s, TIME_FLOOR_S)
    ttft = result.ttft_s[keep]
    e2e = ttft_scale * ttft + tpot_scale * (result.e2e_s[keep] - ttft)
    itl = {k: v * tpot_scale for k, v in _itl(result, keep).items()}
    return {
        "ttft_s": _pct(ttft_scale * ttft),
        "tpot_s": _pct(tpot_scale * result.tpot_s[keep]),
        "itl_s": itl,
        "e2e_s": _pct(e2e),
        "busy_fraction": float(result.busy_s / (result.replicas * span)),
        "stable": queue_stable(result, warmup_fraction),
        "output_tokens_per_s": float(result.output_tokens.sum() / span),
        "decode_batch": float(result.mean_decode_batch),
        "requests": int(n),
        "preemptions": int(result.preemptions.sum()),
        "rejected": result.num_rejected,
    }
