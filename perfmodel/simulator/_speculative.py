"""Speculative decoding in the simulator: acceptance sampled per sequence per step.

Each decode iteration drafts k tokens per running sequence and verifies them in one target pass;
draft token i is accepted with probability alpha given all before it were (Leviathan et al.
2023), so a sequence emits 1 + min(G, k) tokens with G ~ Geometric (failures before the first
rejection).  The iteration time is the draft's k passes plus one target pass over k + 1 tokens
per decoding sequence, riding with any prefill chunks, the same costs as
``perfmodel._speculative.speculative_decode``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import numpy as np

from .._batching import DecodeCost
from .._specs import ModelSpec, System
from .._speculative import MTP_LAYERS_PER_DRAFT_TOKEN
from .._step import decode_step, step_total_s
from .._traces import Trace
from ._records import SimResult


def accepted_tokens_sampler(
    draft_tokens: int, acceptance: float, seed: int = 0
) -> Callable[[np.ndarray], np.ndarray]:
    """Hook: tokens each decoding sequence emits in one verification step, 1 + min(G, k)."""
    rng = np.random.default_rng(seed)

    def emit(ids: np.ndarray) -> np.ndarray:
        if acceptance >= 1.0:
            return np.full(len(ids), draft_tokens + 1, np.int64)
        runs = rng.geometric(1.0 - acceptance, len(ids)) - 1  # accepted before the first rejection
        return 1 + np.minimum(runs, draft_tokens)

    return emit


def speculative_step_function(
    system: System,
    draft_tokens: int,
    draft_model: ModelSpec | None = None,
) -> Callable[[float, float, float, float, float], float]:
    """Iteration time with speculation: draft cost + one target pass in which each decoding
    sequence contributes k + 1 tokens (a short prefill at its own context)."""
    model = system.model
    k = float(draft_tokens)

    @jax.jit
    def f(p_tok, p_seq, p_ctx, d_seq, d_ctx):
        target = decode_step(system, d_seq, d_ctx)
        if draft_model is None:
            draft = (
                k
                * MTP_LAYERS_PER_DRAFT_TOKEN
                * (target.total_s - target.overhead_s)
                / model.num_layers
            )
        else:
            draft = (
                k
                * decode_step(dataclasses.replace(system, model=draft_model), d_seq, d_ctx).total_s
            )
        seqs = p_seq + d_seq
        ctx = (p_seq * p_ctx + d_seq * d_ctx) / jax.numpy.maximum(seqs, 1.0)
        verify = step_total_s(
            system, prefill_tokens=p_tok + d_seq * (k + 1.0), prefill_seqs=seqs, prefill_context=ctx
        )
        return verify + jax.numpy.where(d_seq > 0, draft, 0.0)

    def step_s(p_tok, p_seq, p_ctx, d_seq, d_ctx):
        return float(f(p_tok, p_seq, p_ctx, d_seq, d_ctx))

    return step_s


def simulate_speculative(
    system: System,
    trace: Trace,
    *,
    draft_tokens: int,
    acceptance: float,
    draft_model: ModelSpec | None = None,
    concurrency: int = 0,
    seed: int = 0,
) -> SimResult:
    """One replica of the engine with speculative decoding (open loop on the trace's arrivals,
    or closed loop with ``concurrency`` in flight)."""
    from ._simulate import simulate

    return simulate(
        system,
        trace,
        concurrency=concurrency,
        seed=seed,
        speculation=DecodeCost.speculation(draft_tokens, acceptance, draft_model),
    )
