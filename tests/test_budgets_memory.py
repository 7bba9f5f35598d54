"""Memory budget: KV anchors from the formulas and published configs, capacity, concurrency."""

import math

import equinox as eqx
import jax.numpy as jnp
import pytest
from hypothesis import given, settings, strategies as st
from jax.test_util import check_grads

import perfmodel as pm

BF16 = pm.DTYPE_BYTES["bf16"]


@pytest.fixture(scope="module")
def h100():
    return pm.load_hardware("h100-sxm")


@pytest.mark.parametrize(
    "model_id, expected",
    [
        ("meta-llama/Llama-2-7b-hf", 2 * 32 * 32 * 128 * 2),  # 524,288
        ("meta-llama/Llama-3.1-70B", 2 * 80 * 8 * 128 * 2),  # 327,680
        ("meta-llama/Llama-3.1-8B", 2 * 32 * 8 * 128 * 2),  # 131,072
        ("deepseek-ai/DeepSeek-V3", 61 * (512 + 64) * 2),  # MLA: 70,272
        ("Qwen/Qwen3.5-397B-A17B", 15 * 2 * 2 * 256 * 2),  # hybrid: 15 full-attention layers
    ],
)
def test_kv_bytes_per_token_anchors(model_id, expected):
    assert float(pm.kv_bytes_per_token(pm.load_model(model_id), BF16)) == expected


