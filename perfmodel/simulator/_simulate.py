"""Drive the engine from a ``Workload`` or a ``Trace`` with the step time of ``forward_step``."""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from .._batching import DecodeCost, iteration_s
from .._memory import kv_capacity_tokens
from .._specs import Deployment, HardwareSpec, ModelSpec, System
from .._traces import Trace
from .._workload import Workload, sample_arrivals, sample_lengths
from ._engine import EngineHooks, EngineLimits, run_engine
from ._fast_forward import DECODE_RUN_CHUNK
from ._features import FeatureCounts, PrefixCaching, gather_reused, replica_hooks
from ._records import DecodeGaps, SimResult
from ._speculative import speculative_step_function


def requests_from_workload(workload: Workload, num_requests: int, seed: int = 0) -> Trace:
    """Sample ``num_requests`` requests: gamma inter-arrivals (rate, CV) and lognormal lengths.

    Deterministic for a seed (``numpy.random.default_rng(seed)``).
    """
    rng = np.random.default_rng(seed)
    arrivals = (
        sample_arrivals(
            rng, float(workload.arrival_rate_per_s), float(workload.interarrival_cv), num_requests
        )
        if float(workload.arrival_rate_per_s) > 0
        else np.zeros(num_requests)
    )
    prompts = sample_lengths(
        rng, workload.prompt_tokens_mean, workload.prompt_tokens_cv, num_requests
    )
    outputs = sample_lengths(
        rng, workload.output_tokens_mean, workload.output_tokens_cv, num_requests
    )
    return Trace(arrivals, prompts, outputs, name="workload")


def step_function(system: System) -> Callable[..., float]:
    """A jitted scalar iteration time (``perfmodel._batching.iteration_s`` = forward_step)."""

    @jax.jit
    def f(x):
        return iteration_s(
            system,
            prefill_tokens=x[0],
            prefill_seqs=x[1],
            prefill_context=x[2],
            decode_seqs=x[3],
            decode_context=x[4],
        )

    buf = np.zeros(5)

    def step_s(p_tok, p_seq, p_ctx, d_seq, d_ctx):
        buf[:] = (p_tok, p_seq, p_ctx, d_seq, d_ctx)
        return float(f(buf))

    return step_s


def decode_run_function(system: System) -> Callable[[int, float, int], np.ndarray]:
    """Times of k <= ``DECODE_RUN_CHUNK`` consecutive decode-only iterations at context c, c + 1,
    ... (one vmapped ``iteration_s`` call, always padded to ``DECODE_RUN_CHUNK`` rows: one shape,
    so one trace and compile per run)."""

    @jax.jit
    def f(seqs, contexts):
        return iteration_s(system, decode_seqs=seqs, decode_context=contexts)

    def run(seqs, context, k):
        ctx = context + np.arange(DECODE_RUN_CHUNK, dtype=np.float64)
        return np.asarray(f(np.float64(seqs), ctx))[:k]

    return run


