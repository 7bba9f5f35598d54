"""Host-memory KV tier: it pays when a sequence's host transfer hides under the weight-bound
decode step (short contexts, fast link) and not when it does not (long contexts, slow link)."""

import pytest

from perfmodel import Deployment, Efficiency, GiB, System, decode_step, load_hardware, load_model
from perfmodel._host_tier import host_tier

H100 = load_hardware("h100-sxm")
LLAMA70B = load_model("meta-llama/Llama-3.1-70B")
EFF = Efficiency()


def _tier(seq, bw, host=256 * GiB):
    dep = Deployment.create(tp=2, host_kv_bytes=host, host_kv_bytes_per_s=bw)
    return host_tier(System(LLAMA70B, H100, dep, EFF), sequence_tokens=seq)


def test_no_tier_no_change():
    r = _tier(2500.0, 0.0, host=0.0)
    assert float(r.host_sequences_used) == 0.0 and float(r.gain_fraction) == 0.0


def test_pays_for_short_contexts_on_a_fast_link():
    r = _tier(2500.0, 64e9)
    assert float(r.host_sequences_used) >= 1.0 and float(r.gain_fraction) > 0.2
    # anchor: one sequence's shard is 2500 tokens * 327,680 B / 2 (TP2) at 64 GB/s
    per_seq = 2500 * 327680 / 2 / 64e9
    assert float(r.host_transfer_s_per_step) == pytest.approx(
        float(r.host_sequences_used) * per_seq
    )


def test_does_not_pay_for_long_contexts_on_a_slow_link():
    r = _tier(8000.0, 16e9)
    assert float(r.hbm_sequences) >= 1.0
    assert float(r.host_sequences_used) == 0.0 and float(r.gain_fraction) == 0.0
    # the reason, from the budgets: one sequence's transfer outlasts the step it would join
    dep = Deployment.create(tp=2)
    step = decode_step(
        System(LLAMA70B, H100, dep, EFF), float(r.hbm_sequences) + 1.0, 8000.0
    ).total_s
    assert 8000 * 327680 / 2 / 16e9 > float(step)


def test_gain_falls_with_link_bandwidth():
    gains = [float(_tier(640.0, bw).gain_fraction) for bw in (128e9, 64e9, 16e9, 4e9)]
    assert gains == sorted(gains, reverse=True) and gains[0] > gains[-1]


def test_host_tier_lets_a_sequence_run_that_hbm_cannot_hold():
    r = _tier(32000.0, 64e9)
    assert float(r.hbm_sequences) == 0.0 and float(r.tokens_per_s_with_host) > 0.0


def test_pcie5_x16_bandwidth_is_lanes_times_rate_times_encoding():
    from perfmodel.features import PCIE5_X16_BYTES_PER_S

    # 32 GT/s per lane x 16 lanes x 128/130 encoding / 8 bits = 63.0 GB/s
    assert PCIE5_X16_BYTES_PER_S == pytest.approx(32e9 * 16 * (128 / 130) / 8, rel=1e-3)
