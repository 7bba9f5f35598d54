"""The engines' fitted end-to-end offsets reach every answer the same way.

``Efficiency.ttft_scale`` / ``tpot_scale`` (e^delta of the end-to-end stage's TTFT / TPOT cells)
scale the load model's TTFT and TPOT/ITL in ``serving_metrics`` (both loops), the search model,
the disaggregated pools and the simulator's summary; E2E is their sum and a closed loop's
throughput follows Little's law.  Values are checked against the formulas, the draws against the
posterior's own cells.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import perfmodel as pm
from perfmodel import System
from perfmodel.dynamics import Workload, serving_metrics

MODEL = pm.load_model("meta-llama/Llama-3.1-8B")
H100 = pm.load_hardware("h100-sxm")
DEP = pm.Deployment(max_num_batched_tokens=8192.0, max_num_seqs=256.0)
SCALED = dataclasses.replace(pm.Efficiency(), ttft_scale=2.5, tpot_scale=0.8)


def _pct(p):
    return np.array([p.mean, p.p50, p.p90, p.p95, p.p99], dtype=float)


def test_serving_metrics_scale_ttft_and_tpot_and_compose_e2e():
    workload = Workload(concurrency=16.0, prompt_tokens_mean=1024.0, output_tokens_mean=512.0)
    base = serving_metrics(System(MODEL, H100, DEP, pm.Efficiency()), workload)
    got = serving_metrics(System(MODEL, H100, DEP, SCALED), workload)
    np.testing.assert_allclose(_pct(got.ttft_s), 2.5 * _pct(base.ttft_s), rtol=1e-12)
    np.testing.assert_allclose(_pct(got.tpot_s), 0.8 * _pct(base.tpot_s), rtol=1e-12)
    np.testing.assert_allclose(_pct(got.itl_s), 0.8 * _pct(base.itl_s), rtol=1e-12)
    # E2E = TTFT + (O - 1) TPOT: its mean is 2.5 TTFT + 0.8 (E2E - TTFT)
    ttft, e2e = float(base.ttft_s.mean), float(base.e2e_s.mean)
    ratio = (2.5 * ttft + 0.8 * (e2e - ttft)) / e2e
    np.testing.assert_allclose(_pct(got.e2e_s), ratio * _pct(base.e2e_s), rtol=1e-12)
    # N clients: X E[E2E] = N whatever the latencies, so tokens/s x E2E is unchanged
    assert float(got.output_tokens_per_s) * float(got.e2e_s.mean) == pytest.approx(
        float(base.output_tokens_per_s) * e2e, rel=1e-12
    )
    # the capacity verdicts are the physics'
    assert float(got.utilization) == float(base.utilization)
    # an open loop serves the offered rate: the same latencies, its throughput unchanged
    opened = pm.dynamics.engine_scaled(base, SCALED, closed_loop=False)
    np.testing.assert_allclose(_pct(opened.ttft_s), _pct(got.ttft_s), rtol=1e-12)
    assert float(opened.output_tokens_per_s) == float(base.output_tokens_per_s)


def test_unit_scales_are_the_physics():
    w = Workload(concurrency=8.0, prompt_tokens_mean=2048.0, output_tokens_mean=128.0)
    base = serving_metrics(System(MODEL, H100, DEP, pm.Efficiency()), w)
    same = pm.dynamics.engine_scaled(base, pm.Efficiency(), closed_loop=True)
    for field in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        np.testing.assert_array_equal(_pct(getattr(same, field)), _pct(getattr(base, field)))
    assert float(same.output_tokens_per_s) == float(base.output_tokens_per_s)


def test_search_model_scales_as_the_verdict_model():
    from optimize._metrics import slo_metrics

    w = Workload(arrival_rate_per_s=6.0, prompt_tokens_mean=1500.0, output_tokens_mean=300.0)
    base = slo_metrics(System(MODEL, H100, DEP, pm.Efficiency()), w)
    got = slo_metrics(System(MODEL, H100, DEP, SCALED), w)
    np.testing.assert_allclose(got.ttft_quantiles_s, 2.5 * np.asarray(base.ttft_quantiles_s))
    np.testing.assert_allclose(got.tpot_quantiles_s, 0.8 * np.asarray(base.tpot_quantiles_s))
    np.testing.assert_allclose(got.itl_quantiles_s, 0.8 * np.asarray(base.itl_quantiles_s))
    assert float(got.utilization) == float(base.utilization)


def test_split_pools_take_the_prefill_ttft_and_the_decode_tpot_scale():
    w = Workload(arrival_rate_per_s=2.0, prompt_tokens_mean=4096.0, output_tokens_mean=256.0)
    pre = dataclasses.replace(pm.Efficiency(), ttft_scale=3.0, tpot_scale=7.0)
    dec = dataclasses.replace(pm.Efficiency(), ttft_scale=5.0, tpot_scale=0.5)

    def split(p, d):
        return pm.features.split_serving(
            w, prefill=System(MODEL, H100, DEP, p), decode=System(MODEL, H100, DEP, d)
        )

    base, got = split(pm.Efficiency(), pm.Efficiency()), split(pre, dec)
    np.testing.assert_allclose(_pct(got.ttft_s), 3.0 * _pct(base.ttft_s), rtol=1e-12)
    np.testing.assert_allclose(_pct(got.tpot_s), 0.5 * _pct(base.tpot_s), rtol=1e-12)


def test_split_search_model_takes_the_same_pool_scales():
    """The search's split model (``optimize._split``) prices the pools as the verdict model
    does: the prefill pool's TTFT scale on the first token, the decode pool's TPOT scale on the
    gaps; the capacity verdicts stay the physics'."""
    from optimize._split import split_slo_metrics

    w = Workload(arrival_rate_per_s=2.0, prompt_tokens_mean=4096.0, output_tokens_mean=256.0)
    pre = dataclasses.replace(pm.Efficiency(), ttft_scale=3.0, tpot_scale=7.0)
    dec = dataclasses.replace(pm.Efficiency(), ttft_scale=5.0, tpot_scale=0.5)

    def split(p, d):
        return split_slo_metrics(System(MODEL, H100, DEP, p), System(MODEL, H100, DEP, d), w)

    base, got = split(pm.Efficiency(), pm.Efficiency()), split(pre, dec)
    np.testing.assert_allclose(got.ttft_quantiles_s, 3.0 * np.asarray(base.ttft_quantiles_s))
    np.testing.assert_allclose(got.tpot_quantiles_s, 0.5 * np.asarray(base.tpot_quantiles_s))
    assert float(got.utilization) == float(base.utilization)


