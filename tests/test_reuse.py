"""Prefix caching: block-granular reuse, the Che LRU hit rate against a block-level LRU replay,
and the win with shared system prompts against none with unique prompts."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.test_util import check_grads

from perfmodel import Deployment, Efficiency, System, load_hardware, load_model
from perfmodel._reuse import che_hit_rate, prefix_reuse, reusable_prefix_tokens
from perfmodel.simulator._prefix_cache import (
    MOONCAKE_BLOCK_TOKENS,
    BlockPrefixCache,
    load_mooncake_trace,
    replay_reused_tokens,
    shared_prefix_requests,
)

LLAMA8B = load_model("meta-llama/Llama-3.1-8B")
H100 = load_hardware("h100-sxm")
EFF = Efficiency()


def test_reuse_is_whole_blocks_and_leaves_the_last_token():
    assert float(reusable_prefix_tokens(3000.0, 2000.0, 16.0)) == 2000.0  # 125 whole blocks
    assert float(reusable_prefix_tokens(3000.0, 2000.0, 512.0)) == 1536.0  # 3 * 512
    assert float(reusable_prefix_tokens(1024.0, 1024.0, 16.0)) == 1023.0  # last token recomputed


@given(st.floats(1.0, 1e5), st.floats(0.0, 1.0), st.sampled_from([1, 2, 4, 8]))
@settings(max_examples=30, deadline=None)
def test_a_smaller_block_reuses_at_least_as_much(prompt, share, ratio):
    small, large = 16.0, 16.0 * ratio
    prefix = share * prompt
    assert float(reusable_prefix_tokens(prompt, prefix, small)) >= float(
        reusable_prefix_tokens(prompt, prefix, large)
    )


def test_relaxed_reuse_is_smooth_and_exact_at_zero_temperature():
    check_grads(lambda p: reusable_prefix_tokens(3000.0, p, 16.0, 0.5), (1000.3,), order=1)
    exact = reusable_prefix_tokens(3000.0, 1000.3, 16.0, 0.0)
    assert float(exact) == 992.0


def test_che_without_one_shot_traffic_fills_the_cache_proportionally():
    # N * s * (1 - e^{-lambda T}) = C  =>  hit = C / (N s): 250 / (100 * 10).
    assert float(che_hit_rate(1.0, 10.0, 100.0, 0.0, 250.0)) == pytest.approx(0.25, rel=1e-9)
    assert float(che_hit_rate(1.0, 10.0, 100.0, 0.0, 5000.0)) == pytest.approx(1.0, abs=1e-12)
    assert float(che_hit_rate(1.0, 10.0, 100.0, 50.0, 0.0)) == 0.0


def test_che_gradient_matches_finite_differences():
    f = lambda c, r: che_hit_rate(r, 10.0, 100.0, 50.0, c)
    check_grads(f, (500.0, 1.0), order=1, modes=["rev"], rtol=1e-4)


@pytest.mark.parametrize("capacity_blocks", [300, 1000, 3000])
def test_che_agrees_with_a_block_level_lru_replay(capacity_blocks):
    block, rate, share, n_prefix = 16, 10.0, 0.5, 20
    requests = shared_prefix_requests(
        8000,
        arrival_rate_per_s=rate,
        shared_fraction=share,
        prefix_tokens=320,
        prompt_tokens=400,
        output_tokens=100,
        block_size_tokens=block,
        num_prefixes=n_prefix,
        seed=3,
    )
    reused = replay_reused_tokens(requests, capacity_blocks, block)
    shared = np.array([bool(r.block_hashes) and r.block_hashes[0][0] == "prefix" for r in requests])
    simulated = (reused[shared] > 0).mean()
    closed = che_hit_rate(
        rate * share / n_prefix,
        320 / block,
        n_prefix,
        rate * (400 + 100 - share * 320) / block,
        capacity_blocks,
    )
    assert simulated == pytest.approx(float(closed), abs=0.03)


def test_lru_pins_live_blocks_and_evicts_oldest_released():
    cache = BlockPrefixCache(3)
    cache.acquire(("a", "b"))
    cache.release(("a", "b"))
    cache.acquire(("c",))
    cache.acquire(("d",))  # over capacity: evicts "a", the least recently released
    assert cache.match(("a",)) == 0 and cache.match(("b",)) == 1
    assert cache.acquire(("b", "x")) == 1


def _reuse(shared_fraction, capacity_scale=1.0):
    dep = Deployment.create(gpu_memory_utilization=0.9 * capacity_scale)
    return prefix_reuse(
        System(LLAMA8B, H100, dep, EFF),
        prompt_tokens=3000.0,
        output_tokens=200.0,
        shared_fraction=shared_fraction,
        prefix_tokens=2000.0,
        arrival_rate_per_s=5.0,
    )


def test_shared_system_prompts_win_and_unique_prompts_do_not():
    shared, unique = _reuse(0.9), _reuse(0.0)
    assert float(shared.hit_rate) == pytest.approx(1.0, abs=1e-9)  # 2000 tokens vs ~GBs of cache
    assert float(shared.effective_prefill_tokens) == pytest.approx(3000.0 - 0.9 * 2000.0)
    assert float(shared.prefill_speedup) > 2.0
    assert float(unique.effective_prefill_tokens) == 3000.0
    assert float(unique.prefill_speedup) == 1.0


def test_unique_prompts_reuse_nothing_in_the_replay():
    requests = shared_prefix_requests(
        500,
        arrival_rate_per_s=5.0,
        shared_fraction=0.0,
        prefix_tokens=2000,
        prompt_tokens=3000,
        output_tokens=200,
        block_size_tokens=16,
    )
    assert replay_reused_tokens(requests, 10**6, 16).sum() == 0.0


def test_mooncake_trace_reuse_grows_with_cache_size():
    trace = load_mooncake_trace()[:3000]
    assert len(trace[0].block_hashes) == -(-trace[0].prompt_tokens // MOONCAKE_BLOCK_TOKENS)
    prompt = sum(r.prompt_tokens for r in trace)
    small = replay_reused_tokens(trace, 200, MOONCAKE_BLOCK_TOKENS).sum() / prompt
    large = replay_reused_tokens(trace, 10**7, MOONCAKE_BLOCK_TOKENS).sum() / prompt
    assert 0.0 < small < large < 1.0
    assert large > 0.3  # multi-turn conversations re-send their history


def test_hit_rate_falls_when_live_requests_take_the_cache():
    dep = Deployment.create()
    kw = {
        "prompt_tokens": 3000.0,
        "output_tokens": 200.0,
        "shared_fraction": 0.5,
        "prefix_tokens": 2000.0,
        "arrival_rate_per_s": 50.0,
        "num_prefixes": 200.0,
    }
    idle = prefix_reuse(System(LLAMA8B, H100, dep, EFF), live_requests=0.0, **kw)
    busy = prefix_reuse(System(LLAMA8B, H100, dep, EFF), live_requests=120.0, **kw)
    assert float(busy.cache_tokens) < float(idle.cache_tokens)
    assert float(busy.hit_rate) < float(idle.hit_rate)
    assert float(jnp.asarray(busy.prefill_s)) > float(idle.prefill_s)


def test_simulated_engine_with_prefix_cache_agrees_with_the_closed_form():
    from perfmodel.simulator._prefix_cache import simulate_prefix_cache

    dep = Deployment.create()
    for share in (0.0, 0.9):
        requests = shared_prefix_requests(
            200,
            arrival_rate_per_s=1.0,
            shared_fraction=share,
            prefix_tokens=3000,
            prompt_tokens=4000,
            output_tokens=50,
            block_size_tokens=16,
            seed=2,
        )
        sim, reused = simulate_prefix_cache(
            System(LLAMA8B, H100, dep, EFF), requests, capacity_blocks=10**6
        )
        closed = prefix_reuse(
            System(LLAMA8B, H100, dep, EFF),
            prompt_tokens=4000.0,
            output_tokens=50.0,
            shared_fraction=share,
            prefix_tokens=3000.0,
            arrival_rate_per_s=1.0,
        )
        assert 4000.0 - reused.mean() == pytest.approx(
            float(closed.effective_prefill_tokens), rel=0.03
        )
        # light load: TTFT is the prefill itself (cold or warm), up to a little batching
        assert float(np.median(sim.ttft_s)) == pytest.approx(
            float(closed.prefill_s_no_reuse if share == 0 else closed.prefill_s), rel=0.25
        )
        assert float(np.mean(sim.ttft_s)) == pytest.approx(float(closed.prefill_s), rel=0.15)


def test_prefix_under_load_reduces_to_serving_metrics_without_sharing():
    from perfmodel._features_under_load import prefix_serving_metrics
    from perfmodel.dynamics import Workload, serving_metrics

    dep = Deployment.create()
    w = Workload(arrival_rate_per_s=4.0, prompt_tokens_mean=2000.0, output_tokens_mean=200.0)
    plain = serving_metrics(System(LLAMA8B, H100, dep, EFF), w)
    none = prefix_serving_metrics(
        System(LLAMA8B, H100, dep, EFF), w, shared_fraction=0.0, prefix_tokens=1536.0
    )
    assert float(none.ttft_s.p95) == pytest.approx(float(plain.ttft_s.p95), rel=1e-9)
    assert float(none.tpot_s.p95) == pytest.approx(float(plain.tpot_s.p95), rel=1e-9)
    shared = prefix_serving_metrics(
        System(LLAMA8B, H100, dep, EFF), w, shared_fraction=0.9, prefix_tokens=1536.0
    )
    # 90 % of prefills shrink from 2000 to 464 tokens: TTFT falls, utilisation falls
    assert float(shared.ttft_s.mean) < 0.7 * float(plain.ttft_s.mean)
    assert float(shared.utilization) < float(plain.utilization)
