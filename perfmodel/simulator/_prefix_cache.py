"""Block-level LRU prefix cache for the simulator, driven by real or synthetic prefix identities.

Each prompt is a chain of block hashes (vLLM's automatic prefix caching hashes every full block
together with its predecessors; the Mooncake trace ships them as ``hash_ids``, 512 tokens per
block).  A request reuses the longest run of leading blocks that are cached; blocks held by live
requests are pinned, released blocks join an LRU list and are evicted oldest first when the cache
is full (Kwon et al. 2023; Zheng et al. 2024; Qin et al., Mooncake, FAST 2025).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .._catalog import data_dir
from .._specs import System

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry in the Mooncake trace (its README, FAST'25 release)."""

MS = 1e-3
"""Seconds per millisecond (Mooncake timestamps are in ms)."""


class TraceRequest(NamedTuple):
    """One request: arrival time (s), prompt and output lengths (tokens), prompt block hashes."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[Hashable, ...]


class BlockPrefixCache:
    """LRU cache of KV blocks keyed by chained block hashes, with pinning by live requests.

    Args:
        capacity_blocks: blocks the cache may hold (pinned + evictable).
    """

    def __init__(self, capacity_blocks: int):
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks = {capacity_blocks} must be >= 0")
        self.capacity_blocks = int(capacity_blocks)
        self._pins: dict[Hashable, int] = {}
        self._evictable: OrderedDict[Hashable, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pins) + len(self._evictable)

    def match(self, block_hashes: Sequence[Hashable]) -> int:
        """Leading blocks of ``block_hashes`` already cached (no side effects)."""
        hits = 0
        for h in block_hashes:
            if h not in self._pins and h not in self._evictable:
                break
            hits += 1
        return hits

    def acquire(self, block_hashes: Sequence[Hashable]) -> int:
        """Pin a request's blocks (reusing the cached prefix, inserting the rest); returns hits."""
        hits = self.match(block_hashes)
        for h in block_hashes:
            if h in self._evictable:
                del self._evictable[h]
            self._pins[h] = self._pins.get(h, 0) + 1
        self._evict()
        return hits

    def release(self, block_hashes: Sequence[Hashable]) -> None:
        """Unpin a finished request's blocks; unpinned blocks become most-recently used."""
        for h in block_hashes:
            left = self._pins.get(h, 0) - 1
            if left > 0:
                self._pins[h] = left
            elif left == 0:
                del self._pins[h]
                self._evictable[h] = None
        self._evict()

    def _evict(self) -> None:
        excess = len(self._pins) + len(self._evictable) - self.capacity_blocks
        for _ in range(min(max(excess, 0), len(self._evictable))):
            self._evictable.popitem(last=False)


def load_mooncake_trace(path: str | Path | None = None) -> list[TraceRequest]:
    """Requests of the Mooncake conversation trace (``data/traces/mooncake_conversation.jsonl``)."""
    path = Path(path) if path is not None else data_dir() / "traces" / "mooncake_conversation.jsonl"
    out = []
    with open(path) as fh:
        for line in fh:
            row = json.loads(line)
            out.append(
                TraceRequest(
                    row["timestamp"] * MS,
                    int(row["input_length"]),
                    int(row["output_length"]),
                    tuple(row["hash_ids"]),
                )
            )
    return out


