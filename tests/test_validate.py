"""Validation scores: APE and interval coverage, by scenario / GPU / source."""

import numpy as np
import pandas as pd
import pytest

import fitting
from fitting._validate import score_draws, validate
from fitting.ingest import COLUMNS

KEYS = {
    "n",
    "median_ape",
    "mape",
    "coverage_50",
    "coverage_90",
    "skipped",
    "by_scenario",
    "by_gpu",
    "by_source",
}


def test_scores_on_constructed_draws():
    rng = np.random.default_rng(0)
    table = pd.DataFrame(
        {
            "scenario": ["op", "op", "prefill"],
            "gpu": ["a", "b", "a"],
            "source": ["s", "s", "t"],
            "metric": ["time", "time", "time"],
            "engine": ["x", "x", "y"],
        }
    )
    draws = np.stack(
        [
            rng.standard_normal(4000),
            rng.standard_normal(4000),
            5.0 + 0.1 * rng.standard_normal(4000),
        ],
        axis=1,
    )
    out = score_draws(table, draws, np.zeros(3))
    assert out["n"] == 3
    ape = [abs(np.exp(np.median(draws[:, i])) - 1.0) for i in range(3)]
    assert out["median_ape"] == pytest.approx(np.median(ape))
    assert out["mape"] == pytest.approx(np.mean(ape))
    assert out["coverage_50"] == pytest.approx(2 / 3) and out["coverage_90"] == pytest.approx(2 / 3)
    assert out["by_scenario"]["prefill"]["coverage_90"] == 0.0
    assert out["by_gpu"]["b"]["n"] == 1 and out["by_source"]["s"]["coverage_50"] == 1.0


def _rows():
    raw = pd.read_csv(fitting.bundled_measurements()[0].parent / "splitwise.csv")
    ok = raw[~raw.notes.str.contains("MISMATCH|POWER-CAPPED")].sample(60, random_state=0)
    nvl = {c: np.nan for c in COLUMNS} | {
        "source": "x",
        "gpu": "tpu-v9",
        "scenario": "collective",
        "op": "all_reduce",
        "metric": "time",
        "unit": "s",
        "value": 1e-4,
        "message_bytes": 2**20,
        "tp": 1,
        "pp": 1,
        "num_gpus": 2,
        "notes": "single-node",
        "engine": "nccl",
    }
    return pd.concat([ok, pd.DataFrame([nvl])], ignore_index=True)


def test_validate_keys_and_counts_on_a_tiny_table():
    post = fitting.load_posterior()
    out = validate(post, _rows(), num_draws=100)
    assert KEYS <= set(out)
    assert out["n"] == 60 and out["skipped"] == 1
    assert any("tpu-v9" in reason for reason in out["skipped_reasons"])
    assert set(out["by_scenario"]) == {"prefill", "decode_step"}
    assert sum(s["n"] for s in out["by_gpu"].values()) == 60
    for s in [out, *out["by_scenario"].values()]:
        assert 0.0 <= s["coverage_50"] <= s["coverage_90"] <= 1.0
        assert s["median_ape"] >= 0.0


def test_intervals_are_calibrated_on_data_drawn_from_the_predictive():
    """Simulation-based check (Talts et al. 2018 in spirit): measurements drawn from the posterior
    predictive itself land in its 90 % intervals about 90 % of the time."""
    post = fitting.load_posterior()
    table = _rows().iloc[:60].copy()
    prep = fitting.prepare(table, gpus=post.gpus, cells=post.cells, noise_keys=post.noise_keys)
    fake = fitting.predictive_log_draws(post, prep, 1, seed=11)[0]
    table.loc[prep.table.index, "value"] = np.exp(fake)
    out = validate(post, table, num_draws=400, seed=5)
    assert 0.75 <= out["coverage_90"] <= 1.0
    assert 0.3 <= out["coverage_50"] <= 0.7


