"""``servingmath simulate`` and the load options of ``servingmath explain``: keys, errors, exit codes."""

import argparse
import json
import math

import pytest

import perfmodel as pm
from perfmodel import System
from perfmodel.dynamics import Workload
from servingmath.cli import main
from servingmath.evaluation.load import dynamics_report
from servingmath.reports.load import render_dynamics

BASE = ["--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100-sxm"]
LOAD_KEYS = {"ttft_s", "tpot_s", "e2e_s", "stable", "output_tokens_per_s"}
KEYS = LOAD_KEYS | {"utilization", "seat_occupancy", "queue_bound", "kv_bound"}  # explain
SIM_KEYS = LOAD_KEYS | {"busy_fraction"}  # simulate


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_json_has_the_issue_keys(capsys):
    out = _json(
        capsys,
        [
            "simulate",
            *BASE,
            "--rate",
            "5",
            "--input-len",
            "500",
            "--output-len",
            "50",
            "--requests",
            "200",
            "--json",
        ],
    )
    assert SIM_KEYS <= set(out) and "utilization" not in out
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        p = out[key]
        assert set(p) == {"mean", "p50", "p95", "p99"}
        assert 0 < p["p50"] <= p["p95"] <= p["p99"]
    assert out["stable"] is True and out["requests"] == 200
    # TTFT at light load is about one 500-token prefill, well under a second
    assert out["ttft_s"]["p50"] < 0.1


def test_simulate_is_deterministic_for_a_seed(capsys):
    argv = [
        "simulate",
        *BASE,
        "--rate",
        "8",
        "--input-len",
        "300",
        "--input-cv",
        "1",
        "--output-len",
        "40",
        "--requests",
        "150",
        "--seed",
        "3",
        "--json",
    ]
    assert _json(capsys, argv) == _json(capsys, argv)


def test_simulate_trace_preset_and_closed_loop(capsys):
    out = _json(
        capsys, ["simulate", *BASE, "--workload", "azure-code", "--requests", "150", "--json"]
    )
    assert out["requests"] == 150
    out = _json(
        capsys,
        [
            "simulate",
            *BASE,
            "--workload",
            "sharegpt",
            "--concurrency",
            "8",
            "--requests",
            "100",
            "--json",
        ],
    )
    assert out["stable"] is True


