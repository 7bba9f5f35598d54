"""Per-request engine state and vLLM's length limits (admission before the scheduler)."""

from __future__ import annotations

import numpy as np


def blocks_for(tokens, block: int):
    """ceil(tokens / block): KV blocks that hold ``tokens``."""
    return -(-np.asarray(tokens) // block)


def length_limits(prompt, output, max_model_len: int | None) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's ``max_model_len`` rules: (outputs as served, rejected mask).

    A prompt longer than ``max_model_len`` is rejected before scheduling (vLLM's input
    processor: "prompt is longer than the maximum model length"); otherwise generation stops
    once prompt + output reaches ``max_model_len`` (stop reason ``length``), after at least the
    one token the prefill samples.  ``None`` disables both.
    """
    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    if max_model_len is None:
        return output.copy(), np.zeros(len(prompt), bool)
    rejected = prompt > max_model_len
    capped = np.minimum(output, np.maximum(max_model_len - prompt, 1))
    return np.where(rejected, 0, capped), rejected


class RequestState:
    """Per-request state as parallel numpy arrays, indexed by request id.

    ``output`` is the served length (capped at ``max_model_len``); rejected requests keep NaN
    first-token and finish times.
    """

    def __init__(self, arrival_s, prompt, output, max_model_len: int | None = None):
        n = len(prompt)
        self.arrival = np.array(arrival_s, dtype=np.float64)
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self.output, self.rejected = length_limits(self.prompt, output, max_model_len)
        self.need = self.prompt.copy()  # tokens to prefill before the next token is sampled
        self.done = np.zeros(n, np.int64)  # of those, prefilled so far
        self.kv = np.zeros(n, np.int64)  # tokens held in KV
        self.shared = np.zeros(n, np.int64)  # of those, prefix tokens in shared (cached) blocks
        self.gen = np.zeros(n, np.int64)  # tokens generated
        self.blocks = np.zeros(n, np.int64)
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.preempted = np.zeros(n, np.int64)
