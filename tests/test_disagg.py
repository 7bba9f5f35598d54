"""Prefill/decode disaggregation: the KV hand-off anchor, and the split winning for long prompts
with moderate outputs but losing for short prompts (same 8 GPUs either way)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from perfmodel import (
    Deployment,
    Efficiency,
    System,
    kv_bytes_per_token,
    load_hardware,
    load_model,
    prefill_step,
)
from perfmodel._disagg import DEFAULT_TRANSFER_LATENCY_S, disaggregation, kv_transfer_s
from perfmodel.dynamics import PERCENTILE_QUANTILES as PQ

H100 = load_hardware("h100-sxm")
LLAMA8B = load_model("meta-llama/Llama-3.1-8B")
EFF = Efficiency()


def _compare(prompt, output, load, prefill_gpus=4, decode_gpus=4, **kw):
    """``load`` = colocated prefill utilisation lambda * prefill_s / 8 replicas."""
    colocated = Deployment.create(replicas=8)
    rate = load * 8.0 / float(prefill_step(System(LLAMA8B, H100, colocated, EFF), prompt).total_s)
    return disaggregation(
        LLAMA8B,
        EFF,
        colocated=(H100, colocated),
        prefill=(H100, Deployment.create(replicas=prefill_gpus)),
        decode=(H100, Deployment.create(replicas=decode_gpus)),
        prompt_tokens=prompt,
        output_tokens=output,
        arrival_rate_per_s=rate,
        **kw,
    )


def test_kv_transfer_anchor():
    # Llama-3.1-8B bf16: 2 * 32 layers * 8 KV heads * 128 * 2 B = 131,072 B/token
    assert float(kv_bytes_per_token(LLAMA8B, 2.0)) == 131072.0
    t = kv_transfer_s(LLAMA8B, Deployment.create(), 8000.0, 50e9)
    assert float(t) == pytest.approx(8000 * 131072 / 50e9 + DEFAULT_TRANSFER_LATENCY_S)
    # TP shards move in parallel: each of 2 devices sends half
    t2 = kv_transfer_s(LLAMA8B, Deployment.create(tp=2), 8000.0, 50e9)
    assert float(t2) == pytest.approx(8000 * 65536 / 50e9 + DEFAULT_TRANSFER_LATENCY_S)


def test_split_wins_for_long_prompts_with_moderate_outputs():
    r = _compare(8000.0, 256.0, 0.3)
    assert bool(r.colocated_stable) and bool(r.split_stable)
    assert float(r.prefill_interference) > 1.2  # long prefills stretch colocated decode gaps
    assert float(r.split_tpot_s) < float(r.colocated_tpot_s)
    assert float(r.benefit_of_isolation_s) > float(r.kv_transfer_s + r.orchestration_s)
    assert float(r.net_s) > 0


def test_split_loses_for_short_prompts():
    for load in (0.1, 0.3):
        r = _compare(200.0, 256.0, load)
        # a short prompt rides a bandwidth-bound step: its GEMMs hide under the weight reads, and
        # only its attention kernels and the elementwise kernels' activation traffic (which grows
        # with the tokens) are added: ~2 % of the decode time at load 0.1, ~10 % at 0.3
        assert float(r.prefill_interference) < 1.12
        assert float(r.net_s) < 0


def test_net_is_the_e2e_difference_and_accounts_for_the_handoff():
    r = _compare(2000.0, 256.0, 0.3)
    assert float(r.net_s) == pytest.approx(float(r.colocated_e2e_s - r.split_e2e_s))
    assert float(r.net_s) == pytest.approx(
        float(r.benefit_of_isolation_s - r.kv_transfer_s - r.orchestration_s)
    )
    slow = _compare(2000.0, 256.0, 0.3, transfer_bytes_per_s=1e8)  # 100 MB/s link
    assert float(slow.kv_transfer_s) > 1.0 and float(slow.net_s) < 0


def test_each_pool_runs_at_its_own_gpus_efficiency():
    # half the compute fraction on the prefill pool's GPU: the split's prefill (and so its TTFT)
    # slows by exactly the longer prefill of the prompt, its TPOT and the colocated system do not
    base = _compare(2000.0, 256.0, 0.1)
    slow = Efficiency(compute_fraction_max=EFF.compute_fraction_max / 2)
    r = _compare(2000.0, 256.0, 0.1, prefill_efficiency=slow)
    assert float(r.split_tpot_s) == float(base.split_tpot_s)
    assert float(r.colocated_e2e_s) == float(base.colocated_e2e_s)
    dep = Deployment.create(replicas=4)
    extra_s = float(prefill_step(System(LLAMA8B, H100, dep, slow), 2000.0).total_s) - float(
        prefill_step(System(LLAMA8B, H100, dep, EFF), 2000.0).total_s
    )
    assert extra_s > 0 and float(r.split_ttft_s - base.split_ttft_s) >= extra_s
    # and a slower decode GPU moves the split's TPOT only
    d = _compare(2000.0, 256.0, 0.1, decode_efficiency=Efficiency(bandwidth_fraction=0.4))
    assert float(d.split_tpot_s) > 1.5 * float(base.split_tpot_s)
    assert float(d.colocated_tpot_s) == float(base.colocated_tpot_s)


def test_an_undersized_pool_is_reported_unstable():
    r = _compare(8000.0, 256.0, 0.5, prefill_gpus=2, decode_gpus=6)
    assert not bool(r.split_stable) and float(r.split_ttft_s) == jnp.inf
    assert float(r.net_s) == -jnp.inf


def test_net_gain_is_differentiable_in_the_transfer_bandwidth():
    g = jax.grad(lambda bw: _compare(8000.0, 256.0, 0.3, transfer_bytes_per_s=bw).net_s)(50e9)
    assert jnp.isfinite(g) and float(g) > 0


@pytest.mark.parametrize("prompt, split_wins", [(8000.0, True), (200.0, False)])
def test_simulator_agrees_on_who_wins_and_roughly_on_e2e(prompt, split_wins):
    import numpy as np

    from perfmodel._traces import Trace
    from perfmodel.simulator import simulate
    from perfmodel.simulator._disagg import simulate_disaggregated

    colocated = Deployment.create(replicas=8, max_model_len=16384.0)  # 8000 + 256 tokens fit
    rate = 0.3 * 8.0 / float(prefill_step(System(LLAMA8B, H100, colocated, EFF), prompt).total_s)
    n = 800
    arrival = np.cumsum(np.random.default_rng(0).exponential(1.0 / rate, n))
    trace = Trace(arrival, np.full(n, int(prompt)), np.full(n, 256))
    pools = {
        "prefill": (H100, Deployment.create(replicas=4, max_model_len=16384.0)),
        "decode": (H100, Deployment.create(replicas=4, max_model_len=16384.0)),
    }
    split = simulate_disaggregated(LLAMA8B, EFF, trace, **pools)
    coloc = simulate(System(LLAMA8B, H100, colocated, EFF), trace)
    keep = slice(n // 10, int(0.9 * n))
    sim_net = np.mean(coloc.e2e_s[keep]) - np.mean(split.e2e_s[keep])
    closed = _compare(prompt, 256.0, 0.3)
    assert (sim_net > 0) == split_wins == (float(closed.net_s) > 0)
    if split_wins:
        # 800 short prompts at ~360 req/s span ~2 s, less than one request's life, so only the
        # long-prompt run (~60 s) reaches the steady state the closed form describes
        assert np.mean(split.e2e_s[keep]) == pytest.approx(float(closed.split_e2e_s), rel=0.15)
        assert np.mean(coloc.e2e_s[keep]) == pytest.approx(float(closed.colocated_e2e_s), rel=0.15)


def test_split_percentiles_under_load_agree_with_the_simulator():
    import numpy as np

    from perfmodel._disagg_load import disaggregation_percentiles
    from perfmodel._traces import Trace
    from perfmodel._workload import Workload
    from perfmodel.simulator._disagg import simulate_disaggregated

    colocated = Deployment.create(replicas=8)
    rate = 0.3 * 8.0 / float(prefill_step(System(LLAMA8B, H100, colocated, EFF), 2000.0).total_s)
    pools = {
        "prefill": (H100, Deployment.create(replicas=4)),
        "decode": (H100, Deployment.create(replicas=4)),
    }
    wl = Workload(arrival_rate_per_s=rate, prompt_tokens_mean=2000.0, output_tokens_mean=256.0)
    closed = disaggregation_percentiles(LLAMA8B, EFF, wl, colocated=(H100, colocated), **pools)
    # each keyword drives its own system: a slower GPU (half the compute and bandwidth fractions)
    # as ``efficiency`` slows the colocated engine only, since the decode pool follows
    # ``decode_efficiency`` (its TPOT is unchanged); as ``prefill_efficiency`` it grows mean TTFT
    # by at least the longer prefill of the mean prompt
    slow = Efficiency(
        compute_fraction_max=EFF.compute_fraction_max / 2,
        bandwidth_fraction=EFF.bandwidth_fraction / 2,
    )
    both = disaggregation_percentiles(
        LLAMA8B,
        slow,
        wl,
        colocated=(H100, colocated),
        prefill_efficiency=slow,
        decode_efficiency=EFF,
        **pools,
    )
    assert both.split_tpot_s.at(PQ).tolist() == closed.split_tpot_s.at(PQ).tolist()
    assert float(both.split_tpot_s.mean) == float(closed.split_tpot_s.mean)
    assert float(both.colocated_tpot_s.mean) > 1.5 * float(closed.colocated_tpot_s.mean)
    p_dep = pools["prefill"][1]
    extra_s = float(prefill_step(System(LLAMA8B, H100, p_dep, slow), 2000.0).total_s) - float(
        prefill_step(System(LLAMA8B, H100, p_dep, EFF), 2000.0).total_s
    )
    assert extra_s > 0 and float(both.split_ttft_s.mean - closed.split_ttft_s.mean) >= extra_s
    n = 800
    arrival = np.cumsum(np.random.default_rng(0).exponential(1.0 / rate, n))
    sim = simulate_disaggregated(
        LLAMA8B, EFF, Trace(arrival, np.full(n, 2000), np.full(n, 256)), **pools
    )
    keep = slice(n // 10, int(0.9 * n))
    for stat, q in (("mean", None), ("p95", 95)):
        ttft = np.mean(sim.ttft_s[keep]) if q is None else np.percentile(sim.ttft_s[keep], q)
        e2e = np.mean(sim.e2e_s[keep]) if q is None else np.percentile(sim.e2e_s[keep], q)
        assert float(getattr(closed.split_ttft_s, stat)) == pytest.approx(ttft, rel=0.15)
        assert float(getattr(closed.split_e2e_s, stat)) == pytest.approx(e2e, rel=0.15)


def _md1_wait_cdf(t, rho):
    """Erlang's exact M/D/1 wait CDF (D = 1): (1 - rho) sum_{k <= t} (rho (k - t))^k / k! e^{-rho (k - t)}."""
    import math

    return (1 - rho) * sum(
        (rho * (k - t)) ** k / math.factorial(k) * math.exp(-rho * (k - t))
        for k in range(int(t) + 1)
    )


