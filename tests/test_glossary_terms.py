"""The README glossary's words hold their one meaning wherever they are reported.

``utilization`` (offered load over capacity), ``stable`` (the queue stays finite),
``seat_occupancy`` (running sequences over seats), ``binding_budget`` (the budget that limits
capacity, load or no load) and KV-bound (the cache caps the seats and this load fills them),
checked against numbers derived by hand from the model's own formulas, and the simulator's
``stable`` against runs whose queue is known to hold or to grow.
"""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import perfmodel as pm
from perfmodel import System
from perfmodel._verdicts import verdicts
from perfmodel.dynamics import KV_BOUND_OCCUPANCY, Workload, serving_metrics
from perfmodel.simulator import (
    STABLE_GROWTH_SHARE,
    SimResult,
    backlog_growth_share,
    queue_stable,
    summarize,
)

MODEL = pm.load_model("meta-llama/Llama-3.1-8B")
GPU = pm.load_hardware("h100-sxm")
DEP = pm.Deployment.create()
EFF = pm.Efficiency()


def _open(rate, prompt=1000.0, output=500.0, deployment=DEP):
    w = Workload(
        arrival_rate_per_s=jnp.asarray(float(rate)),
        prompt_tokens_mean=jnp.asarray(prompt),
        output_tokens_mean=jnp.asarray(output),
    )
    return serving_metrics(System(MODEL, GPU, deployment, EFF), w)


def _closed(concurrency, prompt=3000.0, output=200.0):
    w = Workload(
        arrival_rate_per_s=jnp.asarray(0.0),
        concurrency=jnp.asarray(float(concurrency)),
        prompt_tokens_mean=jnp.asarray(prompt),
        output_tokens_mean=jnp.asarray(output),
    )
    return serving_metrics(System(MODEL, GPU, DEP, EFF), w)


def _full_iteration_tokens_per_s(prompt, output, deployment=DEP):
    """C by hand: a chunked iteration filled to the budget B in the ratio the requests need,
    n_d decodes and n_p = n_d P / O prefill tokens, n_d = min(B O / (P + O), seats), seats =
    min(KV seats at P + O / 2, max_num_seqs, B); C = n_d / (its step time)."""
    budget = float(deployment.max_num_batched_tokens)
    kv = float(pm.max_concurrent_requests(MODEL, GPU, deployment, prompt + output / 2.0))
    seats = min(kv, float(deployment.max_num_seqs), budget)
    n_d = min(budget * output / (prompt + output), seats)
    n_p = n_d * prompt / output
    step = pm.forward_step(
        System(MODEL, GPU, deployment, EFF),
        prefill_tokens=n_p,
        prefill_seqs=n_p / prompt,
        prefill_context=prompt / 2.0,
        decode_seqs=n_d,
        decode_context=prompt + output / 2.0,
    )
    return n_d / float(step.total_s)


# ---------------------------------------------------------------- utilization, stable ------


def test_open_loop_utilization_is_offered_tokens_over_full_iteration_capacity():
    # decode-heavy requests (P 1000, O 500) at light load: the whole-iteration ratio
    # rho_w = lambda E[O] / C is the largest of the three, so utilization is exactly it
    capacity = _full_iteration_tokens_per_s(1000.0, 500.0)
    for rate in (1.0, 4.0):
        assert float(_open(rate).utilization) == pytest.approx(rate * 500.0 / capacity, rel=1e-5)


def test_open_loop_utilization_is_per_replica():
    # the rate is split evenly over replicas: two replicas at 2 lambda are one at lambda
    two = pm.Deployment.create(replicas=2)
    assert float(_open(8.0, deployment=two).utilization) == pytest.approx(
        float(_open(4.0).utilization), rel=1e-6
    )


def test_stable_flips_exactly_where_utilization_crosses_one():
    lo, hi = 1.0, 200.0
    assert float(_open(lo).utilization) < 1.0 < float(_open(hi).utilization)
    for _ in range(16):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if float(_open(mid).utilization) < 1.0 else (lo, mid)
    below, above = _open(lo), _open(hi)
    assert hi / lo < 1.001
    assert bool(below.stable) and float(below.utilization) < 1.0
    assert np.isfinite(float(below.ttft_s.p95))
    assert not bool(above.stable) and float(above.utilization) >= 1.0
    assert float(above.ttft_s.p95) == np.inf and bool(above.queue_bound)


