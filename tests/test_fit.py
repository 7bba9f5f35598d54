"""Calibration: parameter recovery on data simulated from the model, bundled-posterior agreement,
netCDF round trip and the ``efficiency_draws`` API."""

import functools

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from _measurement_rows import measurement_row
from numpyro import handlers

import fitting
from fitting import _posterior
from fitting._inference import run_nuts
from fitting._model import (
    PARAM_NAMES,
    calibration_model,
    prior_center_unconstrained,
    to_natural,
)
from fitting._names import ENGINE_ALL_REDUCE_CELL
from fitting._predict import fitted_efficiency

GPUS = ("a100-sxm-80gb", "h100-sxm")


_row = functools.partial(measurement_row, value=1.0)


def _design() -> pd.DataFrame:
    rows = []
    for gpu in GPUS:
        for m in (1, 8, 64, 256, 1024, 4096, 16384):
            # three GEMMs and both layer norms, in that order
            ops = ("mlp_up_proj", "mlp_down_proj", "attn_pre_proj")
            for op in ops + ("input_layernorm", "post_attention_layernorm"):
                rows.append(
                    _row(
                        source="vidur",
                        engine="sarathi",
                        gpu=gpu,
                        model="meta-llama/Llama-2-7b-hf",
                        scenario="op",
                        op=op,
                        num_tokens=m,
                    )
                )
    return pd.DataFrame(rows)


def _truth(prep):
    """Known latent values: every population mean at its prior centre, GPUs spread by +/- tau."""
    truth = {}
    for name in PARAM_NAMES:
        truth[f"mu_{name}"] = jnp.asarray(prior_center_unconstrained(name))
        truth[f"tau_{name}"] = jnp.asarray(0.3)
        truth[f"z_{name}"] = jnp.asarray([1.0, -1.0])
    truth["tau_source"] = jnp.asarray(0.1)
    truth["tau_kernel"] = jnp.asarray(0.1)
    truth["tau_gpu_kernel"] = jnp.asarray(0.05)  # GPU x kernel-group biases: none in the truth
    truth["z_gpu_group"] = jnp.zeros((len(prep.gpus), len(prep.noise_keys)))
    truth["cell_offset"] = jnp.zeros(len(prep.cells))
    truth["sigma"] = jnp.full(len(prep.noise_keys), 0.03)
    return truth


USED_BY_GEMM_AND_NORM = (
    "compute_fraction_max",
    "compute_half_tokens",
    "bandwidth_fraction",
    "launch_overhead_s",
    "gemm_half_width",
    "elementwise_bandwidth_fraction",
    "elementwise_onchip_bytes_per_s",
)
"""Parameters a bf16 GEMM or norm row's prediction depends on (``gemm_time_s``,
``elementwise_time_s``) and the test samples; ``elementwise_launch_overlap``, which norms also use,
stays pinned at its true value with the unused ones (it is not among the checked parameters)."""


def test_nuts_recovers_known_efficiencies_from_simulated_data():
    """GEMMs from 1 to 16k tokens (memory- then compute-bound: bandwidth_fraction and
    compute_fraction_max) and norms on two GPUs, simulated at known values, are recovered within
    their 99 % intervals and 8 %; kernel rows only, so the step model is not compiled here (the
    short refit below runs it)."""
    prep = fitting.prepare(_design())
    assert prep.gpus == GPUS and not prep.skipped
    truth = _truth(prep)
    with jax.numpy_dtype_promotion("standard"):
        tr = handlers.trace(
            handlers.seed(handlers.condition(calibration_model, truth), 1)
        ).get_trace(prep, None)
    simulated = np.asarray(tr["log_value"]["value"])
    prep.log_value = simulated
    # parameters no GEMM or norm row depends on are pinned at their true values: their
    # posteriors are their priors (independent of the data and of the checked parameters), and
    # their hierarchical funnels would only lengthen NUTS trajectories
    unused = [n for n in PARAM_NAMES if n not in USED_BY_GEMM_AND_NORM]
    fixed = {f"{k}_{n}": truth[f"{k}_{n}"] for n in unused for k in ("mu", "tau", "z")}
    fixed |= {k: truth[k] for k in ("tau_source", "tau_kernel", "tau_gpu_kernel", "z_gpu_group")}
    idata = run_nuts(prep, num_draws=150, num_warmup=150, num_chains=1, seed=2, fixed=fixed)
    post = idata.posterior
    for name in ("compute_fraction_max", "bandwidth_fraction"):
        true_vals = np.asarray(to_natural(name, truth[f"mu_{name}"] + 0.3 * truth[f"z_{name}"]))
        lo, hi = np.quantile(post[name].values.reshape(-1, 2), [0.005, 0.995], axis=0)
        med = np.median(post[name].values.reshape(-1, 2), axis=0)
        assert np.all((lo <= true_vals) & (true_vals <= hi)), (name, lo, true_vals, hi)
        # GEMM and norm rows are anchor groups (no GPU x group bias): their GPU's own
        # efficiencies carry all of the GPU's signal
        np.testing.assert_allclose(med, true_vals, rtol=0.08)
    lo, hi = np.quantile(
        post["sigma"].values.reshape(-1, len(prep.noise_keys)), [0.005, 0.995], axis=0
    )
    assert np.all((lo <= 0.03) & (0.03 <= hi)), (lo, hi)


