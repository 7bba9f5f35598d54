"""The continuous-batching simulator: determinism, conservation laws, KV limits, and agreement
with the closed forms on a small grid."""

import numpy as np
import pytest

from perfmodel import Deployment, Efficiency, System, kv_capacity_tokens, load_hardware, load_model
from perfmodel.dynamics import Trace, Workload, serving_metrics
from perfmodel.simulator import EngineHooks, simulate, summarize

MODEL = load_model("meta-llama/Llama-3.1-8B")
GPU = load_hardware("h100-sxm")
DEP = Deployment.create(tp=1)
EFF = Efficiency()


def _workload(rate, prompt_cv=1.0):
    return Workload(
        arrival_rate_per_s=rate,
        prompt_tokens_mean=1000.0,
        prompt_tokens_cv=prompt_cv,
        output_tokens_mean=200.0,
        output_tokens_cv=0.5,
    )


def test_deterministic_for_a_seed_and_different_across_seeds():
    a = simulate(System(MODEL, GPU, DEP, EFF), _workload(10.0), num_requests=300, seed=7)
    b = simulate(System(MODEL, GPU, DEP, EFF), _workload(10.0), num_requests=300, seed=7)
    c = simulate(System(MODEL, GPU, DEP, EFF), _workload(10.0), num_requests=300, seed=8)
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    assert not np.array_equal(a.finish_s, c.finish_s)


@pytest.mark.parametrize("chunked", [True, False])
def test_records_are_causal_and_complete(chunked):
    r = simulate(
        System(MODEL, GPU, DEP, EFF),
        _workload(15.0),
        num_requests=400,
        seed=1,
        chunked_prefill=chunked,
    )
    assert np.isfinite(r.finish_s).all()
    assert (r.first_token_s >= r.arrival_s).all() and (r.finish_s >= r.first_token_s).all()
    # one-token outputs finish with their first token
    one = r.output_tokens == 1
    np.testing.assert_array_equal(r.finish_s[one], r.first_token_s[one])


def test_littles_law_for_the_decode_batch():
    # chunked, no preemption: a request decodes in every iteration between its first token and
    # its finish, so sum(decode batch x iteration time) = sum over requests of (finish - first)
    # (a prompt over max_model_len is rejected at arrival and never decodes)
    r = simulate(System(MODEL, GPU, DEP, EFF), _workload(20.0), num_requests=500, seed=2)
    assert r.preemptions.sum() == 0
    served = ~r.rejected
    assert r.decode_area_s == pytest.approx(
        float(np.sum((r.finish_s - r.first_token_s)[served])), rel=1e-9
    )


def test_single_request_matches_step_times():
    # one request alone: TTFT = one prefill iteration, then O - 1 decode iterations
    from perfmodel import forward_step

    trace = Trace([0.0], [512], [4])
    r = simulate(System(MODEL, GPU, DEP, EFF), trace)
    prefill = float(
        forward_step(
            System(MODEL, GPU, DEP, EFF), prefill_tokens=512.0, prefill_seqs=1.0, decode_seqs=0.0
        ).total_s
    )
    decodes = sum(
        float(
            forward_step(
                System(MODEL, GPU, DEP, EFF), decode_seqs=1.0, decode_context=512.0 + k
            ).total_s
        )
        for k in range(3)
    )
    assert r.ttft_s[0] == pytest.approx(prefill, rel=1e-6)
    assert r.e2e_s[0] == pytest.approx(prefill + decodes, rel=1e-6)


def test_scarce_kv_preempts_and_still_finishes():
    # leave room for ~5000 KV tokens (~4 sequences): decodes run out of blocks and recompute
    from perfmodel import kv_bytes_per_token_per_gpu, weight_bytes_per_gpu, workspace_bytes_per_gpu

    need = float(
        weight_bytes_per_gpu(MODEL, DEP)
        + workspace_bytes_per_gpu(MODEL, DEP)
        + 5000 * kv_bytes_per_token_per_gpu(MODEL, DEP)
    )
    tight = Deployment.create(tp=1, gpu_memory_utilization=need / float(GPU.hbm_bytes))
    cap = float(kv_capacity_tokens(MODEL, GPU, tight))
    assert cap == pytest.approx(5000.0, rel=1e-6)
    r = simulate(System(MODEL, GPU, tight, EFF), _workload(20.0, 0.5), num_requests=200, seed=3)
    assert r.preemptions.sum() > 0
    assert np.isfinite(r.finish_s).all()


