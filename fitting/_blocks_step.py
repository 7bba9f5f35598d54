"""Step rows: ``prefill``, ``decode_step`` and ``static_batch`` measurements of a whole model.

Each row is predicted from ``perfmodel.prefill_step`` and ``perfmodel.decode_step`` at its own
deployment; ``StepMetric`` says which of the four step quantities the row measured.
"""

from __future__ import annotations

from enum import IntEnum


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
