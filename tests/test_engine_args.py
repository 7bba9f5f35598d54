"""Engine launch commands: every flag and value that ``engine_args`` emits, for a spread of
configurations (dense and MoE, TP/PP/DP/EP, bf16/fp8/int8/int4/fp4 weights, bf16/fp8/int8/int4 KV,
MTP and draft-model speculation, pool splits, with and without memory figures), is one that the
engine's flag table (``optimize/engine_flags/<engine>.json``: version, source files, flags) allows;
and the values say what the configuration says."""

import json
import shlex

import pytest

from optimize._engine_args import ENGINES, engine_args, flag_table

MODEL = "meta-llama/Llama-3.1-70B"
MOE = "deepseek-ai/DeepSeek-V3"
GIB = 2.0**30


def _cfg(**kw):
    base = {
        "tp": 4,
        "pp": 1,
        "max_num_batched_tokens": 4096,
        "max_num_seqs": 128,
        "kv_dtype": "bf16",
        "weight_dtype": "bf16",
    }
    return {**base, **kw}


MEMORY = {"hbm_bytes": 80 * GIB, "weight_bytes": 35 * GIB, "workspace_bytes": 3 * GIB}
POOLS = {
    "prefill": {"gpu": "h100-sxm", "num_gpus": 8, "tp": 4, "pp": 1, "replicas": 2},
    "decode": {"gpu": "h200", "num_gpus": 12, "tp": 4, "pp": 1, "replicas": 3},
    "prefill_fraction": 0.4,
    "kv_transfer_s": 0.01,
}

CASES = {
    "dense-bf16-tp4-pp2": (MODEL, _cfg(pp=2), {}),
    "dense-fp8-fp8kv-chunk": (
        MODEL,
        _cfg(tp=2, weight_dtype="fp8", kv_dtype="fp8", chunk_size=1024, max_model_len=16384),
        {},
    ),
    "dense-int4-int8kv": (MODEL, _cfg(weight_dtype="int4", kv_dtype="int8"), {}),
    "dense-int8-int4kv": (MODEL, _cfg(weight_dtype="int8", kv_dtype="int4"), {}),
    "dense-fp4-fp8kv-checkpoint": (
        MODEL,
        _cfg(tp=8, weight_dtype="fp4", kv_dtype="fp8"),
        {"checkpoint": "nvidia/Llama-3.1-70B-Instruct-FP4"},
    ),
    "dense-memory": (MODEL, _cfg(gpu_memory_utilization=0.85), {"memory": MEMORY}),
    "moe-tp8-dp2-ep16": (MOE, _cfg(tp=8, dp=2, ep=16, weight_dtype="fp8", kv_dtype="fp8"), {}),
    "moe-tp4-ep4-mtp": (
        MOE,
        _cfg(ep=4, speculative={"draft": "mtp", "k": 3, "acceptance": 0.7}),
        {"memory": MEMORY},
    ),
    "moe-tp4-ep3": (MOE, _cfg(ep=3), {}),
    "moe-tp8-ep8-attention-dp8": (
        MOE,
        _cfg(tp=8, ep=8, attention_dp=8, moe_layout="ep+dp", weight_dtype="fp8"),
        {"memory": MEMORY},
    ),
    "moe-tp8-attention-dp2": (MOE, _cfg(tp=8, attention_dp=2, weight_dtype="fp8"), {}),
    "dense-sglang-polls": (MODEL, _cfg(scheduler_recv_interval=30), {}),
    "dense-prefill-first": (MODEL, _cfg(prefill_first=True), {}),
    "dense-draft-model": (
        MODEL,
        _cfg(
            speculative={"draft": "draft model", "k": 4, "draft_model": "meta-llama/Llama-3.2-1B"}
        ),
        {},
    ),
    "dense-draft-unnamed": (MODEL, _cfg(speculative={"draft": "draft model", "k": 2}), {}),
    "disaggregated": (
        MODEL,
        _cfg(kv_dtype="fp8", disaggregation=POOLS, memory={"prefill": MEMORY, "decode": MEMORY}),
        {},
    ),
    "disaggregated-mtp-int4": (
        MOE,
        _cfg(
            weight_dtype="int4",
            ep=4,
            disaggregation=POOLS,
            speculative={"draft": "mtp", "k": 1, "acceptance": 0.8},
        ),
        {},
    ),
}


