"""Features under load at the steady state's depth: the ``DecodeCost`` a decode iteration carries
(cached prefix read by every decode; speculative draft + verify, E tokens per iteration) against
hand-derived costs, enumeration and Little's law."""

import jax
import pytest

from perfmodel import Deployment, Efficiency, System, features as ft, load_hardware, load_model
from perfmodel._batching import DecodeCost, decode_iteration_s, iteration_s
from perfmodel._features_under_load import (
    prefix_serving_metrics,
    speculative_serving_metrics,
)
from perfmodel._speculative import expected_tokens_per_step, speculative_decode
from perfmodel.dynamics import Workload, serving_metrics

jax.config.update("jax_enable_x64", True)

LLAMA8B = load_model("meta-llama/Llama-3.1-8B")
DRAFT1B = load_model("meta-llama/Llama-3.2-1B-Instruct")
H100 = load_hardware("h100-sxm")
DEP = Deployment.create()
EFF = Efficiency()
MIXED = {
    "prefill_tokens": 700.0,
    "prefill_seqs": 1.0,
    "prefill_context": 300.0,
    "decode_seqs": 40.0,
    "decode_context": 1500.0,
}


def test_default_cost_is_the_plain_iteration_bit_for_bit():
    plain = iteration_s(System(LLAMA8B, H100, DEP, EFF), **MIXED)
    assert float(
        decode_iteration_s(System(LLAMA8B, H100, DEP, EFF), DecodeCost(), **MIXED)
    ) == float(plain)


def test_cached_prefix_is_read_by_decodes_and_chunks():
    cost = DecodeCost(cached_prompt_tokens=1536.0)
    shifted = dict(MIXED, prefill_context=300.0 + 1536.0, decode_context=1500.0 + 1536.0)
    got = decode_iteration_s(System(LLAMA8B, H100, DEP, EFF), cost, **MIXED)
    assert float(got) == pytest.approx(
        float(iteration_s(System(LLAMA8B, H100, DEP, EFF), **shifted))
    )


@pytest.mark.parametrize("draft", [None, DRAFT1B])
def test_speculative_decode_iteration_is_draft_plus_verify(draft):
    # no prefill: the iteration is speculative_decode's step (draft + verify over k + 1 tokens),
    # the draft paid once any sequence decodes
    cost = DecodeCost(draft_tokens=3.0, acceptance=0.7, draft_model=draft, speculative=True)
    got = decode_iteration_s(
        System(LLAMA8B, H100, DEP, EFF), cost, decode_seqs=64.0, decode_context=2100.0
    )
    step = speculative_decode(
        System(LLAMA8B, H100, DEP, EFF),
        batch_size=64.0,
        context_tokens=2100.0,
        draft_tokens=3.0,
        acceptance=0.7,
        draft_model=draft,
    )
    assert float(got) == pytest.approx(float(step.step_s), rel=1e-12)


@pytest.mark.parametrize(
    "k, a, probs",
    [
        (1.0, 0.5, {1: 0.5, 2: 0.5}),
        (2.0, 0.8, {1: 0.2, 2: 0.8 * 0.2, 3: 0.64}),
        (4.0, 0.6, {1: 0.4, 2: 0.24, 3: 0.144, 4: 0.0864, 5: 0.6**4}),
    ],
)
def test_tokens_per_step_moments_by_enumeration(k, a, probs):
    cost = DecodeCost(draft_tokens=k, acceptance=a, speculative=True)
    mean = sum(t * p for t, p in probs.items())
    var = sum(t * t * p for t, p in probs.items()) - mean**2
    assert float(cost.tokens_per_step()) == pytest.approx(mean, rel=1e-12)
    assert float(cost.tokens_per_step()) == pytest.approx(float(expected_tokens_per_step(a, k)))
    assert float(cost.tokens_per_step_var()) == pytest.approx(var, rel=1e-9)
    assert float(DecodeCost().tokens_per_step_var()) == 0.0


