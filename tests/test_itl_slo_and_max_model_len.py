"""ITL as an SLO of its own and ``--max-model-len`` as a knob checked against KV capacity.

ITL is one gap between consecutive tokens (its p95 over gaps), TPOT a request's mean gap: where
most gaps carry prefill work the ITL tail sits above the TPOT tail, the search model and
``serving_metrics`` agree on it, and a tight ITL bound buys a dearer deployment.  A context no
candidate's KV cache can hold, or one above the model's own (config.json), is one line and exit
2; a long one that fits is in every engine's flags and costs at least as much as the workload's
own context."""

import json

import pytest

import perfmodel as pm
from optimize import Workload
from optimize._metrics import slo_metrics
from perfmodel import System
from perfmodel.dynamics import serving_metrics
from servingmath.cli import main

MODEL = "meta-llama/Llama-3.1-8B"


def test_itl_tail_is_above_the_tpot_tail_where_most_gaps_carry_prefill():
    """8B on one H100, 1024-token prompts at 10 requests/s with a 2048-token budget: about half
    the iterations carry a prompt's chunk, so the p95 gap is a carrying one while a request's
    mean gap averages them with the decode-only ones: p95 ITL >= p95 TPOT, in the load model
    and in the search model.  At 2 requests/s few gaps (1-5 %) carry prefill: the p95 gap is a
    decode-only one and the carrying gaps show at p99 only."""
    model, hw = pm.load_model(MODEL), pm.load_hardware("h100-sxm")
    dep = pm.Deployment(tp=1, replicas=1, max_num_batched_tokens=2048)
    eff = pm.Efficiency()

    def workload(rate):
        return Workload(
            arrival_rate_per_s=rate,
            prompt_tokens_mean=1024.0,
            output_tokens_mean=256.0,
            output_tokens_cv=1.0,
        )

    busy = serving_metrics(System(model, hw, dep, eff), workload(10.0))
    assert float(busy.utilization) < 0.8
    assert float(busy.itl_s.p95) >= float(busy.tpot_s.p95)
    assert float(busy.itl_s.p99) >= float(busy.itl_s.p95) >= float(busy.itl_s.p50)
    # the mean gap over gaps is the steady state's mean gap, as TPOT's before its tail terms
    assert float(busy.itl_s.mean) == pytest.approx(float(busy.tpot_s.mean), rel=0.05)
    fast = slo_metrics(System(model, hw, dep, eff), workload(10.0))
    assert float(fast.itl_p95_s) >= float(fast.tpot_p95_s)
    # one point (19 % apart here); the grid-wide median is held to 15 % below
    assert float(fast.itl_p95_s) == pytest.approx(float(busy.itl_s.p95), rel=0.25)

    light = serving_metrics(System(model, hw, dep, eff), workload(2.0))
    assert float(light.itl_s.p95) < 1.1 * float(light.itl_s.p50)  # decode-only gaps
    assert float(light.itl_s.p99) > 2.0 * float(light.itl_s.p95)  # the chunk-carrying ones


def test_the_simulator_measures_the_same_itl_laws():
    """The simulator's ITL (each decode iteration's duration, once per sequence it decoded) on
    the two loads above, 1,000 requests each: its mean gap is its mean TPOT (one law, two
    averages) and within 5 % of the closed form's mean ITL; at 10 requests/s the chunk-carrying
    gaps lift its p95 ITL above its p95 TPOT, and at 2 requests/s they show at p99 only."""
    from perfmodel.simulator import requests_from_workload, simulate, summarize

    model, hw = pm.load_model(MODEL), pm.load_hardware("h100-sxm")
    dep = pm.Deployment(tp=1, replicas=1, max_num_batched_tokens=2048)
    eff = pm.Efficiency()
    for rate in (10.0, 2.0):
        load = Workload(
            arrival_rate_per_s=rate,
            prompt_tokens_mean=1024.0,
            output_tokens_mean=256.0,
            output_tokens_cv=1.0,
        )
        sim = summarize(
            simulate(System(model, hw, dep, eff), requests_from_workload(load, 1000, seed=3))
        )
        itl, tpot = sim["itl_s"], sim["tpot_s"]
        closed = serving_metrics(System(model, hw, dep, eff), load)
        assert itl["mean"] == pytest.approx(tpot["mean"], rel=0.05)
        assert itl["mean"] == pytest.approx(float(closed.itl_s.mean), rel=0.05)
        assert itl["p99"] >= itl["p95"] >= itl["p50"] > 0.0
        if rate == 10.0:
            assert itl["p95"] > tpot["p95"]
        else:
            assert itl["p95"] < 1.1 * itl["p50"] and itl["p99"] > 2.0 * itl["p95"]


BASE = [
    "optimize",
    "--model",
    MODEL,
    "--prior",
    "--draws",
    "8",
    "--gpus",
    "h100-sxm",
    "--rate",
    "10",
    "--input-len",
    "1024",
    "--output-len",
    "256",
    "--ttft-p95",
    "1",
    "--tpot-p95",
    "0.05",
    "--no-verify",
    "--max-replicas",
    "16",
    "--pool-ratios",
    "none",
    "--chunk-sizes",
    "2048",
    "--kv-dtypes",
    "bf16",
    "--weight-dtypes",
    "bf16",
    "--json",
]