def test_explain_gains_the_load_keys(capsys):
    out = _json(
        capsys,
        ["explain", *BASE, "--rate", "4", "--input-len", "1000", "--output-len", "100", "--json"],
    )
    assert KEYS <= set(out) and out["stable"] is True
    # light load: the p95 barely moves with the rate (and rises with it)
    assert 0.0 < out["ttft_p95_load_elasticity"] < 2.0
    over = _json(capsys, ["explain", *BASE, "--rate", "500", "--json"])
    assert over["stable"] is False and over["ttft_s"]["p95"] is None  # infinite -> null, never NaN
    assert over["queue_bound"] is True and over["ttft_p95_load_elasticity"] is None
    plain = _json(capsys, ["explain", *BASE, "--json"])
    assert "ttft_s" not in plain
    # the budget that limits capacity is the same with and without a load
    assert over["binding_budget"] == plain["binding_budget"]


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--rate", "-1"], "--rate must be a positive number"),
        (["--rate", "0"], "--rate must be a positive number"),
        (["--concurrency", "0"], "--concurrency must be a positive number"),
        (["--rate", "1", "--input-len", "0"], "--input-len must be a positive number"),
        (["--rate", "1", "--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be"),
        (["--rate", "1", "--no-chunked-prefill", "--max-num-batched-tokens", "256"], "cannot hold"),
        (["--workload", "nope.csv"], "no trace 'nope.csv'"),
        (["--workload", "sharegpt"], "no arrival times; add --rate"),
        ([], "give a load"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, fragment):
    assert main(["simulate", *BASE, "--requests", "10", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err and "Traceback" not in err


def test_malformed_trace_file_names_line(tmp_path, capsys):
    p = tmp_path / "bad.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:01,10,2\n2023-11-16 18:00:00,10,2\n"
    )
    assert main(["simulate", *BASE, "--workload", str(p)]) == 2
    assert "bad.csv:3: column TIMESTAMP" in capsys.readouterr().err


def test_simulate_runs_at_the_posterior_median_like_explain(capsys):
    import jax
    import jax.numpy as jnp

    import fitting
    from perfmodel import Deployment, forward_step, load_hardware, load_model

    solo = [
        "simulate",
        *BASE,
        "--concurrency",
        "1",
        "--input-len",
        "512",
        "--output-len",
        "1",
        "--requests",
        "3",
        "--json",
    ]
    out = _json(capsys, solo)
    assert out["efficiency_source"].startswith("posterior") and out["efficiency_source"].endswith(
        "median"
    )
    # alone in the engine, TTFT is one 512-token prefill at the median of the 200 draws (seed 0)
    draws = fitting.efficiency_draws(fitting.load_posterior(), "h100-sxm", 200, seed=0)
    median = jax.tree.map(lambda x: jnp.median(x, axis=0), draws)
    model, gpu = load_model("meta-llama/Llama-3.1-8B"), load_hardware("h100-sxm")
    prefill = float(
        forward_step(
            System(model, gpu, Deployment.create(), median), prefill_tokens=512.0, prefill_seqs=1.0
        ).total_s
    )
    # as the engine delivers it: the fitted end-to-end TTFT offset's median (as explain's)
    assert out["ttft_s"]["p50"] == pytest.approx(prefill * float(median.ttft_scale), rel=1e-6)
    prior = _json(capsys, [*solo, "--prior"])
    assert prior["efficiency_source"].startswith("spec-sheet")
    assert prior["ttft_s"]["p50"] != pytest.approx(prefill, rel=1e-3)
    one = _json(capsys, [*solo, "--draw", "7"])
    draw7 = jax.tree.map(lambda x: x[7], draws)
    assert "draw 7" in one["efficiency_source"]
    assert one["ttft_s"]["p50"] == pytest.approx(
        float(
            forward_step(
                System(model, gpu, Deployment.create(), draw7),
                prefill_tokens=512.0,
                prefill_seqs=1.0,
            ).total_s
        )
        * float(draw7.ttft_scale),
        rel=1e-6,
    )


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--prior", "--draw", "1"], "drop --prior or --draw"),
        (["--draw", "200"], "--draw must be in [0, 199]"),
        (["--posterior", "nope.nc"], "cannot use posterior nope.nc"),
    ],
)
def test_bad_calibration_is_one_line_exit_2(capsys, argv, fragment):
    assert main(["simulate", *BASE, "--rate", "1", "--requests", "10", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err and "Traceback" not in err


def test_max_model_len_rejects_long_prompts_and_caps_outputs(tmp_path, capsys):
    p = tmp_path / "mixed.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00,100,50\n2023-11-16 18:00:01,5000,50\n2023-11-16 18:00:02,300,900\n"
        "2023-11-16 18:00:03,200,20\n"
    )
    out = _json(
        capsys,
        ["simulate", *BASE, "--prior", "--workload", str(p), "--max-model-len", "1024", "--json"],
    )
    # vLLM: the 5000-token prompt is refused; the 300 + 900 request stops at 1024 tokens (724 out)
    assert out["rejected"] == 1 and out["length_capped"] == 1
    assert "rejected" in out["note"] and "--max-model-len" in out["note"]
    text = main(["simulate", *BASE, "--prior", "--workload", str(p), "--max-model-len", "1024"])
    assert (
        text == 0 and "note: 1 prompts longer than --max-model-len 1024" in capsys.readouterr().out
    )


def test_p95_ttft_load_elasticity_and_its_flag():
    # near the running slots' saturation (decode batch ~250 of 256 seats) the elasticity is the
    # log-ratio of the closed form's own p95s at -1 % and +1 % of the rate, and it is large
    args = argparse.Namespace(chunked_prefill=True, chunk_tokens=None)
    model, gpu = pm.load_model("meta-llama/Llama-3.1-8B"), pm.load_hardware("h100-sxm")
    dep = pm.Deployment.create(tp=1, max_num_batched_tokens=16384.0)

    def report(rate):
        w = Workload(
            arrival_rate_per_s=rate,
            prompt_tokens_mean=1000.0,
            prompt_tokens_cv=1.0,
            output_tokens_mean=200.0,
            output_tokens_cv=0.5,
        )
        return dynamics_report(args, System(model, gpu, dep, pm.Efficiency()), w)

    # the edge of stability, found on the closed form itself (bisection on whether p95 TTFT is
    # finite), then 1 % inside it: near the seats' saturation
    lo_rate, hi_rate = 1.0, 100.0
    for _ in range(12):
        mid = 0.5 * (lo_rate + hi_rate)
        p95 = report(mid)["ttft_s"]["p95"]
        lo_rate, hi_rate = (mid, hi_rate) if p95 is not None else (lo_rate, mid)
    rate = lo_rate * 0.985
    out = report(rate)
    lo, hi = (report(rate * k)["ttft_s"]["p95"] for k in (0.99, 1.01))
    e = out["ttft_p95_load_elasticity"]
    assert e == pytest.approx(math.log(hi / lo) / math.log(1.01 / 0.99), rel=1e-6)
    assert e > 10.0 and "near slot saturation" in render_dynamics(out)
    calm = dict(out, ttft_p95_load_elasticity=1.5)
    assert "p95 TTFT elasticity" in render_dynamics(calm)
    assert "near slot saturation" not in render_dynamics(calm)