def _toy_posterior(num_draws=50, engine_all_reduce_scale=None):
    """Two GPUs' draws and one cell (``splitwise|decode_step:time``); with
    ``engine_all_reduce_scale`` a second cell, ``ENGINE_ALL_REDUCE_CELL``, at that constant scale."""
    rng = np.random.default_rng(0)
    post = {}
    for name in PARAM_NAMES:
        mu = prior_center_unconstrained(name) + 0.01 * rng.standard_normal((1, num_draws))
        post[f"mu_{name}"], post[f"tau_{name}"] = mu, np.full((1, num_draws), 0.5)
        post[name] = np.asarray(
            to_natural(name, jnp.asarray(mu[..., None] + np.array([-0.2, 0.2])))
        )
    post["tau_source"] = np.full((1, num_draws), 0.2)
    post["tau_kernel"] = np.full((1, num_draws), 0.5)
    post["cell_offset"] = 0.01 * rng.standard_normal((1, num_draws, 1))
    post["sigma"] = np.full((1, num_draws, 1), 0.1)
    dims = {n: ["gpu"] for n in PARAM_NAMES} | {"cell_offset": ["cell"], "sigma": ["noise_key"]}
    coords = {
        "gpu": list(GPUS),
        "cell": ["splitwise|decode_step:time"],
        "noise_key": ["decode_step:time"],
    }
    if engine_all_reduce_scale is not None:
        scale = np.full((1, num_draws, 1), np.log(engine_all_reduce_scale))
        post["cell_offset"] = np.concatenate([post["cell_offset"], scale], axis=2)
        coords["cell"].append(ENGINE_ALL_REDUCE_CELL)
    return fitting.Posterior(az.from_dict(posterior=post, coords=coords, dims=dims))


def test_efficiency_draws_price_the_all_reduce_at_the_engine_custom_latency():
    """Without a source's own ``comm:latency`` cell, the draws' collective latencies alpha and
    alpha_0 carry the engine all-reduce cell's scale (CUDA-graph custom all-reduce); every other
    field is untouched."""
    plain = fitting.efficiency_draws(_toy_posterior(), "h100-sxm", 100, seed=2)
    engine = fitting.efficiency_draws(
        _toy_posterior(engine_all_reduce_scale=0.4), "h100-sxm", 100, seed=2
    )
    for f in ("collective_latency_s", "collective_base_latency_s"):
        np.testing.assert_allclose(getattr(engine, f), 0.4 * getattr(plain, f), rtol=1e-12)
    np.testing.assert_array_equal(engine.compute_fraction_max, plain.compute_fraction_max)
    np.testing.assert_array_equal(engine.time_scale, plain.time_scale)


def test_posterior_netcdf_round_trip(tmp_path):
    p = _toy_posterior()
    path = fitting.save_posterior(p, tmp_path / "p.nc")
    q = fitting.load_posterior(path)
    assert q.gpus == GPUS and q.cells == p.cells and q.num_draws == 50
    for name in PARAM_NAMES + ("cell_offset", "sigma"):
        np.testing.assert_array_equal(q.flat(name), p.flat(name))


