"""Closed-form queueing against the simulator near saturation (issue 3, item 5), on a few points.

The full grid is ``benchmarks/bench_queueing_vs_sim.py`` (120 points, 10,000 requests each).
Here 2,000 requests a point keep the test to seconds, so each tolerance is the grid's 15 % target
plus the seed-to-seed spread of the simulator's own percentile at that size, measured over seeds
0-5 on these points (half-range around the median): TPOT p50/p95 within +-11 % at utilisation
0.7 and 0.9, TTFT p95 within +-22 % at 0.7; at 0.9 the simulated TTFT p95 spans 0.27-0.93 s
(chunked) and 0.10-1.05 s (unchunked) across seeds, so there only its order of magnitude is
checkable at this size.  The chunked TTFT tail (the fitted ``CORRECTIONS``) is checked without
simulating, against recorded held-out simulator percentiles (seed 7; the terms were fitted on 0).
"""

import jax
import numpy as np
import pytest

from perfmodel import Deployment, Efficiency, load_hardware, load_model
from perfmodel.dynamics import Workload, serving_metrics
from perfmodel.simulator import simulate, summarize

jax.config.update("jax_enable_x64", True)

MODEL = load_model("meta-llama/Llama-3.1-8B")
GPU = load_hardware("h100-sxm")
DEP = Deployment.create(tp=1, max_num_batched_tokens=2048.0)
EFF = Efficiency()
REQUESTS, SEED = 2000, 3
TPOT_REL = 0.15 + 0.11  # target + simulator seed spread at 2,000 requests
TTFT_REL = 0.15 + 0.22


def _workload(rate, cv):
    return Workload(
        arrival_rate_per_s=rate,
        prompt_tokens_mean=1000.0,
        prompt_tokens_cv=cv,
        output_tokens_mean=200.0,
        output_tokens_cv=0.5,
    )


# (chunked, prompt cv, rate, closed-form utilisation at that rate)
POINTS = [
    (True, 1.0, 27.85, 0.7),
    (True, 1.0, 35.06, 0.9),
    (False, 1.0, 23.43, 0.7),
    (False, 0.3, 26.22, 0.9),
]


@pytest.mark.parametrize("chunked, cv, rate, util", POINTS)
def test_closed_form_tracks_simulator_up_to_utilisation_0p9(chunked, cv, rate, util):
    w = _workload(rate, cv)
    cf = serving_metrics(MODEL, GPU, DEP, EFF, w, chunked_prefill=chunked)
    assert bool(cf.stable)
    assert float(cf.utilization) == pytest.approx(util, abs=0.02)
    sim = summarize(
        simulate(MODEL, GPU, DEP, EFF, w, num_requests=REQUESTS, seed=SEED, chunked_prefill=chunked)
    )
    for q in ("p50", "p95"):
        assert float(getattr(cf.tpot_s, q)) == pytest.approx(sim["tpot_s"][q], rel=TPOT_REL), q
    if util <= 0.7:
        assert float(cf.ttft_s.p95) == pytest.approx(sim["ttft_s"]["p95"], rel=TTFT_REL)
    else:  # the simulator's own p95 spreads over a factor 3-10 between seeds here
        assert 0.1 < float(cf.ttft_s.p95) / sim["ttft_s"]["p95"] < 10.0


def test_mean_gap_with_long_prompts_tracks_simulator():
    # chunked, budget 16384, prompt CV 2 at utilisation 0.7: the mean gap a decode waits (mean
    # TPOT) needs the decode context biased to long outputs, attention priced at the
    # token-weighted prompt and carrying iterations that gather the prompts arriving behind
    # them (the Poisson share of carrying iterations left it 19 % short)
    dep = Deployment.create(tp=1, max_num_batched_tokens=16384.0)
    w = _workload(31.34, 2.0)
    cf = serving_metrics(MODEL, GPU, dep, EFF, w)
    sim = summarize(simulate(MODEL, GPU, dep, EFF, w, num_requests=10000, seed=0))
    assert float(cf.tpot_s.mean) == pytest.approx(sim["tpot_s"]["mean"], rel=0.15)


