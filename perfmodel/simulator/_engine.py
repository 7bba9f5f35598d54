"""One replica of an iteration-level continuous-batching engine, event by event.

Each iteration (Orca, Yu et al. OSDI 2022) the scheduler picks work FCFS under
``max_num_seqs`` S and ``max_num_batched_tokens`` B, runs it through ``step_s`` (the same
``perfmodel._step.forward_step`` as the closed forms) and advances the clock by that time:

* chunked prefill (Sarathi-Serve, Agrawal et al. OSDI 2024; vLLM v1): running decodes first, one
  token each; then prompt chunks of admitted requests, then new admissions, into what is left of B;
* unchunked (vLLM v0): if the head of the queue can be admitted, a prefill-only iteration of whole
  prompts (up to B tokens, at least one prompt); otherwise a decode iteration of every running
  sequence.

KV is paged (Kwon et al., SOSP 2023): a request holds ceil(tokens / block) blocks, its prompt's
blocks at admission and one more whenever a decode crosses a block edge; with static
reservation it holds ``max_model_len`` from admission.  When a decode finds no free block the
most recently admitted request is preempted by recompute: it frees its blocks and returns to the
head of the queue to prefill prompt + generated tokens again.

Length limits (vLLM): a prompt longer than ``max_model_len`` is rejected at arrival (counted in
``RequestState.rejected``, no latency recorded); generation stops when prompt + output reaches
``max_model_len``.

Hook points for extensions (``EngineHooks``): prompt tokens already cached at admission (prefix
caching) and tokens a decoding sequence emits per iteration (speculative decoding).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._fast_forward import fast_forward
from ._records import DecodeGaps
from ._requests import RequestState, blocks_for


@dataclass(frozen=True)
class EngineLimits:
    """Scheduler limits of one replica (integers, from ``Deployment`` and the memory budget)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_tokens: int
    total_blocks: int
    chunked_prefill: bool = True
    chunk_tokens: int | None = None
    static_tokens: int | None = None  # static reservation: tokens held from admission
    max_model_len: int | None = None  # longest prompt + output (None: unlimited)


@dataclass(frozen=True)
class EngineHooks:
    """Extension points; ``None`` means the plain engine.

    Attributes:
        cached_prefix_tokens: (request id, prompt tokens) -> prompt tokens already in KV at
            admission (not prefilled again; their blocks count as held unless shared).
        decode_tokens: (ids of decoding requests) -> tokens each emits this iteration (>= 1).
        shared_prefix_blocks: the cached prefix's blocks are shared with other requests (a prefix
            cache: vLLM references them, counted in the cache's budget, not the request's);
            False when the request owns them (a KV hand-off into a decode pool).
    """

    cached_prefix_tokens: Callable[[int, int], int] | None = None
    shared_prefix_blocks: bool = False
    decode_tokens: Callable[[np.ndarray], np.ndarray] | None = None


@dataclass(frozen=True)
class EngineRun:
    """What one replica's run leaves behind.

    Attributes:
        requests: per-request state (arrival, first token, finish, tokens served, preemptions).
        iterations: engine iterations run.
        busy_s: seconds the engine spent in iterations.
        gaps: the decode iterations' inter-token gaps (``DecodeGaps``: their sequences summed
            are the decode batch summed over iterations, and weighted by the gaps the
            decode-sequence-seconds).
    """

    requests: RequestState
    iterations: int
    busy_s: float
    gaps: DecodeGaps