def test_simulator_summary_scales_each_request():
    from perfmodel.simulator import SimResult, summarize

    n = 40
    arrival = np.arange(n, dtype=float)
    first = arrival + 0.2
    finish = first + 0.01 * 99  # 100 output tokens, 10 ms apart
    res = SimResult(
        arrival_s=arrival,
        first_token_s=first,
        finish_s=finish,
        prompt_tokens=np.full(n, 512),
        output_tokens=np.full(n, 100),
        preemptions=np.zeros(n, np.int64),
        iterations=100 * n,
        busy_s=float(n),
        makespan_s=float(n),
        replicas=1,
        mean_decode_batch=1.0,
    )
    s = summarize(res, ttft_scale=3.0, tpot_scale=0.5)
    assert s["ttft_s"]["p95"] == pytest.approx(0.6)
    assert s["tpot_s"]["p50"] == pytest.approx(0.005)
    assert s["e2e_s"]["mean"] == pytest.approx(0.6 + 0.5 * 0.99)
    assert s["output_tokens_per_s"] == summarize(res)["output_tokens_per_s"]


@pytest.fixture(scope="module")
def posterior():
    import fitting

    return fitting.load_posterior(None)


def test_efficiency_draws_carry_the_pooled_engine_offsets(posterior):
    """The draws are e^delta of the end-to-end stage's cell: the engine's pooled one with
    ``engine``, the any-engine one without, a source's own when it was fitted; 1 without an
    end-to-end stage and under the prior."""
    import fitting
    from fitting._posterior import ENGINE_PREFIX, draw_indices
    from optimize import efficiency_draws_for

    def cell(name):
        return posterior.flat("cell_offset")[:, posterior.cells.index(name)]

    n, seed = 64, 3
    idx = draw_indices(posterior, n, np.random.default_rng(seed))
    for engine, key in ((None, "*"), ("sglang", "sglang"), ("vllm", "vllm")):
        e = fitting.efficiency_draws(posterior, "h100-sxm", n, seed=seed, engine=engine)
        ttft = cell(f"{ENGINE_PREFIX}{key}|serving:ttft")[idx]
        tpot = cell(f"{ENGINE_PREFIX}{key}|serving:tpot")[idx]
        np.testing.assert_allclose(np.asarray(e.ttft_scale), np.exp(ttft))
        np.testing.assert_allclose(np.asarray(e.tpot_scale), np.exp(tpot))
    own = fitting.efficiency_draws(posterior, "h100-sxm", n, seed=seed, source="inferencemax:vllm")
    np.testing.assert_allclose(
        np.asarray(own.ttft_scale), np.exp(cell("inferencemax:vllm|serving:ttft")[idx])
    )
    # measured closed-loop TTFT is well above the physics in every engine
    assert np.median(np.asarray(own.ttft_scale)) > 1.5

    from fitting._serving_stage import without_serving_stage

    bare = fitting.Posterior(without_serving_stage(posterior.idata))
    e = fitting.efficiency_draws(bare, "h100-sxm", 8, seed=seed)
    assert np.all(np.asarray(e.ttft_scale) == 1.0) and np.all(np.asarray(e.tpot_scale) == 1.0)
    prior = efficiency_draws_for(("h100-sxm", "l40s"), 8, posterior=None)
    assert np.all(np.asarray(prior.ttft_scale) == 1.0) and prior.ttft_scale.shape == (2, 8)


