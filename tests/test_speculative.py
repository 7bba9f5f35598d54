"""Speculative decoding: the Leviathan et al. expectation, its inversion on measured acceptance
lengths, and when drafting pays (high acceptance, small batch) or loses (low acceptance, large
compute-bound batches)."""

import equinox as eqx
import jax.numpy as jnp
import pytest
from hypothesis import given, settings, strategies as st
from jax.test_util import check_grads

from perfmodel import Deployment, Efficiency, System, load_hardware, load_model
from perfmodel._speculative import (
    acceptance_from_length,
    acceptance_prior,
    expected_tokens_per_step,
    load_acceptance,
    speculative_decode,
)
from perfmodel._step import decode_step

LLAMA70B = load_model("meta-llama/Llama-3.1-70B")
DRAFT1B = load_model("meta-llama/Llama-3.2-1B-Instruct")
H100 = load_hardware("h100-sxm")
TP4 = Deployment.create(tp=4)
EFF = Efficiency()


def test_expected_tokens_anchors():
    assert float(expected_tokens_per_step(0.5, 2.0)) == pytest.approx(1.75)  # 1 + 1/2 + 1/4
    assert float(expected_tokens_per_step(0.0, 4.0)) == pytest.approx(1.0)
    assert float(expected_tokens_per_step(1.0, 4.0)) == pytest.approx(5.0)
    # continuous across the series switch at alpha -> 1
    assert float(expected_tokens_per_step(1.0 - 1.000001e-4, 4.0)) == pytest.approx(
        float(expected_tokens_per_step(1.0 - 0.999999e-4, 4.0)), rel=1e-9
    )


def test_expected_tokens_gradient_near_and_away_from_one():
    for a in (0.7, 1.0 - 5e-5):
        check_grads(lambda x: expected_tokens_per_step(x, 4.0), (a,), order=1, eps=1e-6)
    # dE/dalpha at alpha = 1 is sum_i i = k(k+1)/2
    from jax import grad

    assert float(grad(expected_tokens_per_step)(1.0, 4.0)) == pytest.approx(10.0)


@given(st.floats(0.01, 0.99), st.integers(1, 8))
@settings(max_examples=25, deadline=None)
def test_inverting_the_acceptance_length_recovers_alpha(alpha, k):
    al = expected_tokens_per_step(alpha, float(k))
    assert float(acceptance_from_length(al, float(k))) == pytest.approx(alpha, abs=1e-9)


def test_acceptance_loader_inverts_every_measured_length():
    records = load_acceptance()
    assert len(records) == 112
    first = records[0]  # k = 1: AL = 1 + alpha
    assert first.draft_tokens == 1 and first.acceptance == pytest.approx(
        first.acceptance_length - 1.0
    )
    for r in records:
        assert 0.0 <= r.acceptance <= 1.0
        assert float(
            expected_tokens_per_step(r.acceptance, float(r.draft_tokens))
        ) == pytest.approx(r.acceptance_length, abs=1e-9)
    mean, std = acceptance_prior(records, "mtp")
    assert 0.5 < mean < 1.0 and std > 0.0


def _spec(batch, alpha, draft=DRAFT1B, k=4.0):
    return speculative_decode(
        System(LLAMA70B, H100, TP4, EFF),
        batch_size=batch,
        context_tokens=2000.0,
        draft_tokens=k,
        acceptance=alpha,
        draft_model=draft,
    )


def test_speculation_pays_at_high_acceptance_and_small_batch():
    s = _spec(1.0, 0.8)
    assert float(s.speedup) > 1.5 and float(s.net_gain_s) > 0
    # bandwidth-bound: verifying 5 tokens costs little more than decoding 1
    assert float(s.verify_s) < 1.2 * float(s.target_step_s)


def test_speculation_loses_at_low_acceptance():
    s = _spec(1.0, 0.1)
    assert float(s.speedup) < 1.0 and float(s.net_gain_s) < 0
    assert 0.1 < float(s.breakeven_acceptance) < 0.8


def test_speculation_loses_at_large_compute_bound_batch():
    small, large = _spec(1.0, 0.6), _spec(512.0, 0.6)
    assert float(small.speedup) > 1.0 > float(large.speedup)
    assert float(large.verify_s) > 3.0 * float(large.target_step_s)
    assert float(large.breakeven_acceptance) > float(small.breakeven_acceptance)


@given(st.floats(0.0, 1.0), st.sampled_from([1.0, 16.0, 256.0]))
@settings(max_examples=20, deadline=None)
def test_net_gain_positive_exactly_when_speedup_above_one(alpha, batch):
    s = _spec(batch, alpha, draft=None, k=3.0)
    assert (float(s.net_gain_s) > 0) == (float(s.speedup) > 1.0)


def test_breakeven_acceptance_gives_unit_speedup():
    s = _spec(64.0, 0.5)
    at = _spec(64.0, float(s.breakeven_acceptance))
    assert float(at.speedup) == pytest.approx(1.0, abs=1e-9)


def test_mtp_is_cheaper_to_draft_than_a_separate_model():
    mtp, draft = _spec(8.0, 0.7, draft=None), _spec(8.0, 0.7)
    assert float(mtp.draft_s) < float(draft.draft_s)
    per_layer = (float(mtp.target_step_s) - float(EFF.step_overhead_s)) / float(LLAMA70B.num_layers)
    assert float(mtp.draft_s) == pytest.approx(4.0 * per_layer)