def _all(name):
    model, config, kw = CASES[name]
    return model, config, engine_args(model, config, **kw)


# ---- a parser of the emitted command lines, checking each token against the tables -------------


def _check_value(spec: dict, value, where: str):
    kind = spec["type"]
    if kind == "int":
        v = int(value)
        assert str(v) == str(value), where
        assert v >= spec.get("min", v) and v <= spec.get("max", v), where
    elif kind == "float":
        v = float(value)
        assert v > spec["min_exclusive"] if "min_exclusive" in spec else True, where
        assert v <= spec.get("max", v), where
    elif kind == "choice":
        assert value in spec["choices"], f"{where}: {value!r} not in {spec['choices']}"
    elif kind == "bool":
        assert isinstance(value, bool), where
    elif kind in ("str", "path"):
        assert isinstance(value, str) and value, where
    elif kind == "list":
        assert isinstance(value, list), where
    elif kind == "object":
        _check_object(spec, value, where)
    else:
        raise AssertionError(f"{where}: unknown type {kind}")


def _check_object(spec: dict, obj, where: str):
    assert isinstance(obj, dict), where
    for key in spec.get("required", []):
        assert key in obj, f"{where}: {key} missing"
    for key, value in obj.items():
        assert key in spec["keys"], f"{where}: {key} is not a known key"
        _check_value(spec["keys"][key], value, f"{where}.{key}")


def _segments(line: str) -> list[list[str]]:
    tokens = shlex.split(line)
    out, cur = [], []
    for t in tokens:
        if t == "&&":
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    return [*out, cur]


def parse(engine: str, line: str) -> dict:
    """One command line of ``engine``: {"env", "model", "flags": {flag: value | True}, "files"};
    asserts every token is in the engine's table."""
    table = flag_table(engine)
    files = {}
    *preludes, argv = _segments(line)
    for seg in preludes:
        assert seg[0] == "echo" and seg[2] == ">" and len(seg) == 4, seg
        files[seg[3]] = json.loads(seg[1])  # JSON (valid YAML) option files
    env = {}
    while "=" in argv[0] and not argv[0].startswith("-"):
        key, value = argv.pop(0).split("=", 1)
        assert key in table["env"], f"{engine}: env {key} not in table"
        _check_value(table["env"][key], value, f"{engine} env {key}")
        env[key] = value
    launcher = table["launcher"]
    assert argv[: len(launcher)] == launcher, argv
    argv = argv[len(launcher) :]
    if engine == "trtllm" and argv[0] == "disaggregated":
        assert argv[1:] == ["-c", next(iter(files))], argv
        cfg = files[argv[2]]
        assert set(cfg) <= set(table["disaggregated_config"]), cfg
        for key, value in cfg.items():
            _check_value(table["disaggregated_config"][key], value, f"disagg.{key}")
        return {"env": env, "model": None, "flags": {}, "files": files, "router": cfg}
    if table["model"] == "positional":
        model, argv = argv[0], argv[1:]
    else:
        assert argv[0] == table["model"], argv
        model, argv = argv[1], argv[2:]
    assert not model.startswith("-")
    flags: dict = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        assert flag in table["flags"], f"{engine}: {flag} not in the {table['version']} table"
        assert flag not in flags, f"{engine}: {flag} repeated"
        spec = table["flags"][flag]
        if spec["type"] == "flag":
            flags[flag] = True
            i += 1
            continue
        value = argv[i + 1]
        if spec["type"] == "json":
            obj = json.loads(value)
            _check_object(spec, obj, f"{engine} {flag}")
            flags[flag] = obj
        else:
            _check_value(spec, value, f"{engine} {flag}")
            flags[flag] = value
        if spec["type"] == "path":
            assert value in files, f"{engine}: {flag} {value} is not written by the command"
            for key, obj in files[value].items():
                assert key in table["extra_llm_api_options"], f"{engine}: option {key}"
                _check_value(table["extra_llm_api_options"][key], obj, f"{engine} yaml {key}")
        i += 2
    return {"env": env, "model": model, "flags": flags, "files": files}