def shared_prefix_requests(
    num_requests: int,
    *,
    arrival_rate_per_s: float,
    shared_fraction: float,
    prefix_tokens: int,
    prompt_tokens: int,
    output_tokens: int,
    block_size_tokens: int,
    num_prefixes: int = 1,
    seed: int = 0,
) -> list[TraceRequest]:
    """Synthetic Poisson workload: a share of prompts opens with one of ``num_prefixes`` shared
    system prompts (chosen uniformly), every other block is unique.  Prompts hash only their full
    blocks, as the engine does."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / arrival_rate_per_s, num_requests))
    shared = rng.random(num_requests) < shared_fraction
    which = rng.integers(0, num_prefixes, num_requests)
    full_blocks = prompt_tokens // block_size_tokens
    prefix_blocks = min(prefix_tokens // block_size_tokens, full_blocks)
    out = []
    for i in range(num_requests):
        head = prefix_blocks if shared[i] else 0
        hashes = [("prefix", int(which[i]), j) for j in range(head)]
        hashes += [("unique", i, j) for j in range(head, full_blocks)]
        out.append(TraceRequest(float(times[i]), prompt_tokens, output_tokens, tuple(hashes)))
    return out


def replay_reused_tokens(
    requests: Sequence[TraceRequest], capacity_blocks: int, block_size_tokens: int
) -> np.ndarray:
    """Tokens each request reuses when requests run one after another through an LRU cache
    (no overlap: each releases its blocks before the next arrives), capped at prompt - 1.

    A finished request also leaves the full blocks of its generated tokens in the LRU list
    (``output_block_hashes``); they are never hit again but take space, as in the engine.
    """
    cache = BlockPrefixCache(capacity_blocks)
    reused = np.zeros(len(requests))
    for i, r in enumerate(requests):
        hits = cache.acquire(r.block_hashes)
        reused[i] = min(hits * block_size_tokens, r.prompt_tokens - 1)
        tail = output_block_hashes(i, r, block_size_tokens)
        cache.acquire(tail)
        cache.release(r.block_hashes + tail)
    return reused


def replay_trace_reuse(trace, capacity_tokens: int) -> np.ndarray:
    """``replay_reused_tokens`` for a ``Trace`` with ``block_hashes`` (e.g. Mooncake), the cache
    holding ``capacity_tokens`` (in whole blocks of ``trace.hash_block_tokens``)."""
    block = int(trace.hash_block_tokens)
    reqs = [
        TraceRequest(float(a), int(p), int(o), h)
        for a, p, o, h in zip(
            trace.arrival_s, trace.prompt_tokens, trace.output_tokens, trace.block_hashes
        )
    ]
    return replay_reused_tokens(reqs, int(capacity_tokens) // block, block)


def output_block_hashes(
    request_id: Hashable, request: TraceRequest, block_size_tokens: int
) -> tuple[Hashable, ...]:
    """Unique hashes of the full blocks a request's generated tokens complete."""
    total = (request.prompt_tokens + request.output_tokens) // block_size_tokens
    return tuple(("output", request_id, j) for j in range(len(request.block_hashes), total))


def prefix_cache_hook(
    requests: Sequence[TraceRequest],
    cache: BlockPrefixCache,
    block_size_tokens: int,
    reused: np.ndarray | None = None,
):
    """``EngineHooks.cached_prefix_tokens`` backed by ``cache``: at admission a request reuses
    its longest cached run of leading blocks; its prompt and output blocks then enter the LRU
    list (the cache is a separate budget of blocks beside the live KV).  Writes reuse per request
    into ``reused`` when given."""

    def cached(request_id: int, prompt_tokens: int) -> int:
        r = requests[request_id]
        hits = cache.acquire(r.block_hashes)
        tail = output_block_hashes(request_id, r, block_size_tokens)
        cache.acquire(tail)
        cache.release(r.block_hashes + tail)
        tokens = min(hits * block_size_tokens, prompt_tokens - 1)
        if reused is not None:
            reused[request_id] = tokens
        return tokens

    return cached


def simulate_prefix_cache(
    system: System,
    requests: Sequence[TraceRequest],
    *,
    capacity_blocks: int,
    block_size_tokens: int | None = None,
):
    """The engine with a block-level LRU prefix cache of ``capacity_blocks`` per replica
    (blocks of ``block_size_tokens``, default the deployment's).

    Returns:
        (SimResult, prompt tokens each request reused).
    """
    deployment = system.deployment
    from .._traces import Trace
    from ._features import PrefixCaching
    from ._simulate import simulate

    block = block_size_tokens or round(float(deployment.block_size_tokens))
    trace = Trace(
        [r.arrival_s for r in requests],
        [r.prompt_tokens for r in requests],
        [r.output_tokens for r in requests],
        "prefix",
    )
    result = simulate(
        system,
        trace,
        prefix=PrefixCaching([r.block_hashes for r in requests], block, capacity_blocks * block),
    )
    return result, result.reused_tokens