def run_engine(
    step_s: Callable[[float, float, float, float, float], float],
    arrival_s: np.ndarray,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    limits: EngineLimits,
    hooks: EngineHooks = EngineHooks(),
    concurrency: int = 0,
    progress: Callable[[int, int], None] | None = None,
    decode_run_s: Callable[[int, float, int], np.ndarray] | None = None,
) -> EngineRun:
    """Simulate until every request finishes.

    Args:
        step_s: iteration time (prefill_tokens, prefill_seqs, prefill_context, decode_seqs,
            decode_context) -> seconds.
        arrival_s: arrival times, non-decreasing (ignored when ``concurrency`` > 0).
        concurrency: closed loop: the first N requests arrive at 0, each later one when an
            earlier one finishes.
        decode_run_s: optional (decode_seqs, decode_context, k) -> times of k consecutive
            decode-only iterations (context +1 each); lets the loop jump over stretches with no
            queue and no prefill in one call (same times as k single steps).

    Returns:
        the run's ``EngineRun``.
    """
    lim = limits
    n = len(prompt_tokens)
    arrival = np.array(arrival_s, dtype=np.float64)
    if concurrency > 0:
        arrival[:] = np.inf
        arrival[: min(concurrency, n)] = 0.0
    R = RequestState(arrival, prompt_tokens, output_tokens, lim.max_model_len)
    B, S, blk = lim.max_num_batched_tokens, lim.max_num_seqs, lim.block_tokens
    cap = lim.chunk_tokens or B
    free = lim.total_blocks
    waiting: deque[int] = deque()
    running: list[int] = []
    now, nxt, finished, iters, busy = 0.0, 0, 0, 0, 0.0
    gap_end: list[float] = []  # per decode iteration: end time, duration, sequences
    gap_s: list[float] = []
    gap_seqs: list[float] = []
    next_closed = min(concurrency, n)

    def hold(tokens):
        return blocks_for(lim.static_tokens if lim.static_tokens else tokens, blk)

    def admit_blocks(r):
        return int(hold(R.kv[r] - R.shared[r] + R.need[r] - R.done[r] + 1))

    def admit(r):
        nonlocal free
        if hooks.cached_prefix_tokens is not None and R.gen[r] == 0 and R.preempted[r] == 0:
            cached = int(min(hooks.cached_prefix_tokens(r, int(R.prompt[r])), R.prompt[r] - 1))
            R.done[r] += cached
            R.kv[r] += cached
            if hooks.shared_prefix_blocks:
                R.shared[r] = cached
        R.blocks[r] = admit_blocks(r)
        free -= int(R.blocks[r])
        running.append(r)

    def preempt(r):
        nonlocal free
        free += int(R.blocks[r])
        R.blocks[r] = 0
        R.kv[r] = 0
        R.shared[r] = 0
        R.done[r] = 0
        R.need[r] = R.prompt[r] + R.gen[r]
        R.preempted[r] += 1
        running.remove(r)
        waiting.appendleft(r)

    def release_next(at):
        """Closed loop: a request that leaves (finished or rejected) releases the next one."""
        nonlocal next_closed
        if concurrency > 0 and next_closed < n:
            R.arrival[next_closed] = at
            next_closed += 1

    def retire(done, at):
        """Free finished requests' blocks."""
        nonlocal free, finished
        for r in done:
            R.finish[r] = at
            free += int(R.blocks[r])
            R.blocks[r] = 0
            running.remove(r)
            finished += 1
            release_next(at)

    while finished < n:
        while nxt < n and R.arrival[nxt] <= now:
            if R.rejected[nxt]:
                finished += 1
                release_next(now)
            else:
                waiting.append(nxt)
            nxt += 1
        if not running and not waiting:
            if nxt >= n:  # every request has left: the last ones were rejected on arrival
                break
            now = R.arrival[nxt]
            continue
        if decode_run_s is not None and not waiting and hooks.decode_tokens is None:
            ran = fast_forward(
                R, running, decode_run_s, now, R.arrival[nxt] if nxt < n else np.inf, free, blk, lim
            )
            if ran is not None:
                k, elapsed, grow, done_now, times = ran
                gap_end.extend((now + np.cumsum(times)).tolist())
                gap_s.extend(times.tolist())
                gap_seqs.extend([float(len(running))] * k)
                now += elapsed
                busy += elapsed
                iters += k
                free -= grow
                retire(done_now, now)
                continue
        chunks: list[tuple[int, int]] = []
        dec = np.empty(0, np.int64)
        if lim.chunked_prefill or not (
            waiting and len(running) < S and admit_blocks(waiting[0]) <= free
        ):
            run = np.fromiter(running, np.int64, len(running))
            dec = run[R.done[run] >= R.need[run]] if len(run) else run
            dec = dec[: min(S, B)]
            if lim.static_tokens is None and len(dec):
                grow = blocks_for(R.kv[dec] - R.shared[dec] + 1, blk) - R.blocks[dec]
                while grow.sum() > free and running:
                    victim = running[-1]
                    preempt(victim)
                    keep = dec != victim
                    dec, grow = dec[keep], grow[keep]
                R.blocks[dec] += grow
                free -= int(grow.sum())
        budget = B - len(dec)
        if lim.chunked_prefill:
            for r in running:
                if budget <= 0:
                    break
                left = int(R.need[r] - R.done[r])
                if left > 0:
                    c = min(left, budget, cap)
                    chunks.append((r, c))
                    budget -= c
            while waiting and budget > 0 and len(running) < S:
                r = waiting[0]
                if admit_blocks(r) > free:
                    break
                waiting.popleft()
                admit(r)
                c = min(int(R.need[r] - R.done[r]), budget, cap)
                chunks.append((r, c))
                budget -= c
        elif len(dec) == 0:
            used = 0
            while waiting and len(running) < S:
                r = waiting[0]
                size = int(R.need[r] - R.done[r])
                if (chunks and used + size > B) or admit_blocks(r) > free:
                    break
                waiting.popleft()
                admit(r)
                chunks.append((r, size))
                used += size
        if not chunks and not len(dec):
            if not running and waiting:  # the head cannot fit even alone: report it as failed
                r = waiting.popleft()
                R.first[r] = R.finish[r] = np.inf
                finished += 1
                continue
            now = R.arrival[nxt] if nxt < n else now
            continue

        pf = np.array([r for r, _ in chunks], np.int64)
        pc = np.array([c for _, c in chunks], np.int64)
        p_ctx = float(R.done[pf].mean()) if len(pf) else 0.0
        d_ctx = float(R.kv[dec].mean()) if len(dec) else 0.0
        dt = step_s(float(pc.sum()), float(len(pf)), p_ctx, float(len(dec)), d_ctx)
        now += dt
        busy += dt
        iters += 1
        if len(dec):
            gap_end.append(now)
            gap_s.append(dt)
            gap_seqs.append(float(len(dec)))

        done_now = []
        if len(pf):
            R.done[pf] += pc
            R.kv[pf] += pc
            complete = pf[R.done[pf] >= R.need[pf]]
            R.gen[complete] += 1
            fresh = complete[np.isnan(R.first[complete])]
            R.first[fresh] = now
            done_now.extend(complete[R.gen[complete] >= R.output[complete]].tolist())
        if len(dec):
            emit = 1 if hooks.decode_tokens is None else np.maximum(hooks.decode_tokens(dec), 1)
            R.kv[dec] += emit
            R.gen[dec] += emit
            done_now.extend(dec[R.gen[dec] >= R.output[dec]].tolist())
        retire(done_now, now)
        if progress is not None and iters % 2000 == 0:
            progress(finished, n)
    gaps = DecodeGaps(*(np.asarray(x, dtype=np.float64) for x in (gap_end, gap_s, gap_seqs)))
    return EngineRun(R, iters, busy, gaps)
