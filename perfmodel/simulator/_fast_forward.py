"""Decode-only stretches of the engine in one call: no queue, no prefill, no KV shortage."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._requests import blocks_for

FAST_FORWARD_MAX = 256
"""Most decode-only iterations one fast-forward runs."""

DECODE_RUN_CHUNK = 32
"""Iterations per ``decode_run_s`` call (its one compiled shape): a fast-forward asks for more
chunks only while the next arrival is still ahead, so an open loop (tens of decode steps between
arrivals) needs one call and a closed loop at most ``FAST_FORWARD_MAX / DECODE_RUN_CHUNK``."""


@dataclass(frozen=True)
class DecodeStretch:
    """What a run of decode-only iterations did (``fast_forward``)."""

    iterations: int
    elapsed_s: float
    blocks_taken: int
    finished: list[int]  # ids of the requests it finished
    iteration_s: np.ndarray  # each iteration's seconds


def fast_forward(
    requests,
    running,
    decode_run_s,
    now_s,
    next_arrival_s,
    free_blocks,
    block_tokens,
    limits,
    max_iterations=FAST_FORWARD_MAX,
) -> DecodeStretch | None:
    """Run decode-only iterations until the next arrival, finish or KV shortage, or at most
    ``max_iterations`` (the scheduler's next poll), in one call.

    The iteration times are those of k single decode steps at context c, c + 1, ... (same
    ``forward_step``), so the result equals stepping one by one.

    Returns the ``DecodeStretch``, or None to take a single step.
    """
    req = requests
    if not running:
        return None
    run = np.fromiter(running, np.int64, len(running))
    if np.any(req.done[run] < req.need[run]) or len(run) > min(
        limits.max_num_seqs, limits.max_num_batched_tokens
    ):
        return None
    k = int(min((req.output[run] - req.gen[run]).min(), FAST_FORWARD_MAX, max_iterations))
    if k < 2:
        return None
    grow = 0
    if limits.static_tokens is None:
        held = blocks_for(req.kv[run] - req.shared[run] + k, block_tokens)
        grow = int((held - req.blocks[run]).sum())
        if grow > free_blocks:
            return None
    context, gap = float(req.kv[run].mean()), next_arrival_s - now_s
    chunks: list[np.ndarray] = []
    done, elapsed = 0, 0.0
    while done < k and (not chunks or elapsed < gap):  # times up to the next arrival, by chunk
        times = decode_run_s(len(run), context + done, min(DECODE_RUN_CHUNK, k - done))
        chunks.append(times)
        done, elapsed = done + len(times), elapsed + float(times.sum())
    times = np.concatenate(chunks)
    cum = np.cumsum(times)
    k = int(min(np.searchsorted(cum, gap) + 1, len(cum)))
    if limits.static_tokens is None:
        new_blocks = blocks_for(req.kv[run] - req.shared[run] + k, block_tokens)
        grow = int((new_blocks - req.blocks[run]).sum())
        req.blocks[run] = new_blocks
    req.kv[run] += k
    req.gen[run] += k
    finished = run[req.gen[run] >= req.output[run]].tolist()
    return DecodeStretch(k, float(cum[k - 1]), grow, finished, times[:k])