def test_closed_loop_keeps_n_in_flight():
    n = 16
    r = simulate(
        System(MODEL, GPU, DEP, EFF),
        Workload(concurrency=float(n), prompt_tokens_mean=500.0, output_tokens_mean=100.0),
        num_requests=300,
        seed=4,
    )
    # Little's law over the run: time-average in flight = sum of sojourns / makespan = N
    # (exact up to the ramp-down once fewer than N remain)
    in_flight = float(np.sum(r.e2e_s)) / r.makespan_s
    assert in_flight == pytest.approx(n, rel=0.06)


def test_prefix_hook_skips_prefill_work():
    trace = Trace([0.0], [2048], [2])
    plain = simulate(System(MODEL, GPU, DEP, EFF), trace)
    cached = simulate(
        System(MODEL, GPU, DEP, EFF),
        trace,
        hooks=EngineHooks(cached_prefix_tokens=lambda rid, p: 2000),
    )
    assert cached.ttft_s[0] < 0.5 * plain.ttft_s[0]


def test_chunked_prefill_protects_short_requests_behind_long_ones():
    # seed behaviour: a stream of short prompts with a few giant ones
    rng = np.random.default_rng(5)
    n = 600
    prompts = np.where(rng.random(n) < 0.05, 6000, 100)
    arrivals = np.cumsum(rng.exponential(1 / 8.0, n))
    trace = Trace(arrivals - arrivals[0], prompts, np.full(n, 100))
    dep = Deployment.create(tp=1, max_num_batched_tokens=8192.0)
    short = prompts == 100
    ttft, tpot = {}, {}
    for chunked in (True, False):
        r = simulate(
            System(MODEL, GPU, dep, EFF),
            trace,
            chunked_prefill=chunked,
            chunk_tokens=512 if chunked else None,
        )
        ttft[chunked] = np.percentile(r.ttft_s[short], 95)
        tpot[chunked] = np.percentile(r.tpot_s[short], 95)
    assert ttft[True] < ttft[False]
    assert tpot[True] < tpot[False]


# small grid: closed form vs simulator (the full grid is benchmarks/bench_queueing_vs_sim.py)
@pytest.mark.parametrize(
    "rate, cv, chunked", [(5.0, 1.0, True), (12.0, 0.5, True), (8.0, 1.0, False)]
)
def test_closed_form_agrees_with_simulator_small_grid(rate, cv, chunked):
    w = _workload(rate, cv)
    sim = summarize(
        simulate(
            System(MODEL, GPU, DEP, EFF), w, num_requests=2500, seed=11, chunked_prefill=chunked
        )
    )
    cf = serving_metrics(System(MODEL, GPU, DEP, EFF), w, chunked_prefill=chunked)
    assert bool(cf.stable)
    for key, got in (("ttft_s", cf.ttft_s), ("tpot_s", cf.tpot_s)):
        for q in ("p50", "p95"):
            assert float(getattr(got, q)) == pytest.approx(sim[key][q], rel=0.2), (key, q)


def test_max_model_len_rejects_and_caps_like_vllm():
    from perfmodel.simulator import length_limits

    served, rejected = length_limits([100, 5000, 300, 1024, 1023], [50, 50, 900, 10, 10], 1024)
    # 5000 > 1024 rejected; 300 + 900 stops at 1024 (724 out); a full-length prompt still gets
    # the one token its prefill samples
    np.testing.assert_array_equal(rejected, [False, True, False, False, False])
    np.testing.assert_array_equal(served, [50, 0, 724, 1, 1])
    dep = Deployment.create(tp=1, max_model_len=1024.0)
    r = simulate(
        System(MODEL, GPU, dep, EFF), Trace([0.0, 0.1, 0.2], [100, 5000, 300], [50, 50, 900])
    )
    np.testing.assert_array_equal(r.rejected, [False, True, False])
    assert np.isnan(r.finish_s[1]) and np.isfinite(r.finish_s[[0, 2]]).all()
    np.testing.assert_array_equal(r.output_tokens, [50, 0, 724])
    s = summarize(r)
    assert s["rejected"] == 1 and np.isfinite(s["ttft_s"]["p95"])
    # closed loop: a rejected request frees its slot at once, the rest still run
    c = simulate(
        System(MODEL, GPU, dep, EFF),
        Trace([0.0] * 4, [5000, 100, 5000, 100], [5, 5, 5, 5]),
        concurrency=1,
    )
    assert c.num_rejected == 2 and np.isfinite(c.finish_s[[1, 3]]).all()


