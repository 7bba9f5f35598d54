"""``--plot DIR`` for ``optimize`` (cost vs SLO probability, latency posterior) and ``forecast``
(fan chart): the PNGs are written, non-empty and real PNGs; ``--png FILE`` still works."""

import json

import numpy as np
from demand_files import write_demand
from optimize_problems import WORKLOAD, small_problem

from optimize import make_problem
from optimize._plots import NAMES, config_index, latency_draws, replica_tradeoff
from optimize._recommend import describe
from perfmodel import load_model
from servingmath.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
BASE = ["--model", "meta-llama/Llama-3.1-8B", "--prior", "--draws", "8"]  # as test_cli_optimize


def _is_png(path):
    data = path.read_bytes()
    return data.startswith(PNG) and len(data) > 5000


def test_optimize_plot_writes_two_pngs(tmp_path, capsys):
    out = tmp_path / "figs"
    argv = [
        "optimize",
        *BASE,
        "--gpus",
        "h100-sxm,l40s",
        "--rate",
        "10",
        "--no-verify",
        "--json",
        "--max-replicas",
        "16",
        "--ttft-p95",
        "1.0",
        "--tpot-p95",
        "0.05",
        "--plot",
        str(out),
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["feasible"]  # stdout stays one JSON object
    for key in ("tradeoff", "latency"):
        assert _is_png(out / NAMES[key])
        assert NAMES[key] in captured.err


def test_forecast_plot_dir_and_png_file(tmp_path, capsys):
    demand = write_demand(tmp_path, [("2026-01", 5, 1), ("2026-02", 10, 3)])
    png = tmp_path / "fan.png"
    argv = [
        "forecast",
        *BASE,
        "--kv-dtypes",
        "bf16",
        "--weight-dtypes",
        "bf16",
        "--gpus",
        "h100-sxm",
        "--demand",
        str(demand),
        "--ttft-p95",
        "1.0",
        "--tpot-p95",
        "0.05",
        "--max-replicas",
        "32",
        "--json",
        "--plot",
        str(tmp_path / "figs"),
        "--png",
        str(png),
    ]
    assert main(argv) == 0
    assert "periods" in json.loads(capsys.readouterr().out)
    assert _is_png(tmp_path / "figs" / NAMES["fan"])
    assert _is_png(png)


def test_plot_helpers_agree_with_the_model():
    gpus = ("h100-sxm",)
    problem = small_problem(max_replicas=8, num_draws=16, gpus=gpus)
    grid = problem.grid
    config = np.asarray([0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0], dtype=np.int32)
    assert np.array_equal(config_index(problem, gpus, describe(problem, gpus, config, 3)), config)
    split_grid = grid._replace(num_gpus=2, pool_ratios=((1, 1), (2, 1)), chunk_sizes=(512, 2048))
    two = ("h100-sxm", "l40s")
    split = make_problem(
        load_model("meta-llama/Llama-3.1-8B"), two, WORKLOAD, grid=split_grid, num_draws=4
    )
    c = np.asarray([0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1], dtype=np.int32)  # 2:1, prefill on l40s
    d = describe(split, two, c, 3)
    assert d["disaggregation"]["prefill"] == {
        "gpu": "l40s",
        "num_gpus": 12,
        "tp": 2,
        "pp": 1,
        "replicas": 6,
    }
    assert (
        d["disaggregation"]["decode"]["num_gpus"] == 6
        and d["num_gpus"] == 18
        and d["chunk_size"] == 512
    )
    assert np.array_equal(config_index(split, two, d), c)
    cost, prob = replica_tradeoff(problem, config)
    price = float(problem.hardware.price_per_gpu_hour[0])
    np.testing.assert_allclose(cost, np.arange(1, 9) * 2 * price)  # TP 2: two GPUs per replica
    assert np.all(np.diff(prob) >= 0)  # more replicas never lower the SLO probability
    ttft1, _ = latency_draws(problem, config, 1)
    ttft8, _ = latency_draws(problem, config, 8)
    assert ttft1.shape == (16,)
    assert np.all(ttft8 <= ttft1 + 1e-12)  # less load per replica, shorter queues


def test_fleet_chart_from_a_fleet_result(tmp_path):
    from optimize._plots import fleet_chart

    result = {
        "classes": [
            {"prompt_tokens": 256.0, "output_tokens": 128.0, "requests_per_s": 5.0},
            {"prompt_tokens": 12000.0, "output_tokens": 512.0, "requests_per_s": 1.0},
        ],
        "plan": {
            "h100-sxm": {"gpus": 2, "replicas_by_class": {"1": 2}},
            "l40s": {"gpus": 3, "replicas_by_class": {"0": 3}},
        },
        "cost_per_hour": 10.0,
        "milp_cost_per_hour": 10.0,
    }
    path = fleet_chart(result, tmp_path / "figs" / NAMES["fleet"])
    assert _is_png(path)