def test_kv_bytes_match_catalog_column_for_every_model():
    """models.csv states KV bytes/token (bf16) computed independently from each config."""
    import csv

    with open(pm.data_dir() / "models.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["kv_bytes_per_token_bf16"]]
    assert len(rows) > 30
    for row in rows:
        model = pm.load_model(row["id"])
        assert float(pm.kv_bytes_per_token(model, BF16)) == float(row["kv_bytes_per_token_bf16"]), (
            row["id"]
        )


def test_sliding_window_caps_live_tokens():
    mistral = pm.load_model("mistralai/Mistral-7B-v0.1")  # window 4096 in all 32 layers
    per_token = 2 * 32 * 8 * 128 * 2
    assert float(pm.kv_bytes_per_sequence(mistral, BF16, 2000.0)) == 2000 * per_token
    assert float(pm.kv_bytes_per_sequence(mistral, BF16, 16384.0)) == 4096 * per_token
    gemma = pm.load_model("google/gemma-2-9b-it")  # 21 global + 21 local (4096) layers
    per_layer = 2 * 8 * 256 * 2
    assert float(pm.kv_bytes_per_sequence(gemma, BF16, 8192.0)) == per_layer * (
        21 * 8192 + 21 * 4096
    )


def test_fp8_kv_exactly_doubles_capacity(h100):
    model = pm.load_model("meta-llama/Llama-3.1-70B")
    bf16 = pm.Deployment.create(tp=4, kv_dtype="bf16")
    fp8 = pm.Deployment.create(tp=4, kv_dtype="fp8")
    ratio = pm.kv_capacity_tokens(model, h100, fp8) / pm.kv_capacity_tokens(model, h100, bf16)
    assert float(ratio) == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize(
    "model_id, total_b, active_b",
    [  # published sizes (model cards / papers)
        ("meta-llama/Llama-3.1-8B", 8.03, 8.03),
        ("meta-llama/Llama-2-7b-hf", 6.74, 6.74),
        ("mistralai/Mixtral-8x7B-v0.1", 46.7, 12.9),
        ("deepseek-ai/DeepSeek-V3", 671.0, 37.6),
        ("meta-llama/Llama-3.1-405B", 405.9, 405.9),
    ],
)
def test_weight_bytes_match_published_parameter_counts(model_id, total_b, active_b):
    model = pm.load_model(model_id)
    assert float(pm.weight_bytes(model, BF16)) / 2 / 1e9 == pytest.approx(total_b, rel=2e-3)
    assert float(model.active_params) / 1e9 == pytest.approx(active_b, rel=3e-3)


def test_weights_split_across_tp_and_pp():
    model = pm.load_model("meta-llama/Llama-3.1-70B")
    dep = pm.Deployment.create(tp=4, pp=2, weight_dtype="fp8")
    assert float(pm.weight_bytes_per_gpu(model, dep)) == pytest.approx(
        float(model.total_params) / 8
    )


def test_kv_heads_replicate_beyond_tp_equal_heads(h100):
    """Llama-3.1-8B has 8 KV heads: at TP 16 each rank still holds one head."""
    model = pm.load_model("meta-llama/Llama-3.1-8B")
    per_gpu = lambda tp: float(pm.kv_bytes_per_token_per_gpu(model, pm.Deployment.create(tp=tp)))
    assert per_gpu(8) == per_gpu(1) / 8
    assert per_gpu(16) == per_gpu(8)


def test_static_reservation_wastes_versus_paged(h100):
    model = pm.load_model("meta-llama/Llama-3.1-8B")
    paged = pm.Deployment.create(max_model_len=8192.0, block_size_tokens=16.0)
    static = pm.Deployment.create(max_model_len=8192.0, kv_allocation="static")
    seq = 1000.0
    n_paged = float(pm.max_concurrent_requests(model, h100, paged, seq))
    n_static = float(pm.max_concurrent_requests(model, h100, static, seq))
    free = float(pm.kv_free_bytes_per_gpu(model, h100, paged))
    per_tok = float(pm.kv_bytes_per_token(model, BF16))
    assert n_paged == math.floor(free / (math.ceil(seq / 16) * 16 * per_tok))
    assert n_static == math.floor(free / (8192 * per_tok))
    assert n_paged > 7 * n_static


def test_paged_rounds_up_to_whole_blocks():
    dep = pm.Deployment.create(block_size_tokens=16.0)
    assert float(pm.allocated_tokens_per_sequence(dep, 17.0)) == 32.0
    assert float(pm.allocated_tokens_per_sequence(dep, 32.0)) == 32.0


def test_host_tier_adds_capacity(h100):
    model = pm.load_model("meta-llama/Llama-3.1-8B")
    base = pm.Deployment.create()
    tier = pm.Deployment.create(host_kv_bytes=64 * pm.GiB, host_kv_bytes_per_s=64e9)
    gained = pm.kv_capacity_tokens(model, h100, tier) - pm.kv_capacity_tokens(model, h100, base)
    assert float(gained) == pytest.approx(64 * pm.GiB / 131072)


@settings(max_examples=30, deadline=None)
@given(scale=st.floats(1.0, 8.0))
def test_more_hbm_never_lowers_capacity(scale):
    hw = pm.load_hardware("a100-sxm-80gb")
    model = pm.load_model("meta-llama/Llama-3.1-8B")
    dep = pm.Deployment.create()
    bigger = eqx.tree_at(lambda h: h.hbm_bytes, hw, hw.hbm_bytes * scale)
    assert float(pm.kv_capacity_tokens(model, bigger, dep)) >= float(
        pm.kv_capacity_tokens(model, hw, dep)
    )


@settings(max_examples=20, deadline=None)
@given(log2_tp=st.integers(0, 5), log2_more=st.integers(1, 3))
def test_more_tp_never_raises_per_gpu_weights(log2_tp, log2_more):
    model = pm.load_model("meta-llama/Llama-3.1-405B")
    small = pm.Deployment.create(tp=2**log2_tp)
    large = pm.Deployment.create(tp=2 ** (log2_tp + log2_more))
    assert float(pm.weight_bytes_per_gpu(model, large)) <= float(
        pm.weight_bytes_per_gpu(model, small)
    )


def test_capacity_gradient_matches_finite_difference(h100):
    model = pm.load_model("meta-llama/Llama-3.1-8B")
    dep = pm.Deployment.create()

    def cap(hbm):
        return pm.kv_capacity_tokens(model, eqx.tree_at(lambda h: h.hbm_bytes, h100, hbm), dep)

    check_grads(cap, (jnp.asarray(80.0 * pm.GiB),), order=1, modes=("rev",), eps=1e6)