def test_cached_prefix_blocks_are_shared_not_copied():
    # ~5000 KV tokens hold two 2048-token prompts: the third waits for one to finish its 200
    # tokens; with a cached 1536-token shared prefix each holds only its own ~700 tokens (vLLM
    # references the prefix blocks) and all six run at once
    from perfmodel import (
        forward_step,
        kv_bytes_per_token_per_gpu,
        weight_bytes_per_gpu,
        workspace_bytes_per_gpu,
    )
    from perfmodel.simulator import PrefixCaching, synthetic_prefix_hashes

    need = float(
        weight_bytes_per_gpu(MODEL, DEP)
        + workspace_bytes_per_gpu(MODEL, DEP)
        + 5000 * kv_bytes_per_token_per_gpu(MODEL, DEP)
    )
    tight = Deployment.create(tp=1, gpu_memory_utilization=need / float(GPU.hbm_bytes))
    prompt = np.full(6, 2048)
    trace = Trace(np.arange(6) * 0.01, prompt, np.full(6, 200))
    plain = simulate(System(MODEL, GPU, tight, EFF), trace)
    hashes = synthetic_prefix_hashes(prompt, np.ones(6, bool), 1536, 16)
    shared = simulate(
        System(MODEL, GPU, tight, EFF), trace, prefix=PrefixCaching(hashes, 16, 10**6)
    )
    decode_200 = 199 * float(
        forward_step(System(MODEL, GPU, tight, EFF), decode_seqs=2.0, decode_context=2100.0).total_s
    )
    assert plain.first_token_s[2] > decode_200
    assert shared.first_token_s[2] < 0.2 * decode_200 and shared.preemptions.sum() == 0
    np.testing.assert_array_equal(shared.reused_tokens, [0] + [1536] * 5)


def test_synthetic_prefix_hit_rate_counts_only_the_common_prefix_blocks():
    """Block 16, a 64-token common prefix: request 0 (shared, 100-token prompt) can reuse 4
    blocks = 64 tokens; request 1 (shared, 40-token prompt: 2 full blocks) at most 32 tokens;
    request 2 is unique.  Reused 64 + 10 of reusable 64 + 32 -> 74 / 96."""
    from perfmodel.simulator import (
        PrefixCaching,
        synthetic_prefix_hashes,
        synthetic_prefix_hit_rate,
        synthetic_shared_requests,
    )

    prompts = np.array([100, 40, 80])
    hashes = synthetic_prefix_hashes(prompts, np.array([True, True, False]), 64, 16)
    prefix = PrefixCaching(hashes, 16)
    served = np.array([True, True, True])
    reused = np.array([80.0, 10.0, 16.0])  # request 0 over-reports: counted up to 64
    assert synthetic_prefix_hit_rate(prefix, prompts, reused, served) == pytest.approx(74 / 96)
    assert synthetic_shared_requests(prefix) == 2
    # a rejected request reuses nothing and has nothing reusable
    served = np.array([True, False, True])
    reused = np.array([64.0, 0.0, 0.0])
    assert synthetic_prefix_hit_rate(prefix, prompts, reused, served) == pytest.approx(1.0)
    none = PrefixCaching(synthetic_prefix_hashes(prompts, np.zeros(3, bool), 64, 16), 16)
    assert synthetic_prefix_hit_rate(none, prompts, reused, served) == 0.0


def test_the_iteration_hook_sees_every_iteration_and_changes_no_time():
    # the hook prices every iteration one by one (no decode fast-forward): the same request
    # times as the fast-forwarded run, its iterations counted, its seconds summing to the busy
    # time, and (chunked, no preemption) every served prompt token prefilled exactly once
    log = []
    hooks = EngineHooks(iteration=lambda p_tok, d_seq, dt: log.append((p_tok, d_seq, dt)))
    plain = simulate(System(MODEL, GPU, DEP, EFF), _workload(10.0), num_requests=300, seed=3)
    seen = simulate(
        System(MODEL, GPU, DEP, EFF), _workload(10.0), num_requests=300, seed=3, hooks=hooks
    )
    np.testing.assert_allclose(seen.first_token_s, plain.first_token_s, rtol=1e-12)
    np.testing.assert_allclose(seen.finish_s, plain.finish_s, rtol=1e-12)
    it = np.asarray(log)
    assert len(it) == seen.iterations == plain.iterations
    assert it[:, 2].sum() == pytest.approx(seen.busy_s, rel=1e-12)
    assert seen.preemptions.sum() == 0
    assert it[:, 0].sum() == seen.prompt_tokens[~seen.rejected].sum()
    # decode sequences per iteration summed = the decode-batch total the gaps keep
    assert it[:, 1].sum() == pytest.approx(float(seen.decode_gaps.sequences.sum()))