def test_bundled_host_overhead_is_the_profiled_one_for_every_gpu(posterior):
    """The bundled file's per-iteration host overhead is the value its cut stage profiled (its
    attributes), the same for every GPU fitted and for one never fitted (B200), inside the
    profile's grid, and its profile peaks there."""
    import fitting
    from fitting._serving_stage import OVERHEAD_GRID_S

    g = float(posterior.idata.attrs["serving_step_overhead_s"])
    assert OVERHEAD_GRID_S[0] <= g <= OVERHEAD_GRID_S[-1]
    assert np.all(posterior.flat("step_overhead_s") == g)
    unseen = fitting.efficiency_draws(posterior, "b200", 16, seed=0)
    np.testing.assert_allclose(np.asarray(unseen.step_overhead_s), g)
    profile = {
        float(k.removesuffix("ms")) * 1e-3: float(v)
        for k, v in (
            item.split(":") for item in posterior.idata.attrs["serving_overhead_profile"].split()
        )
    }
    best = max(profile, key=profile.get)
    assert abs(np.log(best / g)) <= 0.5 * np.log(2.0) + 1e-9


def test_explain_reports_the_engine_offsets_and_p95_intervals(capsys):
    """explain under load: the median scales of the engine asked for, TTFT/TPOT at those scales
    (SGLang's measured TTFT is further above the physics than vLLM's: its TTFT is as much
    above vLLM's), 90 % intervals of each
    p95 that contain it (spec-sheet defaults keep scales of 1:
    ``test_efficiency_draws_carry_the_pooled_engine_offsets``)."""
    import json

    from servingmath.cli import main

    base = [
        "explain",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--gpu",
        "h100-sxm",
        "--concurrency",
        "8",
        "--input-len",
        "1024",
        "--output-len",
        "128",
        "--output-cv",
        "0.1",  # lengths spread: a desynchronised loop, whose TTFT scales these are
        "--json",
    ]

    def run(*extra):
        assert main([*base, *extra]) == 0
        return json.loads(capsys.readouterr().out)

    vllm, sglang = run("--engine", "vllm"), run("--engine", "sglang")
    assert vllm["engine_scales"]["engine"] == "vllm"
    assert sglang["engine_scales"]["ttft"] > vllm["engine_scales"]["ttft"] > 1.5
    # the same physics (explain's desynchronised loop) at each engine's scale
    ratio = sglang["ttft_s"]["mean"] / vllm["ttft_s"]["mean"]
    scales = sglang["engine_scales"]["ttft"] / vllm["engine_scales"]["ttft"]
    assert ratio == pytest.approx(scales, rel=0.1)
    for out in (vllm, sglang):
        for k in ("ttft_s", "tpot_s"):
            lo, hi = out["p95_intervals"][k]["p05"], out["p95_intervals"][k]["p95"]
            assert lo < hi
        assert (
            out["p95_intervals"]["ttft_s"]["p05"]
            < out["ttft_s"]["p95"]
            < out["p95_intervals"]["ttft_s"]["p95"]
        )


def test_simulate_reports_the_scales_explain_applies(capsys):
    import json

    from servingmath.cli import main

    argv = ["--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100-sxm", "--engine", "trtllm"]
    load = ["--concurrency", "4", "--input-len", "512", "--output-len", "32"]
    assert main(["simulate", *argv, *load, "--requests", "40", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert main(["explain", *argv, *load, "--json"]) == 0
    exp = json.loads(capsys.readouterr().out)
    assert sim["engine_scales"] == exp["engine_scales"]
    assert sim["engine_scales"]["engine"] == "trtllm" and sim["engine_scales"]["ttft"] > 1.5
