"""``fitting._update``: a few measurements of a held-out GPU beat its spec-sheet-only prediction;
``servingmath fit --prior`` writes a loadable posterior, a GPU outside the catalog included."""

import functools

import jax
import numpy as np
import pandas as pd

import fitting
from fitting._predictive import predictive_log_draws
from fitting._update import run_labels, run_units, update_posterior, without_gpu
from servingmath.cli import main

GPU = "a40"


@functools.lru_cache(maxsize=1)
def _rows() -> pd.DataFrame:
    """A seeded spread of a40 rows (vidur ops), stratified so every op kind appears."""
    data = fitting.bundled_measurements()[0].parent / "vidur_ops.csv.gz"
    table = fitting.load_measurements([str(data)]).table
    return fitting.subsample(table[table["gpu"] == GPU], 6, 0)


def _median_ape_and_width(posterior, table) -> tuple[float, float]:
    """Median APE of the predictive median and median width of the 90 % interval (log scale)."""
    prep = fitting.prepare(
        table, gpus=posterior.gpus, cells=posterior.cells, noise_keys=posterior.noise_keys
    )
    assert len(prep.log_value) == len(table)
    draws = predictive_log_draws(posterior, prep, 100, seed=0)
    ape = np.abs(np.exp(np.median(draws, axis=0) - prep.log_value) - 1.0)
    lo, hi = np.quantile(draws, [0.05, 0.95], axis=0)
    return float(np.median(ape)), float(np.median(hi - lo))


def test_ten_rows_of_a_held_out_gpu_narrow_its_intervals_at_spec_sheet_accuracy_or_better():
    jax.config.update("jax_enable_x64", True)
    prior = without_gpu(fitting.load_posterior(), GPU)
    assert GPU not in prior.gpus
    rows = _rows()
    fit_rows = rows.sample(10, random_state=1)
    rest = rows.drop(fit_rows.index)
    assert len(rest) >= 30
    updated, prep = update_posterior(prior, fit_rows, draws=100, warmup=100, chains=1, seed=0)
    assert len(prep.log_value) == 10 and GPU in updated.gpus
    assert set(prior.gpus) < set(updated.gpus)
    (spec_only, spec_width), (after, width) = (
        _median_ape_and_width(prior, rest),
        _median_ape_and_width(updated, rest),
    )
    # the rows pin the GPU's own parameters: its intervals narrow, and its accuracy is at least
    # the spec sheet's (the bundled population already predicts an a40's vidur ops to ~6 %, so
    # the two medians can tie within the 100-draw Monte Carlo error of half a point)
    assert width < 0.9 * spec_width, (width, spec_width)
    assert after < spec_only + 0.005, (after, spec_only)
    eff = fitting.efficiency_draws(updated, GPU, 50)
    assert eff.bandwidth_fraction.shape == (50,) and np.all(np.isfinite(eff.bandwidth_fraction))
    # the noise of the groups the rows touch is sampled (LogNormal around the prior's median),
    # not pinned at it: its draws spread, and stay positive and finite
    for key in prep.noise_keys:
        sig = updated.flat("sigma")[:, updated.noise_keys.index(key)]
        assert np.all(np.isfinite(sig) & (sig > 0)) and np.std(np.log(sig)) > 0.05, key


