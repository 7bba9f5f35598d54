"""Compute, bandwidth and communication budgets: anchors, gradients, properties, vmap."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.test_util import check_grads

import perfmodel as pm
from perfmodel import System
from perfmodel._smooth import smooth_ceil, smooth_max, smooth_min

EXACT = pm.Efficiency(
    compute_fraction_max=1.0,
    compute_half_tokens=0.0,
    bandwidth_fraction=1.0,
    step_overhead_s=0.0,
    collective_latency_s=0.0,
    collective_bandwidth_fraction=1.0,
    launch_overhead_s=0.0,
    elementwise_bandwidth_fraction=1.0,
    attention_compute_fraction_max=1.0,
    attention_half_tokens=0.0,
    gemm_half_width=0.0,
    low_precision_compute_ratio=1.0,
    attention_overhead_s=0.0,
)
"""Ideal efficiencies: every kernel reduces to its pure datasheet roofline, checkable by hand."""


def _elementwise_bytes(model, tokens):
    """Bytes one layer's two fused residual-add + RMSNorm kernels (2 x 4d: x and the residual in,
    both out), rope (2 (H + H_kv) D) and gated activation (3 x FFN width) read and write per token,
    bf16 (the per-operator step's kernels)."""
    d, h, kv, hd = (
        float(getattr(model, f)) for f in ("hidden_size", "num_heads", "num_kv_heads", "head_dim")
    )
    ffn = float(model.dense_mlp_params) / d
    per_token = (2 * 4 * d + 2 * (h + kv) * hd + ffn) * 2.0
    return float(model.num_layers) * tokens * per_token + tokens * 2 * d * 2.0


@pytest.fixture(scope="module")
def h100():
    return pm.load_hardware("h100-sxm")


@pytest.fixture(scope="module")
def llama8b():
    return pm.load_model("meta-llama/Llama-3.1-8B")


def test_decode_batch1_is_weight_read_time(h100, llama8b):
    """Batch-1 decode at tiny context: weights / HBM bandwidth (Pope et al. 2022)."""
    dep = pm.Deployment.create()
    step = pm.decode_step(System(llama8b, h100, dep, EXACT), 1.0, 0.0)
    weights = float(llama8b.total_params) * 2
    kv = 131072 * 1.0  # the token's own KV
    assert float(step.memory_s) == pytest.approx((weights + kv) / 3.35e12, rel=1e-9)
    # the kernels stream every weight once except the embedding table, of which one row is
    # gathered; activations add ~0.1 %
    streamed = weights - float(llama8b.embedding_params) * 2
    assert float(step.total_s) == pytest.approx(streamed / 3.35e12, rel=2e-3)
    assert float(step.total_s) > streamed / 3.35e12


def test_prefill_flops_match_kaplan(h100, llama8b):
    """Long prefill is compute-bound: (2 N_body s + 2 N_head + attention) / peak."""
    dep = pm.Deployment.create()
    s = 4096.0
    n_body = float(llama8b.active_params - llama8b.embedding_params - llama8b.lm_head_params)
    attn = 2 * 32 * 128 * 2 * 32 * (s * (s + 1) / 2)  # 2 * heads * (d_qk + d_v) per pair, 32 layers
    flops = 2 * n_body * s + 2 * float(llama8b.lm_head_params) + attn
    step = pm.prefill_step(System(llama8b, h100, dep, EXACT), s)
    assert float(step.compute_s) == pytest.approx(flops / 989e12, rel=1e-9)
    # the GEMMs and attention are compute-bound; the elementwise kernels stream their bytes
    # (2 fused add + norms, rope, activation per layer; the embedding gather) at the HBM peak;
    # norms (2 x hidden per layer, one final) are the only body parameters outside the GEMMs
    norms = float(llama8b.num_layers) * 2 * 4096 + 4096
    # the LM head runs on the one sampled row: it streams its weights instead of computing
    head = float(llama8b.lm_head_params)
    gemm_s = (flops - 2 * norms * s - 2 * head) / 989e12 + head * 2 / 3.35e12
    assert float(step.total_s) == pytest.approx(
        gemm_s + _elementwise_bytes(llama8b, s) / 3.35e12, rel=2e-3
    )


def test_fp8_weights_use_fp8_peak(h100, llama8b):
    bf16 = pm.prefill_step(System(llama8b, h100, pm.Deployment.create(), EXACT), 4096.0)
    fp8 = pm.prefill_step(
        System(llama8b, h100, pm.Deployment.create(weight_dtype="fp8"), EXACT), 4096.0
    )
    assert float(bf16.compute_s / fp8.compute_s) == pytest.approx(1979 / 989, rel=1e-3)


def test_a100_fp8_falls_back_to_bf16_rate(llama8b):
    a100 = pm.load_hardware("a100-sxm-80gb")
    assert float(pm.peak_flops_per_s(a100, pm.Deployment.create(weight_dtype="fp8"))) == 312e12


def test_compute_fraction_rises_with_tokens():
    eff = pm.Efficiency()
    small, large = pm.compute_fraction(eff, 8.0), pm.compute_fraction(eff, 8192.0)
    assert float(small) < 0.2 * float(eff.compute_fraction_max) < float(large)
    assert float(pm.compute_fraction(eff, eff.compute_half_tokens)) == pytest.approx(
        float(eff.compute_fraction_max) / 2
    )


def test_ring_all_reduce_anchor():
    """2(p-1)/p * n / bw + 2(p-1) alpha (Patarasuk & Yuan 2009)."""
    eff = pm.Efficiency(collective_latency_s=5e-6, collective_bandwidth_fraction=1.0)
    t = pm.ring_all_reduce_s(1e9, 8.0, 450e9, eff)
    assert float(t) == pytest.approx(2 * 7 / 8 * 1e9 / 450e9 + 14 * 5e-6, rel=1e-12)
    assert float(pm.ring_all_reduce_s(1e9, 1.0, 450e9, eff)) == 0.0


def test_tp_comm_two_all_reduces_per_layer(h100, llama8b):
    dep = pm.Deployment.create(tp=4)
    eff = pm.Efficiency(collective_bandwidth_fraction=1.0, collective_latency_s=0.0)
    t = pm.tp_comm_s(System(llama8b, h100, dep, eff), 1024.0)
    message = 1024 * 4096 * 2
    assert float(t) == pytest.approx(2 * 32 * 2 * 3 / 4 * message / 450e9, rel=1e-12)


def test_tp_beyond_a_node_uses_the_network(h100, llama8b):
    eff = pm.Efficiency()
    in_node = pm.tp_comm_s(System(llama8b, h100, pm.Deployment.create(tp=8), eff), 4096.0)
    cross = pm.tp_comm_s(System(llama8b, h100, pm.Deployment.create(tp=16), eff), 4096.0)
    assert float(cross) > 5 * float(in_node)


@pytest.mark.parametrize(
    "p, m, bubble", [(1, 1, 0.0), (4, 4, 3 / 7), (4, 16, 3 / 19), (8, 1, 7 / 8)]
)
def test_pp_bubble_gpipe(p, m, bubble):
    assert float(pm.pp_bubble_fraction(float(p), float(m))) == pytest.approx(bubble)


def test_moe_decode_reads_only_routed_experts(h100):
    mixtral = pm.load_model("mistralai/Mixtral-8x7B-v0.1")
    assert float(pm.expected_experts_touched(mixtral, 1.0)) == pytest.approx(2.0)
    assert float(pm.expected_experts_touched(mixtral, 512.0)) == pytest.approx(8.0)
    dep = pm.Deployment.create(tp=2)
    b1 = pm.decode_step(System(mixtral, h100, dep, EXACT), 1.0, 0.0)
    active_bytes = float(mixtral.active_params) * 2 / 2
    assert float(b1.memory_s) == pytest.approx(active_bytes / 3.35e12, rel=0.01)


def test_smooth_relaxations_exact_at_zero_temperature():
    a, b = jnp.asarray([1.0, 5.0, 1e-6]), jnp.asarray([2.0, 3.0, 2e-6])
    assert np.array_equal(smooth_max(a, b, 0.0), jnp.maximum(a, b))
    assert np.array_equal(smooth_min(a, b, 0.0), jnp.minimum(a, b))
    assert np.array_equal(smooth_ceil(jnp.asarray([0.2, 3.0]), 0.0), jnp.asarray([1.0, 3.0]))
    close = smooth_max(a, b, 0.01)
    assert np.allclose(close, jnp.maximum(a, b), rtol=0.01)
    assert np.all(close >= jnp.maximum(a, b))


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(1.0, 4.0), batch=st.floats(1.0, 512.0), context=st.floats(0.0, 32768.0))
def test_more_bandwidth_never_slows_decode(scale, batch, context):
    hw = pm.load_hardware("h100-sxm")
    model = pm.load_model("meta-llama/Llama-3.1-8B")
    dep, eff = pm.Deployment.create(), pm.Efficiency()
    faster = eqx.tree_at(lambda h: h.hbm_bytes_per_s, hw, hw.hbm_bytes_per_s * scale)
    base = pm.decode_step(System(model, hw, dep, eff), batch, context).total_s
    assert float(pm.decode_step(System(model, faster, dep, eff), batch, context).total_s) <= float(
        base
    ) * (1 + 1e-12)


