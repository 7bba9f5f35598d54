"""Two pools in the simulator: prefill instances, a KV hand-off delay, decode instances.

The prefill pool runs every request with a one-token output (its prefill); the KV then moves for
``kv_transfer_s`` plus the orchestration overhead; the decode pool admits the request with all
but the last prompt token already in KV (the engine recomputes one token, as vLLM's disaggregated
prefill does) and generates the full output.  The user's first token is the decode pool's first
(DistServe, Zhong et al. 2024; Splitwise, Patel et al. 2024), as in ``perfmodel._disagg``.
"""

from __future__ import annotations

import numpy as np

from .._batching import DecodeCost
from .._disagg import DEFAULT_ORCHESTRATION_S, DEFAULT_TRANSFER_LATENCY_S, kv_transfer_s
from .._specs import Deployment, Efficiency, HardwareSpec, ModelSpec, System
from .._traces import Trace
from ._engine import EngineHooks
from ._features import PrefixCaching
from ._records import SimResult
from ._simulate import simulate


def _received_kv(request_id: int, prompt_tokens: int) -> int:
    """Every prompt token arrives with the hand-off (the engine keeps the last to recompute)."""
    return prompt_tokens


def simulate_disaggregated(
    model: ModelSpec,
    efficiency: Efficiency,
    trace: Trace,
    *,
    prefill: tuple[HardwareSpec, Deployment],
    decode: tuple[HardwareSpec, Deployment],
    transfer_bytes_per_s: float | None = None,
    transfer_latency_s: float = DEFAULT_TRANSFER_LATENCY_S,
    orchestration_s: float = DEFAULT_ORCHESTRATION_S,
    seed: int = 0,
    prefix: PrefixCaching | None = None,
    speculation: DecodeCost | None = None,
    decode_efficiency: Efficiency | None = None,
) -> SimResult:
    """Simulate the split system on a timed trace; per-request records as seen by the user.

    ``prefix`` runs the block-level prefix cache in the prefill pool (where prompts are
    computed), ``speculation`` the draft + verification steps in the decode pool;
    ``decode_efficiency`` defaults to ``efficiency`` (pools of different GPUs differ).
    Prompts longer than ``max_model_len`` are rejected by the prefill pool and never handed off.
    """
    hw_p, dep_p = prefill
    hw_d, dep_d = decode
    ones = np.ones_like(trace.output_tokens)
    first = simulate(
        System(model, hw_p, dep_p, efficiency),
        Trace(trace.arrival_s, trace.prompt_tokens, ones, "prefill"),
        seed=seed,
        prefix=prefix,
    )
    bw = float(hw_p.internode_bytes_per_s) if transfer_bytes_per_s is None else transfer_bytes_per_s
    hand_off = np.asarray(
        kv_transfer_s(model, dep_p, trace.prompt_tokens.astype(float), bw, transfer_latency_s)
    )
    ready = first.finish_s + hand_off + orchestration_s
    passed = np.flatnonzero(~first.rejected)
    order = passed[np.argsort(ready[passed], kind="stable")]
    second = simulate(
        System(model, hw_d, dep_d, decode_efficiency or efficiency),
        Trace(ready[order], trace.prompt_tokens[order], trace.output_tokens[order], "decode"),
        seed=seed + 1,
        hooks=EngineHooks(cached_prefix_tokens=_received_kv),
        speculation=speculation,
    )
    n = len(trace)
    first_token, finish = np.full(n, np.nan), np.full(n, np.nan)
    served = np.zeros(n, np.int64)
    preempted = first.preemptions.copy()
    first_token[order], finish[order], served[order] = (
        second.first_token_s,
        second.finish_s,
        second.output_tokens,
    )
    preempted[order] += second.preemptions
    return SimResult(
        arrival_s=np.asarray(trace.arrival_s, dtype=float),
        first_token_s=first_token,
        finish_s=finish,
        prompt_tokens=trace.prompt_tokens,
        output_tokens=served,
        preemptions=preempted,
        iterations=first.iterations + second.iterations,
        busy_s=first.busy_s + second.busy_s,
        makespan_s=float(np.nanmax(second.finish_s) - np.nanmin(trace.arrival_s))
        if len(order)
        else 0.0,
        replicas=first.replicas + second.replicas,
        mean_decode_batch=second.mean_decode_batch,
        decode_area_s=second.decode_area_s,
        rejected=first.rejected,
        reused_tokens=first.reused_tokens,
        spec_tokens_per_step=second.spec_tokens_per_step,
        decode_gaps=second.decode_gaps,  # every token after the first comes from the decode pool
    )
