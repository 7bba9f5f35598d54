"""Verdicts: each answer follows the budget it quotes (the numbers in the sentence are the
budgets' own), for deployments built to land on each side of each question."""

import re

from perfmodel import (
    Deployment,
    Efficiency,
    System,
    decode_step,
    load_hardware,
    load_model,
    max_concurrent_requests,
)
from perfmodel._verdicts import verdicts

H100 = load_hardware("h100-sxm")
EFF = Efficiency()
LLAMA8B = load_model("meta-llama/Llama-3.1-8B")
LLAMA70B = load_model("meta-llama/Llama-3.1-70B")
KEYS = {"kv_or_queue", "decode_bandwidth", "prefix_reuse", "pp_or_interference"}


def test_kv_limited_seats_without_a_load_quote_the_memory_budget():
    # without a load nothing says the seats are full: KV-limited, not KV-bound
    dep = Deployment.create()
    v = verdicts(System(LLAMA8B, H100, dep, EFF), prompt_tokens=3000.0, output_tokens=200.0)
    assert set(v) == KEYS
    seats = float(max_concurrent_requests(LLAMA8B, H100, dep, 3200.0))
    assert (
        v["kv_or_queue"].startswith("KV-limited seats")
        and f"holds {seats:.0f} sequences" in v["kv_or_queue"]
    )
    assert v["prefix_reuse"].startswith("No prefix reuse")


def test_short_sequences_are_not_kv_bound():
    v = verdicts(
        System(LLAMA8B, H100, Deployment.create(), EFF), prompt_tokens=200.0, output_tokens=100.0
    )
    assert v["kv_or_queue"].startswith("not KV-bound")


def test_overload_by_prefill_is_queue_bound():
    v = verdicts(
        System(LLAMA8B, H100, Deployment.create(), EFF),
        prompt_tokens=8000.0,
        output_tokens=50.0,
        arrival_rate_per_s=50.0,
    )
    assert v["kv_or_queue"].startswith("queue-bound")


def test_decode_bandwidth_verdict_matches_the_roofline():
    dep = Deployment.create(tp=4)
    v = verdicts(System(LLAMA70B, H100, dep, EFF), prompt_tokens=2000.0, output_tokens=500.0)
    batch = min(float(max_concurrent_requests(LLAMA70B, H100, dep, 2500.0)), 256.0)
    step = decode_step(System(LLAMA70B, H100, dep, EFF), batch, 2250.0)
    word = "bandwidth-limited" if step.memory_s >= step.compute_s else "compute-limited"
    assert word in v["decode_bandwidth"]
    assert f"{float(step.memory_s) * 1e3:.2f} ms" in v["decode_bandwidth"]


def test_prefix_reuse_real_with_a_shared_system_prompt_and_not_without():
    kw = {
        "prompt_tokens": 3000.0,
        "output_tokens": 200.0,
        "arrival_rate_per_s": 1.0,
        "prefix_tokens": 2000.0,
    }
    real = verdicts(System(LLAMA8B, H100, Deployment.create(), EFF), shared_fraction=0.9, **kw)
    rare = verdicts(System(LLAMA8B, H100, Deployment.create(), EFF), shared_fraction=0.02, **kw)
    assert real["prefix_reuse"].startswith("Prefix reuse is real")
    assert rare["prefix_reuse"].startswith("Prefix reuse is negligible")
    speedup = float(re.search(r"prefill ([0-9.]+)x faster", real["prefix_reuse"]).group(1))
    assert speedup > 1.5


def test_interference_named_for_long_prompts_and_pp_for_a_kv_starved_replica():
    long = verdicts(
        System(LLAMA8B, H100, Deployment.create(), EFF),
        prompt_tokens=8000.0,
        output_tokens=256.0,
        arrival_rate_per_s=1.7,
    )
    assert long["pp_or_interference"].startswith("Interference is the issue")
    starved = verdicts(
        System(LLAMA70B, H100, Deployment.create(tp=2), EFF),
        prompt_tokens=2000.0,
        output_tokens=500.0,
    )
    assert starved["pp_or_interference"].startswith("PP would help")  # 12 seats -> ~200 with PP=2
    roomy = verdicts(
        System(LLAMA8B, H100, Deployment.create(), EFF), prompt_tokens=3000.0, output_tokens=200.0
    )
    assert roomy["pp_or_interference"].startswith("Neither")


# ------------------------------------------------------------------ CLI (explain --json) -------

import argparse
import json

import pytest

