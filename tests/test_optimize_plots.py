"""``--plot DIR`` for ``optimize`` (cost vs SLO probability, latency posterior) and ``forecast``
(fan chart): the PNGs are written, non-empty and real PNGs; ``--png FILE`` still works."""

import html
import json
import math

import numpy as np
import pytest
from demand_files import write_demand
from optimize_problems import WORKLOAD, small_problem
from report_checks import assert_renders, assert_self_contained, parse_yaml, sheet, table_rows

from optimize import KNOBS, describe_config, make_problem
from optimize._plots import NAMES, config_index, latency_draws, replica_tradeoff
from perfmodel import load_model
from servingmath.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
BASE = ["--model", "meta-llama/Llama-3.1-8B", "--prior", "--draws", "8"]  # as test_cli_optimize


def _is_png(path):
    data = path.read_bytes()
    return data.startswith(PNG) and len(data) > 5000


def test_optimize_plot_writes_two_pngs(tmp_path, capsys):
    """The one real optimize run of the plots also writes --report and --emit (no extra compile:
    the report's figures are the plots' figures)."""
    out = tmp_path / "figs"
    page, emit = tmp_path / "plan.html", tmp_path / "launch"
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
        "--pool-ratios",
        "none",
        "--ttft-p95",
        "1.0",
        "--tpot-p95",
        "0.05",
        "--plot",
        str(out),
        "--report",
        str(page),
        "--emit",
        str(emit),
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    answer = json.loads(captured.out)
    assert answer["feasible"]  # stdout stays one JSON object
    for key in ("tradeoff", "latency"):
        assert _is_png(out / NAMES[key])
        assert NAMES[key] in captured.err
    _check_emit(emit, answer)
    _check_report(page, answer, tmp_path)


def _check_report(page, answer, tmp_path):
    """The page loads in Chromium without a console message, is self-contained, and shows the
    --json object's numbers (cost, GPUs, latency percentiles, runner-ups) and the question."""
    dom = page.read_text(encoding="utf-8")
    assert_self_contained(dom)
    kv = sheet(dom)
    config = f"{answer['replicas']} x {answer['gpu']} (TP {answer['tp']}, PP {answer['pp']})"
    assert kv["configuration"].startswith(config)  # the answer, as text
    assert int(kv["GPUs"]) == answer["num_gpus"] and int(kv["replicas"]) == answer["replicas"]
    assert float(kv["cost ($/hour)"]) == pytest.approx(answer["cost_per_hour"], rel=1e-5)
    assert float(kv["SLO probability"]) == pytest.approx(answer["slo_probability"], rel=1e-5)
    assert kv["binding constraint"] == answer["binding_constraint"]
    (ttft,) = [r for r in table_rows(dom) if r[0] == "TTFT" and len(r) == 4]
    for cell, p in zip(ttft[1:], ("p50", "p95", "p99")):
        assert float(cell) == pytest.approx(answer["ttft_s"][p], rel=1e-5)
    for alt in answer["alternatives"]:
        costs = [
            r[3]
            for r in table_rows(dom)
            if len(r) == 5
            and r[0].startswith(f"{alt['replicas']} x {alt['gpu']} TP{alt['tp']} PP{alt['pp']}")
        ]
        assert any(float(c) == pytest.approx(alt["cost_per_hour"], rel=1e-5) for c in costs)
    assert (
        float(kv["p95 TTFT bound (s)"]) == 1.0
        and float(kv["confidence (probability over the posterior)"]) == 0.9
    )
    assert kv["candidate GPUs"] == "h100-sxm, l40s" and kv["calibration"].endswith("(--prior)")
    assert dom.count("data:image/png;base64,") == 2
    shown = assert_renders(page, tmp_path / "profile")  # loads, no console message
    assert sheet(shown)["configuration"].startswith(config)
    assert answer["engine_args"]["vllm"] in html.unescape(shown)


