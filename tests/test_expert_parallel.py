"""Expert parallelism and attention data parallelism in the one step model and the memory budget.

Hand values from the published configs: Llama-3.1-8B has 32 layers of 4096 x (4096 + 2 * 1024 +
4096) = 41,943,040 attention parameters; DeepSeek-R1 caches one 576-wide MLA latent per token and
layer, which TP replicates on every rank.
"""

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings, strategies as st

from perfmodel import (
    Deployment,
    Efficiency,
    System,
    forward_step,
    kv_bytes_per_sequence,
    kv_bytes_per_token_per_gpu,
    kv_capacity_tokens,
    load_hardware,
    load_model,
    ring_all_reduce_s,
    tp_comm_s,
    weight_bytes_per_gpu,
)
from perfmodel._parallel import group_link_bytes_per_s

H100 = load_hardware("h100-sxm")
H200 = load_hardware("h200-sxm")  # DeepSeek-R1 in FP8 (~671 GB) fits 8 of these, not 8 H100s
EFF = Efficiency()
LLAMA = load_model("meta-llama/Llama-3.1-8B")
R1 = load_model("deepseek-ai/DeepSeek-R1")
LLAMA_ATTENTION_PARAMS = 4096 * (4096 + 2 * 1024 + 4096)


def _dep(tp=8, ep=1, a=1, **kw):
    return Deployment.create(tp=tp, expert_parallel=float(ep), attention_dp=float(a), **kw)


def test_llama_attention_params_match_the_config():
    assert float(LLAMA.attention_params) == LLAMA_ATTENTION_PARAMS


def test_attention_dp_copies_the_attention_weights_into_each_group():
    # tp 2, a 2: each rank holds all attention weights (bf16) instead of half
    extra = weight_bytes_per_gpu(LLAMA, _dep(tp=2, a=2)) - weight_bytes_per_gpu(LLAMA, _dep(tp=2))
    assert float(extra) == pytest.approx(32 * LLAMA_ATTENTION_PARAMS * 2.0 / 2.0, rel=1e-6)


def test_expert_parallel_leaves_each_ranks_weight_share_unchanged():
    assert float(weight_bytes_per_gpu(R1, _dep(ep=8))) == float(weight_bytes_per_gpu(R1, _dep()))


def test_attention_dp_stores_the_mla_latent_once_per_group():
    # TP 8 replicates the latent on all 8 ranks; 8 attention groups keep 1/8 of the sequences each
    tp = kv_bytes_per_token_per_gpu(R1, _dep(weight_dtype="fp8"))
    dp = kv_bytes_per_token_per_gpu(R1, _dep(a=8, weight_dtype="fp8"))
    assert float(tp) == pytest.approx(61 * 576 * 2.0, rel=1e-6)
    assert float(dp) == pytest.approx(float(tp) / 8.0, rel=1e-6)


def test_attention_dp_gives_gqa_no_kv_gain_while_heads_cover_the_ranks():
    # Llama 8 KV heads over TP 8: one head per rank; DP 8: all heads, 1/8 of the sequences
    tp = kv_bytes_per_token_per_gpu(LLAMA, _dep())
    dp = kv_bytes_per_token_per_gpu(LLAMA, _dep(a=8))
    assert float(dp) == pytest.approx(float(tp), rel=1e-6)


def test_mla_capacity_grows_by_the_dp_degree_less_the_weight_copies():
    tp_dep, dp_dep = _dep(weight_dtype="fp8"), _dep(a=8, weight_dtype="fp8")
    free = [
        H200.hbm_bytes * d.gpu_memory_utilization
        - weight_bytes_per_gpu(R1, d)
        - (
            d.max_num_batched_tokens * 8.0 * R1.hidden_size * 2.0 / d.tp + 2.0**30
        )  # workspace: 8 widths per batched token, plus 1 GiB non-torch memory
        for d in (tp_dep, dp_dep)
    ]
    assert float(free[1]) > 0
    ratio = kv_capacity_tokens(R1, H200, dp_dep) / kv_capacity_tokens(R1, H200, tp_dep)
    assert float(ratio) == pytest.approx(8.0 * float(free[1]) / float(free[0]), rel=1e-6)


def test_full_attention_dp_drops_the_attention_all_reduce():
    tokens = 512.0
    tp_only = tp_comm_s(System(LLAMA, H100, _dep(), EFF), tokens)
    dp = tp_comm_s(System(LLAMA, H100, _dep(a=8), EFF), tokens)
    one = ring_all_reduce_s(tokens * 4096 * 2.0, 8.0, group_link_bytes_per_s(H100, 8.0), EFF)
    assert float(tp_only) == pytest.approx(2 * 32 * float(one), rel=1e-6)
    assert float(dp) == pytest.approx(32 * float(one), rel=1e-6)


def test_defaults_are_tp_only():
    kw = {"decode_seqs": 64.0, "decode_context": 2000.0}
    base = forward_step(System(R1, H100, Deployment.create(tp=8, weight_dtype="fp8"), EFF), **kw)
    same = forward_step(System(R1, H100, _dep(ep=1, a=1, weight_dtype="fp8"), EFF), **kw)
    assert float(same.total_s) == float(base.total_s)


