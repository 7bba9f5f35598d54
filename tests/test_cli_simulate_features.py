"""``servingmath simulate`` runs the serving features in the engine itself:
prefix-cache hook, sampled speculative acceptance, two-pool disaggregation; bad input exits 2."""

import json

import pytest

import perfmodel as pm
from servingmath.cli import main

# --prior: these check the engine's feature mechanics at the spec-sheet efficiencies (the posterior
# path is covered in test_cli_simulate.py)
BASE = ["simulate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100-sxm", "--prior"]
OPEN = [
    *BASE,
    "--rate",
    "4",
    "--input-len",
    "3000",
    "--output-len",
    "50",
    "--requests",
    "150",
    "--json",
]
SOLO = [
    *BASE,
    "--concurrency",
    "1",
    "--input-len",
    "500",
    "--output-len",
    "100",
    "--requests",
    "30",
    "--json",
]


_PLAIN: dict = {}


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory) -> list[str]:
    """``--model`` of Llama-3.1-8B's dimensions with one MTP layer (what --spec-draft mtp needs)."""
    config = json.loads((pm.data_dir() / "models" / "meta-llama--Llama-3.1-8B.json").read_text())
    path = tmp_path_factory.mktemp("mtp") / "llama-3.1-8b-mtp.json"
    path.write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    return ["--model", str(path)]


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _plain(capsys, argv):
    """The featureless run, computed once per argv (deterministic for a seed)."""
    key = tuple(argv)
    if key not in _PLAIN:
        _PLAIN[key] = _json(capsys, argv)
    return _PLAIN[key]


def _exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own type errors exit 2 from inside parse_args
        return int(exc.code)


def test_shared_prefix_hits_in_the_engine_and_cuts_ttft(capsys):
    plain = _plain(capsys, OPEN)
    shared = _json(capsys, [*OPEN, "--prefix-reuse", "0.9", "--prefix-len", "2048"])
    sim = shared["simulated"]
    assert sim["prefix_hit_rate"] > 0.5
    # ~90 % of requests reuse 2048 of 3000 tokens (128 whole 16-token blocks): about 1150 left
    assert 1000 < sim["effective_prefill_tokens"] < 1400
    assert sim["effective_prefill_tokens"] < plain["effective_prefill_tokens"] == 3000
    # the closed form sits next to it and agrees on the prefill left to do within 10 %
    assert abs(sim["effective_prefill_tokens"] / shared["effective_prefill_tokens"] - 1) < 0.1
    assert shared["ttft_s"]["p95"] < 0.8 * plain["ttft_s"]["p95"]
    assert "simulated" not in plain


def test_unique_prompts_hit_nothing_and_match_the_plain_engine(capsys):
    plain = _plain(capsys, OPEN)
    unique = _json(capsys, [*OPEN, "--prefix-reuse", "0", "--prefix-len", "2048"])
    sim = unique["simulated"]
    assert sim["prefix_hit_rate"] == 0.0 and sim["prefix_reused_token_fraction"] == 0.0
    assert sim["effective_prefill_tokens"] == 3000.0
    # same requests, same engine: the hook that never hits changes nothing
    assert unique["ttft_s"] == plain["ttft_s"] and unique["e2e_s"] == plain["e2e_s"]


# a draft's iteration pays its own kernel launches (about per layer): a 1B draft of 16 layers costs
# ~0.3 of the 8B target's step, a 3B draft of 28 layers ~0.55, where k = 4 drafts leave 3B little
@pytest.mark.parametrize("draft", ["mtp", "meta-llama/Llama-3.2-1B-Instruct"])
def test_speculation_with_high_acceptance_at_batch_one_lowers_tpot(capsys, draft, mtp_model):
    plain = _plain(capsys, SOLO)
    model = mtp_model if draft == "mtp" else []
    spec = _json(
        capsys,
        [*SOLO, *model, "--spec-draft", draft, "--spec-k", "4", "--spec-acceptance", "0.9"],
    )
    sim = spec["simulated"]
    # sampled acceptance: E[tokens/step] = (1 - 0.9^5) / 0.1 = 4.095; the sample mean is close
    assert abs(sim["spec_tokens_per_step"] - 4.095) < 0.3
    assert abs(sim["spec_tokens_per_step"] - spec["spec_tokens_per_step"]) < 0.3
    assert sim["tpot_s"]["p50"] < 0.8 * plain["tpot_s"]["p50"]
    assert spec["tpot_s"] == sim["tpot_s"]  # the top-level figures are the speculative engine's


