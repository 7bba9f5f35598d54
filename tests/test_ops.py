"""Operator roofline (perfmodel._ops) against hand-computed anchors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import perfmodel
from perfmodel._ops import (
    KernelEfficiency,
    attention_tile_flops,
    attention_time_s,
    collective_time_s,
    elementwise_time_s,
    gemm_time_s,
    one_pass_collective_s,
    prefill_attention_flops,
)
from perfmodel._parallel import point_to_point_s, ring_all_reduce_s

H100 = perfmodel.load_hardware("h100-sxm")
PEAK = float(H100.dense_flops_per_s[0])
BW = float(H100.hbm_bytes_per_s)
NO_RAMP = perfmodel.Efficiency(
    compute_fraction_max=0.75, compute_half_tokens=0.0, bandwidth_fraction=0.8
)
IDEAL_KERNEL = KernelEfficiency(launch_overhead_s=0.0, gemm_half_width=0.0)


def test_gemm_4096_cubed_bf16_h100_is_compute_bound_anchor():
    t = gemm_time_s(4096, 4096, 4096, 2.0, PEAK, BW, NO_RAMP, IDEAL_KERNEL)
    assert PEAK == 989e12
    assert float(t) == pytest.approx(2 * 4096**3 / (0.75 * 989e12), rel=1e-12)  # 185.3 us


def test_gemm_efficiency_curve_and_launch_cost_slow_it_down():
    eff = perfmodel.Efficiency(compute_fraction_max=0.75, compute_half_tokens=64.0)
    ker = KernelEfficiency(launch_overhead_s=5e-6, gemm_half_width=64.0)
    t = gemm_time_s(4096, 4096, 4096, 2.0, PEAK, BW, eff, ker)
    eta = 0.75 * 4096 / (4096 + 64) * (4096 / (4096 + 64)) ** 2
    assert float(t) == pytest.approx(2 * 4096**3 / (eta * PEAK) + 5e-6, rel=1e-12)


def test_gemm_single_token_is_weight_read_bound():
    n, k = 22016, 4096  # Llama-2-7B gate+up projection
    t = gemm_time_s(1, n, k, 2.0, PEAK, BW, NO_RAMP, IDEAL_KERNEL)
    moved = (k + n * k) * 2.0 + n * 2.0
    assert float(t) == pytest.approx(moved / (0.8 * BW), rel=1e-12)


def test_grouped_gemm_fills_the_sms_with_all_its_groups_rows():
    """64 experts x 2 rows each, one launch: the compute fraction is that of 128 rows,
    eta = 0.75 * 128 / (128 + 64) (not of 2 rows: 0.75 * 2 / 66, 22 x slower)."""
    eff = perfmodel.Efficiency(compute_fraction_max=0.75, compute_half_tokens=64.0)
    huge_bw = 1e30
    t = gemm_time_s(2, 4096, 4096, 2.0, PEAK, huge_bw, eff, IDEAL_KERNEL, groups=64.0)
    eta = 0.75 * 128 / (128 + 64)
    assert float(t) == pytest.approx(64 * 2 * 2 * 4096**2 / (eta * PEAK), rel=1e-12)
    single = gemm_time_s(2, 4096, 4096, 2.0, PEAK, huge_bw, eff, IDEAL_KERNEL)
    assert float(single) == pytest.approx(2 * 2 * 4096**2 / (0.75 * 2 / 66 * PEAK), rel=1e-12)


def test_fp8_gemm_uses_low_precision_ratio():
    ker = KernelEfficiency(
        launch_overhead_s=0.0, gemm_half_width=0.0, low_precision_compute_ratio=0.5
    )
    fp8_peak = float(H100.dense_flops_per_s[1])
    t = gemm_time_s(8192, 8192, 8192, 1.0, fp8_peak, BW, NO_RAMP, ker, low_precision=1.0)
    assert float(t) == pytest.approx(2 * 8192**3 / (0.75 * 0.5 * fp8_peak), rel=1e-12)


def test_elementwise_is_bandwidth_bound():
    ker = KernelEfficiency(launch_overhead_s=3e-6, elementwise_bandwidth_fraction=0.5)
    assert float(elementwise_time_s(1e9, BW, ker)) == pytest.approx(1e9 / (0.5 * BW) + 3e-6)


def test_elementwise_launch_overlap_hides_the_launch_under_the_stream():
    """s + L - o * min(s, L): a 2 us stream under a 4 us launch at o = 0.75 takes 2 + 4 - 1.5
    = 4.5 us; a 40 us stream takes 40 + 4 - 3 = 41 us; o = 1 is max(s, L), o = 0 (default) the sum."""
    stream_2us = 2e-6 * 0.5 * BW
    ker = KernelEfficiency(
        launch_overhead_s=4e-6, elementwise_bandwidth_fraction=0.5, elementwise_launch_overlap=0.75
    )
    assert float(elementwise_time_s(stream_2us, BW, ker)) == pytest.approx(4.5e-6, rel=1e-12)
    assert float(elementwise_time_s(20 * stream_2us, BW, ker)) == pytest.approx(41e-6, rel=1e-12)
    full = KernelEfficiency(
        launch_overhead_s=4e-6, elementwise_bandwidth_fraction=0.5, elementwise_launch_overlap=1.0
    )
    assert float(elementwise_time_s(stream_2us, BW, full)) == pytest.approx(4e-6, rel=1e-12)
    none = KernelEfficiency(launch_overhead_s=4e-6, elementwise_bandwidth_fraction=0.5)
    assert float(elementwise_time_s(stream_2us, BW, none)) == pytest.approx(6e-6, rel=1e-12)


def test_prefill_attention_longest_tile_adds_in_series():
    """One sequence x one head of 4096 tokens, head dim 128: the last query tile (128 rows x 4096
    keys x 512 FLOP) = 268 MFLOP at 1/64 of the peak x eta is added to the spread-out work (Graham's
    bound); 64 heads spread 64x the work over the same one-tile tail."""
    s, d = 4096, 128
    tile = float(attention_tile_flops(s, s, d))
    assert tile == 128 * 4096 * 2 * 2 * 128
    assert float(attention_tile_flops(s, 16, d)) == 16 * 4096 * 2 * 2 * 128  # short: 16 rows
    ker = KernelEfficiency(launch_overhead_s=0.0, attention_half_tokens=0.0)
    tail = KernelEfficiency(
        launch_overhead_s=0.0, attention_half_tokens=0.0, attention_tile_share=1.0 / 64
    )
    eta = 0.6 * PEAK  # attention_compute_fraction_max default, no ramp
    for heads in (1, 64):
        flops = float(prefill_attention_flops(1, s, heads, d))
        args = (flops, 0.0, s, PEAK, BW, NO_RAMP)
        assert float(attention_time_s(*args, ker, 0.0, 0.0, tile)) == pytest.approx(flops / eta)
        t = attention_time_s(*args, tail, 0.0, 0.0, tile)
        assert float(t) == pytest.approx((flops + 64 * tile) / eta, rel=1e-12)
    # one head: the tail (64 tiles = 8192 x 4096 pairs) is ~4x its causal work (4096 * 4097 / 2
    # pairs); at 64 heads it is 1/16 of it
    assert 64 * tile / float(prefill_attention_flops(1, s, 1, d)) == pytest.approx(4.0, rel=1e-3)


def test_causal_prefill_flops_and_window():
    # 1 sequence of 4 tokens: 10 causal pairs x 2 matmuls x 2 FLOPs x heads x head_dim
    assert float(prefill_attention_flops(1, 4, 8, 64)) == 10 * 2 * 2 * 8 * 64
    # window 1: each token attends to ~1 position
    assert float(prefill_attention_flops(1, 4, 8, 64, 1.0)) == 4 * 1 * 2 * 2 * 8 * 64


def test_decode_attention_reads_kv_at_bandwidth():
    b, c, hkv, d = 64, 4096, 8, 128
    kv_bytes = b * c * 2 * hkv * d * 2.0
    ker = KernelEfficiency(launch_overhead_s=0.0)
    t = attention_time_s(b * c * 4.0 * 64 * d, kv_bytes, c, PEAK, BW, NO_RAMP, ker)
    assert float(t) == pytest.approx(kv_bytes / (0.8 * BW), rel=1e-12)


def test_decode_attention_grid_cost_adds_per_sequence_and_kv_head():
    """A 1-token-context decode call of batch 2048 x 8 KV heads pays 16384 work units x 25 ns
    = 409.6 us on top of its (tiny) KV stream; the default (0 s per unit) leaves the old time."""
    b, c, hkv, d = 2048, 1, 8, 128
    kv_bytes = b * c * 2 * hkv * d * 2.0
    ker = KernelEfficiency(launch_overhead_s=0.0, attention_cta_s=25e-9)
    args = (b * c * 4.0 * 64 * d, kv_bytes, c, PEAK, BW, NO_RAMP)
    base = attention_time_s(*args, KernelEfficiency(launch_overhead_s=0.0))
    t = attention_time_s(*args, ker, 0.0, b * hkv)
    assert float(t - base) == pytest.approx(b * hkv * 25e-9, rel=1e-9)
    # the default (0 s per work unit) leaves the old time whatever the grid
    same = attention_time_s(*args, KernelEfficiency(launch_overhead_s=0.0), 0.0, b * hkv)
    assert float(same) == float(base)


def test_collectives_volume_factors():
    eff = perfmodel.Efficiency(collective_latency_s=0.0, collective_bandwidth_fraction=1.0)
    n, link = 2.0**29, 450e9
    for p in (2, 4, 8):
        assert float(collective_time_s(0, n, p, link, eff)) == pytest.approx(
            2 * (p - 1) / p * n / link
        )
        assert float(collective_time_s(1, n, p, link, eff)) == pytest.approx((p - 1) / p * n / link)
    assert float(collective_time_s(2, n, 2, link, eff)) == pytest.approx(n / link)
    assert float(one_pass_collective_s(n, 1, link, eff)) == 0.0
    eff2 = perfmodel.Efficiency()
    assert float(collective_time_s(0, 1e6, 4, link, eff2)) == float(
        ring_all_reduce_s(1e6, 4, link, eff2)
    )
    assert float(collective_time_s(2, 1e6, 2, link, eff2)) == float(
        point_to_point_s(1e6, link, eff2)
    )


def test_collective_takes_the_faster_nccl_protocol():
    """2-GPU all-reduce at 300 GB/s: wire time n / 300e9, alpha terms 2 x 1 us + 4 us = 6 us.
    LL (r = 0.4): 6 us + wire / 0.4; Simple: 6 us + wire + 13 us.  2 MiB: LL 23.48 us (Simple
    26.0); 64 MiB: Simple 242.7 us (LL 565.2).  No kernel: one regime, 6 us + wire."""
    eff = perfmodel.Efficiency(
        collective_latency_s=1e-6, collective_base_latency_s=4e-6, collective_bandwidth_fraction=1.0
    )
    ker = KernelEfficiency(collective_ll_bandwidth_ratio=0.4, collective_simple_latency_s=13e-6)
    for n in (2 * 2**20, 64 * 2**20):
        wire = n / 300e9
        want = min(6e-6 + wire / 0.4, 6e-6 + wire + 13e-6)
        assert float(collective_time_s(0, n, 2, 300e9, eff, ker)) == pytest.approx(want, rel=1e-12)
        assert float(collective_time_s(0, n, 2, 300e9, eff)) == pytest.approx(
            6e-6 + wire, rel=1e-12
        )
    assert float(collective_time_s(0, 2 * 2**20, 2, 300e9, eff, ker)) == pytest.approx(
        23.48e-6, rel=1e-3
    )
    assert float(collective_time_s(1, 1e6, 1, 300e9, eff, ker)) == 0.0  # one device: nothing
    # defaults (r = 1, alpha_S = 0) reproduce the one-regime time exactly
    assert float(collective_time_s(1, 1e6, 8, 300e9, eff, KernelEfficiency())) == float(
        collective_time_s(1, 1e6, 8, 300e9, eff)
    )


def test_gemm_gradients_match_finite_differences():
    def f(cfm, bw, launch):
        eff = perfmodel.Efficiency(compute_fraction_max=cfm, bandwidth_fraction=bw)
        ker = KernelEfficiency(launch_overhead_s=launch)
        ms = jnp.asarray([1.0, 64.0, 4096.0])
        return jnp.log(gemm_time_s(ms, 4096.0, 4096.0, 2.0, PEAK, BW, eff, ker)).sum()

    check_grads(f, (0.7, 0.8, 5e-6), order=1, modes=("rev",), eps=1e-7)


def test_vmap_over_parameters_equals_loop():
    cfms = jnp.asarray([0.5, 0.6, 0.7])

    def f(c):
        return gemm_time_s(
            2048.0,
            8192.0,
            8192.0,
            2.0,
            PEAK,
            BW,
            perfmodel.Efficiency(compute_fraction_max=c),
            KernelEfficiency(),
        )

    np.testing.assert_allclose(jax.vmap(f)(cfms), [f(c) for c in cfms], rtol=1e-12)
