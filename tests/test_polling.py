"""The scheduler's poll for new requests (``perfmodel._polling``; SGLang's
``--scheduler-recv-interval k``): hand values of the wait's law, its limits, the load model's
closed and open loops, and the simulator that runs SGLang's poll counter against both."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from perfmodel import Deployment, Efficiency, System, load_hardware, load_model
from perfmodel._polling import (
    closed_loop_busy_probability,
    open_loop_busy_probability,
    poll_wait,
)
from perfmodel.dynamics import Workload, closed_loop_metrics, serving_metrics
from perfmodel.simulator import simulate

MODEL = load_model("meta-llama/Llama-3.1-8B")
GPU = load_hardware("h100-sxm")
EFF = Efficiency()
LEVELS = (0.5, 0.9, 0.95, 0.99)


def test_the_wait_of_a_busy_engine_polling_every_21_iterations_by_hand():
    """k = 21, tau = 10 ms, always busy: W ~ Uniform[0, 0.2 s], E[W] = 0.1 s, sd 0.2 / sqrt(12);
    beside a narrow X at 1 s: p50 = 1.1 s, p95 = 1.1 + 1.6449 x 0.057735 s, p99 capped at
    1.2 s (the longest wait); the exact uniform p95 is 1.19 s (the normal law is 0.5 % off)."""
    wait = poll_wait(jnp.asarray(21.0), jnp.asarray(0.01), jnp.asarray(1.0))
    assert float(wait.mean_s) == pytest.approx(0.1, rel=1e-12)
    base = jnp.ones(4)
    q = np.asarray(wait.quantile_s(base, jnp.asarray(1.0), LEVELS))
    sd = 0.2 / math.sqrt(12.0)
    np.testing.assert_allclose(q, [1.1, 1.1 + 1.2816 * sd, 1.1 + 1.6449 * sd, 1.2], rtol=1e-4)
    assert abs(q[2] - 1.19) < 0.005


def test_half_busy_engine_mixes_no_wait_and_the_uniform():
    """b = 1/2: E[W] = b c / 2, Var[W] = b c^2 / 12 + b (1 - b) c^2 / 4 (a mixture of 0 and the
    uniform): c = 0.2 s gives 0.05 s and 0.2^2 (1/24 + 1/16); p95 of a narrow X moves by
    E[W] + 1.6449 sd."""
    wait = poll_wait(jnp.asarray(21.0), jnp.asarray(0.01), jnp.asarray(0.5))
    assert float(wait.mean_s) == pytest.approx(0.05, rel=1e-12)
    sd = 0.2 * math.sqrt(1.0 / 24.0 + 1.0 / 16.0)
    q95 = float(wait.quantile_s(jnp.ones(1), jnp.asarray(1.0), (0.95,))[0])
    assert q95 == pytest.approx(1.05 + 1.6449 * sd, rel=1e-4)


def test_an_engine_that_polls_every_iteration_adds_nothing_even_when_overloaded():
    """k = 1 (vLLM, TensorRT-LLM): the quantiles come back unchanged and the mean wait is 0, also
    at an infinite iteration (an overloaded open loop), with a zero (not NaN) gradient; k > 1 at
    an infinite iteration is inf; a quantile not computed (NaN) stays NaN."""
    base = jnp.asarray([0.3, 0.5, 0.6, 0.9])
    for tau in (0.01, jnp.inf):
        wait = poll_wait(jnp.asarray(1.0), jnp.asarray(tau), jnp.asarray(1.0))
        assert float(wait.mean_s) == 0.0
        np.testing.assert_array_equal(wait.quantile_s(base, jnp.asarray(0.4), LEVELS), base)
    grad = jax.grad(lambda t: poll_wait(jnp.asarray(1.0), t, jnp.asarray(1.0)).mean_s)(jnp.inf)
    assert float(grad) == 0.0
    overloaded = poll_wait(jnp.asarray(30.0), jnp.asarray(jnp.inf), jnp.asarray(1.0))
    assert float(overloaded.mean_s) == math.inf
    assert np.all(np.isinf(overloaded.quantile_s(base, jnp.asarray(0.4), LEVELS)))
    nan = poll_wait(jnp.asarray(30.0), jnp.asarray(0.01), jnp.asarray(1.0))
    assert np.all(np.isnan(nan.quantile_s(jnp.full(4, jnp.nan), jnp.asarray(0.4), LEVELS)))


@settings(max_examples=40, deadline=None)
@given(
    st.floats(1.0, 64.0),
    st.floats(1e-4, 0.1),
    st.floats(0.0, 1.0),
    st.floats(0.01, 5.0),
    st.floats(0.0, 3.0),
)
def test_quantiles_grow_with_the_level_and_stay_within_the_longest_wait(k, tau, busy, x, spread):
    """For any k, tau, P(busy) and a base law X with increasing quantiles: X + W's quantiles
    increase with the level, lie between Q_X and Q_X + c, and the median moves by E[W]."""
    wait = poll_wait(jnp.asarray(k), jnp.asarray(tau), jnp.asarray(busy))
    base = x * (1.0 + spread * jnp.asarray([0.0, 0.5, 0.7, 1.0]))
    q = np.asarray(wait.quantile_s(base, base[0], LEVELS))
    c = (k - 1.0) * tau
    assert np.all(np.diff(q) >= -1e-12)
    assert np.all(q >= np.asarray(base) - 1e-12) and np.all(q <= np.asarray(base) + c + 1e-9)
    assert q[0] == pytest.approx(float(base[0]) + busy * c / 2.0, rel=1e-9, abs=1e-12)


def test_busy_probabilities_of_the_two_loops():
    """Closed loop: a lone client's request finds the engine idle (0), two or more clients keep
    it busy (1), linear between; open loop: 1 - exp(-L)."""
    np.testing.assert_allclose(
        closed_loop_busy_probability(jnp.asarray([0.5, 1.0, 1.5, 2.0, 64.0])),
        [0.0, 0.0, 0.5, 1.0, 1.0],
    )
    np.testing.assert_allclose(
        open_loop_busy_probability(jnp.asarray([0.0, 1.0, 20.0])),
        [0.0, 1.0 - math.exp(-1.0), 1.0 - math.exp(-20.0)],
        rtol=1e-12,
    )


def _closed(polls: float, clients: float):
    w = Workload(
        concurrency=clients,
        prompt_tokens_mean=500.0,
        prompt_tokens_cv=0.5,
        output_tokens_mean=400.0,
        output_tokens_cv=0.5,
    )
    return w, Deployment.create(tp=1, scheduler_polls=polls)


def test_closed_loop_ttft_and_e2e_move_by_half_of_k_minus_1_gaps_and_tpot_does_not():
    """16 clients, k = 21: TTFT's and E2E's means grow by exactly 10 mean per-token gaps, TPOT and
    ITL are unchanged; one client's engine is idle when its next request comes (no wait); and
    d TTFT / d k = TPOT / 2 against a central finite difference."""
    w, plain = _closed(1.0, 16.0)
    _, polled = _closed(21.0, 16.0)
    a = closed_loop_metrics(System(MODEL, GPU, plain, EFF), w)
    b = closed_loop_metrics(System(MODEL, GPU, polled, EFF), w)
    tpot = float(a.tpot_s[0])
    assert float(b.ttft_s[0]) == pytest.approx(float(a.ttft_s[0]) + 10.0 * tpot, rel=1e-9)
    assert float(b.e2e_s[0]) == pytest.approx(float(a.e2e_s[0]) + 10.0 * tpot, rel=1e-9)
    np.testing.assert_array_equal(b.tpot_s, a.tpot_s)
    np.testing.assert_array_equal(b.itl_s, a.itl_s)
    assert np.all(np.asarray(b.ttft_s[1:]) > np.asarray(a.ttft_s[1:]))
    w1, lone = _closed(21.0, 1.0)
    np.testing.assert_array_equal(
        closed_loop_metrics(System(MODEL, GPU, lone, EFF), w1).ttft_s,
        closed_loop_metrics(System(MODEL, GPU, _closed(1.0, 1.0)[1], EFF), w1).ttft_s,
    )

    def ttft(k):
        return closed_loop_metrics(System(MODEL, GPU, _closed(k, 16.0)[1], EFF), w).ttft_s[0]

    grad = float(jax.grad(ttft)(jnp.asarray(21.0)))
    fd = float(ttft(jnp.asarray(21.5)) - ttft(jnp.asarray(20.5)))
    assert grad == pytest.approx(fd, rel=1e-6) and grad == pytest.approx(tpot / 2.0, rel=1e-9)


def test_open_loop_wait_grows_with_load_toward_half_of_k_minus_1_gaps():
    """Poisson arrivals: the mean TTFT grows by P(busy) x 10 gaps at k = 21, P(busy) = 1 - e^-L
    rising with the rate: at 2 req/s (L ~ 6 requests in flight) the wait is within 1 % of the
    whole 10 gaps; TPOT is unchanged."""
    shifts = []
    for rate in (0.05, 2.0):
        w = Workload(arrival_rate_per_s=rate, prompt_tokens_mean=500.0, output_tokens_mean=400.0)
        a = serving_metrics(System(MODEL, GPU, Deployment.create(tp=1), EFF), w)
        b = serving_metrics(
            System(MODEL, GPU, Deployment.create(tp=1, scheduler_polls=21.0), EFF), w
        )
        assert float(b.tpot_s.p95) == float(a.tpot_s.p95)
        gap = float(a.tpot_s.mean)
        shifts.append((float(b.ttft_s.mean) - float(a.ttft_s.mean)) / (10.0 * gap))
        assert float(b.e2e_s.mean) - float(a.e2e_s.mean) == pytest.approx(
            shifts[-1] * 10.0 * gap, rel=1e-6
        )
    assert 0.0 < shifts[0] < 0.5 and 0.99 < shifts[1] <= 1.0


@pytest.mark.parametrize(
    "workload",
    [
        Workload(
            concurrency=16.0,
            prompt_tokens_mean=500.0,
            prompt_tokens_cv=0.5,
            output_tokens_mean=400.0,
            output_tokens_cv=0.5,
        ),
        Workload(arrival_rate_per_s=2.0, prompt_tokens_mean=500.0, output_tokens_mean=400.0),
    ],
    ids=["16 clients", "2 req per s"],
)
def test_simulator_running_sglangs_poll_counter_agrees_with_the_closed_form(workload):
    """The simulator polls after k decode iterations, after any iteration carrying prefill and at
    once when idle (``SchedulerRecvSkipper``): at k = 21 its mean and p95 TTFT agree with the
    closed form's within 10 % in a closed loop of 16 clients and an open loop at 2 req/s."""
    dep = Deployment.create(tp=1, scheduler_polls=21.0)
    r = simulate(System(MODEL, GPU, dep, EFF), workload, num_requests=400, seed=3)
    cf = serving_metrics(System(MODEL, GPU, dep, EFF), workload)
    assert float(cf.ttft_s.mean) == pytest.approx(float(np.mean(r.ttft_s)), rel=0.1)
    assert float(cf.ttft_s.p95) == pytest.approx(float(np.percentile(r.ttft_s, 95)), rel=0.1)