def test_step_gradients_match_finite_differences(h100, llama8b):
    dep = pm.Deployment.create(tp=2)

    def decode(bw_frac, flops_frac, overhead, batch):
        eff = pm.Efficiency(
            compute_fraction_max=flops_frac, bandwidth_fraction=bw_frac, step_overhead_s=overhead
        )
        return pm.decode_step(System(llama8b, h100, dep, eff), batch, 2048.0).total_s

    def prefill(bw_frac, flops_frac, length):
        eff = pm.Efficiency(compute_fraction_max=flops_frac, bandwidth_fraction=bw_frac)
        return pm.prefill_step(System(llama8b, h100, dep, eff), length).total_s

    check_grads(decode, (0.8, 0.7, 1e-3, 64.0), order=1, modes=("rev",), eps=1e-4)
    check_grads(prefill, (0.8, 0.7, 3000.0), order=1, modes=("rev",), eps=1e-3)


def test_vmap_over_configurations_equals_loop(h100, llama8b):
    eff = pm.Efficiency()
    tps = jnp.asarray([1.0, 2.0, 4.0, 8.0])
    kv_bytes = jnp.asarray([2.0, 1.0, 2.0, 0.5])
    deps = jax.vmap(lambda t, k: pm.Deployment(tp=t, kv_bytes_per_elem=k))(tps, kv_bytes)
    sheet = jax.vmap(lambda d: pm.budget_sheet(System(llama8b, h100, d, eff), 2000.0, 200.0))(deps)
    for i in range(4):
        one = pm.budget_sheet(
            System(llama8b, h100, pm.Deployment(tp=tps[i], kv_bytes_per_elem=kv_bytes[i]), eff),
            2000.0,
            200.0,
        )
        for field in (
            "kv_capacity_tokens",
            "prefill_s",
            "decode_tokens_per_s_max",
            "binding_budget",
        ):
            assert float(getattr(sheet, field)[i]) == pytest.approx(
                float(getattr(one, field)), rel=1e-12
            )