def test_chunked_draws_equal_one_vmapped_call():
    """Draws are evaluated in chunks of one compiled shape, the last one padded: chunking must
    neither reorder, drop nor change a draw (10 draws in chunks of 4: 4 + 4 + 2 padded to 4)."""
    import jax
    import jax.numpy as jnp

    from fitting._posterior import draw_indices, parameter_draws
    from fitting._predict import fitted_efficiency, predict_log
    from fitting._predictive import map_chunks

    post = fitting.load_posterior()
    prep = fitting.prepare(_rows(), gpus=post.gpus, cells=post.cells, noise_keys=post.noise_keys)
    rng = np.random.default_rng(3)
    params = parameter_draws(post, prep.gpus, draw_indices(post, 10, rng), rng)
    xs = (
        fitted_efficiency(params),
        jnp.asarray(rng.normal(0.0, 0.1, (10, len(prep.cells)))),
    )

    def fn(p, o):
        return predict_log(prep, p, o)

    whole = np.asarray(jax.vmap(fn)(*xs))
    chunked = map_chunks(fn, xs, 4)
    assert chunked.shape == whole.shape == (10, 60)
    np.testing.assert_allclose(chunked, whole, rtol=1e-12, atol=0.0)
    assert np.all(np.ptp(whole, axis=0) > 0.0)  # the draws differ, so an order slip would show


def test_held_out_scores_keep_a_predicted_overload_as_a_miss(monkeypatch):
    """A measured run finished, so a prediction of overload (no finite latency) is the model's
    error: the held-out scores count it (APE infinite, in neither interval) instead of dropping
    it; the other rows score as before."""
    import fitting._holdout as holdout

    post = fitting.load_posterior()
    table = _rows().iloc[:5]
    prep = fitting.prepare(table, gpus=post.gpus, cells=post.cells, noise_keys=post.noise_keys)
    draws = np.tile(prep.log_value + np.log(1.1), (40, 1))  # every draw 10 % high
    draws[:, 0] = np.inf
    monkeypatch.setattr(holdout, "predictive_log_draws", lambda *a, **k: draws)
    tab, ape, in50, in90, skipped = holdout.score_rows(post, table, num_draws=40, seed=0)
    assert len(tab) == 5 and skipped == 0
    assert ape[0] == np.inf and not in50[0] and not in90[0]
    assert ape[1:] == pytest.approx(0.1) and not in90[1:].any()
    assert tab["predicted"].iloc[0] == np.inf  # the median draw is overloaded
    np.testing.assert_allclose(tab["predicted"].iloc[1:], 1.1 * np.exp(prep.log_value[1:]))


def test_an_interval_that_reaches_overloaded_draws_is_open_above():
    """Overloaded draws (+inf) rank above every finite one: with 20 of 100 draws overloaded the
    median is finite and the 90 % interval is [q05, inf), so a slow measured run inside it is
    covered (not lost to inf - inf = nan); with 60 of 100 the median is overloaded, a miss."""
    from fitting._validate import row_scores

    finite = np.log(np.linspace(1.0, 2.0, 100))
    draws = np.stack([finite, finite], axis=1)
    draws[80:, 0] = np.inf
    draws[40:, 1] = np.inf
    measured = np.log(np.array([50.0, 50.0]))  # far above every finite draw
    ape, in50, in90 = row_scores(draws, measured)
    assert in90[0] and not in50[0]
    assert np.isfinite(ape[0]) and ape[0] == pytest.approx(1.0 - np.exp(np.median(finite)) / 50)
    assert ape[1] == np.inf and not in90[1] and not in50[1]


def test_validate_scores_an_overloaded_finished_run_as_a_miss_in_plain_json():
    """A finished run the model calls overloaded stays in validate's scores: n counts it, it ranks
    above every finite APE in the median, lies outside both intervals and is counted in
    ``overloaded``; the mean is over the finite APEs, and a median that lands on overloaded rows
    is None (JSON null), never Infinity."""
    import json

    table = pd.DataFrame(
        {
            "scenario": ["serving"] * 3,
            "gpu": ["a"] * 3,
            "source": ["s"] * 3,
            "metric": ["ttft"] * 3,
            "engine": ["x"] * 3,
        }
    )
    draws = np.log(np.tile([1.1, 1.2, 1.0], (100, 1)))
    draws[:, 2] = np.inf
    out = score_draws(table, draws, np.zeros(3))
    assert out["n"] == 3 and out["overloaded"] == 1
    assert out["median_ape"] == pytest.approx(0.2)  # 0.1, 0.2, inf
    assert out["mape"] == pytest.approx(0.15)
    assert out["coverage_90"] == 0.0
    draws[:, 1] = np.inf
    worse = score_draws(table, draws, np.zeros(3))
    assert worse["median_ape"] is None and worse["overloaded"] == 2
    assert "Infinity" not in json.dumps(worse) and "NaN" not in json.dumps(worse)
    assert "overload" in fitting.format_report(worse | {"skipped": 0, "subsample": None})