def test_efficiency_draws_shapes_and_unseen_gpu_fallback():
    p = _toy_posterior()
    e = fitting.efficiency_draws(p, "h100-sxm", 200, seed=3, source="splitwise")
    assert e.compute_fraction_max.shape == (200,) and e.step_overhead_s.shape == (200,)
    # known GPU: its own values (tau spread of draws is 0.01 on the logit scale), scaled by a tiny offset
    known = p.flat("compute_fraction_max")[:, 1]
    assert float(jnp.median(e.compute_fraction_max)) == pytest.approx(
        float(np.median(known)), rel=0.05
    )
    # unseen GPU and unseen source: population draws, wider than the known GPU's
    new = fitting.efficiency_draws(p, "b200", 200, seed=3)
    centre = float(
        to_natural("compute_fraction_max", prior_center_unconstrained("compute_fraction_max"))
    )
    assert float(jnp.median(new.compute_fraction_max)) == pytest.approx(centre, rel=0.1)
    assert float(jnp.std(new.compute_fraction_max)) > 3 * float(jnp.std(e.compute_fraction_max))
    # the FP8 derate belongs to the step model (``low_precision_compute_ratio`` at FP8 GEMMs):
    # the draws are the same whatever the weight dtype, so it is never applied twice
    fp8 = fitting.efficiency_draws(
        p, "h100-sxm", 200, seed=3, source="splitwise", weight_dtype="fp8"
    )
    np.testing.assert_array_equal(fp8.compute_fraction_max, e.compute_fraction_max)
    np.testing.assert_array_equal(fp8.low_precision_compute_ratio, e.low_precision_compute_ratio)
    # vmap-able over the draw axis by construction
    assert jax.tree.leaves(e)[0].shape == (200,)


def test_unseen_gpus_draw_independent_population_values_under_one_seed():
    """Two GPUs the posterior lacks, drawn with the same seed, get independent population draws
    (each has its own stream keyed by its name); the same GPU and seed repeat exactly."""
    p = _toy_posterior()
    a = fitting.kernel_efficiency_draws(p, "b200", 400, seed=0).gemm_half_width
    b = fitting.kernel_efficiency_draws(p, "mi300x", 400, seed=0).gemm_half_width
    again = fitting.kernel_efficiency_draws(p, "b200", 400, seed=0).gemm_half_width
    np.testing.assert_array_equal(np.asarray(a), np.asarray(again))
    # independent draws: |r| ~ 1/sqrt(400) = 0.05; identical streams would give r = 1
    r = np.corrcoef(np.asarray(a), np.asarray(b))[0, 1]
    assert abs(r) < 0.2
    # in one call (the predictive path), two unseen GPUs are independent too
    rng = np.random.default_rng(0)
    both = _posterior.parameter_draws(p, ("b200", "mi300x"), np.arange(50), rng)
    assert abs(np.corrcoef(both["bandwidth_fraction"].T)[0, 1]) < 0.5


def test_bundled_posterior_loads_with_diagnostics_ok_and_api():
    p = fitting.load_posterior()
    assert p.idata.attrs["method"] == "nuts"
    d = fitting.diagnose(p.idata)
    assert d.ok, d.report()
    e = fitting.efficiency_draws(p, "a40", 16)
    assert e.bandwidth_fraction.shape == (16,)
    assert bool(jnp.all((e.bandwidth_fraction > 0) & (e.bandwidth_fraction < 1.5)))


def _closed_loop_rows(metric: str, gpus, concurrencies) -> pd.DataFrame:
    """One lab's vLLM closed-loop rows of ``metric`` (mean), Llama-3.1-8B at 1024/128, TP 1, per
    GPU and concurrency; values to be filled by the test."""
    return pd.DataFrame(
        [
            _row(
                source="lab",
                engine="vllm",
                gpu=gpu,
                model="meta-llama/Llama-3.1-8B",
                scenario="serving",
                metric=metric,
                stat="mean",
                concurrency=c,
                input_len=1024,
                output_len=128,
                tp=1,
            )
            for gpu in gpus
            for c in concurrencies
        ]
    )


