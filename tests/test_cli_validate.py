"""``servingmath validate`` / ``fit`` from the command line: JSON keys, one-line errors."""

import json

import numpy as np
import pandas as pd

import fitting
from servingmath.cli import main


def _tiny_csv(tmp_path):
    raw = pd.read_csv(fitting.bundled_measurements()[0].parent / "trtllm_docs.csv")
    path = tmp_path / "tiny.csv"
    raw.sample(12, random_state=0).to_csv(path, index=False)
    return path


def _tiny_kernel_csv(tmp_path):
    """12 aiconfigurator A100 GEMM rows: a fit through the CLI without compiling the step model."""
    raw = pd.read_csv(
        fitting.bundled_measurements()[0].parent / "aic_kernels_a100.csv.gz", low_memory=False
    )
    path = tmp_path / "tiny_gemm.csv"
    raw[raw["op"] == "gemm"].sample(12, random_state=0).to_csv(path, index=False)
    return path


def test_validate_json(tmp_path, capsys):
    assert main(["validate", "--data", str(_tiny_csv(tmp_path)), "--json", "--draws", "50"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "n",
        "median_ape",
        "mape",
        "coverage_50",
        "coverage_90",
        "skipped",
        "by_scenario",
        "by_gpu",
        "by_source",
    ):
        assert key in out
    assert out["n"] == 12 and out["skipped"] == 0
    assert list(out["by_scenario"]) == ["static_batch"]
    assert np.isfinite(out["median_ape"]) and 0.0 <= out["coverage_90"] <= 1.0


def test_validate_missing_data_file_is_one_line_exit_2(tmp_path, capsys):
    assert main(["validate", "--data", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.csv" in err and "Traceback" not in err


def test_validate_missing_posterior_is_one_line_exit_2(tmp_path, capsys):
    code = main(
        ["validate", "--posterior", str(tmp_path / "p.nc"), "--data", str(_tiny_csv(tmp_path))]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "p.nc" in err


def test_fit_rejects_bad_settings_and_missing_files(tmp_path, capsys):
    assert main(["fit", "--data", str(tmp_path / "x.csv"), "--out", str(tmp_path / "o.nc")]) == 2
    assert (
        main(
            [
                "fit",
                "--data",
                str(_tiny_csv(tmp_path)),
                "--out",
                str(tmp_path / "o.nc"),
                "--chains",
                "0",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("servingmath fit: error:") for line in err)


def test_fit_svi_writes_a_loadable_posterior(tmp_path, capsys):
    out = tmp_path / "svi.nc"
    code = main(
        [
            "fit",
            "--data",
            str(_tiny_kernel_csv(tmp_path)),
            "--out",
            str(out),
            "--svi",
            "--svi-steps",
            "200",
            "--draws",
            "50",
        ]
    )
    assert code == 0
    p = fitting.load_posterior(out)
    assert p.idata.attrs["method"] == "svi" and p.num_draws == 50
    assert "svi" in capsys.readouterr().out
