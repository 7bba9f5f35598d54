"""Prefix caching and speculative decoding under load: one ``serving_metrics`` solve each, with
the decode iteration priced by a ``DecodeCost`` the steady state itself sees.

Prefix caching (``prefix_serving_metrics``): a request whose shared prefix is cached prefills only
P - R tokens, so the prefill path sees the two-point law {P - R w.p. w, P w.p. 1 - w},
w = shared_fraction x hit_rate (``prefix_reuse``), moment-matched to the workload's lognormal
(mean P - wR, variance of the mixture plus the workload's own).  Shared prefix blocks are
referenced, not copied, so KV seats follow the effective prompt too; every decode iteration and
prefill chunk still reads the KV of the whole context (``DecodeCost.cached_prompt_tokens`` = wR),
so the decode batch, TPOT and the utilisation see the full-context KV reads.

Speculative decoding (``speculative_serving_metrics``): each decode iteration drafts k tokens per
sequence and verifies k + 1 in one target pass with the prefill chunks riding in it, and emits
E = (1 - a^(k+1)) / (1 - a) tokens per sequence (Leviathan et al. 2023), so a request decodes
for (O - 1) / E iterations; TPOT per token is the iteration gap / E with the renewal-CLT spread
of the accepted tokens (``_serving_tail.open_loop``).  TTFT carries the verification through the
prefill iteration's own cost and the residual of the running one.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from ._batching import DecodeCost
from ._reuse import prefix_reuse, reuse_rate_per_s
from ._serving_tail import Percentiles
from ._specs import ModelSpec, System
from ._types import Array, ArrayLike


class LoadedFeature(eqx.Module):
    """TTFT, TPOT and ITL percentiles, utilisation, stability, decode batch (one replica)."""

    ttft_s: Percentiles
    tpot_s: Percentiles
    itl_s: Percentiles
    utilization: Array
    stable: Array
    decode_batch: Array
    tokens_per_step: Array


def _loaded(m, tokens_per_step):
    return LoadedFeature(
        ttft_s=m.ttft_s,
        tpot_s=m.tpot_s,
        itl_s=m.itl_s,
        utilization=m.utilization,
        stable=m.stable,
        decode_batch=m.decode_batch,
        tokens_per_step=jnp.asarray(tokens_per_step),
    )


def prefix_serving_metrics(
    system: System,
    workload,
    *,
    shared_fraction: ArrayLike,
    prefix_tokens: ArrayLike,
    chunked_prefill: bool = True,
) -> LoadedFeature:
    """Percentiles with a prefix cache (see module docstring); ``workload`` is a ``Workload``."""
    from ._serving import serving_metrics  # the dynamics layer, imported where used

    served, cost = prefix_workload(
        system, workload, shared_fraction=shared_fraction, prefix_tokens=prefix_tokens
    )
    m = serving_metrics(system, served, chunked_prefill=chunked_prefill, decode_cost=cost)
    return _loaded(m, 1.0)


def prefix_workload(
    system: System,
    workload,
    *,
    shared_fraction: ArrayLike,
    prefix_tokens: ArrayLike,
):
    """(the ``Workload`` the prefill path serves, the ``DecodeCost`` of the cached prefix) under a
    prefix cache (module docstring): prompts of mean P - wR with the two-point law's variance
    added, w = shared_fraction x hit_rate (``prefix_reuse``: the LRU hit rate of this
    deployment's cache at this load, ``reuse_rate_per_s``: a closed loop's at the reference rate),
    every iteration still reading wR cached tokens of KV."""
    p = workload.prompt_tokens_mean
    reuse = prefix_reuse(
        system,
        prompt_tokens=p,
        output_tokens=workload.output_tokens_mean,
        shared_fraction=shared_fraction,
        prefix_tokens=prefix_tokens,
        arrival_rate_per_s=reuse_rate_per_s(workload),
    )
    w, r = reuse.reused_fraction, reuse.reusable_tokens
    mean = p - w * r
    var = jnp.square(workload.prompt_tokens_cv * p) + w * (1.0 - w) * jnp.square(r)
    served = eqx.tree_at(
        lambda x: (x.prompt_tokens_mean, x.prompt_tokens_cv),
        workload,
        (jnp.asarray(mean, dtype=float), jnp.sqrt(var) / mean),
    )
    return served, DecodeCost(cached_prompt_tokens=w * r)


def speculative_serving_metrics(
    system: System,
    workload,
    *,
    draft_tokens: ArrayLike,
    acceptance: ArrayLike,
    draft_model: ModelSpec | None = None,
    chunked_prefill: bool = True,
    chunk_tokens: ArrayLike | None = None,
) -> LoadedFeature:
    """Percentiles with speculative decoding (see module docstring); ``chunk_tokens``: the
    per-sequence prefill chunk (None: the token budget)."""
    from ._serving import serving_metrics

    cost = DecodeCost.speculation(
        jnp.asarray(draft_tokens, dtype=float), jnp.asarray(acceptance, dtype=float), draft_model
    )
    m = serving_metrics(
        system,
        workload,
        chunked_prefill=chunked_prefill,
        chunk_tokens=chunk_tokens,
        decode_cost=cost,
    )
    return _loaded(m, cost.tokens_per_step())
