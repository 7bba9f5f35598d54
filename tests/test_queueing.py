"""Closed-form queueing: textbook anchors, tails, overload as a value, gradients, monotonicity."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from perfmodel import Deployment, Efficiency, System, load_hardware, load_model
from perfmodel._queueing import mg1_conditional_wait_scv
from perfmodel.dynamics import (
    Workload,
    allen_cunneen_wait_s,
    kingman_wait_s,
    lognormal_mixture_quantile,
    mg1_wait_s,
    serving_metrics,
    wait_plus_quantile_s,
    wait_quantile_s,
)

# ---------------------------------------------------------------- textbook anchors ----------


def test_md1_and_mm1_mean_waits():
    # M/D/1, D = 1 s, lambda = 0.5: W = rho D / (2 (1 - rho)) = 0.5 s (Kleinrock 1975)
    assert float(mg1_wait_s(0.5, 1.0, 1.0)) == pytest.approx(0.5)
    # M/M/1, E[S] = 1 s, lambda = 0.5: W = rho / (mu - lambda) = 1 s; E[S^2] = 2
    assert float(mg1_wait_s(0.5, 1.0, 2.0)) == pytest.approx(1.0)
    # DistServe's M/D/1 prefill TTFT: D + lambda D^2 / (2 (1 - lambda D)), D = 0.2, lambda = 3
    d, lam = 0.2, 3.0
    assert d + float(mg1_wait_s(lam, d, d * d)) == pytest.approx(
        d + lam * d * d / (2 * (1 - lam * d))
    )


def test_kingman_and_allen_cunneen_reduce_to_pollaczek_khinchine():
    # Poisson arrivals (c_a = 1): Kingman is exact, = P-K; Allen-Cunneen with c = 1 is Kingman.
    for cs2 in (0.0, 1.0, 4.0):
        pk = mg1_wait_s(0.7, 1.0, 1.0 + cs2)
        assert float(kingman_wait_s(0.7, 1.0, cs2, 1.0)) == pytest.approx(float(pk))
        assert float(allen_cunneen_wait_s(0.7, 1.0, 1.0, cs2, 1.0)) == pytest.approx(float(pk))


def test_mm2_wait_close_to_erlang_c():
    # M/M/2 at rho = 0.8: Erlang C = 2 rho^2 / (1 + rho) = 0.7111, W = C / (c mu - lambda) = 1.7778 s
    w = float(allen_cunneen_wait_s(0.8, 2.0, 1.0, 1.0, 1.0))
    assert w == pytest.approx(0.7111 / 0.4, rel=0.05)


def test_mm1_wait_tail_is_exact():
    # M/M/1: P(W > t) = rho exp(-(mu - lambda) t), mu = 1, lambda = 0.7
    rho = 0.7
    w = float(mg1_wait_s(rho, 1.0, 2.0))
    for q in (0.5, 0.95, 0.99):
        expect = max(np.log(rho / (1 - q)), 0.0) / (1 - rho)
        assert float(wait_quantile_s(rho, w, q)) == pytest.approx(expect, rel=1e-9)


def test_mm1_sojourn_quantile_from_wait_plus_service():
    # M/M/1 sojourn ~ Exp(mu - lambda): q-quantile = -ln(1 - q) / (1 - rho) with mu = 1
    k = 4000
    nodes = -jnp.log1p(
        -(jnp.arange(k, dtype=float) + 0.5) / k
    )  # Exp(1) service, equal-probability nodes
    rho = 0.6
    w = mg1_wait_s(rho, 1.0, 2.0)
    for q in (0.5, 0.95, 0.99):
        got = float(wait_plus_quantile_s(nodes, rho, w / rho, q))
        assert got == pytest.approx(-np.log(1 - q) / (1 - rho), rel=0.01)


def test_conditional_wait_scv_md1_against_lindley_and_mm1():
    # Takacs' second moment: a wait given one has SCV 1 in M/M/1 (E[S^k] = k!) and
    # (1 + 2 rho) / 3 in M/D/1; checked against the Lindley recursion W' = (W + D - A)^+
    assert float(mg1_conditional_wait_scv(0.7, 1.0, 2.0, 6.0)) == pytest.approx(1.0)
    rho = 0.7
    assert float(mg1_conditional_wait_scv(rho, 1.0, 1.0, 1.0)) == pytest.approx((1 + 2 * rho) / 3)
    gaps = np.random.default_rng(0).exponential(1.0 / rho, 200_000)
    w, cur = np.empty_like(gaps), 0.0
    for i, a in enumerate(gaps):
        cur = max(cur + 1.0 - a, 0.0)
        w[i] = cur
    waited = w[w > 0]
    assert waited.var() / waited.mean() ** 2 == pytest.approx((1 + 2 * rho) / 3, rel=0.03)


def test_shifted_wait_quantile_is_exact():
    # X = 0, P(wait) = 1, W | wait = d + Exp(W_cond - d): q-quantile d + (W_cond - d) ln(1 / (1 - q))
    nodes = jnp.zeros(8)
    for q in (0.5, 0.95, 0.99):
        got = float(wait_plus_quantile_s(nodes, 1.0, 2.0, q, 0.5))
        assert got == pytest.approx(0.5 + 1.5 * np.log(1.0 / (1.0 - q)), rel=1e-6)


def test_lognormal_mixture_quantile_of_one_component():
    m, v = 2.0, 1.0
    s2 = np.log1p(v / m**2)
    median = m * np.exp(-s2 / 2)
    p95 = np.exp(np.log(m) - s2 / 2 + 1.6448536269514722 * np.sqrt(s2))
    assert float(lognormal_mixture_quantile(jnp.array([m]), jnp.array([v]), 0.5)) == pytest.approx(
        median
    )
    assert float(lognormal_mixture_quantile(jnp.array([m]), jnp.array([v]), 0.95)) == pytest.approx(
        p95
    )


def test_overload_is_inf_not_nan_with_finite_gradient():
    for f in (
        lambda r: mg1_wait_s(r, 1.0, 2.0),
        lambda r: kingman_wait_s(r, 1.0, 1.0, 1.0),
        lambda r: allen_cunneen_wait_s(r, 4.0, 1.0, 1.0, 1.0),
    ):
        assert float(f(1.0)) == np.inf and float(f(1.5)) == np.inf
        assert np.isfinite(float(jax.grad(f)(1.5)))
        assert np.isfinite(float(jax.grad(f)(0.5)))


@settings(max_examples=40, deadline=None)
@given(st.floats(0.01, 0.98), st.floats(0.0, 0.019), st.floats(0.0, 4.0), st.floats(0.0, 4.0))
def test_more_load_never_lowers_waiting(rho, d_rho, ca2, cs2):
    lo = kingman_wait_s(rho, ca2, cs2, 1.0)
    hi = kingman_wait_s(rho + d_rho, ca2, cs2, 1.0)
    assert float(hi) >= float(lo)
    assert float(allen_cunneen_wait_s(rho + d_rho, 8.0, ca2, cs2, 1.0)) >= float(
        allen_cunneen_wait_s(rho, 8.0, ca2, cs2, 1.0)
    )


# ---------------------------------------------------------------- serving_metrics -----------

MODEL = load_model("meta-llama/Llama-3.1-8B")
GPU = load_hardware("h100-sxm")
DEP = Deployment.create(tp=1)
EFF = Efficiency()


# built outside the jit so that its concurrency leaf stays concrete (0: open loop) and
# serving_metrics does not trace the closed-loop rate solve
BASE = Workload(prompt_tokens_mean=1000.0, output_tokens_mean=200.0, output_tokens_cv=0.5)


@functools.partial(jax.jit, static_argnames=("chunked",))
def _metrics(rate, prompt_cv, budget, chunked=True):
    w = eqx.tree_at(lambda x: (x.arrival_rate_per_s, x.prompt_tokens_cv), BASE, (rate, prompt_cv))
    d = Deployment.create(tp=1, max_num_batched_tokens=budget)
    return serving_metrics(System(MODEL, GPU, d, EFF), w, chunked_prefill=chunked)


def test_low_load_ttft_is_one_prefill():
    m = _metrics(1e-6, 0.0, 8192.0)
    alone = Deployment.create(tp=1)
    from perfmodel import prefill_step

    # nobody ahead, nothing decoding: TTFT = one 1000-token prefill (within 1 %: the vanishing
    # decode batch, ~1e-6 sequences, still launches the decode-attention kernel of every layer)
    assert float(m.ttft_s.p50) == pytest.approx(
        float(prefill_step(System(MODEL, GPU, alone, EFF), 1000.0).total_s), rel=1e-2
    )
    assert bool(m.stable) and float(m.utilization) < 1e-5


@jax.jit
def _grads(rate, budget):
    """d(TTFT p95, TPOT mean, E2E p95, utilization) / d(rate, budget), one compile."""

    def outputs(r, b):
        m = _metrics(r, 1.0, b)
        return jnp.stack([m.ttft_s.p95, m.tpot_s.mean, m.e2e_s.p95, m.utilization])

    return jnp.stack(jax.jacfwd(outputs, argnums=(0, 1))(rate, budget), axis=-1)


def test_overloaded_metrics_are_flagged_not_nan():
    m = _metrics(500.0, 1.0, 8192.0)
    leaves = jax.tree_util.tree_leaves(m)
    assert not any(np.isnan(np.asarray(x, dtype=float)).any() for x in leaves)
    assert not bool(m.stable) and float(m.utilization) >= 1.0
    assert float(m.ttft_s.p95) == np.inf and float(m.e2e_s.mean) == np.inf
    assert bool(m.queue_bound)
    g = _grads(500.0, 8192.0)
    assert np.all(np.isfinite(np.asarray(g)))
    assert float(g[3, 0]) > 0  # more load, more utilisation


@settings(max_examples=12, deadline=None)
@given(st.floats(0.5, 30.0), st.floats(1.02, 1.3))
def test_more_load_never_lowers_latency(rate, factor):
    a, b = _metrics(rate, 1.0, 8192.0), _metrics(rate * factor, 1.0, 8192.0)
    assert float(b.utilization) >= float(a.utilization)
    for get in (
        lambda m: m.ttft_s.mean,
        lambda m: m.ttft_s.p95,
        lambda m: m.tpot_s.mean,
        lambda m: m.e2e_s.p95,
    ):
        assert float(get(b)) >= float(get(a)) * (1 - 1e-9)


def test_gradients_finite_and_match_finite_differences():
    rate, h = 12.0, 1e-3
    g = np.asarray(_grads(rate, 8192.0))
    hi, lo = _metrics(rate + h, 1.0, 8192.0), _metrics(rate - h, 1.0, 8192.0)
    for i, get in enumerate(
        (lambda m: m.ttft_s.p95, lambda m: m.tpot_s.mean, lambda m: m.e2e_s.p95)
    ):
        fd = (float(get(hi)) - float(get(lo))) / (2 * h)
        assert g[i, 0] == pytest.approx(fd, rel=2e-2, abs=1e-6)
    # across the kink where prompt nodes pass the chunk budget, and near saturation
    for budget in (512.0, 1000.0, 2048.0):
        for r in (2.0, 20.0):
            assert np.all(np.isfinite(np.asarray(_grads(r, budget))))


OPEN_LOAD = Workload(
    arrival_rate_per_s=10.0,
    prompt_tokens_mean=1000.0,
    prompt_tokens_cv=1.0,
    output_tokens_mean=200.0,
)
"""The open-loop load of the vmap, means-only and temperature tests (one compiled program)."""


def test_vmap_over_efficiency_draws_equals_loop():
    effs = [Efficiency(bandwidth_fraction=b) for b in (0.6, 0.75, 0.9)]
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *effs)
    w = OPEN_LOAD
    f = jax.jit(jax.vmap(lambda e: serving_metrics(System(MODEL, GPU, DEP, e), w)))
    batched = f(stacked)
    for i, e in enumerate(effs):
        one = serving_metrics(System(MODEL, GPU, DEP, e), w)
        assert float(batched.ttft_s.p95[i]) == pytest.approx(float(one.ttft_s.p95), rel=1e-9)
        assert float(batched.tpot_s.p99[i]) == pytest.approx(float(one.tpot_s.p99), rel=1e-9)


def test_specs_of_python_numbers_and_of_arrays_share_one_compiled_program():
    """A workload and an efficiency built from Python numbers (weakly typed leaves) and the same
    ones built from NumPy arrays (a file's values, strongly typed): one program, same numbers
    (the jit's cache holds one entry per argument signature)."""
    from perfmodel._serving import _serving_metrics

    weak_eff = Efficiency(bandwidth_fraction=0.7)
    strong_eff = Efficiency(bandwidth_fraction=np.float64(0.7) * np.ones(()))
    assert weak_eff.bandwidth_fraction.weak_type and not strong_eff.bandwidth_fraction.weak_type
    strong_load = jax.tree.map(lambda x: jnp.asarray(np.asarray(x, dtype=np.float64)), OPEN_LOAD)
    _serving_metrics._cached.clear_cache()
    a = serving_metrics(System(MODEL, GPU, DEP, weak_eff), OPEN_LOAD)
    b = serving_metrics(System(MODEL, GPU, DEP, strong_eff), strong_load)
    assert _serving_metrics._cached._cache_size() == 1
    assert float(a.ttft_s.p95) == float(b.ttft_s.p95)
    assert float(a.tpot_s.p50) == float(b.tpot_s.p50)


def test_closed_loop_obeys_littles_law():
    w = Workload(
        concurrency=32.0, prompt_tokens_mean=1000.0, prompt_tokens_cv=0.5, output_tokens_mean=200.0
    )
    m = serving_metrics(System(MODEL, GPU, DEP, EFF), w)
    rate = float(m.output_tokens_per_s) / 200.0
    assert rate * float(m.e2e_s.mean) == pytest.approx(32.0, rel=1e-4)


def test_means_only_skips_the_percentiles_and_keeps_every_mean():
    """``means_only`` (calibration rows read means) returns the same means, utilisation,
    throughput and binding budget, with p50/p95/p99 NaN rather than a made-up value."""
    w = OPEN_LOAD
    full = serving_metrics(System(MODEL, GPU, DEP, EFF), w)
    lean = serving_metrics(System(MODEL, GPU, DEP, EFF), w, means_only=True)
    for name in ("ttft_s", "tpot_s", "e2e_s"):
        # two compiled programs: equal up to the rounding of their fused multiply-adds
        assert float(getattr(lean, name).mean) == pytest.approx(
            float(getattr(full, name).mean), rel=1e-12
        )
        assert np.isnan(
            [float(getattr(getattr(lean, name), q)) for q in ("p50", "p95", "p99")]
        ).all()
    for name in (
        "utilization",
        "seat_occupancy",
        "output_tokens_per_s",
        "decode_batch",
        "binding_budget",
    ):
        assert float(getattr(lean, name)) == pytest.approx(float(getattr(full, name)), rel=1e-12)
    assert bool(lean.stable) and float(full.ttft_s.p95) > float(full.ttft_s.mean)


def test_giant_prompts_hurt_p95_ttft_far_more_than_throughput():
    # same mean prompt, a few giant ones (CV 0.2 -> 3)
    calm, spiky = _metrics(15.0, 0.2, 8192.0), _metrics(15.0, 3.0, 8192.0)
    assert float(spiky.ttft_s.p95) > 1.5 * float(calm.ttft_s.p95)
    assert float(spiky.output_tokens_per_s) == pytest.approx(
        float(calm.output_tokens_per_s), rel=0.02
    )


def test_temperature_zero_is_exact_and_small_temperature_close():
    w = OPEN_LOAD
    exact = serving_metrics(System(MODEL, GPU, DEP, EFF), w)
    soft = serving_metrics(System(MODEL, GPU, DEP, EFF), w, temperature=1e-3)
    assert float(soft.ttft_s.p95) == pytest.approx(float(exact.ttft_s.p95), rel=0.05)
    assert float(soft.tpot_s.mean) == pytest.approx(float(exact.tpot_s.mean), rel=0.05)


def test_corrections_of_the_wrong_length_are_refused():
    # an index past the end of a JAX array is clamped, not an error: a corrections vector from an
    # older CORRECTIONS (8 terms) would silently reuse its last entry for the missing ones
    from perfmodel._batching import DecodeCost, EngineConfig
    from perfmodel._serving_tail import CORRECTIONS, LoadPoint, open_loop

    point = LoadPoint(
        system=System(MODEL, GPU, Deployment.create(tp=1), Efficiency()),
        workload=Workload(arrival_rate_per_s=5.0, prompt_tokens_mean=1000.0),
        config=EngineConfig(chunked_prefill=True),
        cost=DecodeCost(),
        ca2=jnp.asarray(1.0),
        corrections=jnp.zeros(len(CORRECTIONS) - 2),
    )
    with pytest.raises(ValueError, match=f"{len(CORRECTIONS)} terms"):
        open_loop(point, jnp.asarray(5.0))


def test_corrections_are_read_by_name_in_the_documented_order():
    """``Corrections.from_array`` names the vector's terms in ``CORRECTIONS``' documented order
    (a fit optimises the flat vector; the model reads the names), and the wait gains follow the
    scheduling mode."""
    from perfmodel.dynamics import CORRECTIONS, Corrections

    vec = jnp.arange(len(CORRECTIONS), dtype=float)
    c = Corrections.from_array(vec)
    assert [float(getattr(c, f)) for f in Corrections.__dataclass_fields__] == list(range(10))
    assert [float(x) for x in c.wait_gains(chunked=True)] == [4.0, 5.0]
    assert [float(x) for x in c.wait_gains(chunked=False)] == [0.0, 1.0]
    assert float(Corrections.from_array(None).running_jensen_gain) == CORRECTIONS[9]


def test_closed_loop_ttft_does_not_depend_on_the_output_spread():
    """On an engine that mixes prompt chunks into decodes, clients are desynchronised whatever
    the output lengths' spread: fixed lengths (a chunk's prompts would re-enter together) and a
    10 % spread give the same steady TTFT and iteration."""
    from perfmodel._closed_loop import closed_loop_state

    model, hw = load_model("meta-llama/Llama-3.1-8B"), load_hardware("h100-sxm")
    dep, eff = Deployment(), Efficiency()
    fixed = Workload(concurrency=16.0, prompt_tokens_mean=512.0, output_tokens_mean=1000.0)
    spread = eqx.tree_at(lambda w: w.output_tokens_cv, fixed, jnp.asarray(0.1))
    a = closed_loop_state(System(model, hw, dep, eff), fixed)
    b = closed_loop_state(System(model, hw, dep, eff), spread)
    assert float(a.ttft_steady_s) == pytest.approx(float(b.ttft_steady_s), rel=1e-9)
    assert float(a.iteration_s) == pytest.approx(float(b.iteration_s), rel=1e-9)


def test_closed_loop_keeps_littles_law_and_a_near_single_client_ttft():
    """Eight desynchronised clients (fixed or spread outputs) keep N = X E[E2E] (Little's law)
    and a mean TTFT within 2x of one client's (their prompts arrive one by one)."""
    base = Workload(concurrency=8.0, prompt_tokens_mean=1000.0, output_tokens_mean=200.0)
    spread = eqx.tree_at(lambda w: w.output_tokens_cv, base, jnp.asarray(0.3))
    together = serving_metrics(System(MODEL, GPU, DEP, EFF), base)
    apart = serving_metrics(System(MODEL, GPU, DEP, EFF), spread)
    one = float(
        serving_metrics(
            System(MODEL, GPU, DEP, EFF),
            eqx.tree_at(lambda w: w.concurrency, base, jnp.asarray(1.0)),
        ).ttft_s.mean
    )
    assert float(together.ttft_s.mean) < 2.0 * one and float(apart.ttft_s.mean) < 2.0 * one
    for m in (together, apart):
        rate = float(m.output_tokens_per_s) / 200.0
        assert rate * float(m.e2e_s.mean) == pytest.approx(8.0, rel=1e-4)


def test_fewer_quadrature_nodes_are_the_same_laws_coarser_in_the_tails():
    """The length quadrature is a fidelity, not a model: the default nodes reproduce the default
    call bit for bit, the means do not depend on it beyond the node average of lognormal lengths
    (CV 1 prompts: within 1 %), and the p95s on 8 x 4 nodes, whose top prompt node averages the
    longest 12.5 % of prompts, fall short of 64 x 32 by less than a fifth (p95 TTFT of CV 1
    prompts sits in that node), never above it by more than rounding."""
    from perfmodel.dynamics import OUTPUT_NODES, PROMPT_NODES

    w = OPEN_LOAD
    full = serving_metrics(System(MODEL, GPU, DEP, EFF), w)
    same = serving_metrics(
        System(MODEL, GPU, DEP, EFF), w, quadrature_nodes=(PROMPT_NODES, OUTPUT_NODES)
    )
    coarse = serving_metrics(System(MODEL, GPU, DEP, EFF), w, quadrature_nodes=(8, 4))
    for name in ("ttft_s", "tpot_s", "e2e_s"):
        a, b, c = getattr(full, name), getattr(same, name), getattr(coarse, name)
        assert float(b.p95) == float(a.p95) and float(b.mean) == float(a.mean)
        assert float(c.mean) == pytest.approx(float(a.mean), rel=0.01)
        assert 0.8 * float(a.p95) < float(c.p95) < 1.01 * float(a.p95)
    assert float(coarse.utilization) == pytest.approx(float(full.utilization), rel=0.01)


_TRACING = {"on": False, "traces": 0}


def _count_traces(event, duration, **kwargs):
    if _TRACING["on"] and event.endswith("jaxpr_trace_duration"):
        _TRACING["traces"] += kwargs.get("fun_name") == "_serving_metrics"


jax.monitoring.register_event_duration_secs_listener(_count_traces)


def test_one_program_serves_every_model_and_gpu_of_the_same_structure():
    """A spec's name is its one static field; ``serving_metrics`` leaves it out of the compiled
    call, so another dense model on another GPU reuses the program (no new trace) and still gets
    its own numbers."""
    load = OPEN_LOAD  # the program the tests above compiled for the 8B model on an H100
    first = serving_metrics(System(MODEL, GPU, DEP, EFF), load)
    _TRACING.update(on=True, traces=0)
    try:
        other = serving_metrics(
            System(
                load_model("meta-llama/Llama-3.1-70B"),
                load_hardware("a100-sxm-80gb"),
                Deployment.create(tp=4, replicas=4),
                EFF,
            ),
            load,
        )
    finally:
        _TRACING["on"] = False
    assert _TRACING["traces"] == 0
    # 70B on 4 x TP4 A100s: ~9x the weights over 4 GPUs of ~2/3 the bandwidth, a slower decode step
    assert bool(other.stable) and float(other.tpot_s.mean) > 1.5 * float(first.tpot_s.mean)


def test_ttft_p95_load_elasticity_is_the_exponent_of_a_power_law():
    """A p95 TTFT of c * rate^3 has elasticity exactly 3; closed loop and overload: None."""
    from types import SimpleNamespace

    from perfmodel.dynamics import Workload, ttft_p95_load_elasticity

    def metrics_at(w, stable=True):
        p95 = 0.2 * float(w.arrival_rate_per_s) ** 3
        return SimpleNamespace(stable=stable, ttft_s=SimpleNamespace(p95=p95))

    open_loop = Workload(arrival_rate_per_s=4.0)
    assert ttft_p95_load_elasticity(metrics_at, open_loop) == pytest.approx(3.0, rel=1e-9)
    closed = Workload(arrival_rate_per_s=0.0, concurrency=8.0)
    assert ttft_p95_load_elasticity(metrics_at, closed) is None
    overloaded = metrics_at(open_loop, stable=False)
    assert ttft_p95_load_elasticity(metrics_at, open_loop, overloaded) is None
    # stable at the rate, but +-1 % overloads (an infinite p95): not defined either
    overloads = SimpleNamespace(stable=False, ttft_s=SimpleNamespace(p95=float("inf")))
    here = metrics_at(open_loop)
    assert ttft_p95_load_elasticity(lambda w: overloads, open_loop, here) is None
