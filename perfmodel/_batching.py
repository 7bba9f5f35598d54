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

import equinox as eqx
import jax.numpy as jnp
from jax.typing import ArrayLike

from ._memory import max_concurrent_requests
from ._smooth import smooth_min
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec
from ._step import forward_step

Array = jnp.ndarray

class EngineConfig(eqx.Module):
    """Scheduler knobs that are not ``Deployment`` fields.

    Attributes:
        chunked_prefill: split prompts into chunks that share iterations with decodes (static).
        chunk_tokens: largest prefill chunk one sequence gets per iteration (inf = the budget).
    """

    chunked_prefill: bool = eqx.field(static=True, default=True)
    chunk_tokens: Array = eqx.field(converter=jnp.asarray, default=float("inf"))


def iteration_s(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    **step: ArrayLike,
) -> Array:
    """Wall time of one mixed iteration: ``forward_step(..., **step).total_s``.

    ``step`` takes ``forward_step``'s keywords (prefill_tokens, prefill_seqs, prefill_context,
    decode_seqs, decode_context, temperature); an empty iteration costs only the fixed overhead
    (``forward_step`` guards its 0/0).
    """
    return forward_step(model, hardware, deployment, efficiency, **step).total_s


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


def saturated_output_tokens_per_s(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    prompt_tokens: ArrayLike,
    output_tokens: ArrayLike,
    temperature: float = 0.0,
) -> Array:
    """Output tokens/s of one replica when every iteration is full (batch-service view).

    A full chunked iteration carries n_d decodes and B - n_d prefill tokens in the ratio the
    requests need them, n_d / (B - n_d) = O / P, capped by ``seat_capacity``; the engine then
    completes n_d / O requests per iteration time.
    """
    p = jnp.asarray(prompt_tokens)
    o = jnp.asarray(output_tokens)
    b = deployment.max_num_batched_tokens
    seats = seat_capacity(model, hardware, deployment, p + o / 2.0, temperature)
    n_d = smooth_min(b * o / (p + o), seats, temperature)
    n_p = n_d * p / o
    t = iteration_s(
        model, hardware, deployment, efficiency,
        prefill_tokens=n_p, prefill_seqs=jnp.maximum(n_p / p, 1e-9), prefill_context=p / 2.0,
        decode_seqs=n_d, decode_context=p + o / 2.0, temperature=temperature,
    )
    return n_d / t
