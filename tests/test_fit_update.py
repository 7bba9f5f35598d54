"""``fitting._update``: a few measurements of a held-out GPU beat its spec-sheet-only prediction;
``servingmath fit --prior`` writes a loadable posterior, a GPU outside the catalog included."""

import functools

import jax
import numpy as np
import pandas as pd

import fitting
from fitting._predictive import predictive_log_draws
from fitting._update import update_posterior, without_gpu
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