WORK = Workload(arrival_rate_per_s=2.0, prompt_tokens_mean=2000.0, output_tokens_mean=200.0)


def test_speculation_obeys_littles_law_in_tokens():
    # a request decodes (O - 1) / E iterations of gap E x TPOT: n_d = lambda (O - 1) TPOT
    spec = speculative_serving_metrics(
        System(LLAMA8B, H100, DEP, EFF), WORK, draft_tokens=2.0, acceptance=0.8
    )
    assert float(spec.tokens_per_step) == pytest.approx(2.44)
    little = 2.0 * 199.0 * float(spec.tpot_s.mean)
    # within 8 %: the running count's Little law adds the slot-feedback Jensen term
    # (``CORRECTIONS``' running_jensen_gain, fitted to the simulator) that the mean TPOT lacks
    assert float(spec.decode_batch) == pytest.approx(little, rel=0.08)
    # light load: against plain decoding TPOT falls by the speedup of one speculative step
    plain = serving_metrics(System(LLAMA8B, H100, DEP, EFF), WORK)
    step = speculative_decode(
        System(LLAMA8B, H100, DEP, EFF),
        batch_size=float(spec.decode_batch),
        context_tokens=2100.0,
        draft_tokens=2.0,
        acceptance=0.8,
    )
    ratio = float(spec.tpot_s.p50) / float(plain.tpot_s.p50)
    # within 12 %: under load the two runs' iterations also carry different prefill shares
    assert ratio == pytest.approx(1.0 / float(step.speedup), rel=0.12)


def test_prefix_cache_cuts_ttft_not_the_decode_kv_reads():
    none = prefix_serving_metrics(
        System(LLAMA8B, H100, DEP, EFF), WORK, shared_fraction=0.0, prefix_tokens=1536.0
    )
    shared = prefix_serving_metrics(
        System(LLAMA8B, H100, DEP, EFF), WORK, shared_fraction=0.9, prefix_tokens=1536.0
    )
    assert float(shared.ttft_s.p50) < 0.5 * float(none.ttft_s.p50)
    # decodes still read the whole 2000-token prompt: TPOT moves only by the shorter prefill
    # work landing in the decode gaps (a few per cent at this load)
    assert 0.85 * float(none.tpot_s.p50) < float(shared.tpot_s.p50) < float(none.tpot_s.p50)


def test_a_closed_loop_prefix_cache_is_judged_at_the_reference_rate():
    """A closed loop's request rate is the engine's own: its prefix hit rate is the open loop's
    at ``REUSE_REFERENCE_RATE_PER_S``, whatever arrival rate the workload carries; an open loop
    keeps its own rate (the LRU hit rate falls as other requests crowd the cache)."""
    kw = {"shared_fraction": 0.5, "prefix_tokens": 1536.0}
    closed = Workload(
        arrival_rate_per_s=7.0,
        prompt_tokens_mean=2000.0,
        output_tokens_mean=200.0,
        concurrency=16.0,
    )
    reference = Workload(
        arrival_rate_per_s=ft.REUSE_REFERENCE_RATE_PER_S,
        prompt_tokens_mean=2000.0,
        output_tokens_mean=200.0,
    )
    assert float(ft.reuse_rate_per_s(closed)) == ft.REUSE_REFERENCE_RATE_PER_S
    assert float(ft.reuse_rate_per_s(WORK)) == 2.0
    c_served, c_cost = ft.prefix_workload(System(LLAMA8B, H100, DEP, EFF), closed, **kw)
    r_served, r_cost = ft.prefix_workload(System(LLAMA8B, H100, DEP, EFF), reference, **kw)
    assert float(c_cost.cached_prompt_tokens) == float(r_cost.cached_prompt_tokens) > 0
    assert float(c_served.prompt_tokens_mean) == float(r_served.prompt_tokens_mean) < 2000.0