def test_mla_decode_reads_one_eighth_of_the_kv_under_attention_dp():
    seqs, ctx = 256.0, 4000.0
    kw = {"decode_seqs": seqs, "decode_context": ctx}
    tp = forward_step(System(R1, H100, _dep(weight_dtype="fp8"), EFF), **kw)
    dp = forward_step(System(R1, H100, _dep(a=8, weight_dtype="fp8"), EFF), **kw)
    bw = H100.hbm_bytes_per_s * EFF.bandwidth_fraction
    kv = seqs * kv_bytes_per_sequence(R1, 2.0, ctx + 1.0)
    copies = 61 * float(R1.attention_params) * 7.0 * 1.0 / 8.0  # fp8 attention copies per rank
    expected = float(tp.memory_s) - float(kv) * (1.0 - 1.0 / 8.0) / float(bw) + copies / float(bw)
    assert float(dp.memory_s) == pytest.approx(expected, rel=1e-6)
    assert float(dp.total_s) < float(tp.total_s)  # long-context decode: KV traffic dominates


def test_expert_parallel_runs_fewer_wider_expert_gemms_no_slower():
    for seqs in (8.0, 64.0, 512.0):
        kw = {"decode_seqs": seqs, "decode_context": 1000.0}
        tp = forward_step(System(R1, H100, _dep(weight_dtype="fp8"), EFF), **kw)
        ep = forward_step(System(R1, H100, _dep(ep=8, weight_dtype="fp8"), EFF), **kw)
        assert float(ep.total_s) <= float(tp.total_s)
        assert float(ep.compute_s) == pytest.approx(float(tp.compute_s), rel=1e-9)
        assert float(ep.memory_s) == pytest.approx(float(tp.memory_s), rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    tp=st.sampled_from([2, 4, 8]),
    ep_share=st.sampled_from([1, 2, 4, 8]),
    a_share=st.sampled_from([1, 2, 4, 8]),
    seqs=st.floats(1.0, 1024.0),
    prompt=st.floats(0.0, 4096.0),
)
def test_flops_per_rank_do_not_depend_on_how_the_group_splits(tp, ep_share, a_share, seqs, prompt):
    ep, a = min(ep_share, tp), min(a_share, tp)
    kw = {
        "decode_seqs": seqs,
        "decode_context": 1500.0,
        "prefill_tokens": prompt,
        "prefill_seqs": 1.0 if prompt > 0 else 0.0,
    }
    base = forward_step(System(R1, H100, _dep(tp=tp, weight_dtype="fp8"), EFF), **kw)
    split = forward_step(System(R1, H100, _dep(tp=tp, ep=ep, a=a, weight_dtype="fp8"), EFF), **kw)
    assert float(split.compute_s) == pytest.approx(float(base.compute_s), rel=1e-6)
    assert jnp.isfinite(split.total_s) and float(split.total_s) > 0


def test_create_rejects_degrees_that_do_not_divide_tp():
    with pytest.raises(ValueError, match="expert_parallel"):
        Deployment.create(tp=4, expert_parallel=3.0)
    with pytest.raises(ValueError, match="attention_dp"):
        Deployment.create(tp=2, attention_dp=4.0)


def test_step_gradient_in_the_degrees_matches_finite_differences():
    def total(ep, a):
        dep = Deployment.create(tp=8, weight_dtype="fp8")
        dep = Deployment(**{**vars(dep), "expert_parallel": ep, "attention_dp": a})
        return forward_step(
            System(R1, H100, dep, EFF), decode_seqs=128.0, decode_context=3000.0
        ).total_s

    x = (jnp.asarray(4.0), jnp.asarray(2.0))
    grads = jax.grad(total, argnums=(0, 1))(*x)
    h = 1e-3
    for i in range(2):
        up = [float(v) for v in x]
        dn = [float(v) for v in x]
        up[i] += h
        dn[i] -= h
        fd = (float(total(*up)) - float(total(*dn))) / (2 * h)
        assert float(grads[i]) == pytest.approx(fd, rel=1e-3, abs=1e-9)


@pytest.mark.parametrize(
    ("tp", "ep", "notes", "expected"),
    [
        # aiconfigurator: tp is the attention's TP, attention_dp_size its groups (num_gpus 16)
        (4.0, 16.0, "moe_ep_size=16; attention_dp_size=4; x=y", (16.0, 16.0, 4.0)),
        (4.0, 4.0, "attention_dp_size=1; attention_dp_note=missing", (4.0, 4.0, 1.0)),
        # InferenceMAX: tp is the stage's ranks; dp_attention=true puts attention on every rank
        (2.0, 2.0, "framework=trt; dp_attention=true; spec_decoding=none", (2.0, 2.0, 2.0)),
        (8.0, 8.0, "framework=sglang; dp_attention=false", (8.0, 8.0, 1.0)),
        # an EP that does not divide the ranks is not a layout an engine runs
        (4.0, 3.0, "", (4.0, 1.0, 1.0)),
        (8.0, float("nan"), "", (8.0, 1.0, 1.0)),
    ],
)
def test_fitting_reads_each_runs_layout(tp, ep, notes, expected):
    import pandas as pd

    from fitting._rows import _moe_parallelism

    assert _moe_parallelism(pd.Series({"ep": ep, "notes": notes}), tp) == expected
