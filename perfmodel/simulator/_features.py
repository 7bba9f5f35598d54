"""Serving features inside ``simulate``: a block-level prefix cache and sampled speculation.

``PrefixCaching`` carries each request's chain of block identities (the Mooncake trace's
``hash_ids`` at 512 tokens per id, or synthetic shared-prefix chains at the engine's block size);
every replica keeps its own LRU cache (``_prefix_cache.BlockPrefixCache``).  A speculative
``DecodeCost`` (the load model's decode-cost type: k draft tokens, acceptance alpha, a draft model
or MTP heads) swaps the step time for draft + verification
(``_speculative.speculative_step_function``) and samples accepted tokens per sequence per step
(Leviathan et al. 2023).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .._batching import DecodeCost
from ._prefix_cache import BlockPrefixCache, TraceRequest, prefix_cache_hook
from ._speculative import accepted_tokens_sampler


@dataclass(frozen=True)
class PrefixCaching:
    """Block-level LRU prefix cache per replica.

    Attributes:
        block_hashes: per request, the chained identities of its prompt's full blocks.
        hash_block_tokens: tokens per identity (512 for Mooncake; the engine block otherwise).
        capacity_tokens: cache size per replica in tokens (default: the replica's KV capacity).
    """

    block_hashes: Sequence[tuple[Hashable, ...]]
    hash_block_tokens: int
    capacity_tokens: int | None = None


@dataclass
class FeatureCounts:
    """What the feature hooks saw: prompt tokens reused per request, spec tokens and steps."""

    reused_tokens: np.ndarray
    spec_tokens: int = 0
    spec_steps: int = 0
    _local: list = field(default_factory=list)


def synthetic_prefix_hashes(
    prompt_tokens: np.ndarray, shared: np.ndarray, prefix_tokens: int, block_tokens: int
) -> list[tuple]:
    """Chained block identities: a shared request opens with the common prefix's full blocks
    (capped at its own full blocks), every other full block is unique to the request."""
    out = []
    for i, p in enumerate(np.asarray(prompt_tokens)):
        full = int(p) // block_tokens
        head = min(prefix_tokens // block_tokens, full) if shared[i] else 0
        out.append(
            tuple(
                [(PREFIX_TAG, j) for j in range(head)]
                + [("unique", i, j) for j in range(head, full)]
            )
        )
    return out


def shared_prefix_caching(
    prompt_tokens: np.ndarray,
    shared_fraction: float,
    prefix_tokens: int,
    block_tokens: int,
    seed: int,
) -> PrefixCaching:
    """A block-level prefix cache over seeded synthetic requests: a share ``shared_fraction`` of
    them (drawn on ``seed``'s stream) opens with one common prefix of ``prefix_tokens``
    (``synthetic_prefix_hashes``)."""
    shared = np.random.default_rng(seed).random(len(prompt_tokens)) < float(shared_fraction)
    hashes = synthetic_prefix_hashes(prompt_tokens, shared, int(prefix_tokens), block_tokens)
    return PrefixCaching(hashes, block_tokens)


PREFIX_TAG = "prefix"
"""First element of a common-prefix block's identity in ``synthetic_prefix_hashes``."""


def synthetic_prefix_hit_rate(
    prefix: PrefixCaching, prompt_tokens: np.ndarray, reused_tokens: np.ndarray, served: np.ndarray
) -> float:
    """Share of the reusable prompt tokens the cache served, over ``synthetic_prefix_hashes``
    requests: only the common prefix's blocks can hit (unique blocks never recur), so a served
    request can reuse its prefix blocks times the block size, at most its prompt less one token
    (the last prompt token is always computed to give the first output token).  Each request's
    reuse counts up to that bound (``reused_tokens``, 0 where not ``served``); 0 when nothing was
    reusable."""
    block = prefix.hash_block_tokens
    reusable = np.array(
        [
            min(sum(1 for h in hs if h[0] == PREFIX_TAG) * block, p - 1)
            for hs, p in zip(prefix.block_hashes, prompt_tokens)
        ],
        dtype=float,
    )
    reusable[~served] = 0.0
    return (
        float(np.minimum(reused_tokens, reusable).sum() / reusable.sum()) if reusable.sum() else 0.0
    )


def synthetic_shared_requests(prefix: PrefixCaching) -> int:
    """Requests of ``synthetic_prefix_hashes`` chains that open with the common prefix."""
    return int(sum(1 for hs in prefix.block_hashes if hs and hs[0][0] == PREFIX_TAG))


def replica_hooks(
    idx: np.ndarray,
    arrival_s: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    replica: int,
    seed: int,
    engine_capacity_tokens: int,
    counts: FeatureCounts,
    prefix: PrefixCaching | None,
    speculation: DecodeCost | None,
):
    """(cached_prefix_tokens, decode_tokens) hooks for the requests ``idx`` of one replica."""
    cached = decode_tokens = None
    if prefix is not None:
        block = int(prefix.hash_block_tokens)
        cap = (
            prefix.capacity_tokens if prefix.capacity_tokens is not None else engine_capacity_tokens
        )
        local = [
            TraceRequest(
                float(arrival_s[i]), int(prompt[i]), int(output[i]), tuple(prefix.block_hashes[i])
            )
            for i in idx
        ]
        local_reused = np.zeros(idx.size)
        counts._local.append((idx, local_reused))
        cached = prefix_cache_hook(local, BlockPrefixCache(int(cap) // block), block, local_reused)
    if speculation is not None:
        sample = accepted_tokens_sampler(
            int(speculation.draft_tokens), float(speculation.acceptance), seed + 3 + replica
        )

        def decode_tokens(ids):
            e = sample(ids)
            counts.spec_tokens += int(e.sum())
            counts.spec_steps += len(ids)
            return e

    return cached, decode_tokens


def gather_reused(counts: FeatureCounts) -> np.ndarray:
    """Scatter each replica's reuse into ``counts.reused_tokens`` (request order)."""
    for idx, local in counts._local:
        counts.reused_tokens[idx] = local
    return counts.reused_tokens