def test_lundberg_tail_anchors_and_gradient():
    from perfmodel._disagg_load import lundberg_tail, prefill_pool_waits

    # M/M/1 (Gamma CV 1): theta = mu - lambda, so theta D = 1 - rho, and C = rho
    x, c = lundberg_tail(jnp.asarray(0.6), 1.0)
    assert float(x) == pytest.approx(0.4, rel=1e-6) and float(c) == pytest.approx(0.6, rel=1e-6)
    # M/D/1: rho (e^x - 1) = x; the p95 wait (D = 1, mean wait rho / (2 (1 - rho))) is within
    # 6 % of Erlang's exact 1.07 at rho = 0.3 (the exponential tail W / rho gives 1.28)
    x, c = lundberg_tail(jnp.asarray(0.3), 0.0)
    assert 0.3 * jnp.expm1(x) == pytest.approx(float(x), rel=1e-9)
    waits = prefill_pool_waits(0.3 / 1.4, 1.0, 0.0, (0.95,))
    assert float(waits[0]) == pytest.approx(0.3 / 1.4)
    assert _md1_wait_cdf(float(waits[1]), 0.3) == pytest.approx(0.95, abs=0.01)
    # differentiable in the load: implicit-function gradient vs a central difference
    g = jax.grad(lambda r: lundberg_tail(r, 0.25)[0])(0.5)
    fd = (lundberg_tail(0.5 + 1e-5, 0.25)[0] - lundberg_tail(0.5 - 1e-5, 0.25)[0]) / 2e-5
    assert float(g) == pytest.approx(float(fd), rel=1e-4)


