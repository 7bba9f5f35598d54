"""Token-budget batching: the mixed iteration of an iteration-level engine and its limits.

An iteration-level engine (Orca, Yu et al. OSDI 2022) runs one forward pass per iteration over the
decode tokens of every running sequence plus prefill tokens of waiting ones, under a token budget
``max_num_batched_tokens`` and a cap ``max_num_seqs`` (vLLM).  With chunked prefill
(Sarathi-Serve, Agrawal et al. OSDI 2024) decodes go first and prompts fill what is left of the
budget in chunks, so a long prompt never stalls decodes for more than one budget's worth of work;
without it a prompt is prefilled whole in a prefill-only iteration and running decodes wait.
Every time here is ``perfmodel._step.forward_step``.
"""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import jax.numpy as jnp

from ._floors import COUNT_FLOOR
from ._memory import max_concurrent_requests
from ._smooth import smooth_min
from ._specs import Deployment, HardwareSpec, ModelSpec, System
from ._speculative import MTP_LAYERS_PER_DRAFT_TOKEN, expected_tokens_per_step
from ._step import step_total_s
from ._types import Array, ArrayLike

SPEC_MAX_DRAFT = 16
"""Largest draft length k the tokens-per-step variance sums over (terms j <= k)."""


class EngineConfig(eqx.Module):
    """Scheduler knobs that are not ``Deployment`` fields.

    Attributes:
        chunked_prefill: split prompts into chunks that share iterations with decodes (static).
        chunk_tokens: largest prefill chunk one sequence gets per iteration (inf = the budget).
    """

    chunked_prefill: bool = eqx.field(static=True, default=True)
    chunk_tokens: Array = eqx.field(converter=jnp.asarray, default=float("inf"))


class DecodeCost(eqx.Module):
    """What one decode iteration costs and emits; the default is plain decoding (one token).

    Attributes:
        cached_prompt_tokens: mean prompt tokens per request already in KV at admission (prefix
            cache hits): not prefilled, but read by every decode and prefill chunk of the request.
            KV seats leave them out (shared blocks are referenced, not copied, as in vLLM).
        draft_tokens: speculative draft length k.
        acceptance: per-token acceptance alpha (i.i.d., Leviathan et al. 2023).
        draft_model: a separate draft model (k decode passes of its own) or None (MTP heads).
        speculative: static; True = each decode iteration drafts k tokens per sequence and
            verifies k + 1 in one target pass (``perfmodel._speculative.speculative_decode``).
    """

    cached_prompt_tokens: Array = eqx.field(converter=jnp.asarray, default=0.0)
    draft_tokens: Array = eqx.field(converter=jnp.asarray, default=0.0)
    acceptance: Array = eqx.field(converter=jnp.asarray, default=0.0)
    draft_model: ModelSpec | None = None
    speculative: bool = eqx.field(static=True, default=False)

    @classmethod
    def speculation(
        cls,
        draft_tokens: ArrayLike,
        acceptance: ArrayLike,
        draft_model: ModelSpec | None = None,
        cached_prompt_tokens: ArrayLike = 0.0,
    ) -> DecodeCost:
        """Speculative decoding: ``draft_tokens`` k drafted per sequence per iteration, each
        accepted with probability alpha = ``acceptance``, by ``draft_model`` (None: the target's
        MTP heads)."""
        return cls(
            cached_prompt_tokens=cached_prompt_tokens,
            draft_tokens=draft_tokens,
            acceptance=acceptance,
            draft_model=draft_model,
            speculative=True,
        )

    def tokens_per_step(self) -> Array:
        """E[T] = (1 - a^(k+1)) / (1 - a) tokens a sequence emits per iteration (1 when plain)."""
        if not self.speculative:
            return jnp.asarray(1.0)
        return expected_tokens_per_step(self.acceptance, self.draft_tokens)

    def tokens_per_step_var(self) -> Array:
        """Var T, T = 1 + min(G, k), G geometric: E[T^2] = sum_{j <= k} (2 j + 1) a^j."""
        if not self.speculative:
            return jnp.asarray(0.0)
        j = jnp.arange(0.0, SPEC_MAX_DRAFT + 1.0)
        a, k = self.acceptance, self.draft_tokens
        second = jnp.sum(jnp.where(j <= k, (2.0 * j + 1.0) * a[..., None] ** j, 0.0), axis=-1)
        return jnp.maximum(second - jnp.square(self.tokens_per_step()), 0.0)


