"""A newcomer's first hour: every bad input is one line on stderr naming the problem and
the fix, exit status 2, no traceback, and it is caught where it enters (argument parsing or the
file read), before any posterior loads or anything compiles.  ``--help`` works for every command,
output piped into a reader that stops early ends quietly, and ArviZ's refactor notice is silent.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import perfmodel as pm
from perfmodel._catalog import mtp_layers
from servingmath import cli
from servingmath.cli import main

LLAMA = ["--model", "meta-llama/Llama-3.1-8B"]
EXPLAIN = ["explain", *LLAMA, "--gpu", "h100-sxm", "--prior"]
SIMULATE = ["simulate", *LLAMA, "--gpu", "h100-sxm", "--prior", "--requests", "10"]
OPTIMIZE = ["optimize", *LLAMA, "--gpus", "h100-sxm", "--prior", "--draws", "8"]
FLEET = ["fleet", *LLAMA, "--gpus", "h100-sxm", "--prior", "--draws", "8", "--rate", "5"]
FORECAST = ["forecast", *LLAMA, "--gpus", "h100-sxm", "--prior", "--draws", "8"]
BINARY = bytes(range(128, 256)) * 4
"""Bytes that are neither UTF-8 text nor gzip data."""


def _one_line_exit_2(capsys, argv, fragment):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert fragment in err, err
    return err


@pytest.fixture
def no_work(monkeypatch):
    """Every command's ``run`` fails the test: the input must be refused before it."""

    def reached(args):
        pytest.fail(f"servingmath {args.command} started working on bad input")

    for name in cli.COMMANDS:
        monkeypatch.setattr(f"servingmath.commands.{name}.run", reached)


def _subprocess(args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "servingmath", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **kwargs,
    )


# ------------------------------------------------------------------ 1-3: start-up and output