def test_prefill_pool_wait_is_the_packing_mg1_one():
    from perfmodel._disagg_load import prefill_pool_mean_wait_s

    # no packing (f = 0): Pollaczek-Khinchine M/D/1, rho D / (2 (1 - rho)) at D = 1, rho = 0.6
    w = prefill_pool_mean_wait_s(0.6, 1.0, 1.0, 0.0, 0.0, 1.0)
    assert float(w) == pytest.approx(0.6 / 0.8, rel=1e-12)
    # linear packing (m = D = 1, f = 1): + the prompts arriving in the residual rho / 2, each 1
    w = prefill_pool_mean_wait_s(0.6, 1.0, 1.0, 1.0, 0.0, 1.0)
    assert float(w) == pytest.approx(0.6 / 0.8 + 0.6 * 0.3, rel=1e-12)
    # queued prompts packed at half cost: W = E[R] / (1 - lambda m) + lambda E[R] m; stable while
    # lambda m < 1 even past lambda D = 1 (the busy fraction is then capped at 1)
    w = prefill_pool_mean_wait_s(0.6, 1.0, 0.5, 1.0, 0.0, 1.0)
    assert float(w) == pytest.approx(0.3 / 0.7 + 0.6 * 0.3 * 0.5, rel=1e-12)
    assert jnp.isfinite(prefill_pool_mean_wait_s(1.5, 1.0, 0.5, 1.0, 0.0, 1.0))
    assert jnp.isinf(prefill_pool_mean_wait_s(2.5, 1.0, 0.5, 1.0, 0.0, 1.0))
    # no fitted colocated terms: in the split system at 2,000 tokens, load 0.6 per prefill
    # replica, the mean TTFT exceeds that of an idle system by this wait (m = T(2) - T(1), f = 1);
    # the decode pool is large and the outputs one token long, so it adds the same to both
    from perfmodel._disagg_load import disaggregation_percentiles
    from perfmodel._workload import Workload

    pool, big = Deployment.create(replicas=4), Deployment.create(replicas=1000)
    d_s = float(prefill_step(System(LLAMA8B, H100, pool, EFF), 2000.0).total_s)
    m_s = float(prefill_step(System(LLAMA8B, H100, pool, EFF), 2000.0, 2.0).total_s) - d_s

    def mean_ttft(rate):
        wl = Workload(arrival_rate_per_s=rate, prompt_tokens_mean=2000.0, output_tokens_mean=1.0)
        out = disaggregation_percentiles(
            LLAMA8B, EFF, wl, colocated=(H100, pool), prefill=(H100, pool), decode=(H100, big)
        )
        return float(out.split_ttft_s.mean)

    e_r = 0.6 * d_s / 2.0
    w_s = e_r / (1.0 - 0.6 * m_s / d_s) + 0.6 / d_s * e_r * m_s
    assert mean_ttft(4 * 0.6 / d_s) - mean_ttft(4e-9 / d_s) == pytest.approx(w_s, rel=1e-6)


