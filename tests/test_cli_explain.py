"""`servingmath explain`: JSON keys and values, and one-line errors with exit status 2."""

import json
import re

import pytest

from servingmath.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_json_keys_and_values(capsys):
    code, out, _ = run(
        capsys,
        "explain",
        "--model",
        "meta-llama/Llama-3.1-70B",
        "--gpu",
        "h100-sxm",
        "--tp",
        "4",
        "--kv-dtype",
        "fp8",
        "--input-len",
        "2000",
        "--output-len",
        "200",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    for key in (
        "kv_bytes_per_token",
        "weight_bytes_per_gpu",
        "kv_capacity_tokens",
        "max_concurrent_requests",
        "prefill_s",
        "decode_step_s_batch1",
        "decode_step_s_max_batch",
        "decode_tokens_per_s_max",
        "binding_budget",
        "elasticities",
    ):
        assert key in report
    assert report["kv_bytes_per_token"] == 327680 / 2  # fp8 KV
    assert report["weight_bytes_per_gpu"] == pytest.approx(70553706496 * 2 / 4)
    assert report["binding_budget"] in (
        "memory_capacity",
        "compute",
        "memory_bandwidth",
        "communication",
    )
    assert set(report["elasticities"]) == {
        "peak_flops_per_s",
        "hbm_bytes_per_s",
        "hbm_bytes",
        "link_bytes_per_s",
    }
    assert report["decode_step_s_max_batch"] >= report["decode_step_s_batch1"]


def test_explain_human_output(capsys):
    code, out, _ = run(capsys, "explain", "--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb")
    assert code == 0
    assert "binding budget" in out and "elasticities" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--model", "llama-3.1-8b", "--gpu", "h100-sxn"],
            "unknown GPU 'h100-sxn'; close matches: .*h100-sxm",
        ),
        (["--model", "llama-9", "--gpu", "h100-sxm"], "unknown model 'llama-9'"),
        (
            ["--model", "meta-llama/Llama-3.1-405B", "--gpu", "h100-sxm", "--tp", "2"],
            "does not fit.*smallest that fits is --tp 4 --pp 3",
        ),
        # 405.9e9 params x 2 B = 756 GiB; 72 GiB usable per H100 (0.9 x 80) less ~1.5 GiB workspace
        # -> at least 11 GPUs; the smallest legal TP x PP product >= 11 is 12 = TP 4 x PP 3
        (
            ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--input-len", "0"],
            "--input-len must be a positive number",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--output-len", "-5"],
            "--output-len must be a positive number",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "3"],
            "--tp 3 does not divide .* 32 attention heads; use one of 1, 2, 4, 8",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--input-len", "9000"],
            "exceeds --max-model-len 8192",
        ),
    ],
)
def test_explain_bad_input_one_line_exit_2(capsys, argv, message):
    import re

    code, out, err = run(capsys, "explain", *argv)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert re.search(message, err), err