def test_arviz_refactor_notice_is_silenced(tmp_path):
    """ArviZ warns once a day (a stamp in the user cache): a fresh cache makes it want to."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    proc = _subprocess(["validate", "--data", str(tmp_path / "none.csv")], env=env)
    assert proc.returncode == 2
    assert "ArviZ" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("command", [None, *cli.COMMANDS])
def test_every_help_prints(capsys, command):
    assert main([command, "--help"] if command else ["--help"]) == 0
    assert "usage: servingmath" in capsys.readouterr().out


def test_output_into_a_closed_pipe_ends_quietly():
    """The reader is gone before the first write: EPIPE on every write, deterministically."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "servingmath", "models"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_output_into_a_reader_that_stops_early_ends_quietly():
    reader = f"{sys.executable} -c 'import sys; sys.stdin.readline()'"
    proc = subprocess.run(
        f"{sys.executable} -m servingmath gpus | {reader}; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------ 4: undecodable files


@pytest.mark.parametrize(
    "argv, name, fragment",
    [
        (["explain", "--model", "{path}", "--gpu", "h100-sxm"], "config.json", "not a UTF-8"),
        ([*SIMULATE, "--workload", "{path}"], "trace.csv", "not a UTF-8"),
        ([*SIMULATE, "--workload", "{path}"], "trace.jsonl", "not a UTF-8"),
        ([*FLEET, "--classes", "{path}"], "classes.csv", "not a UTF-8"),
        ([*FORECAST, "--demand", "{path}"], "demand.csv", "not a UTF-8"),
        ([*EXPLAIN[:3], "--gpu", "mine", "--hardware-csv", "{path}"], "hw.csv", "not a UTF-8"),
        ([*OPTIMIZE, "--rate", "5", "--prices", "{path}"], "prices.csv", "not a UTF-8"),
        (["fit", "--data", "{path}", "--out", "{tmp}/o.nc"], "rows.csv.gz", "not gzip data"),
        (["fit", "--data", "{path}", "--out", "{tmp}/o.nc"], "rows.bin", "not UTF-8 text"),
        (["fit", "--data", "{path}", "--out", "{tmp}/o.nc"], "rows.csv", "not UTF-8 text"),
    ],
)
def test_binary_file_names_the_file(tmp_path, capsys, argv, name, fragment):
    path = tmp_path / name
    path.write_bytes(BINARY)
    argv = [a.format(path=path, tmp=tmp_path) for a in argv]
    err = _one_line_exit_2(capsys, argv, fragment)
    assert str(path) in err


# ------------------------------------------------------------------ 5: accepted although wrong


@pytest.mark.parametrize(
    "price, fragment",
    [
        ("-5", "'-5' must be a positive"),
        ("0", "'0' must be a positive"),
        ("cheap", "'cheap' is not a number"),
    ],
)
def test_bad_price_is_refused(tmp_path, capsys, price, fragment):
    prices = tmp_path / "p.csv"
    prices.write_text(f"gpu,price_per_gpu_hour\nh100-sxm,{price}\n")
    err = _one_line_exit_2(capsys, [*OPTIMIZE, "--rate", "5", "--prices", str(prices)], fragment)
    assert f"{prices}:2" in err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        ([*OPTIMIZE, "--rate", "5", "--output-cv", "nan"], "--output-cv must be a number >= 0"),
        ([*OPTIMIZE, "--rate", "5", "--output-cv", "-1"], "--output-cv must be a number >= 0"),
        ([*OPTIMIZE, "--rate", "inf"], "--rate must be a positive number, got 'inf'"),
        ([*OPTIMIZE, "--rate", "nan"], "--rate must be a positive number, got 'nan'"),
        ([*OPTIMIZE, "--workload", "no-such-preset"], "no trace 'no-such-preset'"),
        ([*OPTIMIZE, "--rate", "5", "--ttft-p95", "inf"], "--ttft-p95 must be a positive number"),
        ([*OPTIMIZE, "--rate", "5", "--confidence", "nan"], "strictly between 0 and 1"),
        ([*OPTIMIZE, "--rate", "5", "--max-replicas", "0"], "--max-replicas must be a positive"),
        ([*OPTIMIZE, "--rate", "5", "--quality-penalty", "int4=nan"], "int4=nan"),
        ([*OPTIMIZE, "--rate", "5", "--spec-draft", "mtp"], "needs multi-token-prediction"),
        ([*FLEET, "--max-gpus", "h100-sxm=nan"], "h100-sxm=nan: must be a number >= 0"),
        ([*FLEET, "--max-gpus", "h100-sxm=-1"], "h100-sxm=-1: must be a number >= 0"),
        ([*FLEET, "--max-gpus", "l40s=4"], "not in --gpus"),
        ([*FORECAST, "--demand", "data/examples/demand.csv", "--workload", "nope"], "no trace"),
        ([*EXPLAIN, "--max-num-seqs", "0"], "--max-num-seqs must be a positive number"),
        ([*EXPLAIN, "--gpu-memory-utilization", "nan"], "must be in (0, 1]"),
        ([*EXPLAIN, "--tp", "-2"], "--tp must be a positive number"),
        ([*EXPLAIN, "--rate", "nan"], "--rate must be a positive number"),
        ([*EXPLAIN, "--input-cv", "inf"], "--input-cv must be a number >= 0"),
        ([*EXPLAIN, "--host-kv-bw", "nan"], "--host-kv-bw must be a positive number"),
        ([*EXPLAIN, "--prefix-reuse", "nan", "--prefix-len", "10"], "must be a finite number"),
        (
            [*EXPLAIN, "--spec-draft", "meta-llama/Llama-3.2-1B-Instruct", "--spec-k", "1000"],
            "--spec-k must be a positive integer <= 16",
        ),
        ([*EXPLAIN, "--spec-draft", "mtp"], "--spec-draft mtp needs multi-token-prediction"),
        ([*SIMULATE, "--rate", "nan"], "--rate must be a positive number, got 'nan'"),
        ([*SIMULATE, "--rate", "1", "--seed", "-1"], "--seed must be a number >= 0"),
        ([*SIMULATE, "--rate", "1", "--spec-draft", "mtp"], "needs multi-token-prediction"),
        ([*SIMULATE, "--workload", "no-such-preset", "--rate", "1"], "no trace 'no-such-preset'"),
        (["validate", "--data", "x.csv", "--draws", "nan"], "invalid int value: 'nan'"),
        (["fit", "--data", "x.csv", "--out", "o.nc", "--warmup", "-1"], "--warmup must be"),
    ],
)
def test_bad_flag_is_refused_at_parse_time(no_work, capsys, argv, fragment):
    _one_line_exit_2(capsys, argv, fragment)