from servingmath.errors import UsageError
from servingmath.options.features import add_feature_arguments, validate_feature_arguments


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_feature_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ("--spec-draft", "mtp", "--spec-acceptance", "1.5"),
            "--spec-acceptance must be in [0, 1]",
        ),
        (("--spec-draft", "mtp", "--spec-k", "0"), "--spec-k must be a positive integer"),
        (("--prefix-reuse", "0.5", "--prefix-len", "5000"), "longer than the 3000-token prompt"),
        (("--prefix-reuse", "1.5", "--prefix-len", "500"), "--prefix-reuse must be in [0, 1]"),
        (("--prefix-reuse", "0.5"), "go together"),
        (("--disagg", "0:4"), "each pool needs at least one GPU"),
        (("--disagg", "4-4"), "is not PREFILL_GPUS:DECODE_GPUS"),
        (("--disagg", "4:4", "--transfer-bw", "-1"), "--transfer-bw must be a positive"),
        (("--host-kv-bytes", "-5"), "--host-kv-bytes must be >= 0"),
    ],
)
def test_bad_feature_input_is_one_usage_error(argv, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        validate_feature_arguments(_args(*argv), 3000.0)


def _explain(argv):
    """Run ``servingmath explain`` alone (independent of the other subcommands' imports)."""
    from servingmath.commands import explain

    parser = argparse.ArgumentParser()
    explain.add_arguments(parser)
    return explain.run(parser.parse_args(argv))


def test_explain_json_reports_the_feature_numbers_and_verdicts(capsys):
    rc = _explain(
        [
            "--model",
            "meta-llama/Llama-3.1-8B",
            "--gpu",
            "h100-sxm",
            "--input-len",
            "3000",
            "--output-len",
            "200",
            "--prefix-reuse",
            "0.9",
            "--prefix-len",
            "2000",
            "--spec-draft",
            "mtp",
            "--spec-acceptance",
            "0.8",
            "--spec-k",
            "3",
            "--disagg",
            "4:4",
            "--json",
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["effective_prefill_tokens"] == pytest.approx(3000 - 0.9 * 2000)
    assert report["prefix_hit_rate"] == pytest.approx(1.0)
    assert report["spec_tokens_per_step"] == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert report["spec_speedup"] > 1.0
    assert report["kv_transfer_s"] == pytest.approx(3000 * 131072 / 50e9 + 1e-4)
    assert set(report["verdicts"]) == KEYS


def test_explain_rejects_a_draft_larger_than_the_target():
    with pytest.raises(UsageError) as info:
        _explain(
            [
                "--model",
                "meta-llama/Llama-3.1-8B",
                "--gpu",
                "h100-sxm",
                "--spec-draft",
                "meta-llama/Llama-3.1-70B",
            ]
        )
    assert "not smaller than" in str(info.value) and "\n" not in str(info.value)


def test_given_metrics_are_the_ones_judged():
    """A caller's ``metrics`` (the CLI passes its load report's) stand in for computing them:
    the same load's metrics give the same sentences, an overloaded load's make it queue-bound."""
    from perfmodel import Workload, serving_metrics

    dep = Deployment.create()
    light = Workload(arrival_rate_per_s=2.0, prompt_tokens_mean=200.0, output_tokens_mean=100.0)
    heavy = Workload(arrival_rate_per_s=50.0, prompt_tokens_mean=8000.0, output_tokens_mean=50.0)
    kw = {"prompt_tokens": 200.0, "output_tokens": 100.0, "workload": light}
    own = verdicts(System(LLAMA8B, H100, dep, EFF), **kw)
    given = serving_metrics(System(LLAMA8B, H100, dep, EFF), light)
    assert verdicts(System(LLAMA8B, H100, dep, EFF), **kw, metrics=given) == own
    overloaded = serving_metrics(System(LLAMA8B, H100, dep, EFF), heavy)
    assert not own["kv_or_queue"].startswith("queue-bound")
    assert verdicts(System(LLAMA8B, H100, dep, EFF), **kw, metrics=overloaded)[
        "kv_or_queue"
    ].startswith("queue-bound")


def test_given_prefill_interference_is_the_one_quoted():
    """The CLI passes the colocated interference it computed (one cached program): the same
    value gives the same sentences, and the sentence quotes whatever stretch it is given."""
    from perfmodel.features import disaggregation

    dep = Deployment.create()
    kw = {"prompt_tokens": 2000.0, "output_tokens": 200.0, "arrival_rate_per_s": 4.0}
    own = verdicts(System(LLAMA8B, H100, dep, EFF), **kw)
    pools = (H100, dep)
    stretch = float(
        disaggregation(
            LLAMA8B,
            EFF,
            colocated=pools,
            prefill=pools,
            decode=pools,
            prompt_tokens=2000.0,
            output_tokens=200.0,
            arrival_rate_per_s=4.0,
        ).prefill_interference
    )
    assert f"{stretch:.2f}x" in own["pp_or_interference"]
    assert verdicts(System(LLAMA8B, H100, dep, EFF), **kw, prefill_interference=stretch) == own
    other = verdicts(System(LLAMA8B, H100, dep, EFF), **kw, prefill_interference=stretch + 0.5)
    assert f"{stretch + 0.5:.2f}x" in other["pp_or_interference"]


def test_verdict_budgets_jitted_are_the_budgets_the_sentences_quote():
    # one compiled program gives the numbers decode_step and max_concurrent_requests give eagerly
    import equinox as eqx
    import jax.numpy as jnp

    from perfmodel._verdicts import verdict_budgets

    dep = Deployment.create(tp=2)
    b = eqx.filter_jit(verdict_budgets)(
        System(LLAMA70B, H100, dep, EFF), jnp.asarray(1000.0), jnp.asarray(500.0)
    )
    seats = float(max_concurrent_requests(LLAMA70B, H100, dep, 1500.0))
    batch = max(min(seats, float(dep.max_num_seqs)), 1.0)
    step = decode_step(System(LLAMA70B, H100, dep, EFF), batch, 1250.0)
    assert abs(float(b.seats) - seats) <= 1e-9 * seats
    assert abs(float(b.decode_total_s) - float(step.total_s)) <= 1e-9 * float(step.total_s)
    # doubling PP halves the weights per GPU, so the doubled-PP replica holds more seats
    assert float(b.pp_seats) > seats
    v = verdicts(
        System(LLAMA70B, H100, dep, EFF), prompt_tokens=1000.0, output_tokens=500.0, budgets=b
    )
    assert f"step {float(step.total_s) * 1e3:.2f} ms" in v["decode_bandwidth"]