@settings(max_examples=6, deadline=None)
@given(st.floats(0.5, 400.0))
def test_open_loop_stable_means_utilization_below_one(rate):
    m = _open(rate)
    assert bool(m.stable) == (float(m.utilization) < 1.0)
    assert 0.0 <= float(m.seat_occupancy) <= 1.0


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 3000), st.floats(200.0, 6000.0))
def test_closed_loop_fields_stay_in_their_documented_ranges(concurrency, prompt):
    m = _closed(concurrency, prompt=prompt)
    seats = min(
        float(pm.max_concurrent_requests(MODEL, GPU, DEP, prompt + 200.0)),
        float(DEP.max_num_seqs),
    )
    assert float(m.seats) == pytest.approx(seats, rel=1e-6)
    assert bool(m.stable)
    assert 0.0 < float(m.utilization) <= 1.0
    # occupancy: the admitted clients min(N, seats) over the seats
    assert float(m.seat_occupancy) == pytest.approx(min(concurrency, seats) / seats, rel=1e-5)
    assert bool(m.queue_bound) == (concurrency > seats)
    if concurrency >= seats:  # every seat held: the loop runs at its capacity
        assert float(m.utilization) == pytest.approx(1.0, abs=1e-5)
    if bool(m.kv_bound):
        assert float(m.seat_occupancy) >= KV_BOUND_OCCUPANCY


def test_closed_loop_utilization_grows_with_the_clients_up_to_the_seats():
    u = [float(_closed(n).utilization) for n in (1, 8, 64, 140)]
    assert all(a < b for a, b in itertools.pairwise(u)) and u[-1] < 1.0


# ---------------------------------------------------------------- KV-bound -----------------


def test_kv_bound_needs_the_cache_to_cap_the_seats_and_the_load_to_fill_them():
    # P 3000 + O 200: the KV cache holds 142 sequences, below max_num_seqs = 256
    seats = float(pm.max_concurrent_requests(MODEL, GPU, DEP, 3200.0))
    assert seats < float(DEP.max_num_seqs)
    few, full = _closed(8), _closed(1000)
    assert float(few.seat_occupancy) == pytest.approx(8.0 / seats, rel=1e-5)
    assert not bool(few.kv_bound) and bool(full.kv_bound)
    light = _open(1.0, prompt=3000.0, output=200.0)
    assert float(light.seat_occupancy) < 0.1 and not bool(light.kv_bound)
    # short requests: max_num_seqs caps the seats, a full batch is not KV-bound
    short = _closed(1000, prompt=200.0, output=100.0)
    assert float(short.seat_occupancy) == pytest.approx(1.0) and not bool(short.kv_bound)


def test_verdict_says_kv_bound_only_when_the_load_fills_the_seats():
    kw = {"prompt_tokens": 3000.0, "output_tokens": 200.0}

    def verdict(n):
        load = Workload(
            arrival_rate_per_s=0.0,
            concurrency=float(n),
            prompt_tokens_mean=3000.0,
            output_tokens_mean=200.0,
        )
        return verdicts(System(MODEL, GPU, DEP, EFF), workload=load, **kw)["kv_or_queue"]

    few = verdict(8)
    assert not few.startswith("KV-bound") and few.startswith("neither")
    assert "8 of 142 seats" in few
    assert verdict(1000).startswith("KV-bound")


# ---------------------------------------------------------------- binding budget -----------