FP8_CHECKPOINT = ["--model", "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8"]


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["explain", *FP8_CHECKPOINT, "--gpu", "h100-sxm", "--prior"], "pass --weight-dtype fp8"),
        (
            ["simulate", *FP8_CHECKPOINT, "--gpu", "h100-sxm", "--weight-dtype", "int4"],
            "pre-quantized fp8 checkpoint (its name says so), not int4 weights",
        ),
        (
            ["optimize", *FP8_CHECKPOINT, "--gpus", "h100-sxm", "--weight-dtypes", "bf16"],
            "pass --weight-dtypes fp8",
        ),
        (["fleet", *FP8_CHECKPOINT, "--gpus", "h100-sxm", "--weight-dtypes", "int4"], "fp8"),
    ],
)
def test_a_quantized_checkpoint_in_another_dtype_is_refused(no_work, capsys, argv, fragment):
    _one_line_exit_2(capsys, argv, fragment)


def test_spec_k_is_capped_in_simulate_too(capsys):
    argv = [*SIMULATE, "--rate", "1", "--spec-draft", "meta-llama/Llama-3.2-1B-Instruct"]
    _one_line_exit_2(capsys, [*argv, "--spec-k", "1000"], "--spec-k must be a positive integer")


def test_mtp_layers_come_from_the_config(tmp_path):
    assert mtp_layers("deepseek-ai/DeepSeek-V3") == 1
    assert mtp_layers("meta-llama/Llama-3.1-8B") == 0
    config = json.loads((pm.data_dir() / "models" / "meta-llama--Llama-3.1-8B.json").read_text())
    path = tmp_path / "with-mtp.json"
    path.write_text(json.dumps({**config, "num_nextn_predict_layers": 2}))
    assert mtp_layers(str(path)) == 2


@pytest.mark.parametrize(
    "row, fragment",
    [
        ("mine,inf,1e12,1e14", "'hbm_bytes' = 'inf' must be a positive, finite number"),
        ("mine,8e10,nan,1e14", "'hbm_bytes_per_s' = 'nan' must be a positive, finite number"),
        ("mine,8e10,1e12,-1e14", "'dense_bf16_flops_per_s' = '-1e14' must be a positive"),
    ],
)
def test_non_finite_or_negative_hardware_cell_is_refused(tmp_path, capsys, row, fragment):
    hw = tmp_path / "hw.csv"
    hw.write_text(f"id,hbm_bytes,hbm_bytes_per_s,dense_bf16_flops_per_s\n{row}\n")
    argv = ["explain", *LLAMA, "--gpu", "mine", "--hardware-csv", str(hw), "--prior"]
    _one_line_exit_2(capsys, argv, fragment)


