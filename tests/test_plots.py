"""``--plot DIR``: validate writes the three PNGs (non-empty, PNG signature); the library call too."""

import pandas as pd

import fitting
from fitting._plots import write_plots
from servingmath.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
NAMES = ("posteriors.png", "predicted_vs_measured.png", "residuals_by_scenario.png")


def _tiny_csv(tmp_path):
    raw = pd.read_csv(fitting.bundled_measurements()[0].parent / "trtllm_docs.csv")
    path = tmp_path / "tiny.csv"
    raw.sample(12, random_state=0).to_csv(path, index=False)
    return path


def test_validate_plot_writes_three_pngs(tmp_path, capsys):
    out = tmp_path / "plots"
    assert (
        main(["validate", "--data", str(_tiny_csv(tmp_path)), "--draws", "30", "--plot", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    for name in NAMES:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
        assert name in printed


def test_write_plots_without_measurements_draws_only_the_posteriors(tmp_path):
    paths = write_plots(fitting.load_posterior(), tmp_path)
    assert [p.name for p in paths] == ["posteriors.png"]
    assert (tmp_path / "posteriors.png").read_bytes().startswith(PNG)
