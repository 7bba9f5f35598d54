"""End-to-end rows: ``serving`` runs (closed loop at a concurrency, open loop at a request rate)
and ``saturated`` (offline) runs.

One evaluation of a run's configuration yields a table of ``SUMMARY_COLUMNS`` numbers: four
latency summaries of five statistics each (column ``len(SummaryStat) * latency + stat``), then
three throughputs (``ServingThroughput``); each row picks its column.
"""

from __future__ import annotations

from enum import IntEnum


class ServingLatency(IntEnum):
    """Latency a serving row measured, in the order of ``closed_loop_metrics``' summaries."""

    TTFT = 0
    """Time to first token, seconds."""
    TPOT = 1
    """Time per output token after the first, seconds."""
    ITL = 2
    """Inter-token latency: the gap between streamed chunks, seconds."""
    E2E_LATENCY = 3
    """Request latency from arrival to last token, seconds."""


class SummaryStat(IntEnum):
    """Statistic of a latency summary, its offset within the latency's five columns."""

    MEAN = 0
    P50 = 1
    P90 = 2
    P95 = 3
    P99 = 4


class ServingThroughput(IntEnum):
    """Throughput a row measured: its column after the 4 x 5 latency summaries."""

    OUTPUT_TOKENS_PER_S = 20
    TOTAL_TOKENS_PER_S = 21
    """Prompt and output tokens per second."""
    REQUESTS_PER_S = 22


SUMMARY_COLUMNS = len(ServingLatency) * len(SummaryStat) + len(ServingThroughput)
"""Columns of one configuration's table."""


def summary_column(latency: ServingLatency, stat: SummaryStat) -> int:
    """Column of a latency statistic in a configuration's table."""
    return len(SummaryStat) * int(latency) + int(stat)


E2E_METRICS = {
    "ttft": ServingLatency.TTFT,
    "tpot": ServingLatency.TPOT,
    "itl": ServingLatency.ITL,
    "e2e_latency": ServingLatency.E2E_LATENCY,
}
"""Latency metric names of end-to-end rows."""
E2E_STATS = {
    "mean": SummaryStat.MEAN,
    "": SummaryStat.MEAN,
    "p50": SummaryStat.P50,
    "median": SummaryStat.P50,
    "p90": SummaryStat.P90,
    "p95": SummaryStat.P95,
    "p99": SummaryStat.P99,
}
"""Statistic names of end-to-end rows (an empty ``stat`` is a mean)."""
THROUGHPUT_COLUMNS = {
    "output_throughput": ServingThroughput.OUTPUT_TOKENS_PER_S,
    "total_throughput": ServingThroughput.TOTAL_TOKENS_PER_S,
    "request_throughput": ServingThroughput.REQUESTS_PER_S,
}
"""Throughput metric names of end-to-end rows."""
