"""Decode-only stretches of the engine in one call: no queue, no prefill, no KV shortage."""

from __future__ import annotations

import numpy as np

from ._requests import blocks_for

FAST_FORWARD_MAX = 256
"""Most decode-only iterations one fast-forward runs."""

DECODE_RUN_CHUNK = 32
"""Iterations per ``decode_run_s`` call (its one compiled shape): a fast-forward asks for more
chunks only while the next arrival is still ahead, so an open loop (tens of decode steps between
arrivals) needs one call and a closed loop at most ``FAST_FORWARD_MAX / DECODE_RUN_CHUNK``."""


def fast_forward(R, running, decode_run_s, now, next_arrival, free, blk, lim):
    """Run decode-only iterations until the next arrival, finish or KV shortage, in one call.

    The iteration times are those of k single decode steps at context c, c + 1, ... (same
    ``forward_step``), so the result equals stepping one by one.

    Returns (iterations, elapsed s, blocks taken, finished ids, each iteration's seconds) or
    None to take a single step.
    """
    if not running:
        return None
    run = np.fromiter(running, np.int64, len(running))
    if np.any(R.done[run] < R.need[run]) or len(run) > min(
        lim.max_num_seqs, lim.max_num_batched_tokens
    ):
        return None
    k = int(min((R.output[run] - R.gen[run]).min(), FAST_FORWARD_MAX))
    if k < 2:
        return None
    grow = 0
    if lim.static_tokens is None:
        grow = int((blocks_for(R.kv[run] - R.shared[run] + k, blk) - R.blocks[run]).sum())
        if grow > free:
            return None
    context, gap = float(R.kv[run].mean()), next_arrival - now
    chunks: list[np.ndarray] = []
    done, elapsed = 0, 0.0
    while done < k and (not chunks or elapsed < gap):  # times up to the next arrival, by chunk
        times = decode_run_s(len(run), context + done, min(DECODE_RUN_CHUNK, k - done))
        chunks.append(times)
        done, elapsed = done + len(times), elapsed + float(times.sum())
    times = np.concatenate(chunks)
    cum = np.cumsum(times)
    k = int(min(np.searchsorted(cum, gap) + 1, len(cum)))
    if lim.static_tokens is None:
        new_blocks = blocks_for(R.kv[run] - R.shared[run] + k, blk)
        grow = int((new_blocks - R.blocks[run]).sum())
        R.blocks[run] = new_blocks
    R.kv[run] += k
    R.gen[run] += k
    return k, float(cum[k - 1]), grow, run[R.gen[run] >= R.output[run]].tolist(), times[:k]
