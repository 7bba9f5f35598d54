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
from dataclasses import dataclass, field

import numpy as np

from ._fast_forward import FAST_FORWARD_MAX, fast_forward
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
    scheduler_polls: int = 1  # decode iterations between polls for new requests (``_polling``)
    prefill_first: bool = False  # prompt chunks in iterations of their own, ahead of decodes


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
        iteration: called with (prefill tokens, decode sequences, seconds) of every iteration
            the engine runs; each is then priced one by one (no decode fast-forward), so every
            iteration is seen.
    """

    cached_prefix_tokens: Callable[[int, int], int] | None = None
    shared_prefix_blocks: bool = False
    decode_tokens: Callable[[np.ndarray], np.ndarray] | None = None
    iteration: Callable[[float, float, float], None] | None = None


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


@dataclass
class _Replica:
    """The mutable state of one replica's run: the requests, the FCFS queue, the running set,
    the free KV blocks, the clock and what the run records (its decode gaps)."""

    limits: EngineLimits
    hooks: EngineHooks
    requests: RequestState
    concurrency: int
    free_blocks: int
    waiting: deque[int] = field(default_factory=deque)
    running: list[int] = field(default_factory=list)
    now_s: float = 0.0
    next_arrival: int = 0  # first request not yet arrived (ids arrive in order)
    next_closed: int = 0  # closed loop: first request not yet released
    since_poll: int = 0  # decode-only iterations since the scheduler last polled
    finished: int = 0
    iterations: int = 0
    busy_s: float = 0.0
    gap_end_s: list[float] = field(default_factory=list)  # per decode iteration: its end,
    gap_s: list[float] = field(default_factory=list)  # its duration
    gap_seqs: list[float] = field(default_factory=list)  # and its decode sequences

    @property
    def size(self) -> int:
        return len(self.requests.prompt)

    def hold_blocks(self, tokens):
        """Blocks a request holds for ``tokens`` in KV (static reservation: ``static_tokens``)."""
        lim = self.limits
        return blocks_for(lim.static_tokens if lim.static_tokens else tokens, lim.block_tokens)

    def admit_blocks(self, r: int) -> int:
        """Blocks request ``r`` needs to be admitted: its KV so far, what it still prefills and
        the next token's slot (its shared prefix blocks not counted)."""
        req = self.requests
        return int(self.hold_blocks(req.kv[r] - req.shared[r] + req.need[r] - req.done[r] + 1))

    def admit(self, r: int) -> None:
        """Start ``r``: its cached prefix (first admission only) counts as prefilled."""
        req, hooks = self.requests, self.hooks
        if hooks.cached_prefix_tokens is not None and req.gen[r] == 0 and req.preempted[r] == 0:
            cached = int(min(hooks.cached_prefix_tokens(r, int(req.prompt[r])), req.prompt[r] - 1))
            req.done[r] += cached
            req.kv[r] += cached
            if hooks.shared_prefix_blocks:
                req.shared[r] = cached
        req.blocks[r] = self.admit_blocks(r)
        self.free_blocks -= int(req.blocks[r])
        self.running.append(r)

    def preempt(self, r: int) -> None:
        """Preemption by recompute: ``r`` frees its blocks and returns to the head of the queue to
        prefill its prompt and generated tokens again."""
        req = self.requests
        self.free_blocks += int(req.blocks[r])
        req.blocks[r] = req.kv[r] = req.shared[r] = req.done[r] = 0
        req.need[r] = req.prompt[r] + req.gen[r]
        req.preempted[r] += 1
        self.running.remove(r)
        self.waiting.appendleft(r)

    def release_next(self, at_s: float) -> None:
        """Closed loop: a request that leaves (finished or rejected) releases the next one."""
        if self.concurrency > 0 and self.next_closed < self.size:
            self.requests.arrival[self.next_closed] = at_s
            self.next_closed += 1

    def retire(self, done, at_s: float) -> None:
        """Finish the requests ``done`` at ``at_s`` and free their blocks."""
        req = self.requests
        for r in done:
            req.finish[r] = at_s
            self.free_blocks += int(req.blocks[r])
            req.blocks[r] = 0
            self.running.remove(r)
            self.finished += 1
            self.release_next(at_s)

    def poll_due(self) -> bool:
        """Whether the scheduler polls for new requests now: SGLang's ``SchedulerRecvSkipper``
        polls after ``scheduler_polls`` decode-only iterations, after any iteration that
        carried prefill and at once when idle; every other engine at each iteration."""
        idle = not self.running and not self.waiting
        return idle or self.since_poll >= self.limits.scheduler_polls

    def polls_in(self) -> int:
        """Decode-only iterations a stretch may run before the scheduler must look at a request
        already arrived (``FAST_FORWARD_MAX`` when none is waiting to be seen)."""
        if self.next_arrival_s() > self.now_s:
            return FAST_FORWARD_MAX
        return max(self.limits.scheduler_polls - self.since_poll, 1)

    def take_arrivals(self) -> None:
        """Poll: queue every request that has arrived by now (rejected ones leave at once)."""
        self.since_poll = 0
        req = self.requests
        while self.next_arrival < self.size and req.arrival[self.next_arrival] <= self.now_s:
            if req.rejected[self.next_arrival]:
                self.finished += 1
                self.release_next(self.now_s)
            else:
                self.waiting.append(self.next_arrival)
            self.next_arrival += 1

    def next_arrival_s(self) -> float:
        n = self.size
        return self.requests.arrival[self.next_arrival] if self.next_arrival < n else np.inf

    def record_gaps(self, end_s, seconds, seqs) -> None:
        self.gap_end_s.extend(end_s)
        self.gap_s.extend(seconds)
        self.gap_seqs.extend(seqs)

    def fast_forward(self, decode_run_s) -> bool:
        """A stretch of decode-only iterations in one call (``fast_forward``); False when the
        state needs a single step."""
        ran = fast_forward(
            self.requests,
            self.running,
            decode_run_s,
            self.now_s,
            self.next_arrival_s(),
            self.free_blocks,
            self.limits.block_tokens,
            self.limits,
            self.polls_in(),
        )
        if ran is None:
            return False
        # the polls inside the stretch found nothing; the count resumes from the last one, and
        # one due at the stretch's last iteration stays due (it sees the arrival that ended it)
        polls = self.limits.scheduler_polls
        self.since_poll = (self.since_poll + ran.iterations - 1) % polls + 1
        self.record_gaps(
            (self.now_s + np.cumsum(ran.iteration_s)).tolist(),
            ran.iteration_s.tolist(),
            [float(len(self.running))] * ran.iterations,
        )
        self.now_s += ran.elapsed_s
        self.busy_s += ran.elapsed_s
        self.iterations += ran.iterations
        self.free_blocks -= ran.blocks_taken
        self.retire(ran.finished, self.now_s)
        return True

    def decode_batch(self) -> np.ndarray:
        """The iteration's decodes: running sequences done prefilling, at most min(S, B), each
        given the block its next token needs; short of blocks, the most recently admitted
        request is preempted until they fit.  Unchunked, none while the queue's head can be
        admitted (a prefill-only iteration runs instead)."""
        lim, req, waiting = self.limits, self.requests, self.waiting
        head_fits = (
            waiting
            and len(self.running) < lim.max_num_seqs
            and self.admit_blocks(waiting[0]) <= self.free_blocks
        )
        if not lim.chunked_prefill and head_fits:
            return np.empty(0, np.int64)
        run = np.fromiter(self.running, np.int64, len(self.running))
        dec = run[req.done[run] >= req.need[run]] if len(run) else run
        dec = dec[: min(lim.max_num_seqs, lim.max_num_batched_tokens)]
        if lim.static_tokens is None and len(dec):
            grow = blocks_for(req.kv[dec] - req.shared[dec] + 1, lim.block_tokens) - req.blocks[dec]
            while grow.sum() > self.free_blocks and self.running:
                victim = self.running[-1]
                self.preempt(victim)
                keep = dec != victim
                dec, grow = dec[keep], grow[keep]
            req.blocks[dec] += grow
            self.free_blocks -= int(grow.sum())
        return dec

    def chunked_prefill(self, budget: int) -> list[tuple[int, int]]:
        """Chunked: prompt chunks of running requests, then new admissions, FCFS into the
        ``budget`` tokens the decodes leave (one sequence at most ``chunk_tokens``)."""
        lim, req = self.limits, self.requests
        cap = lim.chunk_tokens or lim.max_num_batched_tokens
        chunks: list[tuple[int, int]] = []
        for r in self.running:
            if budget <= 0:
                break
            left = int(req.need[r] - req.done[r])
            if left > 0:
                c = min(left, budget, cap)
                chunks.append((r, c))
                budget -= c
        while self.waiting and budget > 0 and len(self.running) < lim.max_num_seqs:
            r = self.waiting[0]
            if self.admit_blocks(r) > self.free_blocks:
                break
            self.waiting.popleft()
            self.admit(r)
            c = min(int(req.need[r] - req.done[r]), budget, cap)
            chunks.append((r, c))
            budget -= c
        return chunks

    def whole_prompts(self) -> list[tuple[int, int]]:
        """Unchunked: a prefill-only iteration of whole prompts from the head of the queue, up to
        the budget B (at least one prompt)."""
        lim, req = self.limits, self.requests
        chunks: list[tuple[int, int]] = []
        used = 0
        while self.waiting and len(self.running) < lim.max_num_seqs:
            r = self.waiting[0]
            size = int(req.need[r] - req.done[r])
            if (chunks and used + size > lim.max_num_batched_tokens) or (
                self.admit_blocks(r) > self.free_blocks
            ):
                break
            self.waiting.popleft()
            self.admit(r)
            chunks.append((r, size))
            used += size
        return chunks

    def idle(self) -> None:
        """Nothing to run: a head that cannot fit even alone fails (first token and finish
        inf); otherwise the clock jumps to the next arrival."""
        if not self.running and self.waiting:
            r = self.waiting.popleft()
            self.requests.first[r] = self.requests.finish[r] = np.inf
            self.finished += 1
            return
        if self.next_arrival < self.size:
            self.now_s = self.requests.arrival[self.next_arrival]

    def iterate(self, step_s, chunks: list[tuple[int, int]], dec: np.ndarray) -> None:
        """Run one iteration of ``chunks`` and the decodes ``dec``: advance the clock by
        ``step_s``, sample the first token of prompts completed, emit the decodes' tokens
        (``decode_tokens`` each when speculative) and retire the finished."""
        req = self.requests
        pf = np.array([r for r, _ in chunks], np.int64)
        pc = np.array([c for _, c in chunks], np.int64)
        p_ctx = float(req.done[pf].mean()) if len(pf) else 0.0
        d_ctx = float(req.kv[dec].mean()) if len(dec) else 0.0
        dt = step_s(float(pc.sum()), float(len(pf)), p_ctx, float(len(dec)), d_ctx)
        self.now_s += dt
        self.busy_s += dt
        self.iterations += 1
        # an iteration that carried prefill makes the next poll due (``poll_due``)
        self.since_poll = self.limits.scheduler_polls if len(pf) else self.since_poll + 1
        if len(dec):
            self.record_gaps([self.now_s], [dt], [float(len(dec))])
        done_now = []
        if len(pf):
            req.done[pf] += pc
            req.kv[pf] += pc
            complete = pf[req.done[pf] >= req.need[pf]]
            req.gen[complete] += 1
            fresh = complete[np.isnan(req.first[complete])]
            req.first[fresh] = self.now_s
            done_now.extend(complete[req.gen[complete] >= req.output[complete]].tolist())
        if len(dec):
            hook = self.hooks.decode_tokens
            emit = 1 if hook is None else np.maximum(hook(dec), 1)
            req.kv[dec] += emit
            req.gen[dec] += emit
            done_now.extend(dec[req.gen[dec] >= req.output[dec]].tolist())
        self.retire(done_now, self.now_s)