def test_spec_budget_gradient_in_acceptance():
    check_grads(lambda a: _spec(8.0, a).tpot_s, (0.6,), order=1, modes=["rev"])
    assert jnp.isfinite(_spec(8.0, 1.0).tpot_s)


def test_simulated_speculation_agrees_with_the_closed_form():
    import numpy as np

    from perfmodel._traces import Trace
    from perfmodel.simulator._speculative import simulate_speculative

    llama8b = load_model("meta-llama/Llama-3.1-8B")
    dep = Deployment.create()
    n, prompt, output = 48, 1000, 400
    trace = Trace(np.zeros(n), np.full(n, prompt), np.full(n, output))
    for batch, tol in ((1, 0.03), (8, 0.15)):
        for alpha in (0.3, 0.8):
            sim = simulate_speculative(
                System(llama8b, H100, dep, EFF),
                trace,
                draft_tokens=4,
                acceptance=alpha,
                concurrency=batch,
                seed=1,
            )
            closed = speculative_decode(
                System(llama8b, H100, dep, EFF),
                batch_size=float(batch),
                context_tokens=prompt + output / 2,
                draft_tokens=4.0,
                acceptance=alpha,
            )
            assert float(np.nanmean(sim.tpot_s)) == pytest.approx(float(closed.tpot_s), rel=tol)


@pytest.mark.parametrize(
    "cost",
    [
        {"draft_tokens": 4.0, "acceptance": 0.7},  # not marked speculative: plain decoding
        {
            "draft_tokens": 4.0,
            "acceptance": 0.7,
            "speculative": True,
            "cached_prompt_tokens": 500.0,
        },
    ],
)
def test_the_simulator_refuses_a_decode_cost_it_would_not_simulate(cost):
    # the simulator draws speculation from the load model's DecodeCost; a plain one (the engine
    # would not speculate) or one with a closed-form cached prefix (the simulator's own prefix
    # cache decides hits) would be silently ignored, so it is refused
    import numpy as np

    from perfmodel._batching import DecodeCost
    from perfmodel._traces import Trace
    from perfmodel.simulator import simulate

    trace = Trace(np.zeros(4), np.full(4, 100), np.full(4, 20))
    system = System(load_model("meta-llama/Llama-3.1-8B"), H100, Deployment.create(), EFF)
    with pytest.raises(ValueError, match="speculative DecodeCost"):
        simulate(system, trace, concurrency=2, speculation=DecodeCost(**cost))


def test_speculation_under_load_at_zero_acceptance_only_adds_the_spec_cost():
    # alpha = 0: one token per step.  The one-solve form (DecodeCost priced at draft + verify)
    # is cross-checked against an independent construction: the plain engine with each decode
    # step stretched by r = (draft + verify) / target step, substituted to its fixed point.
    from perfmodel._features_under_load import speculative_serving_metrics
    from perfmodel.dynamics import Workload, serving_metrics

    llama8b, dep = load_model("meta-llama/Llama-3.1-8B"), Deployment.create()
    w = Workload(arrival_rate_per_s=4.0, prompt_tokens_mean=2000.0, output_tokens_mean=200.0)
    plain = serving_metrics(System(llama8b, H100, dep, EFF), w)
    spec = speculative_serving_metrics(
        System(llama8b, H100, dep, EFF), w, draft_tokens=4.0, acceptance=0.0
    )
    n = float(plain.decode_batch)

    def step(batch):
        return speculative_decode(
            System(llama8b, H100, dep, EFF),
            batch_size=batch,
            context_tokens=2100.0,
            draft_tokens=4.0,
            acceptance=0.0,
        )

    # TPOT = plain gap x r with the plain engine run at 1 + 199 r decode steps (the longer step
    # keeps more sequences decoding, Little's law), r = step_spec(n') / tau_d(n') at its batch n'
    assert float(spec.tokens_per_step) == pytest.approx(1.0)
    n2 = float(spec.decode_batch)
    assert n2 > n
    r, spec_step_s = 1.0, float(step(n2).step_s)
    for _ in range(8):  # the plain step's context 2000 + O'/2 moves with r (converged by 6)
        tau = decode_step(System(llama8b, H100, dep, EFF), n2, 2000.0 + (1.0 + 199.0 * r) / 2.0)
        r = spec_step_s / float(tau.total_s)
    stretched = serving_metrics(
        System(llama8b, H100, dep, EFF),
        eqx.tree_at(lambda x: x.output_tokens_mean, w, 1.0 + 199.0 * r),
    )
    assert float(spec.tpot_s.mean) == pytest.approx(float(stretched.tpot_s.mean) * r, rel=0.03)
    assert r > 1.0  # draft + verify cost more than a plain step
    assert float(spec.tpot_s.mean) > float(plain.tpot_s.mean)  # loses at zero acceptance
    good = speculative_serving_metrics(
        System(llama8b, H100, dep, EFF), w, draft_tokens=4.0, acceptance=0.8
    )
    assert float(good.tpot_s.p95) < 0.6 * float(plain.tpot_s.p95)