def test_cli_fit_prior_writes_a_loadable_posterior_for_a_gpu_outside_the_catalog(tmp_path, capsys):
    """The command's plumbing (hardware CSV, plots, the saved file), not the update's accuracy
    (the test above): a few short draws are enough."""
    jax.config.update("jax_enable_x64", True)
    hw = pd.read_csv(
        fitting.bundled_measurements()[0].parent.parent / "hardware.csv",
        dtype=str,
        keep_default_na=False,
    )
    mine = hw[hw["id"] == GPU].assign(id="my-gpu", name="My GPU")
    mine.to_csv(tmp_path / "mine.csv", index=False)
    data = _rows().sample(10, random_state=2).assign(gpu="my-gpu")
    data.to_csv(tmp_path / "new_gpu.csv", index=False)
    out = tmp_path / "new.nc"
    assert (
        main(
            [
                "fit",
                "--data",
                str(tmp_path / "new_gpu.csv"),
                "--prior",
                "--out",
                str(out),
                "--hardware-csv",
                str(tmp_path / "mine.csv"),
                "--draws",
                "10",
                "--warmup",
                "10",
                "--chains",
                "1",
                "--max-tree-depth",
                "3",
                "--plot",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    )
    assert "10 rows of GPU my-gpu" in capsys.readouterr().out
    for name in ("posteriors.png", "predicted_vs_measured.png", "residuals_by_scenario.png"):
        assert (tmp_path / "plots" / name).read_bytes().startswith(b"\x89PNG")
    post = fitting.load_posterior(out)
    assert "my-gpu" in post.gpus and "h100-sxm" in post.gpus and post.num_draws == 10
    frac = post.flat("compute_fraction_max")[:, post.gpus.index("my-gpu")]
    assert np.all((frac > 0) & (frac <= 1))
    assert fitting.efficiency_draws(post, "my-gpu", 20).compute_fraction_max.shape == (20,)


E2E_GPU = "h100-sxm"


@functools.lru_cache(maxsize=1)
def _inferencemax_rows() -> pd.DataFrame:
    """The end-to-end rows of InferenceMAX's h100-sxm runs (13 rows a run: mean, median and p99
    of TTFT, TPOT, ITL and end-to-end latency, and the output throughput)."""
    data = fitting.bundled_measurements()[0].parent / "inferencemax_nvidia.csv.gz"
    table = fitting.load_measurements([str(data)]).table
    return table[(table["gpu"] == E2E_GPU) & table["scenario"].isin(fitting.E2E_SCENARIOS)]


def test_run_units_pool_the_rows_one_benchmark_run_reports_per_metric():
    """Two InferenceMAX runs, 13 rows each: per run one unit per metric (TTFT, TPOT, ITL and
    end-to-end latency: mean, median, p99 each; the throughput alone), so 2 x 5 units."""
    rows = _inferencemax_rows()
    labels = run_labels(rows)
    two = rows[labels.isin(sorted(labels.unique())[:2])]
    assert len(two) == 26
    prep = fitting.prepare(two)
    unit, unit_key = run_units(prep)
    assert len(prep.log_value) == 26 and len(unit_key) == 10
    sizes = np.bincount(unit)
    assert sorted(sizes) == [1, 1] + [3] * 8
    keys = np.asarray(prep.noise_keys)
    for u in range(10):
        assert set(keys[prep.noise_idx[unit == u]]) == {keys[unit_key[u]]}
        assert run_labels(prep.table[unit == u]).nunique() == 1


def test_three_runs_of_a_new_gpu_keep_its_90_percent_intervals_on_its_other_runs():
    """An update on 3 benchmark runs (39 rows) of a GPU the prior treats as new, scored on rows of
    its other runs: its 90 % intervals must still cover near 90 % of them.  The 3 runs pin only
    3 configurations; treated as 39 independent rows they would pin the efficiencies and the
    noise to those configurations.  (The prior's cut stage here saw this GPU's runs, as the
    bundled one did; ``benchmarks/bench_new_gpu_e2e.py`` refits it without them.)"""
    jax.config.update("jax_enable_x64", True)
    prior = without_gpu(fitting.load_posterior(), E2E_GPU)
    rows = _inferencemax_rows()
    labels = run_labels(rows)
    order = np.random.default_rng(0).permutation(np.asarray(sorted(labels.unique())))
    fit_rows = rows[labels.isin(order[:3])]
    held = rows[labels.isin(order[3:])].sample(150, random_state=0)
    updated, prep = update_posterior(
        prior,
        fit_rows,
        from_population=True,
        draws=60,
        warmup=60,
        chains=1,
        seed=0,
        max_tree_depth=4,
    )
    assert len(prep.log_value) == 39 and updated.idata.attrs["update_run_units"] == 15
    _, _, _, in90, skipped = fitting.score_rows(updated, held, num_draws=100, seed=0)
    assert skipped == 0 and len(in90) == 150
    # nominal 90 % (0.90 here; 0.91 at tree depth 5); rows counted as independent: 0.80 on these
    # rows
    assert in90.mean() >= 0.85, in90.mean()


def _posterior_with_group_biases(n: int):
    """A posterior of one fitted GPU ``a`` with GPU x group biases on a kernel and a step group."""
    import arviz as az

    from fitting._posterior import Posterior

    return Posterior(
        az.from_dict(
            posterior={
                "gpu_group": np.stack([np.full(n, 0.3), np.full(n, -0.2)], axis=-1)[None, :, None],
                "tau_gpu_kernel": np.full((1, n), 0.4),
            },
            coords={"gpu": ["a"], "group": ["op:rope", "decode_step:time"]},
            dims={"gpu_group": ["gpu", "group"]},
        )
    )


def test_a_new_gpus_update_starts_its_end_to_end_biases_from_its_spec_sheet_predictive():
    """The update's prior of eta for a new GPU is the spread the predictive gives it before any
    run (tau_gpu_kernel on its kernel, whole-model and end-to-end groups); a GPU the prior fitted
    keeps its own draws, and 0 on end-to-end groups (its runs pinned the offsets); anchor
    groups get 0.  The merged posterior keeps the new GPU's end-to-end biases."""
    from fitting._update_groups import gpu_group_prior, merge_gpu_group

    n = 400
    post = _posterior_with_group_biases(n)
    keys = ("op:rope", "decode_step:time", "serving:ttft", "saturated:output_throughput", "op:norm")
    loc, scale = gpu_group_prior(post, ("a", "new"), keys, from_population=False)
    np.testing.assert_allclose(loc[0, :2], [0.3, -0.2])
    np.testing.assert_allclose(scale[1, :4], 0.4)  # new GPU: tau on every non-anchor group
    assert np.all(loc[1] == 0.0)
    assert scale[0, 2] == scale[0, 3] == scale[1, 4] == 1e-3  # fitted GPU e2e; anchor group
    # from the population, the fitted GPU is new too
    _, scale_pop = gpu_group_prior(post, ("a",), keys, from_population=True)
    np.testing.assert_allclose(scale_pop[0, :4], 0.4)

    class Prep:
        gpus, noise_keys = ("new",), ("serving:ttft",)

    measured = np.full((1, n, 1, 1), 0.25)  # the update's draws of eta[new, serving:ttft]
    out, merged_keys = merge_gpu_group(
        post, Prep, {"gpu_group": measured}, np.arange(n), ["a", "new"], np.random.default_rng(0)
    )
    assert merged_keys == ["op:rope", "decode_step:time", "serving:ttft"]
    np.testing.assert_allclose(out[:, 1, 2], 0.25)  # the new GPU's fitted TTFT bias
    assert np.all(out[:, 0, 2] == 0.0)  # the fitted GPU: none on the new end-to-end group
    np.testing.assert_allclose(out[:, 0, :2], [[0.3, -0.2]] * n)
    assert abs(out[:, 1, 1].std() - 0.4) < 0.05  # the new GPU's unmeasured step group: tau