def test_elasticities_name_the_bottleneck(h100):
    """Batch-1-like decode of a big model is bandwidth-bound: elasticity ~1 to HBM bandwidth,
    ~0 to peak FLOP/s; a KV-limited batch responds to HBM capacity."""
    model = pm.load_model("meta-llama/Llama-3.1-70B")
    dep = pm.Deployment.create(tp=2, max_num_seqs=1024.0)
    el = pm.decode_elasticities(System(model, h100, dep, pm.Efficiency()), 8000.0, 1000.0)
    flops, bw, hbm, _link = (float(x) for x in el)
    assert abs(flops) < 0.05
    assert bw > 0.5
    assert hbm > 0.5  # more HBM -> larger batch -> more tokens/s
    sheet = pm.budget_sheet(System(model, h100, dep, pm.Efficiency()), 8000.0, 1000.0)
    assert pm.BINDING_BUDGETS[int(sheet.binding_budget)] == "memory_capacity"


def test_long_prefill_binding_is_compute(h100, llama8b):
    """A one-sequence, 8k-prompt prefill is compute-bound on any datacenter GPU."""
    step = pm.prefill_step(System(llama8b, h100, pm.Deployment.create(), pm.Efficiency()), 8192.0)
    assert float(step.compute_s) > 3 * float(step.memory_s)


def test_empty_iteration_costs_only_overhead(h100, llama8b):
    step = pm.forward_step(System(llama8b, h100, pm.Deployment.create(), pm.Efficiency()))
    assert float(step.compute_s) == 0.0
    assert float(step.total_s) == pytest.approx(
        float(pm.Efficiency().step_overhead_s) + float(step.memory_s)
    )
    grad = jax.grad(
        lambda n: (
            pm.forward_step(
                System(llama8b, h100, pm.Deployment.create(), pm.Efficiency()), decode_seqs=n
            ).total_s
        )
    )(0.0)
    assert np.isfinite(float(grad))


@pytest.mark.parametrize(
    ("model_id", "tp", "pp"),
    [("meta-llama/Llama-3.1-8B", 1, 1), ("mistralai/Mixtral-8x7B-v0.1", 4, 2)],
)
def test_step_total_is_the_forward_steps_total(h100, model_id, tp, pp):
    """``step_total_s`` (the load model's iteration time, without the rooflines reported beside
    it) is ``forward_step(...).total_s``, from an empty iteration to a mixed one, pipelined."""
    model = pm.load_model(model_id)
    d = pm.Deployment.create(tp=tp, pp=pp)
    tokens = {
        "prefill_tokens": jnp.array([0.0, 0.0, 512.0, 3000.0]),
        "prefill_seqs": jnp.array([0.0, 0.0, 1.0, 3.0]),
        "prefill_context": jnp.array([0.0, 0.0, 0.0, 4096.0]),
        "decode_seqs": jnp.array([0.0, 64.0, 0.0, 17.0]),
        "decode_context": jnp.array([0.0, 1500.0, 0.0, 2200.0]),
    }
    whole = pm.forward_step(System(model, h100, d, pm.Efficiency()), **tokens).total_s
    total = pm.step_total_s(System(model, h100, d, pm.Efficiency()), **tokens)
    np.testing.assert_array_equal(np.asarray(total), np.asarray(whole))
