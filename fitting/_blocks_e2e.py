"""End-to-end rows: ``serving`` runs (closed loop at a concurrency, open loop at a request rate)
and ``saturated`` (offline) runs.

One evaluation of a run's configuration yields a table of ``SUMMARY_COLUMNS`` numbers: four
latency summaries of five statistics each (column ``len(SummaryStat) * latency + stat``), then
three throughputs (``ServingThroughput``); each row picks its column.
"""

from __future__ import annotations

import abc
import dataclasses
from enum import IntEnum
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import perfmodel
from perfmodel import Deployment, Efficiency, HardwareSpec, ModelSpec, System, Workload
from perfmodel.dynamics import closed_loop_metrics

from ._blocks_base import RowBlock, RowScales, stack_specs


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


class ServingRows(RowBlock):
    """End-to-end rows folded onto their runs' configurations: the fields from
    ``prompt_tokens_mean`` to ``requests_per_client`` and ``specs`` hold one entry per
    configuration (``num_configurations``), ``pos``, ``config``, ``column`` and
    ``stream_chunk_tokens`` one per row."""

    prompt_tokens_mean: np.ndarray
    """Mean prompt tokens of the run's requests (the median of its uncertain value where the run
    does not record it, ``MLPERF_PROMPT_TOKENS``)."""
    prompt_tokens_cv: np.ndarray
    """Coefficient of variation of the prompt lengths."""
    prompt_mean_log_sd: np.ndarray
    """Log-normal spread of a prompt mean nobody recorded (MLPerf), else 0."""
    output_tokens_mean: np.ndarray
    """Mean output tokens of the run's requests."""
    output_tokens_cv: np.ndarray
    """Coefficient of variation of the output lengths."""
    concurrency: np.ndarray
    """Closed-loop clients (1e9 for a saturated run, 0 for an open loop)."""
    request_rate_per_s: np.ndarray
    """Poisson arrival rate of an open loop, requests/s (1 for closed loops)."""
    requests_per_client: np.ndarray
    """Requests each closed-loop client sends (inf for a saturated run)."""
    column: np.ndarray
    """Each row's column of its configuration's table (``summary_column``,
    ``ServingThroughput``; int)."""
    stream_chunk_tokens: np.ndarray
    """Tokens per streamed chunk behind an ITL row (its gap spans them), 1 for other rows."""
    config: np.ndarray
    """Each row's configuration (int)."""
    specs: tuple[ModelSpec, HardwareSpec, Deployment]
    """Per-configuration model, hardware and deployment, stacked leaf by leaf."""

    INTEGER_FIELDS: ClassVar[frozenset[str]] = RowBlock.INTEGER_FIELDS | {"column", "config"}
    PER_ROW: ClassVar[tuple[str, ...]] = (
        "pos",
        "column",
        "stream_chunk_tokens",
        "config",
    )
    """Fields of a row's own; the others describe its configuration."""

    @classmethod
    def from_rows(cls, rows: list[dict[str, float]], specs: list[tuple]) -> ServingRows:
        """Fold the rows of one run (13 rows: 4 latencies x 3 stats + throughput) onto one
        configuration each: rows with the same specs and configuration numbers share one, in
        order of first appearance."""
        names = [f.name for f in dataclasses.fields(cls) if f.name not in cls.PER_ROW + ("specs",)]
        keys = [(id(sp),) + tuple(float(r[c]) for c in names) for r, sp in zip(rows, specs)]
        first: dict[tuple, int] = {}
        config = [first.setdefault(k, len(first)) for k in keys]
        rows_of = {j: i for i, j in reversed(list(enumerate(config)))}
        heads = [rows_of[j] for j in range(len(first))]
        per_row = [r | {"config": j} for r, j in zip(rows, config)]
        return super().from_rows(
            per_row,
            **{c: np.asarray([float(rows[i][c]) for i in heads]) for c in names},
            specs=stack_specs([specs[i] for i in heads]),
        )

    @property
    def num_configurations(self) -> int:
        """Distinct configurations (evaluations of the serving model) behind the rows."""
        return len(self.prompt_tokens_mean)

    def workloads(self, prompt_z: jnp.ndarray | float) -> Workload:
        """The configurations' workloads; a prompt mean nobody recorded is drawn log-normal
        around its median, P exp(log_sd z) (``MLPERF_PROMPT_LOG_SD``; z = 0 gives the median)."""
        return Workload(
            arrival_rate_per_s=self.request_rate_per_s,
            concurrency=self.concurrency,
            interarrival_cv=np.ones_like(self.prompt_tokens_mean),
            prompt_tokens_mean=self.prompt_tokens_mean
            * jnp.exp(self.prompt_mean_log_sd * prompt_z),
            prompt_tokens_cv=self.prompt_tokens_cv,
            output_tokens_mean=self.output_tokens_mean,
            output_tokens_cv=self.output_tokens_cv,
            requests_per_client=self.requests_per_client,
        )

    def config_efficiency(self, eff: Efficiency) -> Efficiency:
        """Per-row parameters -> one per configuration (a configuration's rows share its GPU)."""
        first = np.zeros(int(self.config.max()) + 1, dtype=int)
        first[self.config[::-1]] = np.arange(len(self.config))[::-1]
        return jax.tree.map(lambda x: x[first], eff)

    @abc.abstractmethod
    def summaries(self, m, h, d, e: Efficiency, w: Workload) -> jnp.ndarray:
        """One configuration's ``SUMMARY_COLUMNS`` numbers."""

    def predict(self, eff: Efficiency, ker: Efficiency, scales: RowScales) -> jnp.ndarray:
        """Each row's entry of its configuration's table; an ITL row's gap spans
        ``stream_chunk_tokens`` tokens, every other row's factor is 1."""
        # a serving engine's TP all-reduces: the latency scale of its comm cell
        eff = eff.with_collective_latency_scale(jnp.exp(scales.comm_latency_log[self.pos]))
        model, hw, dep = self.specs
        table = jax.vmap(self.summaries)(
            model, hw, dep, self.config_efficiency(eff), self.workloads(scales.prompt_z)
        )
        return table[self.config, self.column] * self.stream_chunk_tokens


class ClosedLoopRows(ServingRows):
    """Closed-loop serving rows (clients at a ``concurrency``) and saturated (offline) rows ->
    ``perfmodel.dynamics.closed_loop_metrics``."""

    def summaries(self, m, h, d, e: Efficiency, w: Workload) -> jnp.ndarray:
        r = closed_loop_metrics(System(m, h, d, e), w)
        thr = jnp.stack([r.output_tokens_per_s, r.total_tokens_per_s, r.requests_per_s])
        return jnp.concatenate([r.ttft_s, r.tpot_s, r.itl_s, r.e2e_s, thr])


class OpenLoopRows(ServingRows):
    """Open-loop serving rows (Poisson arrivals at ``request_rate_per_s``) ->
    ``perfmodel.serving_metrics``; an overloaded point predicts ``inf`` latency and its
    saturated throughput."""

    def summaries(self, m, h, d, e: Efficiency, w: Workload) -> jnp.ndarray:
        s = perfmodel.serving_metrics(System(m, h, d, e), w, closed_loop=False)
        lat = [
            jnp.stack([p.mean, p.p50, p.p90, p.p95, p.p99])
            for p in (s.ttft_s, s.tpot_s, s.tpot_s, s.e2e_s)
        ]
        req = s.output_tokens_per_s / w.output_tokens_mean
        thr = jnp.stack(
            [s.output_tokens_per_s, req * (w.prompt_tokens_mean + w.output_tokens_mean), req]
        )
        return jnp.concatenate(lat + [thr])