def test_binding_budget_is_the_same_with_and_without_a_load():
    for prompt, output in ((3000.0, 200.0), (200.0, 100.0)):
        sheet = int(pm.budget_sheet(System(MODEL, GPU, DEP, EFF), prompt, output).binding_budget)
        assert sheet == int(pm.binding_budget(System(MODEL, GPU, DEP, EFF), prompt, output))
        for m in (
            _open(1.0, prompt, output),
            _open(500.0, prompt, output),  # overloaded: queueing is ``queue_bound``, not this
            _closed(8, prompt, output),
        ):
            assert int(m.binding_budget) == sheet
    # long prompts: the KV cache caps a bandwidth-bound batch; short ones: it does not
    assert pm.BINDING_BUDGETS[
        int(pm.binding_budget(System(MODEL, GPU, DEP, EFF), 3000.0, 200.0))
    ] == ("memory_capacity")
    assert pm.BINDING_BUDGETS[
        int(pm.binding_budget(System(MODEL, GPU, DEP, EFF), 200.0, 100.0))
    ] != ("memory_capacity")


# ---------------------------------------------------------------- simulator's stable -------


def _run(arrival_s, finish_s) -> SimResult:
    n = len(arrival_s)
    return SimResult(
        arrival_s=np.asarray(arrival_s),
        first_token_s=np.asarray(arrival_s) + 0.01,
        finish_s=np.asarray(finish_s),
        prompt_tokens=np.full(n, 100),
        output_tokens=np.full(n, 10),
        preemptions=np.zeros(n, dtype=int),
        iterations=n,
        busy_s=1.0,
        makespan_s=float(np.max(finish_s) - np.min(arrival_s)),
        replicas=1,
        mean_decode_batch=1.0,
    )


def _fifo(rate, service_s, n=2000, seed=0):
    """One FIFO server, Poisson arrivals at ``rate``, fixed ``service_s``: rho = rate service."""
    arrival = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))
    finish = np.empty(n)
    t = 0.0
    for i, a in enumerate(arrival):
        t = max(t, a) + service_s
        finish[i] = t
    return _run(arrival, finish)


def test_simulator_stable_reads_the_backlog_growth():
    # rho = 1.15: the backlog grows by 1 - 1 / 1.15 = 13 % of arrivals; the last arrival's
    # queue drains in 0.15 of the span, which a drain-time rule would pass
    over = _fifo(10.0, 0.115)
    assert backlog_growth_share(over) == pytest.approx(1.0 - 1.0 / 1.15, abs=0.03)
    assert queue_stable(over) is False and summarize(over)["stable"] is False
    calm = _fifo(10.0, 0.08)  # rho = 0.8
    assert abs(backlog_growth_share(calm)) < STABLE_GROWTH_SHARE
    assert queue_stable(calm) is True


def test_a_healthy_long_tailed_run_is_stable():
    # a steady in-flight count with lognormal E2E (CV 3) and the last request 100 s long: the
    # drain after the last arrival is half the 200 s span, yet nothing queued up
    rng = np.random.default_rng(1)
    arrival = np.cumsum(rng.exponential(0.1, 2000))
    sigma = np.sqrt(np.log1p(9.0))
    e2e = rng.lognormal(np.log(5.0) - sigma**2 / 2, sigma, 2000)
    e2e[-1] = 100.0
    run = _run(arrival, arrival + e2e)
    assert run.finish_s.max() - arrival.max() > 0.25 * (arrival.max() - arrival.min())
    assert queue_stable(run) is True


def test_a_closed_loop_run_is_stable_and_a_tiny_run_is_undecided():
    # closed loop: each of 8 clients sends its next request as the last one finishes
    rng = np.random.default_rng(2)
    arrival, finish = [], []
    for _ in range(8):
        t = 0.0
        for e in rng.exponential(1.0, 100):
            arrival.append(t)
            finish.append(t + e)
            t += e
    assert queue_stable(_run(np.array(arrival), np.array(finish))) is True
    assert queue_stable(_run(np.arange(8.0), np.arange(8.0) + 1.0)) is None


# ---------------------------------------------------------------- the glossary itself -------


def test_readme_glossary_defines_each_reported_word():
    from pathlib import Path

    from perfmodel.dynamics import ServingMetrics

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    glossary = readme.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    words = ("utilization", "stable", "seats", "seat_occupancy", "binding_budget", "queue_bound")
    for word in (*words, "kv_bound", "busy_fraction"):
        assert f"**{word}**" in glossary or f"(`{word}`" in glossary, word
    # the words the closed form reports are ServingMetrics fields of those names
    assert {*words, "kv_bound"} <= set(ServingMetrics.__annotations__)