def test_speculation_with_low_acceptance_emits_about_one_token(capsys, mtp_model):
    spec = _json(
        capsys,
        [*SOLO, *mtp_model, "--spec-draft", "mtp", "--spec-k", "4", "--spec-acceptance", "0.05"],
    )
    tokens_per_step = spec["simulated"]["spec_tokens_per_step"]
    assert tokens_per_step >= 1.0 and tokens_per_step < 1.15


def test_disaggregation_runs_two_pools_with_a_kv_hand_off(capsys):
    out = _json(
        capsys,
        [
            *BASE,
            "--rate",
            "2",
            "--input-len",
            "4000",
            "--output-len",
            "100",
            "--requests",
            "60",
            "--disagg",
            "1:1",
            "--json",
        ],
    )
    d = out["simulated"]["disaggregation"]
    assert out["kv_transfer_s"] > 0 and d["kv_transfer_s"] > 0
    # every request has the same 4000-token prompt: the simulated hand-off is the closed form's
    assert d["kv_transfer_s"] == pytest.approx(out["kv_transfer_s"], rel=1e-6)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert 0 < d[key]["p50"] <= d[key]["p95"]
    # the split TTFT includes the prefill pool's prefill and the hand-off
    assert d["ttft_s"]["p50"] > d["kv_transfer_s"]
    assert d["e2e_s"]["p50"] > d["ttft_s"]["p50"] + 90 * d["tpot_s"]["p50"]
    assert (d["prefill_gpus"], d["decode_gpus"]) == (1, 1)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (
            ["--spec-draft", "meta-llama/Llama-3.2-3B", "--spec-acceptance", "1.5"],
            "--spec-acceptance must be in [0, 1]",
        ),
        (
            ["--spec-draft", "meta-llama/Llama-3.2-3B", "--spec-acceptance", "-0.1"],
            "--spec-acceptance must be in [0, 1]",
        ),
        (["--spec-draft", "meta-llama/Llama-3.1-70B"], "is not smaller than"),
        (
            ["--spec-draft", "meta-llama/Llama-3.2-3B", "--spec-k", "0"],
            "--spec-k must be a positive integer",
        ),
        (["--spec-draft", "mtp"], "--spec-draft mtp needs multi-token-prediction layers"),
        (["--prefix-reuse", "0.5", "--prefix-len", "5000"], "longer than the 1000-token prompt"),
        (["--prefix-reuse", "0.5", "--prefix-len", "-1"], "--prefix-len must be >= 0"),
        (["--prefix-reuse", "1.2", "--prefix-len", "100"], "--prefix-reuse must be in [0, 1]"),
        (["--prefix-reuse", "0.5"], "go together"),
        (["--disagg", "0:4"], "each pool needs at least one GPU"),
        (["--disagg", "2:0"], "each pool needs at least one GPU"),
        (["--disagg", "two"], "is not PREFILL_GPUS:DECODE_GPUS"),
        (["--disagg", "1:1", "--transfer-bw", "0"], "--transfer-bw must be a positive"),
        (["--block-size", "0"], "--block-size must be a positive number"),
        (["--block-size", "-16"], "--block-size must be a positive number"),
        (["--block-size", "1.5"], "invalid int value"),
    ],
)
def test_bad_feature_input_is_one_line_exit_2(capsys, argv, fragment):
    assert _exit_code([*BASE, "--rate", "2", "--input-len", "1000", "--requests", "10", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err and "Traceback" not in err


def test_disaggregation_in_a_closed_loop_is_refused(capsys):
    argv = [
        *BASE,
        "--concurrency",
        "4",
        "--input-len",
        "1000",
        "--requests",
        "10",
        "--disagg",
        "1:1",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--disagg in simulate needs timed arrivals" in err and "\n" not in err


def test_every_feature_composes_with_disagg(capsys, mtp_model):
    argv = [
        *BASE,
        "--rate",
        "2",
        "--input-len",
        "3000",
        "--output-len",
        "60",
        "--requests",
        "40",
        "--disagg",
        "1:1",
        "--json",
    ]
    plain = _json(capsys, argv)["simulated"]["disaggregation"]
    both = _json(
        capsys,
        [
            *argv,
            *mtp_model,
            "--prefix-reuse",
            "0.9",
            "--prefix-len",
            "2048",
            "--spec-draft",
            "mtp",
            "--spec-acceptance",
            "0.9",
        ],
    )["simulated"]["disaggregation"]
    # the prefill pool reuses the shared 2048-token prefix (~0.9 * 2048 / 3000 of prompt tokens)
    assert 0.5 < both["prefix_reused_token_fraction"] < 0.65
    assert both["ttft_s"]["p50"] < 0.8 * plain["ttft_s"]["p50"]
    # the decode pool speculates: E = (1 - 0.9^5) / 0.1 = 4.095 tokens per verification step
    assert abs(both["spec_tokens_per_step"] - 4.095) < 0.3
    assert both["tpot_s"]["p50"] < 0.6 * plain["tpot_s"]["p50"]
    assert "prefix_reused_token_fraction" not in plain and "spec_tokens_per_step" not in plain


def test_mooncake_hash_ids_drive_the_prefix_cache(tmp_path, capsys):
    # three requests of 1024 tokens (two 512-token hash blocks): the second repeats the first's
    # blocks and reuses all but the recomputed last token; the third shares nothing
    p = tmp_path / "tiny_mooncake.jsonl"
    rows = [(0, [1, 2]), (1000, [1, 2]), (2000, [3, 4])]
    p.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 1024, "output_length": 20, "hash_ids": h})
            + "\n"
            for t, h in rows
        )
    )
    out = _json(capsys, [*BASE, "--workload", str(p), "--json"])
    sim = out["simulated"]
    assert sim["prefix_reused_token_fraction"] == pytest.approx(1023 / 3072)
    assert sim["effective_prefill_tokens"] == pytest.approx((1024 + 1 + 1024) / 3)
    assert sim["prefix_hit_rate"] == pytest.approx(1 / 3) and sim["cache_block_tokens"] == 512
    # the closed form gets the measured reuse: a third of requests reuse 1023 tokens
    assert sim["trace_reuse_replay"]["shared_fraction"] == pytest.approx(1 / 3)
    assert out["effective_prefill_tokens"] == pytest.approx(1024 - 1023 / 3, rel=0.02)