def engine_limits(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    chunked_prefill: bool = True,
    chunk_tokens: int | None = None,
) -> EngineLimits:
    """Integer scheduler limits of one replica: budgets, ``max_model_len`` and the scheduler's
    polls from ``deployment``, KV blocks from the memory budget (``kv_capacity_tokens`` / block
    size, floored)."""
    block = round(float(deployment.block_size_tokens))
    capacity = float(kv_capacity_tokens(model, hardware, deployment))
    static = int(float(deployment.max_model_len)) if deployment.kv_allocation == "static" else None
    return EngineLimits(
        max_num_batched_tokens=int(float(deployment.max_num_batched_tokens)),
        max_num_seqs=int(float(deployment.max_num_seqs)),
        block_tokens=block,
        total_blocks=int(capacity // block),
        chunked_prefill=chunked_prefill,
        chunk_tokens=chunk_tokens,
        static_tokens=static,
        max_model_len=int(float(deployment.max_model_len)),
        scheduler_polls=max(round(float(deployment.scheduler_polls)), 1),
        prefill_first=float(deployment.prefill_first) > 0.5,
    )


def _iteration_functions(
    system: System,
    speculation: DecodeCost | None,
) -> tuple[Callable, Callable | None]:
    """(iteration time, decode-run time) the engine loop calls: the step model's, or with
    ``speculation`` its draft-and-verify iteration (no decode-run shortcut: each step's
    acceptance is sampled)."""
    if speculation is None:
        return step_function(system), decode_run_function(system)
    step_s = speculative_step_function(
        system, int(speculation.draft_tokens), speculation.draft_model
    )
    return step_s, None


def _replica_engine_hooks(
    hooks: EngineHooks,
    arrival: np.ndarray,
    trace: Trace,
    limits: EngineLimits,
    counts: FeatureCounts,
    prefix: PrefixCaching | None,
    speculation: DecodeCost | None,
    *,
    requests: np.ndarray,
    replica: int,
    seed: int,
) -> EngineHooks:
    """The hooks one replica's engine runs with: ``hooks``, with the prefix cache's hits and the
    speculative steps' accepted tokens of this replica's requests in place of theirs where those
    features are on (``replica_hooks``: ``requests`` are the indices of the replica's requests,
    ``replica`` its number)."""
    cached, decode_tokens = replica_hooks(
        requests,
        arrival,
        trace.prompt_tokens,
        trace.output_tokens,
        replica,
        seed,
        limits.total_blocks * limits.block_tokens,
        counts,
        prefix,
        speculation,
    )
    return EngineHooks(
        cached_prefix_tokens=cached if prefix is not None else hooks.cached_prefix_tokens,
        decode_tokens=decode_tokens if speculation is not None else hooks.decode_tokens,
        shared_prefix_blocks=prefix is not None or hooks.shared_prefix_blocks,
        iteration=hooks.iteration,
    )


def simulate(
    system: System,
    requests: Workload | Trace,
    *,
    num_requests: int = 2000,
    seed: int = 0,
    concurrency: int | None = None,
    chunked_prefill: bool = True,
    chunk_tokens: int | None = None,
    hooks: EngineHooks | None = None,
    progress: Callable[[int, int], None] | None = None,
    prefix: PrefixCaching | None = None,
    speculation: DecodeCost | None = None,
) -> SimResult:
    """Simulate a continuous-batching deployment request by request.

    Args:
        requests: a ``Workload`` (``num_requests`` are sampled with ``seed``) or a ``Trace``
            (used as is; a length-only trace needs ``concurrency`` or a timed trace).
        concurrency: closed loop with N in flight (default: ``Workload.concurrency`` if > 0).
        chunked_prefill, chunk_tokens: scheduler mode (see ``_engine``).
        hooks: extension points (default none); ``prefix`` / ``speculation`` replace the
            matching hook.
        prefix: block-level LRU prefix cache per replica (``PrefixCaching``).
        speculation: a speculative ``DecodeCost`` (k draft tokens, acceptance alpha, draft model
            or None for MTP heads): draft + verification steps with sampled acceptance.
        progress: called as ``progress(finished, total)`` now and then.

    Returns:
        ``SimResult``; replicas get requests by a seeded random split.  Prompts longer than
        ``deployment.max_model_len`` are rejected and outputs capped at it (vLLM).
    """
    model, hardware, deployment = system.model, system.hardware, system.deployment
    hooks = hooks if hooks is not None else EngineHooks()
    if isinstance(requests, Workload):
        if concurrency is None and float(requests.concurrency) > 0:
            concurrency = round(float(requests.concurrency))
        trace = requests_from_workload(requests, num_requests, seed)
    else:
        trace = requests
    concurrency = concurrency or 0
    if concurrency == 0 and not trace.has_arrivals:
        raise ValueError(f"trace {trace.name!r} has no arrival times; give a concurrency or a rate")
    if speculation is not None and not (
        speculation.speculative and float(speculation.cached_prompt_tokens) == 0.0
    ):
        raise ValueError(
            "speculation must be a speculative DecodeCost without cached prompt tokens "
            "(the simulator's prefix cache decides hits: pass prefix=)"
        )
    limits = engine_limits(model, hardware, deployment, chunked_prefill, chunk_tokens)
    step_s, decode_run = _iteration_functions(system, speculation)
    replicas = max(round(float(deployment.replicas)), 1)
    n = len(trace)
    owner = (
        np.random.default_rng(seed + 1).integers(0, replicas, n)
        if replicas > 1
        else np.zeros(n, int)
    )
    first, finish = np.full(n, np.nan), np.full(n, np.nan)
    preempted = np.zeros(n, np.int64)
    served = np.array(trace.output_tokens, dtype=np.int64)
    rejected = np.zeros(n, bool)
    counts = FeatureCounts(np.zeros(n))
    iters, busy = 0, 0.0
    gap_parts: list[DecodeGaps] = []
    arrival = np.nan_to_num(trace.arrival_s, nan=0.0)
    for k in range(replicas):
        idx = np.flatnonzero(owner == k)
        if idx.size == 0:
            continue
        share = concurrency // replicas + (1 if k < concurrency % replicas else 0)
        replica_hooks_k = _replica_engine_hooks(
            hooks,
            arrival,
            trace,
            limits,
            counts,
            prefix,
            speculation,
            requests=idx,
            replica=k,
            seed=seed,
        )
        run = run_engine(
            step_s,
            arrival[idx],
            trace.prompt_tokens[idx],
            trace.output_tokens[idx],
            limits,
            replica_hooks_k,
            share,
            progress,
            decode_run,
        )
        req = run.requests
        first[idx], finish[idx], preempted[idx] = req.first, req.finish, req.preempted
        served[idx], rejected[idx] = req.output, req.rejected
        arrival[idx] = req.arrival
        iters += run.iterations
        busy += run.busy_s
        gap_parts.append(run.gaps)
    gaps = DecodeGaps.join(gap_parts)
    done = finish[np.isfinite(finish)]
    makespan = float(done.max() - arrival.min()) if done.size else 0.0
    return SimResult(
        arrival_s=arrival,
        first_token_s=first,
        finish_s=finish,
        prompt_tokens=trace.prompt_tokens,
        output_tokens=served,
        preemptions=preempted,
        iterations=iters,
        busy_s=busy,
        makespan_s=makespan,
        replicas=replicas,
        mean_decode_batch=float(gaps.sequences.sum()) / max(iters, 1),
        decode_area_s=float(np.dot(gaps.gap_s, gaps.sequences)),
        rejected=rejected,
        reused_tokens=gather_reused(counts) if prefix is not None else None,
        spec_tokens_per_step=(counts.spec_tokens / max(counts.spec_steps, 1))
        if speculation is not None
        else None,
        decode_gaps=gaps,
    )