@pytest.mark.parametrize(
    "key, value",
    [
        ("num_key_value_heads", 0),
        ("hidden_size", -4096),
        ("num_hidden_layers", 0),
        ("vocab_size", float("nan")),
        ("num_attention_heads", "32"),
    ],
)
def test_config_with_impossible_dimension_is_refused(tmp_path, capsys, key, value):
    config = json.loads((pm.data_dir() / "models" / "meta-llama--Llama-3.1-8B.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, key: value}))
    argv = ["explain", "--model", str(path), "--gpu", "h100-sxm", "--prior"]
    _one_line_exit_2(capsys, argv, f"{key} = {value!r} must be a positive whole number")


@pytest.mark.parametrize(
    "name, text, fragment",
    [
        (
            "t.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,inf,10\n",
            "t.csv:2: column ContextTokens: 'inf' is not a non-negative token count",
        ),
        (
            "t.csv",
            "num_prefill_tokens,num_decode_tokens\n10,nan\n",
            "t.csv:2: column num_decode_tokens: 'nan'",
        ),
        (
            "t.jsonl",
            '{"timestamp": 0, "input_length": Infinity, "output_length": 1, "hash_ids": []}\n',
            "t.jsonl:1: key input_length: inf is not a non-negative, finite number",
        ),
    ],
)
def test_non_finite_trace_lengths_are_refused(tmp_path, capsys, name, text, fragment):
    path = tmp_path / name
    path.write_text(text)
    _one_line_exit_2(capsys, [*SIMULATE, "--rate", "1", "--workload", str(path)], fragment)


# ------------------------------------------------------------------ 6, 8: output paths, flags


def test_output_paths_are_checked_before_any_work(no_work, tmp_path, capsys):
    data = ["--data", "x.csv"]
    _one_line_exit_2(capsys, ["fit", *data, "--out", str(tmp_path)], "is a folder")
    missing = tmp_path / "missing" / "o.nc"
    _one_line_exit_2(capsys, ["fit", *data, "--out", str(missing)], "does not exist")
    demand = ["--demand", "data/examples/demand.csv"]
    for flag in ("--csv", "--png"):
        argv = [*FORECAST, *demand, flag, str(tmp_path / "missing" / "x")]
        _one_line_exit_2(capsys, argv, f"argument {flag}: folder")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    _one_line_exit_2(capsys, ["validate", *data, "--plot", str(a_file)], "is a file, not a folder")
    _one_line_exit_2(
        capsys, [*OPTIMIZE, "--rate", "5", "--plot", str(a_file / "sub")], "is a file, not a folder"
    )


def test_fit_names_its_own_prior_flag(tmp_path, capsys):
    argv = ["fit", "--data", "x.csv", "--out", str(tmp_path / "o.nc"), "--prior", "nope.nc"]
    err = _one_line_exit_2(capsys, argv, "--prior nope.nc: no such file")
    assert "--posterior" not in err


# ------------------------------------------------------------------ 7: infeasible fleet


@pytest.mark.parametrize(
    "capacity, fragment",
    [
        (0.0, "class 0 (prompt 1024, output 256 tokens) meets the SLO on no type"),
        (3.0, "within the --max-gpus limits (h100-sxm=1)"),
    ],
)
def test_infeasible_fleet_exits_2_with_the_reason(monkeypatch, capsys, capacity, fragment):
    """The fleet solvers are stubbed with an infeasible answer (no compile)."""
    import optimize
    from optimize import FleetPlan, FleetProblem

    one = np.ones((1, 1))
    fp = FleetProblem(np.asarray([5.0]), capacity * one, one, one, np.asarray([1.0]))
    none = FleetPlan(np.zeros((1, 1), dtype=int), float("inf"))
    monkeypatch.setattr(optimize, "make_problem", lambda *a, **k: None)
    no_configs = -np.ones((1, 1, len(optimize.KNOBS)), dtype=np.int32)  # no usable pair
    monkeypatch.setattr(optimize, "fleet_problem", lambda *a, **k: (fp, no_configs))
    monkeypatch.setattr(optimize, "fleet_gradient", lambda *a, **k: none)
    monkeypatch.setattr(optimize, "fleet_milp", lambda *a, **k: none)
    err = _one_line_exit_2(capsys, [*FLEET, "--max-gpus", "h100-sxm=1"], fragment)
    assert err.startswith("servingmath fleet: error: ")
    assert main([*FLEET, "--max-gpus", "h100-sxm=1", "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["feasible"] is False and len(err.strip().splitlines()) == 1