def _check_emit(emit, answer):
    """Scripts hold engine_args' commands; the manifest the answer's replicas and GPUs."""
    for engine in ("vllm", "sglang", "trtllm"):
        script = (emit / f"{engine}.sh").read_text()
        assert (emit / f"{engine}.sh").stat().st_mode & 0o111
        assert script.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in script
        if not answer["disaggregation"]:
            assert answer["engine_args"][engine] in script.splitlines()
    docs = parse_yaml((emit / "deployment.yaml").read_text())
    pools = answer["disaggregation"] or {}
    expected = [pools["prefill"], pools["decode"]] if pools else [answer]
    assert [d["spec"]["replicas"] for d in docs] == [p["replicas"] for p in expected]
    for doc, pool in zip(docs, expected):
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert gpus * pool["replicas"] == pool["num_gpus"] and gpus == answer["tp"] * answer["pp"]
        assert f"--tensor-parallel-size {answer['tp']}" in " ".join(container["args"])


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
        "--report",
        str(tmp_path / "forecast.html"),
    ]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert "periods" in result
    assert _is_png(tmp_path / "figs" / NAMES["fan"])
    assert _is_png(png)
    page = tmp_path / "forecast.html"
    dom = page.read_text(encoding="utf-8")
    assert_self_contained(dom)
    rows = {r[0]: r for r in table_rows(dom) if len(r) == 8}  # period -> its h100-sxm row
    for p in result["periods"]:
        s = p["gpus"]["h100-sxm"]
        row = rows[p["period"]]
        assert float(row[1]) == p["requests_per_s"] and row[2] == "h100-sxm"
        assert float(row[3]) == pytest.approx(s["p50"], rel=1e-5)
        assert [float(x) for x in row[4].split(" to ")] == pytest.approx(s["p80"], rel=1e-5)
        assert [float(x) for x in row[5].split(" to ")] == pytest.approx(s["p95"], rel=1e-5)
        assert float(row[7]) == pytest.approx(p["cost_per_hour"]["p50"], rel=1e-5)
    assert sheet(dom)["demand CSV (the rate above is its peak)"] == str(demand)
    assert result["question"]["workload"]["arrival_rate_per_s"] == 10.0  # the peak
    assert dom.count("data:image/png;base64,") == 1
    shown = assert_renders(page, tmp_path / "profile")  # loads, no console message
    assert "The answer: GPUs per period" in shown


def test_plot_helpers_agree_with_the_model():
    gpus = ("h100-sxm",)
    problem = small_problem(max_replicas=8, num_draws=16, gpus=gpus)
    grid = problem.grid
    config = np.zeros(len(KNOBS), dtype=np.int32)
    config[KNOBS.index("tp")] = config[KNOBS.index("prefill_tp")] = 1  # colocated: one TP, PP
    assert np.array_equal(
        config_index(problem, gpus, describe_config(problem, gpus, config, 3)), config
    )
    split_grid = grid._replace(num_gpus=2, pool_ratios=((1, 1), (2, 1)), chunk_sizes=(512, 2048))
    two = ("h100-sxm", "l40s")
    split = make_problem(
        load_model("meta-llama/Llama-3.1-8B"), two, WORKLOAD, grid=split_grid, num_draws=4
    )
    c = np.asarray(
        [0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 1, 0], dtype=np.int32
    )  # 2:1, prefill on l40s
    d = describe_config(split, two, c, 3)
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
    # the prefill pool at its own TP 1 beside the decode pool's TP 2: 6 + 6 GPUs
    own = c.copy()
    own[KNOBS.index("prefill_tp")] = 0
    d = describe_config(split, two, own, 3)
    assert d["disaggregation"]["prefill"]["tp"] == 1 and d["disaggregation"]["decode"]["tp"] == 2
    assert d["disaggregation"]["prefill"]["num_gpus"] == 6 and d["num_gpus"] == 12
    assert np.array_equal(config_index(split, two, d), own)
    cost, prob = replica_tradeoff(problem, config)
    price = float(problem.hardware.price_per_gpu_hour[0])
    np.testing.assert_allclose(cost, np.arange(1, 9) * 2 * price)  # TP 2: two GPUs per replica
    assert np.all(np.diff(prob) >= 0)  # more replicas never lower the SLO probability
    ttft1, _, itl1 = latency_draws(problem, config, 1)
    ttft8, _, _ = latency_draws(problem, config, 8)
    assert itl1.shape == (16,) and np.all(itl1 > 0)
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


def test_latency_figure_shows_itl_only_when_the_question_bounds_it():
    """Two panels (p95 TTFT, p95 TPOT) without an ITL bound; a third, p95 ITL with its bound as
    the red line, when the question has one.  The figure draws the numbers it is given."""
    from types import SimpleNamespace

    from optimize._plots import latency_figure

    rng = np.random.default_rng(0)
    draws = tuple(np.exp(rng.normal(np.log(x), 0.1, 64)) for x in (0.4, 0.03, 0.05))
    out = {"replicas": 2, "gpu": "h100-sxm", "tp": 1, "pp": 1}
    loose = SimpleNamespace(slo_ttft_p95_s=1.0, slo_tpot_p95_s=0.05, slo_itl_p95_s=math.inf)
    tight = SimpleNamespace(slo_ttft_p95_s=1.0, slo_tpot_p95_s=0.05, slo_itl_p95_s=0.06)
    two = latency_figure(loose, ("h100-sxm",), out, {"latency": draws})
    three = latency_figure(tight, ("h100-sxm",), out, {"latency": draws})
    assert [a.get_xlabel() for a in two.axes] == ["p95 TTFT (ms)", "p95 TPOT (ms)"]
    assert three.axes[2].get_xlabel() == "p95 ITL (ms)"
    red = [ln.get_xdata()[0] for ln in three.axes[2].get_lines()]
    assert red == pytest.approx([60.0])
    assert sum(p.get_height() for p in three.axes[2].patches) == 64  # every draw binned