def test_small_budget_caps_the_tpot_tail():
    # chunked with budget 512 at utilisation 0.9 (Llama-2-70B TP4): with a prefill backlog every
    # iteration carries one full budget, so no request's mean gap exceeds that iteration's time
    # and the simulated p95 sits at it (100-101 ms over seeds 0-3 at 3,000 requests, while p50
    # spreads 70-100 ms); the compound-Poisson stall variance alone put p95 at +39 %
    model, gpu = load_model("meta-llama/Llama-2-70b-hf"), load_hardware("a100-sxm-80gb")
    dep = Deployment.create(tp=4, max_num_batched_tokens=512.0)
    w = _workload(4.41, 2.0)
    cf = serving_metrics(model, gpu, dep, EFF, w)
    assert float(cf.utilization) == pytest.approx(0.9, abs=0.02)
    sim = summarize(simulate(model, gpu, dep, EFF, w, num_requests=REQUESTS, seed=SEED))
    assert float(cf.tpot_s.p95) == pytest.approx(sim["tpot_s"]["p95"], rel=0.15)


def test_slot_utilisation_reaches_one_where_the_slots_saturate():
    # unchunked, the running slots bind first: just past the closed form's utilisation 1 the
    # simulated queue grows without bound (TTFT of late arrivals far above early ones)
    def late_over_early(rate):
        r = simulate(
            MODEL,
            GPU,
            DEP,
            EFF,
            _workload(rate, 1.0),
            num_requests=REQUESTS,
            seed=SEED,
            chunked_prefill=False,
        )
        ttft = r.ttft_s
        return np.nanmean(ttft[-300:]) / np.nanmean(ttft[200:500])

    over = 28.6
    assert (
        float(
            serving_metrics(
                MODEL, GPU, DEP, EFF, _workload(over, 1.0), chunked_prefill=False
            ).utilization
        )
        > 1.0
    )
    assert late_over_early(over) > 10.0


# Held-out simulator p95 TTFT (s): the agreement grid's fresh run with seed 7 (10,000 requests a
# point at utilisation 0.5/0.7, ``bench_queueing_vs_sim.py --utilizations 0.2 0.5 0.7 --seed 7``;
# 160,000 at 0.9, ``--utilizations 0.9 --requests 160000 --seed 7``); ``CORRECTIONS`` were fitted
# on seed 0.  Chunked points where the physical model alone was 16-23 % low, and the 70B 16384
# points at 0.9 that a full budget's packing of B / E[P] prompts put 14-17 % low (model, budget,
# prompt cv, rate, simulated p95 TTFT).
HELD_OUT = [
    ("meta-llama/Llama-3.1-8B", "h100-sxm", 1, 16384.0, 2.0, 31.337395, 0.2188),
    ("meta-llama/Llama-2-70b-hf", "a100-sxm-80gb", 4, 16384.0, 1.0, 3.370409, 1.4013),
    ("meta-llama/Llama-2-70b-hf", "a100-sxm-80gb", 4, 16384.0, 2.0, 3.795116, 1.7992),
    ("meta-llama/Llama-2-70b-hf", "a100-sxm-80gb", 4, 16384.0, 2.0, 2.710797, 1.2231),
    ("meta-llama/Llama-2-70b-hf", "a100-sxm-80gb", 4, 16384.0, 0.3, 4.271421, 1.5682),
    ("meta-llama/Llama-2-70b-hf", "a100-sxm-80gb", 4, 16384.0, 1.0, 4.333383, 2.6267),
    ("meta-llama/Llama-2-70b-hf", "a100-sxm-80gb", 4, 16384.0, 2.0, 4.879434, 3.1789),
]


@pytest.mark.parametrize("model, gpu, tp, budget, cv, rate, sim_p95", HELD_OUT)
def test_chunked_ttft_tail_on_held_out_simulations(model, gpu, tp, budget, cv, rate, sim_p95):
    # no simulation here: the closed form against recorded held-out percentiles (15 % target)
    dep = Deployment.create(tp=tp, max_num_batched_tokens=budget)
    cf = serving_metrics(load_model(model), load_hardware(gpu), dep, EFF, _workload(rate, cv))
    assert float(cf.ttft_s.p95) == pytest.approx(sim_p95, rel=0.15)


def test_chunked_budget_packs_several_prompts():
    # a backlogged 16384-token chunked budget packs the 1000-token prompts present, not one
    # 16k-token sequence (quadratic attention): the simulated p95 TTFT at budgets 2048 and 16384 differ by
    # 4 % (0.180 / 0.172 s, seed 7, utilisation 0.7); pricing the budget as one sequence put the
    # closed form's 16384 point 23 % above its 2048 point
    w = _workload(27.85, 1.0)
    p95 = [
        float(
            serving_metrics(
                MODEL, GPU, Deployment.create(tp=1, max_num_batched_tokens=b), EFF, w
            ).ttft_s.p95
        )
        for b in (2048.0, 16384.0)
    ]
    assert p95[1] == pytest.approx(p95[0], rel=0.15)