def _stats(p) -> np.ndarray:
    """A ``Percentiles``' mean and quantiles as one array."""
    return np.asarray([p.mean, *p.at(PQ)])


def _split(rate, cost=None, prompt=2000.0, output=256.0, pools=4):
    from perfmodel._workload import Workload
    from perfmodel.features import split_serving

    wl = Workload(arrival_rate_per_s=rate, prompt_tokens_mean=prompt, output_tokens_mean=output)
    dep = Deployment.create(replicas=pools)
    return split_serving(
        wl,
        prefill=System(LLAMA8B, H100, dep, EFF),
        decode=System(LLAMA8B, H100, dep, EFF),
        cost=cost,
    )


def test_split_serving_speculative_decode_pool_emits_e_tokens_per_iteration():
    """MTP heads, k = 3 at alpha = 0.8: E = (1 - 0.8^4) / (1 - 0.8) = 2.952 tokens per
    iteration.  At a vanishing rate a request decodes alone (batch 1 + n, n -> 0), so its mean
    TPOT is one draft + verify iteration at batch 1 over E, and the speculative pool's TPOT is
    below the plain one's (the verify pass reads the weights once for 4 tokens)."""
    from perfmodel.dynamics import DecodeCost, decode_iteration_s

    cost = DecodeCost(draft_tokens=3.0, acceptance=0.8, speculative=True)
    e_step = (1.0 - 0.8**4) / (1.0 - 0.8)
    assert float(cost.tokens_per_step()) == pytest.approx(e_step, rel=1e-12)
    spec, plain = _split(1e-6, cost), _split(1e-6)
    ctx = 2000.0 + 255.0 / 2.0
    dep = Deployment.create(replicas=4)
    one = float(
        decode_iteration_s(
            System(LLAMA8B, H100, dep, EFF), cost, decode_seqs=1.0, decode_context=ctx
        )
    )
    assert float(spec.tpot_s.mean) == pytest.approx(one / e_step, rel=1e-4)
    assert float(spec.tpot_s.mean) < 0.6 * float(plain.tpot_s.mean)
    assert bool(spec.stable) and bool(plain.stable)