def decode_iteration_s(
    system: System,
    cost: DecodeCost,
    *,
    prefill_tokens: ArrayLike = 0.0,
    prefill_seqs: ArrayLike = 0.0,
    prefill_context: ArrayLike = 0.0,
    decode_seqs: ArrayLike = 0.0,
    decode_context: ArrayLike = 0.0,
    temperature: float = 0.0,
) -> Array:
    """Wall time of one mixed iteration under ``cost``; contexts count served tokens only.

    The cached prefix is added to both contexts.  Speculative (the simulator's iteration):
    draft(n) + one target pass over the prefill chunks and k + 1 tokens per decoding sequence,
    the draft paid when any sequence decodes (weight min(n, 1): a decoding sequence always pays
    it; a prefill-only iteration, n = 0, never does).  Plain: ``iteration_s``.
    """
    model, efficiency = system.model, system.efficiency
    p_ctx = jnp.asarray(prefill_context) + cost.cached_prompt_tokens
    d_ctx = jnp.asarray(decode_context) + cost.cached_prompt_tokens
    n = jnp.asarray(decode_seqs)
    if not cost.speculative:
        return iteration_s(
            system,
            prefill_tokens=prefill_tokens,
            prefill_seqs=prefill_seqs,
            prefill_context=p_ctx,
            decode_seqs=n,
            decode_context=d_ctx,
            temperature=temperature,
        )
    k = cost.draft_tokens
    target_s = step_total_s(system, decode_seqs=n, decode_context=d_ctx, temperature=temperature)
    if cost.draft_model is None:
        busy = target_s - efficiency.step_overhead_s
        draft = k * MTP_LAYERS_PER_DRAFT_TOKEN * busy / model.num_layers
    else:
        draft = k * iteration_s(
            dataclasses.replace(system, model=cost.draft_model),
            decode_seqs=n,
            decode_context=d_ctx,
            temperature=temperature,
        )
    p_seq = jnp.asarray(prefill_seqs)
    seqs = p_seq + n
    ctx = (p_seq * p_ctx + n * d_ctx) / jnp.maximum(seqs, 1.0)
    verify = iteration_s(
        system,
        prefill_tokens=jnp.asarray(prefill_tokens) + n * (k + 1.0),
        prefill_seqs=seqs,
        prefill_context=ctx,
        temperature=temperature,
    )
    return verify + smooth_min(n, 1.0, temperature) * draft


class IterationTokens(eqx.Module):
    """The work of one iteration, ``forward_step``'s token arguments (each elementwise): prefill
    tokens over prefill sequences at their cached context, decoding sequences at theirs."""

    prefill_tokens: ArrayLike = 0.0
    prefill_seqs: ArrayLike = 0.0
    prefill_context: ArrayLike = 0.0
    decode_seqs: ArrayLike = 0.0
    decode_context: ArrayLike = 0.0


def decode_iterations_s(
    system: System,
    cost: DecodeCost,
    steps: tuple[IterationTokens, ...],
    temperature: float = 0.0,
) -> tuple[Array, ...]:
    """``decode_iteration_s`` of each of ``steps``, from one forward pass over all their token
    counts laid end to end.

    The step model is elementwise in its token arguments, so this equals one call per step; one
    pass emits the step model's operations once instead of once per step (the steady state
    prices ~5 independent iterations per gap: tracing, differentiating and compiling the load
    model scale with its operation count)."""
    names = [f.name for f in dataclasses.fields(IterationTokens)]
    columns = [[getattr(step, name) for name in names] for step in steps]
    shapes = [jnp.broadcast_shapes(*(jnp.shape(v) for v in col)) for col in columns]
    dtype = jnp.result_type(*(v for col in columns for v in col))
    laid = [
        jnp.concatenate(
            [
                jnp.broadcast_to(jnp.asarray(col[j], dtype), shape).reshape(-1)
                for col, shape in zip(columns, shapes, strict=True)
            ]
        )
        for j in range(len(names))
    ]
    total = decode_iteration_s(
        system, cost, temperature=temperature, **dict(zip(names, laid, strict=True))
    )
    times, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        times.append(total[start : start + size].reshape(shape))
        start += size
    return tuple(times)