def test_the_search_model_prices_the_poll_its_grid_fixes():
    """``Grid(scheduler_polls=21)``: every deployment the search builds carries k = 21, and the
    search model's TTFT (``optimize.slo_metrics``) grows at each quantile while its TPOT does
    not; the median moves by at most the mean wait, 10 of its gaps."""
    from optimize import Grid, one_hot_weights, slo_metrics
    from optimize._grid import deployment_from_weights, grid_tables

    grid = Grid(num_gpus=1, scheduler_polls=21)
    config = np.zeros(len(grid.sizes()), dtype=int)
    dep = deployment_from_weights(one_hot_weights(config, grid), grid_tables(grid), 1.0)
    assert float(dep.scheduler_polls) == 21.0
    w = Workload(arrival_rate_per_s=2.0, prompt_tokens_mean=500.0, output_tokens_mean=400.0)
    plain = slo_metrics(System(MODEL, GPU, Deployment.create(tp=1), EFF), w)
    polled = slo_metrics(System(MODEL, GPU, Deployment.create(tp=1, scheduler_polls=21.0), EFF), w)
    np.testing.assert_array_equal(polled.tpot_quantiles_s, plain.tpot_quantiles_s)
    shift = np.asarray(polled.ttft_quantiles_s) - np.asarray(plain.ttft_quantiles_s)
    assert np.all(shift > 0.0)
    assert shift[0] <= 10.0 * float(plain.tpot_quantiles_s[0]) * 1.05