def test_malformed_config_and_hardware_row(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 4096,')
    code, _, err = run(capsys, "explain", "--model", str(bad), "--gpu", "h100-sxm")
    assert code == 2 and "not valid JSON" in err
    hw = tmp_path / "hw.csv"
    hw.write_text("id,hbm_bytes,hbm_bytes_per_s,dense_bf16_flops_per_s\nmine,lots,1e12,1e14\n")
    code, _, err = run(
        capsys, "explain", "--model", "llama-3.1-8b", "--gpu", "mine", "--hardware-csv", str(hw)
    )
    assert code == 2 and "'hbm_bytes' = 'lots' is not a number" in err
    # a row whose bf16 rate is blank (no datasheet value found) cannot be used for compute
    blank = tmp_path / "blank.csv"
    blank.write_text("id,hbm_bytes,hbm_bytes_per_s,dense_bf16_flops_per_s\nmine,8.6e10,3.35e12,\n")
    code, _, err = run(
        capsys, "explain", "--model", "llama-3.1-8b", "--gpu", "mine", "--hardware-csv", str(blank)
    )
    assert code == 2 and re.search("mine.*dense_bf16_flops_per_s' is empty", err)


def test_subprocess_entry_point_exit_status(tmp_path):
    """The console entry point itself returns status 2 and one line (no traceback)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "servingmath", "explain", "--model", "x", "--gpu", "h100-sxm"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown model 'x'" in proc.stderr


def test_explain_carries_posterior_intervals(capsys):
    code, out, _ = run(
        capsys, "explain", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--json", "--draws", "50"
    )
    assert code == 0
    report = json.loads(out)
    assert report["efficiency_source"].startswith("posterior")
    for key in (
        "prefill_s",
        "decode_step_s_batch1",
        "decode_step_s_max_batch",
        "decode_tokens_per_s_max",
    ):
        band = report["intervals"][key]
        assert 0 < band["p05"] < band["p50"] < band["p95"]
        assert band["p05"] <= report[key] <= band["p95"]


def test_explain_prior_and_bad_posterior(capsys, tmp_path):
    code, out, _ = run(
        capsys, "explain", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--json", "--prior"
    )
    assert code == 0 and "intervals" not in json.loads(out)
    missing = tmp_path / "nope.nc"
    code, _, err = run(
        capsys,
        "explain",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-sxm",
        "--posterior",
        str(missing),
    )
    assert code == 2 and "cannot use posterior" in err and len(err.strip().splitlines()) == 1


def test_disagg_pools_on_other_gpus_run_at_those_gpus_efficiencies(monkeypatch):
    # explain --gpu h100-sxm --disagg 1:1 --prefill-gpu a100-sxm-80gb: the prefill pool's
    # efficiency is the a100's (resolved like the command's own), the decode pool keeps the h100's
    import argparse

    import perfmodel as pm
    from servingmath.evaluation import features
    from servingmath.options import disagg

    h100, a100 = pm.load_hardware("h100-sxm"), pm.load_hardware("a100-sxm-80gb")
    own, a100_eff = pm.Efficiency(), pm.Efficiency(compute_fraction_max=0.3)
    asked, passed = [], {}

    def fake_resolve(args, hardware, weight_dtype):
        asked.append(hardware.name)
        return a100_eff, None, "stub"

    def fake_disaggregation(model, efficiency, **kw):
        passed.update(kw, efficiency=efficiency)
        raise StopIteration  # the wiring is all this test checks

    monkeypatch.setattr(disagg, "resolve_efficiency", fake_resolve)
    monkeypatch.setattr(features.ft, "disaggregation", fake_disaggregation)
    args = argparse.Namespace(
        disagg="1:1",
        prefill_gpu="a100-sxm-80gb",
        decode_gpu=None,
        transfer_bw=None,
        weight_dtype="bf16",
        hardware_csv=None,
    )
    model = pm.load_model("meta-llama/Llama-3.1-8B")
    with pytest.raises(StopIteration):
        features._disagg(
            args, pm.System(model, h100, pm.Deployment.create(), own), 2000.0, 200.0, 1.0
        )
    assert asked == [a100.name]
    assert passed["efficiency"] is own and passed["decode_efficiency"] is own
    assert passed["prefill_efficiency"] is a100_eff


def test_prefix_reuse_moves_the_under_load_percentiles(capsys):
    """``--prefix-reuse 0.9 --prefix-len 2500`` under a load (the fidelity issue's example had
    ``--rate 2``; a closed loop of 4 compiles faster and wires the same way): the percentiles
    under load serve the uncached prompts, so TTFT falls with the prefill (it was byte-identical
    to the run without a cache), and every iteration still reads the cached KV."""
    base = [
        "explain",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--gpu",
        "h100-sxm",
        "--concurrency",
        "4",
        "--input-len",
        "3000",
        "--output-len",
        "256",
        "--prior",
        "--json",
    ]
    _, plain, _ = run(capsys, *base)
    _, cached, _ = run(capsys, *base, "--prefix-reuse", "0.9", "--prefix-len", "2500")
    plain, cached = json.loads(plain), json.loads(cached)
    assert cached["prefix_hit_rate"] > 0.9
    for q in ("mean", "p50", "p95", "p99"):
        assert cached["ttft_s"][q] < 0.7 * plain["ttft_s"][q]
    # TPOT keeps the full context's KV reads: within the prefill interference it loses
    assert cached["tpot_s"]["mean"] == pytest.approx(plain["tpot_s"]["mean"], rel=0.25)


def test_scheduler_recv_interval_delays_the_first_token_under_load(capsys):
    """``--scheduler-recv-interval 21`` in a closed loop of 4 clients: each request waits 10 mean
    per-token gaps for the scheduler's poll (``perfmodel._polling``; the other 3 clients keep
    the engine iterating), so mean TTFT and E2E grow by 10 x the mean TPOT and TPOT is
    unchanged; 0 and 5000 iterations are refused in one line."""
    base = [
        "explain",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--gpu",
        "h100-sxm",
        "--concurrency",
        "4",
        "--input-len",
        "1000",
        "--output-len",
        "256",
        "--prior",
        "--json",
    ]
    _, plain, _ = run(capsys, *base)
    _, polled, _ = run(capsys, *base, "--scheduler-recv-interval", "21")
    plain, polled = json.loads(plain), json.loads(polled)
    gap = plain["tpot_s"]["mean"]
    assert polled["tpot_s"] == plain["tpot_s"]
    for key in ("ttft_s", "e2e_s"):
        assert polled[key]["mean"] == pytest.approx(plain[key]["mean"] + 10.0 * gap, rel=1e-6)
    for bad in ("0", "5000"):
        code, out, err = run(capsys, *base, "--scheduler-recv-interval", bad)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
        assert "--scheduler-recv-interval" in err and "Traceback" not in err


def test_a_checkpoint_and_gpu_named_as_a_benchmark_names_them_explain_the_same(capsys):
    """``meta-llama/Llama-3.1-8B-Instruct`` on ``NVIDIA H100 80GB HBM3`` (nvidia-smi's name) is
    the catalog's Llama-3.1-8B on h100-sxm: the same budget sheet, word for word."""
    common = ("explain", "--prior", "--tp", "2", "--json")
    named = run(
        capsys,
        *common,
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--gpu",
        "NVIDIA H100 80GB HBM3",
    )
    catalog = run(capsys, *common, "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100-sxm")
    assert named[0] == catalog[0] == 0
    named_report = json.loads(named[1])
    assert named_report.pop("checkpoint") == "meta-llama/Llama-3.1-8B-Instruct"
    assert named_report == json.loads(catalog[1])


def test_gpu_names_on_the_command_line_become_catalog_ids():
    import argparse

    from servingmath.options.gpu_names import canonical_gpu_arguments

    args = argparse.Namespace(
        gpu="A100",  # SXM 40 or 80 GB: left for the command's one-line refusal
        gpus="H100,NVIDIA A100-SXM4-80GB, l40s",
        max_gpus={"NVIDIA H100 80GB HBM3": 4.0},
        prefill_gpu="NVIDIA H200",
        hardware_csv=None,
    )
    canonical_gpu_arguments(args)
    assert args.gpu == "A100" and args.prefill_gpu == "h200-sxm"
    assert args.gpus == "h100-sxm,a100-sxm-80gb,l40s"
    assert args.max_gpus == {"h100-sxm": 4.0}
