"""Prefix-caching budget: reusable prefix tokens, LRU hit rate, effective prefill work.

Reuse happens at block granularity: a cached prefix is reusable only in whole blocks of B tokens
(vLLM's block hashes; SGLang RadixAttention, Zheng et al. 2024), and the last prompt token is
always recomputed to produce the first output's logits.  Whether a shared prefix is still cached
when the next request that needs it arrives is an LRU question, answered with the characteristic-
time (Che) approximation (Che, Tung & Wang, IEEE JSAC 2002; Fricker, Robert & Roberts 2012): an
LRU cache of C blocks behaves like a TTL cache with timer T_C solving

    sum_i s_i (1 - exp(-lambda_i T_C)) + r_u T_C = C,

where item i (a shared prefix of s_i blocks) is requested at rate lambda_i and one-shot blocks
(the unique tails of finished requests, which sit in the evictable list but are never hit again)
arrive at r_u blocks/s.  A request's hit probability is 1 - exp(-lambda_i T_C) (Poisson arrivals see
time averages).  Cache space is the KV capacity less what live requests hold.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from ._memory import kv_capacity_tokens
from ._smooth import smooth_floor, smooth_max, smooth_min
from ._specs import System
from ._step import step_total_s
from ._types import Array, ArrayLike

BISECTION_STEPS = 200
"""Halvings of the bracket in ``monotone_root``; 200 halvings of a 60-e-fold log bracket reach
double precision."""

CHE_LOG_TIME_BRACKET = (-20.0, 40.0)
"""Natural-log bracket (seconds) of the Che characteristic time: 2e-9 s to 2e17 s.  At the upper
end every shared prefix is cached (hit rate 1 to double precision)."""

RECOMPUTED_TAIL_TOKENS = 1.0
"""Prompt tokens always recomputed even on a full hit (the last one, whose logits sample the first
output token; vLLM recomputes it)."""


def monotone_root(
    g: Callable[[Array], Array], lo: ArrayLike, hi: ArrayLike, steps: int = BISECTION_STEPS
) -> Array:
    """Root of ``g`` increasing on [lo, hi] by bisection, clipped to the bracket, differentiable.

    The bisection runs under ``stop_gradient``; one Newton step x* - g(x*)/g'(x*) then carries the
    implicit-function-theorem derivative dx*/dtheta = -(dg/dtheta)/(dg/dx) to whatever ``g``
    closes over, while leaving the value unchanged at the root.
    """
    shape = jax.eval_shape(g, jnp.asarray(lo, dtype=float)).shape
    lo = jnp.broadcast_to(jnp.asarray(lo, dtype=float), shape)
    hi = jnp.broadcast_to(jnp.asarray(hi, dtype=float), shape)

    def body(_, bracket):
        a, b = bracket
        mid = 0.5 * (a + b)
        below = jax.lax.stop_gradient(g(mid)) < 0
        return jnp.where(below, mid, a), jnp.where(below, b, mid)

    a, b = jax.lax.fori_loop(0, steps, body, (lo, hi))
    x = jax.lax.stop_gradient(0.5 * (a + b))
    value, slope = jax.jvp(g, (x,), (jnp.ones_like(x),))
    inside = (x > lo) & (x < hi) & (jax.lax.stop_gradient(slope) > 0)
    safe_slope = jnp.where(inside, slope, 1.0)
    return jnp.where(inside, x - (value - jax.lax.stop_gradient(value)) / safe_slope, x)


def reusable_prefix_tokens(
    prompt_tokens: ArrayLike,
    prefix_tokens: ArrayLike,
    block_size_tokens: ArrayLike,
    temperature: float = 0.0,
) -> Array:
    """Prompt tokens a cached prefix saves: min(floor(prefix / B) * B, prompt - 1).

    Args:
        prompt_tokens: prompt length (tokens).
        prefix_tokens: shared prefix length (tokens), <= prompt.
        block_size_tokens: KV block size B (tokens).
        temperature: relaxation of the floor and min (0 = exact).
    """
    whole = smooth_floor(jnp.asarray(prefix_tokens) / block_size_tokens, temperature)
    cap = jnp.maximum(jnp.asarray(prompt_tokens) - RECOMPUTED_TAIL_TOKENS, 0.0)
    return smooth_min(whole * block_size_tokens, cap, temperature)


def che_hit_rate(
    request_rate_per_s: ArrayLike,
    item_blocks: ArrayLike,
    num_items: ArrayLike,
    one_shot_blocks_per_s: ArrayLike,
    cache_blocks: ArrayLike,
) -> Array:
    """LRU hit probability of ``num_items`` equally popular items (Che approximation).

    Args:
        request_rate_per_s: requests per second for each item.
        item_blocks: size of one item (blocks).
        num_items: distinct items.
        one_shot_blocks_per_s: blocks per second entering the cache that are never requested again.
        cache_blocks: LRU capacity C (blocks).

    Returns:
        1 - exp(-rate * T_C), T_C the characteristic time; 0 when the cache is empty.
    """
    rate = jnp.asarray(request_rate_per_s, dtype=float)
    c = jnp.maximum(jnp.asarray(cache_blocks, dtype=float), 0.0)

    def excess(log_t):
        t = jnp.exp(log_t)
        return (
            num_items * item_blocks * -jnp.expm1(-rate * t) + one_shot_blocks_per_s * t - c
        ) / jnp.maximum(c, 1.0)

    log_t = monotone_root(excess, *CHE_LOG_TIME_BRACKET)
    return jnp.where(c > 0, -jnp.expm1(-rate * jnp.exp(log_t)), 0.0)


REUSE_REFERENCE_RATE_PER_S = 1.0
"""Request rate at which a prefix cache's hit rate is judged when the load names none: a
closed loop (its rate is the engine's own, known only once the load model has run) or no load
at all.  A prefix the requests share is re-read every 1/(rate x shared fraction) seconds, and
the LRU keeps it while fewer other tokens than the cache holds enter in between, so at any rate
that reuses it the hit rate of one hot prefix hardly moves."""


def reuse_rate_per_s(workload) -> Array:
    """The request rate a prefix cache sees under ``workload`` (a ``Workload``): its open-loop
    arrival rate, else ``REUSE_REFERENCE_RATE_PER_S`` (a closed loop or no rate)."""
    rate = jnp.asarray(workload.arrival_rate_per_s, dtype=float)
    closed = (jnp.asarray(workload.concurrency) > 0) | ~(rate > 0)
    return jnp.where(closed, REUSE_REFERENCE_RATE_PER_S, rate)


class PrefixReuse(eqx.Module):
    """Prefix-cache effect on one replica (SI units; tokens are per request)."""

    reusable_tokens: Array
    hit_rate: Array
    reused_fraction: Array
    effective_prefill_tokens: Array
    cache_tokens: Array
    prefill_s: Array
    prefill_s_no_reuse: Array
    prefill_speedup: Array


def prefix_reuse(
    system: System,
    *,
    prompt_tokens: ArrayLike,
    output_tokens: ArrayLike,
    shared_fraction: ArrayLike,
    prefix_tokens: ArrayLike,
    arrival_rate_per_s: ArrayLike,
    num_prefixes: ArrayLike = 1.0,
    live_requests: ArrayLike = 0.0,
    temperature: float = 0.0,
) -> PrefixReuse:
    """Hit rate, effective prefill tokens and prefill time with a block-level LRU prefix cache.

    A share ``shared_fraction`` of requests starts with one of ``num_prefixes`` equally popular
    prefixes of ``prefix_tokens``; the rest is unique.  Each replica sees arrival_rate / replicas.
    Cache space = KV capacity - live_requests * (prompt + output / 2) (mean tokens a live request
    holds).  Unique blocks of finished requests stream through the LRU at
    rate * (prompt + output - reused) / B.

    effective_prefill_tokens = prompt - shared_fraction * hit_rate * reusable_tokens, and the
    prefill time is the mixture of a prefill from an empty cache and one that starts from the
    cached prefix (``forward_step`` with ``prefill_context``).
    """
    model, hardware, deployment = system.model, system.hardware, system.deployment
    b = deployment.block_size_tokens
    prompt = jnp.asarray(prompt_tokens, dtype=float)
    f = jnp.asarray(shared_fraction, dtype=float)
    reusable = reusable_prefix_tokens(prompt, prefix_tokens, b, temperature)
    rate = jnp.asarray(arrival_rate_per_s) / deployment.replicas
    held = jnp.asarray(live_requests) * (prompt + jnp.asarray(output_tokens) / 2.0)
    cache_tokens = smooth_max(
        kv_capacity_tokens(model, hardware, deployment) - held, 0.0, temperature
    )
    one_shot = rate * (prompt + output_tokens - f * reusable) / b
    hit = che_hit_rate(
        rate * f / num_prefixes, reusable / b, num_prefixes, one_shot, cache_tokens / b
    )
    hit = jnp.where(reusable > 0, hit, 0.0)
    reused_fraction = f * hit

    cold = step_total_s(system, prefill_tokens=prompt, prefill_seqs=1.0, temperature=temperature)
    warm = step_total_s(
        system,
        prefill_tokens=prompt - reusable,
        prefill_seqs=1.0,
        prefill_context=reusable,
        temperature=temperature,
    )
    mean_prefill = reused_fraction * warm + (1.0 - reused_fraction) * cold
    return PrefixReuse(
        reusable_tokens=reusable,
        hit_rate=hit,
        reused_fraction=reused_fraction,
        effective_prefill_tokens=prompt - reused_fraction * reusable,
        cache_tokens=cache_tokens,
        prefill_s=mean_prefill,
        prefill_s_no_reuse=cold,
        prefill_speedup=cold / mean_prefill,
    )