def test_serving_stage_recovers_a_known_engine_offset_and_spread(monkeypatch):
    """Serving rows simulated as f(theta_median) * e^(0.7 +/- 0.05): the cut stage's cell offset is
    0.7 and its sigma about the MAD scale 1.4826 * 0.05.  f is a stand-in that depends on the
    parameters and the row (the queueing solve itself is tested in test_queueing; compiling it
    here would cost ~30 s of CPU); it does not read the host overhead, which the stage profiles
    (``test_serving_stage_profiles_the_host_overhead``)."""
    from fitting import _serving_stage
    from fitting._serving_stage import add_serving_stage

    def predict_log(prep, params, cell_offset=None):
        b = prep.blocks.closed
        conc = jnp.asarray(b.concurrency)[b.config]
        return jnp.log(1e-3 * (1.0 + conc) / params.bandwidth_fraction[prep.gpu_idx])

    monkeypatch.setattr(_serving_stage, "predict_log", predict_log)

    # 2,000 draws: the pooled draws' sample sd is then within 10 % of its law's (4.5 of its
    # standard errors, sd / sqrt(2 (n - 1))) for any random stream
    post = _toy_posterior(num_draws=2000)
    table = _closed_loop_rows("ttft", ("h100-sxm",), (1, 2, 4, 8, 16, 32))
    prep = fitting.prepare(table, gpus=post.gpus, cells=post.cells, noise_keys=post.noise_keys)
    params = fitted_efficiency({n: np.median(post.flat(n), axis=0) for n in PARAM_NAMES})
    noise = np.array([0.05, -0.05] * 3)
    table["value"] = np.exp(np.asarray(predict_log(prep, params)) + 0.7 + noise)
    idata, n = add_serving_stage(post.idata, table, seed=0)
    new = fitting.Posterior(idata)
    assert n == 6 and "lab:vllm|serving:ttft" in new.cells and new.noise_keys[-1] == "serving:ttft"
    off = new.flat("cell_offset")[:, new.cells.index("lab:vllm|serving:ttft")]
    assert abs(np.median(off) - 0.7) < 0.03
    # a lab never seen draws from pooled cells, the random-effects predictive of the seen cells
    # with the physics (offset 0) as one more cell: from one lab's c = 0.7 by hand,
    # mu = 0.7 / 2 = 0.35, tau^2 = ((0.7 - 0.35)^2 + 0.35^2) / 1 = 0.245, sd = tau sqrt(1 + 1/2);
    # an engine seen once shrinks its cell towards mu: (0.7 + 0.35) / 2 = 0.525, same sd
    sd = np.sqrt(0.245 * 1.5)
    for name, centre in (("engine:vllm|serving:ttft", 0.525), ("engine:*|serving:ttft", 0.35)):
        pooled = new.flat("cell_offset")[:, new.cells.index(name)]
        # sample median of n draws of N(centre, sd): its sd 1.2533 sd / sqrt(n); within 3 of them
        # (the seen cell's own centre carries the noise's +-0.05 median error: 0.01 more)
        assert abs(np.median(pooled) - centre) < 3.0 * 1.2533 * sd / np.sqrt(len(pooled)) + 0.01
        assert np.std(pooled) == pytest.approx(sd, rel=0.1)
    assert 0.03 < np.median(new.flat("sigma")[:, -1]) < 0.2