@settings(max_examples=15, deadline=None)
@given(st.floats(0.5, 60.0), st.floats(1.05, 3.0))
def test_split_serving_utilization_grows_with_load_and_overload_is_inf(rate, factor):
    lo, hi = _split(rate), _split(rate * factor)
    assert float(hi.utilization) > float(lo.utilization) > 0.0
    for m in (lo, hi):
        if bool(m.stable):
            assert float(m.utilization) < 1.0 and np.all(np.isfinite(_stats(m.ttft_s)))
            assert float(m.ttft_s.p99) >= float(m.ttft_s.p95) >= float(m.ttft_s.p90)
            assert float(m.ttft_s.p90) >= float(m.ttft_s.p50) > 0.0
        else:  # the first token never comes; the decode pool's TPOT is its own (inf if it is
            # the overloaded pool)
            assert np.all(np.isinf(_stats(m.ttft_s))) and np.all(np.isinf(_stats(m.e2e_s)))
    flooded = _split(1e4)
    assert not bool(flooded.stable) and np.all(np.isinf(_stats(flooded.tpot_s)))


def test_colocated_decode_batch_is_littles_law_capped_at_the_seats():
    """batch = lambda / replicas x (output - 1) x TPOT, between 1 and the seats."""
    from perfmodel import max_concurrent_requests
    from perfmodel.features import colocated_decode_batch

    model, eff = load_model("meta-llama/Llama-3.1-8B"), Efficiency()
    dep = Deployment.create(replicas=2)
    prompt, output, rate = 1000.0, 201.0, 4.0
    tpot = float(
        disaggregation(
            model,
            eff,
            colocated=(H100, dep),
            prefill=(H100, dep),
            decode=(H100, dep),
            prompt_tokens=prompt,
            output_tokens=output,
            arrival_rate_per_s=rate,
        ).colocated_tpot_s
    )
    # 2 req/s per replica, each decoding 200 tokens at tpot seconds
    expected = 2.0 * 200.0 * tpot
    seats = min(float(max_concurrent_requests(model, H100, dep, prompt + output)), 256.0)
    got = colocated_decode_batch(System(model, H100, dep, eff), prompt, output, rate)
    assert got == pytest.approx(expected, rel=1e-12)
    # a trickle of requests: Little's law gives far below one sequence, the floor holds it at 1
    assert colocated_decode_batch(System(model, H100, dep, eff), prompt, output, 1e-3) == 1.0
    assert colocated_decode_batch(System(model, H100, dep, eff), prompt, output, None) == 1.0
    flood = colocated_decode_batch(System(model, H100, dep, eff), prompt, output, 1e6)
    assert flood == pytest.approx(seats)  # overloaded: the seats (max_num_seqs 256 here)