@pytest.fixture(scope="module")
def baseline():
    """The answer without an ITL bound or a context (one compiled search shape for the module)."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(BASE) == 0
    return json.loads(buf.getvalue())


def test_tight_itl_bound_buys_a_dearer_answer(baseline, capsys):
    """A 30 ms p95 ITL bound on an answer whose gaps carrying a chunk reach ~46 ms: a dearer
    configuration, with ITL the binding constraint, its shadow price reported, and its p95 ITL
    within the bound; without the bound ITL has no shadow price and binds nothing."""
    assert baseline["feasible"] and "itl_p95_s" not in baseline["shadow_prices"]
    assert baseline["itl_s"]["p95"] > 0.03  # the bound below is tight
    assert main([*BASE, "--itl-p95", "0.03"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] and out["question"]["slo_itl_p95_s"] == 0.03
    assert out["cost_per_hour"] > baseline["cost_per_hour"]
    assert out["binding_constraint"] == "itl_p95"
    assert out["itl_s"]["p95"] <= 0.03
    assert out["shadow_prices"]["itl_p95_s"] < 0  # a looser bound is cheaper


def test_long_context_that_fits_is_in_the_engine_flags_and_costs_at_least_as_much(baseline, capsys):
    """8B's whole context, 131,072 tokens (config.json, RoPE llama3): one sequence of its bf16 KV
    is 16 GiB, which one H100 holds beside the weights; every engine is launched with that
    context, and serving it costs at least what the 8,192-token default does."""
    assert baseline["max_model_len"] == 8192
    assert "--max-model-len 8192" in baseline["engine_args"]["vllm"]
    assert main([*BASE, "--max-model-len", "131072"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] and out["max_model_len"] == 131_072
    assert out["cost_per_hour"] >= baseline["cost_per_hour"]
    e = out["engine_args"]
    assert "--max-model-len 131072" in e["vllm"]
    assert "--context-length 131072" in e["sglang"]
    assert "--max_seq_len 131072" in e["trtllm"]


@pytest.mark.parametrize(
    "model, tokens",
    [
        ("meta-llama/Llama-3.1-8B", 131_072),  # RoPE llama3: max_position_embeddings as stated
        ("meta-llama/Llama-2-7b-hf", 4_096),  # no RoPE scaling
        ("deepseek-ai/DeepSeek-R1", 4_096 * 40),  # YaRN: original 4,096 x factor 40
        ("openai/gpt-oss-120b", 4_096 * 32),  # YaRN: original 4,096 x factor 32
        ("EleutherAI/gpt-j-6b", None),  # a catalog row without a config.json
    ],
)
def test_model_context_is_the_configs_as_vllm_derives_it(model, tokens):
    assert pm.model_context_tokens(model) == tokens


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--model", "EleutherAI/gpt-j-6b", "--max-model-len", "50000000"],  # no config: KV
            "raise TP / choose a larger GPU / lower --max-model-len",
        ),
        (
            ["--max-model-len", "1000000"],
            "exceeds meta-llama/Llama-3.1-8B's context of 131,072 tokens",
        ),
        (["--max-model-len", "nan"], "--max-model-len"),
        (["--max-model-len", "0"], "--max-model-len"),
        (["--max-model-len", "-4096"], "--max-model-len"),
        (["--max-model-len", "1.5"], "--max-model-len"),
        (["--max-model-len", "lots"], "--max-model-len"),
        (["--itl-p95", "nan"], "--itl-p95"),
        (["--itl-p95", "-0.1"], "--itl-p95"),
        (["--itl-p95", "0"], "--itl-p95"),
        (["--slo-itl-p95", "inf"], "--itl-p95"),
    ],
)
def test_bad_itl_and_context_are_one_line_exit_2(extra, message, capsys):
    """No GPU holding one sequence of the context, a context above the model's own, or a bound
    or context that is not a positive finite number (a whole number of tokens), is one line
    naming the flag and exit 2, before the search (no traceback)."""
    assert main([*BASE, *extra]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert "Traceback" not in err and captured.out == ""


LLAMA2 = ["--model", "meta-llama/Llama-2-7b-hf", "--gpu", "h100-sxm"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (  # Llama-2's context is 4,096 tokens: the default is capped there, not 8,192
            ["explain", *LLAMA2, "--input-len", "3000", "--output-len", "2000"],
            "exceeds --max-model-len 4096",
        ),
        (  # the simulator rejects prompts longer than the context, as vLLM does
            ["simulate", *LLAMA2, "--input-len", "5000", "--rate", "1", "--requests", "10"],
            "every prompt is longer than --max-model-len 4096",
        ),
        (
            ["explain", "--model", MODEL, "--gpu", "h100-sxm", "--max-model-len", "200000"],
            "exceeds meta-llama/Llama-3.1-8B's context of 131,072 tokens",
        ),
        (
            ["simulate", "--model", MODEL, "--gpu", "h100-sxm", "--max-model-len", "200000"],
            "exceeds meta-llama/Llama-3.1-8B's context of 131,072 tokens",
        ),
    ],
)
def test_explain_and_simulate_admit_at_most_the_models_context(argv, message, capsys):
    """Without --max-model-len the engine admits 8,192 tokens or the model's context if shorter
    (vLLM's default is the model's context); above the context is one line and exit 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
