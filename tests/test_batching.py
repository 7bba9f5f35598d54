"""Token-budget batching: mixed iterations, seat capacity, and the budget trade-off."""

import jax
import numpy as np
from hypothesis import given, settings, strategies as st

from perfmodel import Deployment, Efficiency, System, forward_step, load_hardware, load_model
from perfmodel.dynamics import (
    DecodeCost,
    EngineConfig,
    IterationTokens,
    Workload,
    decode_iteration_s,
    decode_iterations_s,
    iteration_s,
    prefill_budget_tokens,
    saturated_output_tokens_per_s,
    seat_capacity,
    serving_metrics,
)

MODEL = load_model("meta-llama/Llama-3.1-8B")
GPU = load_hardware("h100-sxm")
EFF = Efficiency()


def test_iteration_is_forward_step():
    d = Deployment.create(tp=1)
    kw = {
        "prefill_tokens": 700.0,
        "prefill_seqs": 2.0,
        "prefill_context": 100.0,
        "decode_seqs": 30.0,
        "decode_context": 900.0,
    }
    assert float(iteration_s(System(MODEL, GPU, d, EFF), **kw)) == float(
        forward_step(System(MODEL, GPU, d, EFF), **kw).total_s
    )
    assert np.isfinite(
        float(iteration_s(System(MODEL, GPU, d, EFF)))
    )  # empty iteration: overhead, no NaN


@settings(max_examples=5, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 8192.0),
            st.floats(0.0, 16.0),
            st.floats(0.0, 32768.0),
            st.floats(0.0, 512.0),
            st.floats(0.0, 32768.0),
            st.sampled_from([(), (3,), (2, 2)]),
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(["meta-llama/Llama-3.1-8B", "mistralai/Mixtral-8x7B-v0.1"]),
)
def test_iterations_in_one_pass_equal_one_call_each(steps, model_name):
    """``decode_iterations_s`` lays several iterations end to end in one forward pass: each
    time equals its own ``decode_iteration_s`` (the step model is elementwise in its tokens),
    shape included, for scalar and array token counts, dense and MoE."""
    model = load_model(model_name)
    d = Deployment.create(tp=2)
    cost = DecodeCost()
    tokens = []
    for p_tok, p_seq, p_ctx, d_seq, d_ctx, shape in steps:
        grow = np.arange(1.0, 1.0 + np.prod(shape, dtype=int)).reshape(shape)
        tokens.append(
            IterationTokens(
                prefill_tokens=p_tok * grow,
                prefill_seqs=p_seq,
                prefill_context=p_ctx,
                decode_seqs=d_seq,
                decode_context=d_ctx * grow,
            )
        )
    laid = decode_iterations_s(System(model, GPU, d, EFF), cost, tuple(tokens))
    for step, time_s in zip(tokens, laid, strict=True):
        one = decode_iteration_s(System(model, GPU, d, EFF), cost, **vars(step))
        assert time_s.shape == one.shape
        np.testing.assert_allclose(np.asarray(time_s), np.asarray(one), rtol=1e-12)


def test_prefill_budget_left_by_decodes():
    d = Deployment.create(tp=1, max_num_batched_tokens=2048.0)
    assert float(prefill_budget_tokens(d, EngineConfig(), 48.0)) == 2000.0
    assert float(prefill_budget_tokens(d, EngineConfig(chunk_tokens=512.0), 48.0)) == 512.0
    assert float(prefill_budget_tokens(d, EngineConfig(chunked_prefill=False), 48.0)) == 2048.0


def test_seat_capacity_is_the_tightest_limit():
    d = Deployment.create(tp=1, max_num_seqs=64.0)
    assert float(seat_capacity(MODEL, GPU, d, 1000.0)) == 64.0
    d = Deployment.create(tp=1, max_num_seqs=10_000.0, max_num_batched_tokens=100_000.0)
    kv = float(seat_capacity(MODEL, GPU, d, 1000.0))
    assert 100 < kv < 10_000 and kv == np.floor(kv)


def test_lower_max_model_len_raises_static_concurrency():
    seats = [
        float(
            seat_capacity(
                MODEL,
                GPU,
                Deployment.create(tp=1, kv_allocation="static", max_model_len=L, max_num_seqs=1e6),
                500.0,
            )
        )
        for L in (32768.0, 8192.0, 2048.0)
    ]
    assert seats[0] < seats[1] < seats[2]


@jax.jit
def _capacity(budget):
    d = Deployment.create(tp=1, max_num_batched_tokens=budget, max_num_seqs=1024.0)
    return saturated_output_tokens_per_s(System(MODEL, GPU, d, EFF), 1000.0, 200.0)


@settings(max_examples=15, deadline=None)
@given(st.floats(128.0, 2048.0), st.floats(1.1, 2.0))
def test_bigger_budget_raises_throughput(budget, factor):
    # below the point where the KV seats bind (there a bigger budget's workspace costs KV)
    assert float(_capacity(budget * factor)) > float(_capacity(budget))


def test_bigger_budget_worsens_tpot_tail_at_the_same_load():
    # seed behaviour: raising the budget raises capacity but lets bigger prefill chunks ride with
    # the decodes, so p95 TPOT gets worse at a fixed arrival rate
    w = Workload(
        arrival_rate_per_s=4.0,
        prompt_tokens_mean=3000.0,
        prompt_tokens_cv=1.0,
        output_tokens_mean=200.0,
        output_tokens_cv=0.5,
    )
    small, big = (
        serving_metrics(
            System(MODEL, GPU, Deployment.create(tp=1, max_num_batched_tokens=b), EFF), w
        )
        for b in (512.0, 16384.0)
    )
    assert bool(small.stable) and bool(big.stable)
    assert float(big.tpot_s.p95) > float(small.tpot_s.p95)
    cap_small, cap_big = (
        float(
            saturated_output_tokens_per_s(
                System(MODEL, GPU, Deployment.create(tp=1, max_num_batched_tokens=b), EFF),
                3000.0,
                200.0,
            )
        )
        for b in (512.0, 16384.0)
    )
    assert cap_big > cap_small


def test_more_flops_same_bandwidth_barely_helps_decode():
    w = Workload(arrival_rate_per_s=0.5, prompt_tokens_mean=4000.0, output_tokens_mean=500.0)
    d = Deployment.create(tp=1)
    fast = type(GPU)(
        name="h100-2x-flops",
        hbm_bytes=GPU.hbm_bytes,
        hbm_bytes_per_s=GPU.hbm_bytes_per_s,
        dense_flops_per_s=2.0 * GPU.dense_flops_per_s,
        link_bytes_per_s=GPU.link_bytes_per_s,
        gpus_per_node=GPU.gpus_per_node,
        internode_bytes_per_s=GPU.internode_bytes_per_s,
        price_per_gpu_hour=GPU.price_per_gpu_hour,
    )
    base, more = (
        serving_metrics(System(MODEL, GPU, d, EFF), w),
        serving_metrics(System(MODEL, fast, d, EFF), w),
    )
    assert float(more.tpot_s.mean) > 0.95 * float(base.tpot_s.mean)
    assert float(more.ttft_s.mean) < 0.75 * float(
        base.ttft_s.mean
    )  # a 4000-token prefill is compute-bound


def test_saturated_throughput_gradient_finite():
    g = jax.grad(
        lambda b: saturated_output_tokens_per_s(
            System(MODEL, GPU, Deployment.create(tp=1, max_num_batched_tokens=b), EFF),
            1000.0,
            200.0,
            1e-2,
        )
    )(512.0)
    assert np.isfinite(float(g)) and float(g) > 0