def test_gradients_through_the_wait_are_finite_at_every_edge():
    """The search differentiates TTFT through the wait: at k = 1 (no spread), at the median beside
    an equal mean (d = 0, z = 0) and with a wait, every gradient is finite, and at k = 1 the
    quantiles' gradient is the base law's own (the identity)."""
    levels = (0.5, 0.95)

    def total(k, tau, base):
        wait = poll_wait(k, tau, jnp.asarray(1.0))
        return jnp.sum(wait.quantile_s(base, base[0], levels)) + wait.mean_s

    base = jnp.asarray([0.2, 0.2])
    for k in (1.0, 21.0):
        grads = jax.grad(total, argnums=(0, 1, 2))(jnp.asarray(k), jnp.asarray(0.01), base)
        assert all(np.all(np.isfinite(np.asarray(g))) for g in grads), (k, grads)
    g_base = jax.grad(total, argnums=2)(jnp.asarray(1.0), jnp.asarray(0.01), base)
    np.testing.assert_allclose(g_base, [1.0, 1.0])


def test_a_speculative_engine_waits_iterations_not_tokens():
    """SGLang counts verify iterations as it counts decodes: with 2.5 tokens an iteration the poll
    wait at k = 21 is 10 iterations, 25 mean per-token gaps, in the closed loop."""
    w, plain = _closed(1.0, 16.0)
    _, polled = _closed(21.0, 16.0)
    a = closed_loop_metrics(System(MODEL, GPU, plain, EFF), w, tokens_per_decode=2.5)
    b = closed_loop_metrics(System(MODEL, GPU, polled, EFF), w, tokens_per_decode=2.5)
    shift = float(b.ttft_s[0]) - float(a.ttft_s[0])
    assert shift == pytest.approx(25.0 * float(a.tpot_s[0]), rel=1e-9)