def commands(engine: str, out: dict) -> list[dict]:
    return [parse(engine, line.strip()) for line in out[engine].split("\n")]


# ---- the tables themselves --------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_tables_name_version_sources_and_map_into_their_own_choices(engine):
    table = flag_table(engine)
    assert table["engine"] == engine and table["version"]
    assert table["sources"] and all(":" in s for s in table["sources"].values())
    for flag, spec in table["flags"].items():
        assert flag.startswith("-") and spec["type"], flag
        if "from" in spec:
            assert spec["from"] in table["sources"], flag
    maps = table["maps"]
    kv_flag = "--kv-cache-dtype" if engine != "trtllm" else None
    kv_choices = (
        table["flags"][kv_flag]["choices"]
        if kv_flag
        else table["extra_llm_api_options"]["kv_cache_config"]["keys"]["dtype"]["choices"]
    )
    assert set(maps["kv_cache_dtype"].values()) <= set(kv_choices)
    for q in maps["quantization"].values():
        assert q["value"] is None or q["value"] in table["flags"]["--quantization"]["choices"]
        assert q["online"] or q["checkpoint"]


def test_reviewed_values_are_gone_or_right():
    """The review's findings: w8a8, int8 KV on SGLang, EAGLE with a plain draft, P2pNcclConnector
    without its settings, awq / modelopt_fp4 beside a bf16 id with no word about it."""
    for name in CASES:
        _, _, out = _all(name)
        text = "\n".join(out[e] for e in ENGINES)
        assert "w8a8 " not in text and "--quantization w8a8\n" not in text
        assert "P2pNcclConnector" not in text
        assert "EAGLE" not in out["sglang"] and "Eagle" not in out["trtllm"]
    _, _, out = _all("dense-int4-int8kv")
    need = "int4 weights need a pre-quantized checkpoint served in place of " + MODEL
    assert need in out["notes"]
    assert "SGLang: an AWQ INT4 checkpoint, --quantization awq_marlin" in out["notes"]
    assert "SGLang 0.5.23 has no int8 KV cache" in out["notes"]
    assert "TensorRT-LLM 1.2 has no int8 KV cache" in out["notes"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_emitted_flag_and_value_is_in_the_tables(name):
    _, config, out = _all(name)
    for engine in ENGINES:
        cmds = commands(engine, out)
        pools = config.get("disaggregation")
        assert len(cmds) == (3 if pools and engine == "trtllm" else 2 if pools else 1)
        for cmd in cmds:
            if cmd.get("router"):
                continue
            f = cmd["flags"]
            tp, pp = config["tp"], config["pp"]
            if engine == "vllm":
                # attention DP: DP ranks of TP / a GPUs each
                assert f["--tensor-parallel-size"] == str(tp // config.get("attention_dp", 1))
                assert f["--pipeline-parallel-size"] == str(pp)
                assert f["--max-num-batched-tokens"] == str(config["max_num_batched_tokens"])
                assert f["--max-num-seqs"] == str(config["max_num_seqs"])
                assert f["--max-model-len"] == str(config.get("max_model_len", 8192))
                assert "--gpu-memory-utilization" in f and f["--enable-chunked-prefill"]
            elif engine == "sglang":
                assert f["--tp-size"] == str(tp) and f["--pp-size"] == str(pp)
                assert f["--max-prefill-tokens"] == str(config["max_num_batched_tokens"])
                assert f["--max-running-requests"] == str(config["max_num_seqs"])
                assert f["--context-length"] == str(config.get("max_model_len", 8192))
                assert "--mem-fraction-static" in f
                # a colocated engine mixes prefill chunks with decodes, unless the prediction
                # priced SGLang's prefill-first scheduler
                mixes = not pools and not config.get("prefill_first")
                assert ("--enable-mixed-chunk" in f) == mixes
            else:
                assert f["--tp_size"] == str(tp) and f["--pp_size"] == str(pp)
                assert f["--max_num_tokens"] == str(config["max_num_batched_tokens"])
                assert f["--max_batch_size"] == str(config["max_num_seqs"])
                assert f["--max_seq_len"] == str(config.get("max_model_len", 8192))
                assert f["--enable_chunked_prefill"]


def test_chunk_below_budget():
    _, _, out = _all("dense-fp8-fp8kv-chunk")
    assert parse("vllm", out["vllm"])["flags"]["--long-prefill-token-threshold"] == "1024"
    s = parse("sglang", out["sglang"])["flags"]
    assert s["--chunked-prefill-size"] == "1024" and s["--max-prefill-tokens"] == "4096"
    assert "no per-request prefill chunk below --max_num_tokens" in out["notes"]


def test_a_poll_interval_reaches_sglang_and_is_noted_for_the_others():
    """A prediction priced with a poll every 30 iterations launches SGLang with
    ``--scheduler-recv-interval 30``; vLLM and TensorRT-LLM poll every iteration, which the notes
    say; at the default (1) no engine gets the flag or the note."""
    _, _, out = _all("dense-sglang-polls")
    assert parse("sglang", out["sglang"])["flags"]["--scheduler-recv-interval"] == "30"
    for name in ("vLLM", "TensorRT-LLM"):
        assert f"{name} polls for requests every iteration" in out["notes"]
    _, _, plain = _all("dense-bf16-tp4-pp2")
    assert "--scheduler-recv-interval" not in parse("sglang", plain["sglang"])["flags"]
    assert "polls for requests" not in plain["notes"]


def test_dtypes_map_per_engine_version():
    _, _, out = _all("dense-fp8-fp8kv-chunk")
    v, s, t = (parse(e, out[e]) for e in ENGINES)
    assert v["flags"]["--kv-cache-dtype"] == "fp8" and s["flags"]["--kv-cache-dtype"] == "fp8_e4m3"
    assert t["files"]["trtllm_options.yaml"]["kv_cache_config"]["dtype"] == "fp8"
    # fp8 weights: quantized at load from the bf16 id (vLLM 0.33's `fp8` refuses that)
    assert v["flags"]["--quantization"] == "fp8_per_tensor" and v["model"] == MODEL
    assert s["flags"]["--quantization"] == "fp8"
    assert "--quantization" not in t["flags"] and "a ModelOpt FP8 checkpoint" in out["notes"]
    # int8 KV exists in vLLM 0.33 (per-token-head scales) but not in SGLang / TensorRT-LLM
    _, _, out = _all("dense-int4-int8kv")
    v, s, t = (parse(e, out[e]) for e in ENGINES)
    assert v["flags"]["--kv-cache-dtype"] == "int8_per_token_head"
    assert "--kv-cache-dtype" not in s["flags"] and "trtllm_options.yaml" not in t["files"]
    assert v["flags"]["--quantization"] == "awq_marlin" == s["flags"]["--quantization"]
    _, _, out = _all("dense-int8-int4kv")
    v, s = parse("vllm", out["vllm"]), parse("sglang", out["sglang"])
    assert v["flags"]["--kv-cache-dtype"] == "int4_per_token_head"
    assert v["flags"]["--quantization"] == "compressed-tensors"
    assert s["flags"]["--quantization"] == "w8a8_int8"
    assert "SGLang 0.5.23 has no int4 KV cache" in out["notes"]
    # a pre-quantized checkpoint, when named, is what every engine serves
    _, _, out = _all("dense-fp4-fp8kv-checkpoint")
    ckpt = CASES["dense-fp4-fp8kv-checkpoint"][2]["checkpoint"]
    v, s, t = (parse(e, out[e]) for e in ENGINES)
    assert v["model"] == s["model"] == t["model"] == ckpt
    assert v["flags"]["--quantization"] == "modelopt_fp4" == s["flags"]["--quantization"]
    assert "in place of" not in out["notes"]


def test_a_pre_quantized_checkpoint_id_carries_its_own_quantization():
    """A model id that names its quantisation (``-FP8``, ``-AWQ-INT4``) is served as named, with
    no --quantization flag: the engines read the method from the checkpoint's config (vLLM
    refuses a --quantization that differs from it)."""
    for checkpoint, dtype in (
        ("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8", "fp8"),
        ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "int4"),
    ):
        out = engine_args(checkpoint, _cfg(weight_dtype=dtype))
        for engine in ENGINES:
            line = parse(engine, out[engine])
            assert line["model"] == checkpoint and "--quantization" not in line["flags"], engine
        assert f"{checkpoint} is a pre-quantized {dtype} checkpoint" in out["notes"]
        assert "in place of" not in out["notes"]


def test_memory_fractions_convert_the_share_of_hbm():
    _, config, out = _all("dense-memory")
    h, w, a = MEMORY["hbm_bytes"], MEMORY["weight_bytes"], MEMORY["workspace_bytes"]
    util = config["gpu_memory_utilization"]
    v, s, t = (parse(e, out[e])["flags"] for e in ENGINES)
    assert float(v["--gpu-memory-utilization"]) == util
    static = float(s["--mem-fraction-static"])
    free = float(t["--kv_cache_free_gpu_memory_fraction"])
    assert static == pytest.approx((util * h - a) / h, abs=1e-4)
    assert free == pytest.approx((util * h - w - a) / (h - w), abs=1e-4)
    # the same KV bytes in all three: vLLM util*H - W - A, SGLang static*H - W, TRT free*(H - W)
    kv = util * h - w - a
    assert static * h - w == pytest.approx(kv, rel=1e-3)
    assert free * (h - w) == pytest.approx(kv, rel=1e-3)
    # without memory figures TensorRT-LLM's fraction is left out, with the formula in a note
    _, _, out = _all("dense-bf16-tp4-pp2")
    assert "--kv_cache_free_gpu_memory_fraction" not in parse("trtllm", out["trtllm"])["flags"]
    assert "(util * HBM - weights - workspace) / (HBM - weights)" in out["notes"]


def test_data_and_expert_parallel():
    _, _, out = _all("moe-tp8-dp2-ep16")
    v, s, t = (parse(e, out[e])["flags"] for e in ENGINES)
    assert v["--data-parallel-size"] == "2" and v["--enable-expert-parallel"]
    assert s["--dp-size"] == "2" and "--ep-size" not in s  # EP 16 does not divide TP 8
    assert "SGLang's --ep-size must divide --tp-size 8: EP=16 left out" in out["notes"]
    assert "trtllm-serve has no replica data parallelism" in out["notes"]
    assert "shards experts" not in out["notes"]  # EP = TP x DP: what vLLM does
    _, _, out = _all("moe-tp4-ep4-mtp")
    v, s, t = (parse(e, out[e])["flags"] for e in ENGINES)
    assert v["--enable-expert-parallel"] and "--data-parallel-size" not in v
    assert s["--ep-size"] == "4" and t["--ep_size"] == "4"
    _, _, out = _all("moe-tp4-ep3")
    t = parse("trtllm", out["trtllm"])["flags"]
    assert "--ep_size" not in t and "EP=3 left out" in out["notes"]
    assert "not EP=3" in out["notes"]


def test_attention_data_parallel():
    _, _, out = _all("moe-tp8-ep8-attention-dp8")
    v, s = (parse(e, out[e])["flags"] for e in ("vllm", "sglang"))
    assert v["--tensor-parallel-size"] == "1" and v["--data-parallel-size"] == "8"
    assert v["--enable-expert-parallel"] and "shards experts" not in out["notes"]
    assert s["--tp-size"] == "8" and s["--dp-size"] == "8" and s["--enable-dp-attention"]
    assert s["--ep-size"] == "8"
    t = parse("trtllm", out["trtllm"])
    options = t["files"][t["flags"]["--extra_llm_api_options"]]
    assert t["flags"]["--ep_size"] == "8" and options["enable_attention_dp"] is True
    _, _, out = _all("moe-tp8-attention-dp2")
    v, s = (parse(e, out[e])["flags"] for e in ("vllm", "sglang"))
    assert v["--tensor-parallel-size"] == "4" and v["--data-parallel-size"] == "2"
    assert s["--dp-size"] == "2" and s["--enable-dp-attention"]
    t = parse("trtllm", out["trtllm"])
    assert not any("enable_attention_dp" in f for f in t["files"].values())
    assert "not in 2 groups: left off" in out["notes"]


def test_speculation():
    _, _, out = _all("moe-tp4-ep4-mtp")
    v, s, t = (parse(e, out[e]) for e in ENGINES)
    assert v["flags"]["--speculative-config"] == {"method": "mtp", "num_speculative_tokens": 3}
    assert s["flags"]["--speculative-algorithm"] == "NEXTN"
    assert s["flags"]["--speculative-num-steps"] == "3"
    assert s["flags"]["--speculative-num-draft-tokens"] == "4"
    assert "--speculative-draft-model-path" not in s["flags"]
    spec = t["files"]["trtllm_options.yaml"]["speculative_config"]
    assert spec == {"decoding_type": "MTP", "num_nextn_predict_layers": 3}
    _, _, out = _all("dense-draft-model")
    draft = "meta-llama/Llama-3.2-1B"
    v, s, t = (parse(e, out[e]) for e in ENGINES)
    assert v["flags"]["--speculative-config"] == {
        "method": "draft_model",
        "model": draft,
        "num_speculative_tokens": 4,
    }
    assert s["flags"]["--speculative-algorithm"] == "STANDALONE"
    assert s["flags"]["--speculative-draft-model-path"] == draft
    spec = t["files"]["trtllm_options.yaml"]["speculative_config"]
    assert spec == {"decoding_type": "Draft_Target", "max_draft_len": 4, "speculative_model": draft}
    # a draft model the recommendation does not name gets no flags, and a note
    _, _, out = _all("dense-draft-unnamed")
    assert "speculative" not in out["vllm"] + out["sglang"] + out["trtllm"]
    assert "name it (speculative.draft_model)" in out["notes"]


def test_pool_split_launches_complete_producer_and_consumer_engines():
    _, _, out = _all("disaggregated")
    vp, vd = parse("vllm", out["vllm_prefill"]), parse("vllm", out["vllm_decode"])
    assert vp["flags"]["--kv-transfer-config"] == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
    }
    assert vd["flags"]["--kv-transfer-config"]["kv_role"] == "kv_consumer"
    assert vp["flags"]["--port"] != vd["flags"]["--port"]
    assert vp["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] != vd["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    sp, sd = parse("sglang", out["sglang_prefill"]), parse("sglang", out["sglang_decode"])
    assert sp["flags"]["--disaggregation-mode"] == "prefill"
    assert sd["flags"]["--disaggregation-mode"] == "decode"
    assert sp["flags"]["--disaggregation-transfer-backend"] == "nixl"
    tp_, td = parse("trtllm", out["trtllm_prefill"]), parse("trtllm", out["trtllm_decode"])
    for t in (tp_, td):
        (opts,) = t["files"].values()
        assert opts["cache_transceiver_config"] == {"backend": "DEFAULT"}
        # the YAML's kv_cache_config replaces the flag's: it carries the fraction too
        frac = float(t["flags"]["--kv_cache_free_gpu_memory_fraction"])
        assert opts["kv_cache_config"] == {"dtype": "fp8", "free_gpu_memory_fraction": frac}
    router = parse("trtllm", out["trtllm_router"])["router"]
    assert router["context_servers"]["num_instances"] == POOLS["prefill"]["replicas"]
    assert router["generation_servers"]["num_instances"] == POOLS["decode"]["replicas"]
    urls = router["context_servers"]["urls"] + router["generation_servers"]["urls"]
    assert f"localhost:{tp_['flags']['--port']}" in urls
    assert f"localhost:{td['flags']['--port']}" in urls
    assert "prefill pool: 2 engine(s) on h100-sxm" in out["notes"]
    assert "P/D router" in out["notes"]
    _, _, out = _all("disaggregated-mtp-int4")
    assert "NEXTN" in out["sglang_prefill"] and "NEXTN" in out["sglang_decode"]
    assert out["notes"].count("int4 weights need a pre-quantized checkpoint") == 1
    assert out["notes"].count("an AWQ INT4 checkpoint, --quantization awq_marlin") == 2


@pytest.mark.parametrize(
    ("engine", "line"),
    [
        ("sglang", "python -m sglang.launch_server --model-path m --quantization w8a8"),
        ("sglang", "python -m sglang.launch_server --model-path m --kv-cache-dtype int8"),
        ("sglang", "python -m sglang.launch_server --model-path m --tp 4"),
        ("vllm", "vllm serve m --kv-cache-dtype int8"),
        ("vllm", 'vllm serve m --kv-transfer-config \'{"kv_connector":"P2pNcclConnector"}\''),
        ("vllm", "vllm serve m --gpu-memory-utilization 1.2"),
        (
            "trtllm",
            (
                'echo \'{"kv_cache_config": {"dtype": "int8"}}\' > o.yaml && '
                "trtllm-serve m --extra_llm_api_options o.yaml"
            ),
        ),
        ("trtllm", "trtllm-serve m --kv_cache_dtype fp8"),
    ],
)
def test_the_checker_rejects_what_the_review_found(engine, line):
    with pytest.raises((AssertionError, KeyError)):
        parse(engine, line)


def test_notes_name_the_engine_versions():
    _, _, out = _all("dense-bf16-tp4-pp2")
    assert out["notes"].startswith("flags for vLLM 0.33.0, SGLang 0.5.23, TensorRT-LLM 1.2")


@pytest.mark.parametrize("split", [False, True])
def test_a_recommendation_passes_its_memory_to_every_engine(split):
    """A recommendation's engine flags are given its per-GPU HBM, weight and workspace bytes (per
    pool when split): SGLang's and TensorRT-LLM's memory fractions are computed, not left to a
    note asking for them.  Llama-3.1-8B bf16 TP1 on an H100 SXM: weights 16.06 GB of 85.9 GB."""
    import jax.numpy as jnp
    import numpy as np
    from optimize_problems import small_problem

    from optimize import describe_config
    from optimize._grid import one_hot_weights
    from optimize._recommend import _engine_memory

    problem = small_problem(max_replicas=4, num_draws=2)
    config = np.zeros(len(problem.grid.sizes()), dtype=np.int32)
    described = describe_config(problem, ("h100-sxm",), config, 2)
    if split:
        described["disaggregation"] = {
            **POOLS,
            "prefill": {**POOLS["prefill"], "gpu": "h100-sxm"},
            "decode": {**POOLS["decode"], "gpu": "h100-sxm"},
        }
    weights = one_hot_weights(jnp.asarray(config), problem.grid)  # each pool's from its TP
    memory = _engine_memory(problem, ("h100-sxm",), described, weights)
    per_gpu = [memory["prefill"], memory["decode"]] if split else [memory]
    for m in per_gpu:
        assert m["hbm_bytes"] == 80 * GIB
        assert m["weight_bytes"] == pytest.approx(16.06e9, rel=0.01)
    out = engine_args("meta-llama/Llama-3.1-8B", described, memory=memory)
    assert "pass memory" not in " ".join(out.get("notes", []) if isinstance(out, dict) else [])
    assert "pass memory" not in json.dumps(out)


@pytest.mark.parametrize("engine", [None, "sglang"])
def test_sglang_mixes_chunks_only_where_the_prediction_does(engine):
    """A problem priced for SGLang runs its default prefill-first scheduler (the one its fitted
    runs used), so its SGLang launch line leaves ``--enable-mixed-chunk`` off; priced for the
    pooled engines (chunks mixed with decodes, as vLLM does) it turns it on.  The flags launch
    the scheduler that the prediction and its simulator check priced."""
    import numpy as np
    from optimize_problems import small_problem

    from optimize import describe_config

    problem = small_problem(max_replicas=2, num_draws=2, engine=engine)
    config = np.zeros(len(problem.grid.sizes()), dtype=np.int32)
    described = describe_config(problem, ("h100-sxm",), config, 1)
    assert described["prefill_first"] == (engine == "sglang")
    flags = parse("sglang", engine_args("meta-llama/Llama-3.1-8B", described)["sglang"])["flags"]
    assert ("--enable-mixed-chunk" in flags) == (engine is None)