def test_bundled_mooncake_preset_runs_with_reuse(capsys):
    out = _json(
        capsys,
        [
            *BASE,
            "--workload",
            "mooncake",
            "--rate",
            "0.5",
            "--requests",
            "40",
            "--max-model-len",
            "131072",
            "--json",
        ],
    )
    sim = out["simulated"]
    # 40 requests at 0.5 req/s barely overlap: the engine reuses what a serial LRU replay does
    replay = sim["trace_reuse_replay"]["reused_token_fraction"]
    assert out["rejected"] == 0 and replay > 0.02
    assert sim["prefix_reused_token_fraction"] == pytest.approx(replay, rel=0.1)


@pytest.mark.parametrize(
    "line, fragment",
    [
        ('{"timestamp": 0, "input_length": 10}', "missing key 'output_length'"),
        (
            '{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}',
            "key input_length",
        ),
        ("not json", "not a JSON object"),
    ],
)
def test_bad_mooncake_lines_are_one_line_exit_2(tmp_path, capsys, line, fragment):
    p = tmp_path / "bad.jsonl"
    p.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n' + line + "\n"
    )
    assert _exit_code([*BASE, "--workload", str(p), "--requests", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad.jsonl:2" in err and fragment in err and "\n" not in err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (
            ["--spec-draft", "mtp", "--spec-acceptance", "1.5"],
            "--spec-acceptance must be in [0, 1]",
        ),
        (["--spec-draft", "meta-llama/Llama-3.1-70B"], "is not smaller than"),
        (["--prefix-reuse", "0.5", "--prefix-len", "5000"], "longer than the 1000-token prompt"),
        (["--disagg", "0:4"], "each pool needs at least one GPU"),
        (["--block-size", "1.5"], "invalid int value"),
        (["--block-size", "0"], "--block-size must be a positive number"),
    ],
)
def test_explain_gives_the_same_one_line_errors(capsys, argv, fragment):
    explain = ["explain", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100-sxm", "--prior"]
    assert _exit_code([*explain, "--input-len", "1000", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err and "Traceback" not in err