# Llama-3.1-8B chunked at budget 16384, utilisation 0.9: the decode batch runs within ~45 of its
# 256 seats, where the p95 TTFT is the seat wait.  Simulated p95 (s) averaged over six seeds
# (7, 8, 9, 11, 12, 13) of 160,000 requests each (``--utilizations 0.9 --requests 160000
# --seed S``; one seed alone ranges 0.44-0.70, 0.94-1.46 and 1.61-4.28 s).  Before the entry/stall
# cross term in the running count's variance, Little's law at the requests' own mean gaps and the
# chunked clump exponent (BENCHMARKS round 8), the closed form was 36-58 % low here (prompt cv,
# rate, pooled simulated p95 TTFT).
SATURATING = [
    (0.3, 33.979848, 0.56984),
    (1.0, 33.925405, 1.31865),
    (2.0, 37.731115, 2.41566),
]


@pytest.mark.parametrize("cv, rate, sim_p95", SATURATING)
def test_ttft_tail_near_saturated_seats_within_the_40_percent_bound(cv, rate, sim_p95):
    dep = Deployment.create(tp=1, max_num_batched_tokens=16384.0)
    cf = serving_metrics(MODEL, GPU, dep, EFF, _workload(rate, cv))
    assert float(cf.ttft_s.p95) == pytest.approx(sim_p95, rel=0.40)


# Llama-2-70B on four A100s, unchunked at budget 2048, utilisation 0.9: the decode batch (~120)
# sits just past the roofline's kink (decode turns compute-bound near 105 sequences), so the
# running count's restoring force weakens towards the 256 seats and they fill more often than a
# Gaussian says.  Simulated p95 TTFT (s) averaged over eight seeds (7, 8, 9, 11, 12, 13, 14, 15)
# of 160,000 requests each (one seed alone: 1.82-3.37 and 4.08-6.02 s; eight further seeds give
# 2.44 and 5.27).  With the restoring force frozen at the mean (before BENCHMARKS round 9) the
# closed form was 42 and 40 % low (prompt cv, rate, pooled simulated p95 TTFT).
PAST_THE_KINK = [
    (0.3, 4.271421, 2.53445),
    (1.0, 4.333383, 5.30259),
]


@pytest.mark.parametrize("cv, rate, sim_p95", PAST_THE_KINK)
def test_ttft_tail_past_the_roofline_kink_within_the_40_percent_bound(cv, rate, sim_p95):
    model, gpu = load_model("meta-llama/Llama-2-70b-hf"), load_hardware("a100-sxm-80gb")
    dep = Deployment.create(tp=4, max_num_batched_tokens=2048.0)
    cf = serving_metrics(model, gpu, dep, EFF, _workload(rate, cv), chunked_prefill=False)
    assert float(cf.ttft_s.p95) == pytest.approx(sim_p95, rel=0.40)


# The same pair and load, p95 TPOT (s; the eight seeds' mean, one seed within +-4 %).  The decode
# batch's spread straddles the kink, so a request's gaps see the gain averaged over it: with the
# gain frozen at the mean (0.56 at budget 2048, just past the kink; 0.21 at 16384, just below it)
# the closed form was 25 and 29 % high at 2048 and 21 % low at 16384 (budget, prompt cv, rate,
# pooled simulated p95 TPOT).
PAST_THE_KINK_TPOT = [
    (2048.0, 0.3, 4.271421, 0.29285),
    (2048.0, 1.0, 4.333383, 0.30938),
    (16384.0, 0.3, 4.271421, 0.27351),
]


@pytest.mark.parametrize("budget, cv, rate, sim_p95", PAST_THE_KINK_TPOT)
def test_tpot_tail_across_the_roofline_kink(budget, cv, rate, sim_p95):
    model, gpu = load_model("meta-llama/Llama-2-70b-hf"), load_hardware("a100-sxm-80gb")
    dep = Deployment.create(tp=4, max_num_batched_tokens=budget)
    cf = serving_metrics(model, gpu, dep, EFF, _workload(rate, cv), chunked_prefill=False)
    assert float(cf.tpot_s.p95) == pytest.approx(sim_p95, rel=0.15)