def test_serving_stage_profiles_the_host_overhead(monkeypatch):
    """Runs simulated as (g* + 1 ms x c) e^(0.4 +/- 0.02), g* = 0.3 ms, c the concurrency: a fixed
    cost per iteration beside work that grows with the batch.  A multiplicative offset cannot
    mimic g*, so the profile recovers it (within the grid's parabola, 5 %), for every GPU and for
    a GPU never fitted (tau 0), and the offset is then the 0.4 the rows carry.  Without any
    overhead in the rows the profile rests at the fit's prior median (1 ms)."""
    from fitting import _serving_stage
    from fitting._serving_stage import add_serving_stage

    def predict_log(prep, params, cell_offset=None):
        b = prep.blocks.closed
        conc = jnp.asarray(b.concurrency)[b.config]
        return jnp.log(params.step_overhead_s[prep.gpu_idx] + 1e-3 * conc)

    monkeypatch.setattr(_serving_stage, "predict_log", predict_log)
    post = _toy_posterior()
    table = _closed_loop_rows("tpot", GPUS, (1, 2, 4, 8, 16, 32, 64))
    conc = table["concurrency"].to_numpy(float)
    noise = 0.02 * np.tile([1.0, -1.0], len(table) // 2 + 1)[: len(table)]
    table["value"] = (0.3e-3 + 1e-3 * conc) * np.exp(0.4 + noise)
    idata, n = add_serving_stage(post.idata, table, seed=0)
    new = fitting.Posterior(idata)
    g = idata.attrs["serving_step_overhead_s"]
    assert n == len(table) and g == pytest.approx(0.3e-3, rel=0.05)
    assert np.all(new.flat("step_overhead_s") == g) and np.all(new.flat("tau_step_overhead_s") == 0)
    unseen = fitting.efficiency_draws(new, "b200", 8, seed=0)
    np.testing.assert_allclose(np.asarray(unseen.step_overhead_s), g)
    off = new.flat("cell_offset")[:, new.cells.index("lab:vllm|serving:tpot")]
    assert abs(np.median(off) - 0.4) < 0.03

    def flat(prep, params, cell_offset=None):
        b = prep.blocks.closed
        return jnp.log(
            1e-3 * jnp.asarray(b.concurrency)[b.config] + 0.0 * params.step_overhead_s[prep.gpu_idx]
        )

    monkeypatch.setattr(_serving_stage, "predict_log", flat)
    idata, _ = add_serving_stage(post.idata, table, seed=0)
    assert idata.attrs["serving_step_overhead_s"] == pytest.approx(1e-3, rel=1e-6)


def test_population_offset_by_hand_and_its_limits():
    """The unseen-lab offset: the physics counts as one cell (mu = sum c / (n + 1))."""
    from fitting._serving_stage import MIN_SPREAD, population_offset

    # three labs at +1.0: mu = 3 / 4, tau^2 = (3 * 0.25^2 + 0.75^2) / 3 = 0.25, sd = 0.5 sqrt(5/4)
    mu, sd = population_offset([1.0, 1.0, 1.0])
    assert mu == pytest.approx(0.75) and sd == pytest.approx(0.5 * np.sqrt(1.25))
    # labs that disagree about 0 leave the centre at the physics and widen the interval
    mu, sd = population_offset([-1.0, 1.0])
    assert mu == pytest.approx(0.0) and sd == pytest.approx(np.sqrt(1.0 * (1 + 1 / 3)))
    # many labs agreeing: the centre goes to their value, the spread to the floor
    mu, sd = population_offset([0.4] * 999)
    assert mu == pytest.approx(0.4 * 999 / 1000) and sd < 0.02 + MIN_SPREAD


def test_a_pooled_cells_draws_do_not_move_when_another_group_is_added():
    """Each pooled cell draws from a stream of its own name (``named_stream``): adding another
    group's cells (listed first, so a shared stream would hand the old cells later numbers)
    leaves the old cells' draws bit for bit; the draws follow the pooled law's centre and spread
    (``population_offset``), and another seed gives other draws."""
    from fitting._serving_stage import _engine_cells, population_offset

    n = 4000
    ttft = ["a:vllm|serving:ttft", "b:vllm|serving:ttft"]
    offsets = [np.full(8, 0.3), np.full(8, 0.5)]
    names, draws = _engine_cells(ttft, offsets, seed=0, n_draw=n)
    more = ["a:vllm|serving:tpot", "b:sglang|serving:tpot"] + ttft
    names2, draws2 = _engine_cells(more, [np.full(8, -0.1), np.full(8, 0.2)] + offsets, 0, n)
    before, after = dict(zip(names, draws)), dict(zip(names2, draws2))
    assert set(before) == {"engine:vllm|serving:ttft", "engine:*|serving:ttft"}
    for name, d in before.items():
        np.testing.assert_array_equal(after[name], d)
    mu, sd = population_offset([0.3, 0.5])
    any_engine = before["engine:*|serving:ttft"]
    assert np.mean(any_engine) == pytest.approx(mu, abs=4 * sd / np.sqrt(n))
    assert np.std(any_engine) == pytest.approx(sd, rel=0.05)
    _, other = _engine_cells(ttft, offsets, seed=1, n_draw=n)
    assert not np.array_equal(other[0], draws[0])
