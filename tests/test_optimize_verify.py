"""Every kind of answer is checked: the split verdict calls ``split_serving`` with
p x replicas prefill and d x replicas decode engines (and the speculative choice's decode cost) (the wiring, recorded without compiling the
closed form), and ``--simulate`` runs the colocated, speculative or two-pool simulator (small N:
seconds)."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from optimize import KNOBS, Grid, Workload, _verify as verify, make_problem
from optimize._describe import _kv_transfer
from optimize._simcheck import simulate_check
from optimize._verify import VERDICT_MODELS, kind_of
from perfmodel import Percentiles, load_hardware, load_model

GRID = Grid(
    num_gpus=2,
    tp=(1,),
    pp=(1,),
    kv_dtypes=("bf16",),
    weight_dtypes=("bf16",),
    max_num_batched_tokens=(2048,),
    max_num_seqs=(256,),
    spec_k=(0, 3),
    pool_ratios=((2, 1),),
    max_replicas=8,
)
GPUS = ("h100-sxm", "l40s")


@pytest.fixture(scope="module")
def problem():
    wl = Workload(
        arrival_rate_per_s=4.0,
        prompt_tokens_mean=1024.0,
        output_tokens_mean=64.0,
        output_tokens_cv=0.5,
    )
    return make_problem(
        load_model("meta-llama/Llama-3.1-8B"),
        GPUS,
        wl,
        slo_ttft_p95_s=2.0,
        slo_tpot_p95_s=0.1,
        grid=GRID,
        num_draws=2,
        spec_draft="mtp",
        spec_acceptance=0.8,
    )


def _config(spec=0, pool=0, prefill_gpu=0):
    c = np.zeros(len(KNOBS), dtype=np.int32)
    c[KNOBS.index("spec_k")], c[KNOBS.index("pool_split")] = spec, pool
    c[KNOBS.index("prefill_gpu")] = prefill_gpu
    return c


class _Recorded:
    """What ``split_serving`` was called with, packed into its outputs."""

    def __init__(self, workload, *, prefill, decode, cost, **kw):
        hw_p, dep_p, eff_p = prefill.hardware, prefill.deployment, prefill.efficiency
        hw_d, dep_d, eff_d = decode.hardware, decode.deployment, decode.efficiency
        bw = kw["transfer_bytes_per_s"]
        k = jnp.asarray(0.0) if cost is None else cost.draft_tokens
        alpha = jnp.asarray(0.0) if cost is None else cost.acceptance
        zero = bw * 0
        # the verdict reads (p50, p95, p99): the pool sizes and the hand-off bandwidth; and per
        # pool (decode, prefill) its efficiency draw, its GPU's HBM and the speculation
        self.ttft_s = Percentiles(zero, dep_p.replicas, zero, dep_d.replicas, bw)
        self.tpot_s = Percentiles(
            jnp.stack([zero, zero]),
            jnp.stack([eff_d.bandwidth_fraction, eff_p.bandwidth_fraction]),
            jnp.stack([zero, zero]),
            jnp.stack([hw_d.hbm_bytes, hw_p.hbm_bytes]),
            jnp.stack([k, alpha]),
        )
        self.utilization = bw * 0
        self.seats = bw * 0 + 1.0


@pytest.mark.parametrize("spec", [0, 1])
def test_split_verdict_calls_split_serving_with_p_and_d_engines(problem, monkeypatch, spec):
    """Pool split 2:1, 3 replica units, prefill on l40s, decode on h100: 6 prefill engines and 3
    decode engines, the l40s network for the hand-off, and each pool its own GPU's efficiency
    draw (the l40s draws are made to differ from the h100's, which the prior draws equal); with
    speculation the decode pool's cost carries the choice's k = 3 and alpha = 0.8."""
    config = _config(spec=spec, pool=1, prefill_gpu=1)
    kind = "split_speculative" if spec else "split"
    assert kind_of(problem, config) == kind and "split_serving" in VERDICT_MODELS[kind]
    bw_frac = problem.efficiency.bandwidth_fraction
    two_gpus = eqx.tree_at(
        lambda p: p.efficiency.bandwidth_fraction, problem, bw_frac.at[1].multiply(0.5)
    )
    monkeypatch.setattr(verify, "split_serving", _Recorded)
    fresh = eqx.filter_jit(verify._split.__wrapped__)  # not the compiled closed form
    m = fresh(two_gpus, jnp.asarray(config[None]), jnp.asarray([3.0]), bool(spec))
    h100, l40s = load_hardware("h100-sxm"), load_hardware("l40s")
    np.testing.assert_allclose(m.ttft_quantiles_s[0, 1], [6.0, 3.0, l40s.internode_bytes_per_s])
    decode_draw, prefill_draw = float(bw_frac[0, 1]), 0.5 * float(bw_frac[1, 1])
    k, alpha = (3.0, 0.8) if spec else (0.0, 0.0)
    np.testing.assert_allclose(
        m.tpot_quantiles_s[0, 1],
        [[decode_draw, h100.hbm_bytes, k], [prefill_draw, l40s.hbm_bytes, alpha]],
    )


@pytest.mark.parametrize(
    "spec, pool, kind",
    [(0, 0, "colocated"), (1, 0, "speculative"), (0, 1, "split"), (1, 1, "split + speculative")],
)
def test_simulator_check_runs_the_answers_kind(problem, spec, pool, kind):
    out = simulate_check(problem, _config(spec, pool, prefill_gpu=pool), 2, 150)
    assert out["kind"] == kind and out["requests"] == 150
    assert 0 < out["ttft_s"]["p50"] <= out["ttft_s"]["p95"] <= out["ttft_s"]["p99"]
    assert 0 < out["tpot_s"]["p50"] <= out["tpot_s"]["p99"]
    assert ("spec_tokens_per_step" in out) == bool(spec)
    if spec:  # k = 3 at alpha 0.8: E = (1 - 0.8^4) / 0.2 = 2.95 tokens per step
        assert out["spec_tokens_per_step"] > 1.5 and out["spec_tokens_per_step"] <= 4.0
    if pool:  # the first token waits for the prefill pool and the KV hand-off
        assert out["ttft_s"]["p50"] > _kv_transfer(problem, _config(spec, pool, prefill_gpu=1))


@settings(max_examples=40, deadline=None)
@given(
    need=st.lists(st.integers(1, 12), min_size=3, max_size=3),
    search=st.lists(st.integers(1, 8), min_size=3, max_size=3),
)
def test_verdict_finds_the_first_trial_that_meets_the_confidence(problem, need, search):
    """Whatever the search model's count, the verdict's guided bisection returns what a scan of
    every trial would (the fewest trial replicas meeting the confidence, which improves with
    replicas; none: infeasible), and where the search count is the answer it settles in at most
    2 rounds.  The verdict model is replaced by a threshold per candidate (no compile)."""
    need, calls = np.asarray(need), []

    def kind_metrics(_problem, _kind, _configs, replicas):
        calls.append(np.asarray(replicas))
        return jnp.asarray(replicas)

    def probabilities(_problem, replicas):
        return (np.asarray(replicas) >= need).astype(float)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verify, "_kind_metrics", kind_metrics)
        mp.setattr(verify, "_probabilities", probabilities)
        configs = np.stack([_config()] * 3)
        out = verify.verify_replicas(problem, configs, np.asarray(search))
    for i, r in enumerate(search):
        trials = sorted(
            {max(1, int(np.ceil(r * f))) for f in verify.VERIFY_FACTORS}
            | {max(1, r - 1), r + 1, r + 2}
        )
        meeting = [t for t in trials if t >= need[i]]
        assert out.replicas[i] == (meeting[0] if meeting else 0)
        assert np.isfinite(out.cost_per_hour[i]) == bool(meeting)
    if all(n == r for n, r in zip(need, search)):
        assert len(calls) <= 2