def _recording(
    step_s: Callable[[float, float, float, float, float], float],
    record: Callable[[float, float, float], None],
) -> Callable[[float, float, float, float, float], float]:
    """``step_s`` that also hands each iteration's (prefill tokens, decode sequences, seconds)
    to ``record``."""

    def step(p_tok, p_seq, p_ctx, d_seq, d_ctx):
        dt = step_s(p_tok, p_seq, p_ctx, d_seq, d_ctx)
        record(p_tok, d_seq, dt)
        return dt

    return step


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
            queue and no prefill in one call (same times as k single steps);
            unused when ``hooks.iteration`` records every iteration.

    Returns:
        the run's ``EngineRun``.
    """
    n = len(prompt_tokens)
    if hooks.iteration is not None:
        step_s, decode_run_s = _recording(step_s, hooks.iteration), None
    arrival = np.array(arrival_s, dtype=np.float64)
    if concurrency > 0:
        arrival[:] = np.inf
        arrival[: min(concurrency, n)] = 0.0
    replica = _Replica(
        limits=limits,
        hooks=hooks,
        requests=RequestState(arrival, prompt_tokens, output_tokens, limits.max_model_len),
        concurrency=concurrency,
        free_blocks=limits.total_blocks,
        next_closed=min(concurrency, n),
    )
    while replica.finished < n:
        if replica.poll_due():
            replica.take_arrivals()
        if not replica.running and not replica.waiting:
            if replica.next_arrival >= n:  # every request has left: the last ones were rejected
                break
            replica.now_s = replica.next_arrival_s()
            continue
        forward = decode_run_s is not None and not replica.waiting and hooks.decode_tokens is None
        if forward and replica.fast_forward(decode_run_s):
            continue
        if limits.prefill_first and limits.chunked_prefill:
            # prompts waiting or part-prefilled take the whole budget; decodes wait for them
            chunks = replica.chunked_prefill(limits.max_num_batched_tokens)
            dec = replica.decode_batch() if not chunks else np.empty(0, np.int64)
        elif limits.chunked_prefill:
            dec = replica.decode_batch()
            chunks = replica.chunked_prefill(limits.max_num_batched_tokens - len(dec))
        else:
            dec = replica.decode_batch()
            chunks = replica.whole_prompts() if len(dec) == 0 else []
        if not chunks and not len(dec):
            replica.idle()
            continue
        replica.iterate(step_s, chunks, dec)
        if progress is not None and replica.iterations % 2000 == 0:
            progress(replica.finished, n)
    gaps = DecodeGaps(
        *(
            np.asarray(x, dtype=np.float64)
            for x in (replica.gap_end_s, replica.gap_s, replica.gap_seqs)
        )
    )
    return EngineRun(replica.requests, replica.iterations, replica.busy_s, gaps)