def iteration_s(
    system: System,
    **step: ArrayLike,
) -> Array:
    """Wall time of one mixed iteration: ``forward_step(..., **step).total_s``.

    ``step`` takes ``forward_step``'s keywords (prefill_tokens, prefill_seqs, prefill_context,
    decode_seqs, decode_context, temperature); an empty iteration costs only the fixed overhead
    (``forward_step`` guards its 0/0).
    """
    return step_total_s(system, **step)


def seat_capacity(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    mean_resident_tokens: ArrayLike,
    temperature: float = 0.0,
) -> Array:
    """Sequences that can run at once: min(max_num_seqs, max_num_batched_tokens, KV seats).

    KV seats = ``max_concurrent_requests`` at the mean tokens a running request holds (paged
    blocks or static reservation, ``perfmodel._memory``); each running decode also takes one token
    of the iteration budget.
    """
    kv = max_concurrent_requests(model, hardware, deployment, mean_resident_tokens, temperature)
    caps = smooth_min(deployment.max_num_seqs, deployment.max_num_batched_tokens, temperature)
    return smooth_min(caps, jnp.maximum(kv, 0.0), temperature)


def prefill_budget_tokens(
    deployment: Deployment, config: EngineConfig, decode_seqs: ArrayLike, temperature: float = 0.0
) -> Array:
    """Prefill tokens one iteration can take while ``decode_seqs`` sequences decode.

    Chunked: min(B - n_d, chunk) (decodes first, Sarathi-Serve); at least one token so the
    queue still moves in the limit.  Not chunked: the whole budget B (prefill-only iterations).
    """
    b = deployment.max_num_batched_tokens
    if config.chunked_prefill:
        left = jnp.maximum(b - jnp.asarray(decode_seqs), 1.0)
        return smooth_min(left, jnp.minimum(config.chunk_tokens, b), temperature)
    return jnp.broadcast_to(b, jnp.shape(jnp.asarray(decode_seqs)))


def saturated_batch(
    budget_tokens: ArrayLike,
    prompt_tokens: ArrayLike,
    decode_steps: ArrayLike,
    seats: ArrayLike,
    temperature: float = 0.0,
) -> tuple[Array, Array]:
    """(decodes n_d, prefill tokens n_p) of a full chunked iteration serving requests of
    ``prompt_tokens`` P and ``decode_steps`` s decode iterations each: the budget B splits in the
    ratio the requests need, n_d / n_p = s / P, so n_d = min(B s / (P + s), seats) and
    n_p = n_d P / s (every running request decodes once per iteration; a request completes every
    s of its iterations)."""
    p, steps = jnp.asarray(prompt_tokens), jnp.asarray(decode_steps)
    n_d = smooth_min(jnp.asarray(budget_tokens) * steps / (p + steps), seats, temperature)
    return n_d, n_d * p / steps


def saturated_output_tokens_per_s(
    system: System,
    prompt_tokens: ArrayLike,
    output_tokens: ArrayLike,
    temperature: float = 0.0,
    cost: DecodeCost | None = None,
) -> Array:
    """Output tokens/s of one replica when every iteration is full (batch-service view).

    A full chunked iteration carries n_d decodes and B - n_d prefill tokens in the ratio the
    requests need them, n_d / (B - n_d) = (O / E) / P (E tokens per decode iteration, 1 unless
    speculative), capped by ``seat_capacity``; the engine then completes n_d / (O / E) requests
    per iteration time (``decode_iteration_s`` under ``cost``; ``prompt_tokens`` are the served,
    uncached ones).
    """
    model, hardware, deployment = system.model, system.hardware, system.deployment
    cost = DecodeCost() if cost is None else cost
    p = jnp.asarray(prompt_tokens)
    o = jnp.asarray(output_tokens)
    e = cost.tokens_per_step()
    steps = o / e if cost.speculative else o
    seats = seat_capacity(model, hardware, deployment, p + o / 2.0, temperature)
    n_d, n_p = saturated_batch(deployment.max_num_batched_tokens, p, steps, seats, temperature)
    t = decode_iteration_s(
        system,
        cost,
        prefill_tokens=n_p,
        prefill_seqs=jnp.maximum(n_p / p, COUNT_FLOOR),
        prefill_context=p / 2.0,
        decode_seqs=n_d,
        decode_context=p + o / 2.0,
        temperature=temperature,
    )
    return (n_d * e if cost.speculative else n_d) / t
