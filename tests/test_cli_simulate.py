"""``servingmath simulate`` and the load options of ``servingmath explain``: keys, errors, exit codes."""

import json

import pytest

from servingmath.cli import main

BASE = ["--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100-sxm"]
KEYS = {"ttft_s", "tpot_s", "e2e_s", "utilization", "stable", "output_tokens_per_s"}


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_json_has_the_issue_keys(capsys):
    out = _json(capsys, ["simulate", *BASE, "--rate", "5", "--input-len", "500", "--output-len", "50",
                         "--requests", "200", "--json"])
    assert KEYS <= set(out)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        p = out[key]
        assert set(p) == {"mean", "p50", "p95", "p99"}
        assert 0 < p["p50"] <= p["p95"] <= p["p99"]
    assert out["stable"] is True and out["requests"] == 200
    # TTFT at light load is about one 500-token prefill, well under a second
    assert out["ttft_s"]["p50"] < 0.1


def test_simulate_is_deterministic_for_a_seed(capsys):
    argv = ["simulate", *BASE, "--rate", "8", "--input-len", "300", "--input-cv", "1",
            "--output-len", "40", "--requests", "150", "--seed", "3", "--json"]
    assert _json(capsys, argv) == _json(capsys, argv)


def test_simulate_trace_preset_and_closed_loop(capsys):
    out = _json(capsys, ["simulate", *BASE, "--workload", "azure-code", "--requests", "150", "--json"])
    assert out["requests"] == 150
    out = _json(capsys, ["simulate", *BASE, "--workload", "sharegpt", "--concurrency", "8",
                         "--requests", "100", "--json"])
    assert out["stable"] is True


def test_explain_gains_the_load_keys(capsys):
    out = _json(capsys, ["explain", *BASE, "--rate", "4", "--input-len", "1000", "--output-len", "100", "--json"])
    assert KEYS <= set(out) and out["stable"] is True
    over = _json(capsys, ["explain", *BASE, "--rate", "500", "--json"])
    assert over["stable"] is False and over["ttft_s"]["p95"] is None  # infinite -> null, never NaN
    assert over["binding_budget"] == "queueing"
    plain = _json(capsys, ["explain", *BASE, "--json"])
    assert "ttft_s" not in plain


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
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:01,10,2\n2023-11-16 18:00:00,10,2\n")
    assert main(["simulate", *BASE, "--workload", str(p)]) == 2
    assert "bad.csv:3: column TIMESTAMP" in capsys.readouterr().err
