"""Step rows: ``prefill``, ``decode_step`` and ``static_batch`` measurements of a whole model.

Each row is predicted from ``perfmodel.prefill_step`` and ``perfmodel.decode_step`` at its own
deployment; ``StepMetric`` says which of the four step quantities the row measured.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import perfmodel
from perfmodel import Deployment, Efficiency, HardwareSpec, ModelSpec, System

from ._blocks_base import RowBlock, RowScales, stack_specs


class StepMetric(IntEnum):
    """What a step row measured: its column in the (rows, 4) table of step quantities.

    A static batch of B requests of P prompt and O output tokens: TTFT = prefill of B prompts,
    TPOT = a decode iteration of B sequences at the mean context P + O / 2,
    latency = TTFT + (O - 1) TPOT, output throughput = B O / latency."""

    PREFILL_TIME = 0
    """Seconds of one prefill of the batch's prompts (``prefill`` time, static-batch TTFT)."""
    DECODE_ITERATION_TIME = 1
    """Seconds of one decode iteration (``decode_step`` time, static-batch TPOT)."""
    BATCH_LATENCY = 2
    """Seconds from the batch's arrival to its last output token."""
    OUTPUT_THROUGHPUT = 3
    """Output tokens per second of the whole batch."""


STEP_METRICS = {
    ("prefill", "time"): StepMetric.PREFILL_TIME,
    ("decode_step", "time"): StepMetric.DECODE_ITERATION_TIME,
    ("static_batch", "ttft"): StepMetric.PREFILL_TIME,
    ("static_batch", "tpot"): StepMetric.DECODE_ITERATION_TIME,
    ("static_batch", "latency"): StepMetric.BATCH_LATENCY,
    ("static_batch", "output_throughput"): StepMetric.OUTPUT_THROUGHPUT,
}
"""(scenario, metric) of a step row -> the quantity it measured."""


class StepRows(RowBlock):
    """Step rows with their deployments stacked for ``vmap``: per row a prefill and a decode
    iteration (``perfmodel.prefill_step`` / ``decode_step``), combined as ``StepMetric`` says."""

    prompt_tokens: np.ndarray
    """P: prompt tokens of each request."""
    output_tokens: np.ndarray
    """O: output tokens of each request (1 where the row records none)."""
    batch_size: np.ndarray
    """B: requests (sequences) in the batch."""
    context_tokens: np.ndarray
    """Tokens in context at a decode iteration (P + O / 2 where the row records none)."""
    metric: np.ndarray
    """``StepMetric`` code of what the row measured (int)."""
    specs: tuple[ModelSpec, HardwareSpec, Deployment]
    """Per-row model, hardware and deployment, stacked leaf by leaf."""

    INTEGER_FIELDS: ClassVar[frozenset[str]] = RowBlock.INTEGER_FIELDS | {"metric"}

    @classmethod
    def from_rows(cls, rows: list[dict[str, float]], specs: list[tuple]) -> StepRows:
        """Stack per-row numbers (keyed by field name) and each row's specs."""
        return super().from_rows(rows, specs=stack_specs(specs))

    def predict(self, eff: Efficiency, ker: Efficiency, scales: RowScales) -> jnp.ndarray:
        # the source's collective-latency scale (COMM_GROUP) on the TP all-reduces
        eff = eff.with_collective_latency_scale(jnp.exp(scales.comm_latency_log[self.pos]))
        model, hw, dep = self.specs

        def one(m, h, d, e, inp, batch, ctx):
            pre = perfmodel.prefill_step(System(m, h, d, e), inp, batch).total_s
            dec = perfmodel.decode_step(System(m, h, d, e), batch, ctx).total_s
            return pre, dec

        pre, dec = jax.vmap(one)(
            model, hw, dep, eff, self.prompt_tokens, self.batch_size, self.context_tokens
        )
        latency = pre + (self.output_tokens - 1.0) * dec
        quantity = {
            StepMetric.PREFILL_TIME: pre,
            StepMetric.DECODE_ITERATION_TIME: dec,
            StepMetric.BATCH_LATENCY: latency,
            StepMetric.OUTPUT_THROUGHPUT: self.batch_size * self.output_tokens / latency,
        }
        table = jnp.stack([quantity[m] for m in StepMetric], axis=1)
        return jnp.take_along_axis(table, self.metric[:, None], axis=1)[:, 0]
