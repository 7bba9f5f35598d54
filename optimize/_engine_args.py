"""Engine launch commands for a recommended configuration (vLLM, SGLang, TensorRT-LLM).

Every flag, every allowed value and every mapping from a recommendation's dtypes to an engine's
values comes from the tables in ``optimize/engine_flags/{vllm,sglang,trtllm}.json``, one per
engine, each naming the engine version and the source files its flags were read from (see
``flag_table``).  This module only decides which flags a configuration needs; a value a table does
not allow is never emitted: the command leaves the flag out and ``notes`` says why.

What each recommendation knob becomes:

* TP / PP / DP / EP: vLLM ``--tensor-parallel-size``, ``--pipeline-parallel-size``,
  ``--data-parallel-size``, ``--enable-expert-parallel`` (vLLM shards experts over all TP x DP
  ranks); SGLang ``--tp-size``, ``--pp-size``, ``--dp-size``, ``--ep-size``; TensorRT-LLM
  ``--tp_size``, ``--pp_size``, ``--ep_size`` (``trtllm-serve`` has no replica data parallelism:
  run DP instances).
* attention data parallelism over a groups of the TP ranks (``attention_dp``): vLLM
  ``--tensor-parallel-size tp/a --data-parallel-size a``; SGLang ``--dp-size a
  --enable-dp-attention``; TensorRT-LLM ``enable_attention_dp: true`` in the
  ``--extra_llm_api_options`` YAML (a = tp only).
* iteration token budget B, sequence cap, prefill chunk c <= B: vLLM ``--max-num-batched-tokens``,
  ``--max-num-seqs``, ``--enable-chunked-prefill`` and ``--long-prefill-token-threshold c`` when
  c < B; SGLang ``--max-prefill-tokens B``, ``--chunked-prefill-size c``,
  ``--max-running-requests`` and ``--enable-mixed-chunk`` (a colocated engine whose prediction
  mixes prefill chunks with decodes, as vLLM does; not when it was priced with SGLang's default
  prefill-first scheduler, ``config["prefill_first"]``); TensorRT-LLM ``--max_num_tokens``,
  ``--max_batch_size`` and ``--enable_chunked_prefill`` (off by default there).
* context length: vLLM ``--max-model-len``, SGLang ``--context-length``, TensorRT-LLM
  ``--max_seq_len`` (``config["max_model_len"]``, default 8192 as ``perfmodel.Deployment``).
* memory: the deployment's share of total HBM ``util`` (``config["gpu_memory_utilization"]``,
  default 0.9 as ``perfmodel.Deployment``) is vLLM's ``--gpu-memory-utilization`` itself.  SGLang's
  ``--mem-fraction-static`` covers weights and KV pool only (activations live outside it), and
  TensorRT-LLM's ``--kv_cache_free_gpu_memory_fraction`` is a fraction of the memory still FREE
  after weights (and buffers) are loaded.  With per-GPU ``memory = {"hbm_bytes": H,
  "weight_bytes": W, "workspace_bytes": A}`` (``perfmodel._memory.weight_bytes_per_gpu`` and
  ``workspace_bytes_per_gpu``):

      mem_fraction_static = (util * H - A) / H
      free_fraction       = (util * H - W - A) / (H - W)

  both leave the KV cache the same ``util * H - W - A`` bytes that vLLM gets.  Without ``memory``,
  SGLang gets ``util`` (a little more KV than vLLM) and TensorRT-LLM's flag is left out (its
  default 0.9 of free memory is more than the recommendation assumes) with a note.
* KV dtype: the table's ``maps.kv_cache_dtype``; a dtype an engine version cannot store gives a
  note instead of a flag (the engine then keeps the model's dtype, so fewer tokens fit).
* weight dtype: ``maps.quantization``: an online method (vLLM ``fp8_per_tensor``, SGLang ``fp8``)
  quantizes the bf16 checkpoint at load; the others need a pre-quantized checkpoint, served in
  place of ``model`` (``checkpoint=``), and a note says so while none is given.  TensorRT-LLM reads
  the quantization from the checkpoint (no flag).
* speculation: vLLM ``--speculative-config`` (method ``mtp`` or ``draft_model``); SGLang
  ``--speculative-algorithm NEXTN`` (MTP layers) or ``STANDALONE`` (a plain draft model: EAGLE
  needs an EAGLE head); TensorRT-LLM ``speculative_config`` ``decoding_type`` ``MTP`` or
  ``Draft_Target`` in the ``--extra_llm_api_options`` YAML.
* pool split: one engine per pool: vLLM with a complete ``--kv-transfer-config`` (NixlConnector,
  kv_producer / kv_consumer) and its own ``VLLM_NIXL_SIDE_CHANNEL_PORT``; SGLang
  ``--disaggregation-mode prefill|decode`` with the NIXL transfer backend; TensorRT-LLM context and
  generation servers with a ``cache_transceiver_config`` and ``trtllm-serve disaggregated -c``.

TensorRT-LLM options that have no command-line flag go in an ``--extra_llm_api_options`` file that
the command writes first (``echo '<json>' > file && trtllm-serve ...``; JSON is YAML).
"""

from __future__ import annotations

import functools
import json
import math
import shlex
from pathlib import Path

import perfmodel

ENGINES: tuple[str, ...] = ("vllm", "sglang", "trtllm")
"""Engines with a flag table under ``optimize/engine_flags``."""

DEFAULT_MAX_MODEL_LEN = 8192
"""``perfmodel.Deployment.max_model_len``'s default: the context the recommendation assumed."""

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""``perfmodel.Deployment.gpu_memory_utilization``'s default (vLLM 0.33.0's own is 0.92)."""

_TABLES = Path(__file__).with_name("engine_flags")
_UNQUANTIZED = ("bf16", "fp16", "fp32")
_ROLES = ("prefill", "decode")


@functools.cache
def flag_table(engine: str) -> dict:
    """The flag table of ``engine`` (one of ``ENGINES``): version, sources, flags, maps."""
    return json.loads((_TABLES / f"{engine}.json").read_text())


def engine_args(
    model: str,
    config: dict,
    *,
    checkpoint: str | None = None,
    memory: dict | None = None,
) -> dict[str, str]:
    """Launch commands per engine, with a ``notes`` entry for what a flag cannot say.

    Args:
        model: Hugging Face id.
        config: a described configuration: ``tp``, ``pp``, ``max_num_batched_tokens``,
            ``max_num_seqs``, ``kv_dtype``, ``weight_dtype``; optional ``chunk_size``,
            ``dp``, ``ep`` (expert-parallel degree), ``max_model_len``,
            ``gpu_memory_utilization``, ``memory`` (as the argument), ``speculative``
            ({"draft": "mtp" | "draft model", "k", "draft_model"}) and ``disaggregation``
            ({"prefill": {"tp", "pp", "replicas", "gpu"}, "decode": {...}}).
        checkpoint: a pre-quantized checkpoint to serve in place of ``model`` when the weight
            dtype needs one (int8 / int4 / fp4 everywhere, any quantized dtype on TensorRT-LLM).
        memory: per-GPU ``{"hbm_bytes", "weight_bytes", "workspace_bytes"}`` (or one such dict per
            pool under "prefill" / "decode"), used to convert the memory share for SGLang and
            TensorRT-LLM; defaults to ``config["memory"]``.

    Returns:
        ``vllm``, ``sglang``, ``trtllm`` commands (a split deployment: the per-pool commands on
        separate lines, also as ``<engine>_prefill`` / ``<engine>_decode``, and TensorRT-LLM's
        proxy as ``trtllm_router``) and ``notes`` ("; "-joined).
    """
    notes = _Notes()
    notes.add(
        "flags for "
        + ", ".join(f"{_NAMES[e]} {flag_table(e)['version'].split(' ')[0]}" for e in ENGINES)
    )
    memory = memory if memory is not None else config.get("memory")
    pools = config.get("disaggregation")
    out: dict[str, str] = {}
    for engine, build in (("vllm", _vllm), ("sglang", _sglang), ("trtllm", _trtllm)):
        if not pools:
            out[engine] = build(model, config, None, checkpoint, _pool_memory(memory, None), notes)
            continue
        for role in _ROLES:
            cfg = {**config, **{k: pools[role][k] for k in ("tp", "pp") if k in pools[role]}}
            mem = _pool_memory(memory, role)
            out[f"{engine}_{role}"] = build(model, cfg, role, checkpoint, mem, notes)
        out[engine] = f"{out[f'{engine}_prefill']}\n  {out[f'{engine}_decode']}"
    if pools:
        out["trtllm_router"] = _trtllm_router(pools)
        out["trtllm"] += f"\n  {out['trtllm_router']}"
        for role in _ROLES:
            notes.add(f"{role} pool: {pools[role]['replicas']} engine(s) on {pools[role]['gpu']}")
        notes.add(
            "route requests through a P/D router (the sglang-router package's PD mode for SGLang; "
            "a NixlConnector proxy such as the vllm-router package for vLLM; trtllm_router for "
            "TensorRT-LLM, whose config lists engine i of a pool at the pool's port + i: put each "
            "engine on its host and port and edit the urls to match)"
        )
    out["notes"] = notes.text()
    return out


_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


class _Notes:
    """Ordered, de-duplicated notes; a group gathers one note's per-engine parts."""

    def __init__(self):
        self._items: list[str | tuple] = []
        self._groups: dict[str, tuple[str, dict[str, str]]] = {}

    def add(self, text: str) -> None:
        if text not in self._items:
            self._items.append(text)

    def group(self, key: str, head: str, engine: str, part: str) -> None:
        if key not in self._groups:
            self._groups[key] = (head, {})
            self._items.append(("group", key))
        self._groups[key][1].setdefault(engine, part)

    def text(self) -> str:
        def render(item):
            if isinstance(item, str):
                return item
            head, parts = self._groups[item[1]]
            return f"{head} ({', '.join(f'{_NAMES[e]}: {p}' for e, p in parts.items())})"

        return "; ".join(render(i) for i in self._items)


def _pool_memory(memory: dict | None, role: str | None) -> dict | None:
    if not memory:
        return None
    if role is not None and role in memory:
        return memory[role]
    return memory if "hbm_bytes" in memory else None


def _fraction(x: float) -> str:
    """A fraction rounded down to 4 decimals (never above the budget it was computed from)."""
    return f"{math.floor(x * 1e4) / 1e4:g}"


def _memory_fractions(
    config: dict, memory: dict | None
) -> tuple[float, float | None, float | None]:
    """(util, SGLang mem_fraction_static, TensorRT-LLM free fraction) from the share of HBM; the
    last two are None without ``memory``; the free fraction is None when nothing is left."""
    util = float(config.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
    if not memory:
        return util, None, None
    hbm, w, a = (float(memory[k]) for k in ("hbm_bytes", "weight_bytes", "workspace_bytes"))
    static = (util * hbm - a) / hbm
    free = (util * hbm - w - a) / (hbm - w) if hbm > w else 0.0
    return util, static if static > 0 else None, free if 0 < free <= 1 else None


def _spec(config: dict, notes: _Notes) -> tuple[bool, int, str | None] | None:
    """(is_mtp, k, draft model) of the recommendation's speculation, None when off or unnamed."""
    spec = config.get("speculative")
    if not spec:
        return None
    mtp = spec.get("draft") == "mtp"
    draft = spec.get("draft_model")
    if not mtp and not draft:
        notes.add(
            f"speculative k={spec['k']} with a draft model: name it (speculative.draft_model) "
            "to get the speculative flags"
        )
        return None
    return mtp, int(spec["k"]), draft


def _weights(engine: str, model: str, config: dict, checkpoint: str | None, notes: _Notes):
    """(model id to serve, --quantization value or None) for the weight dtype."""
    w = config["weight_dtype"]
    if w in _UNQUANTIZED:
        return model, None
    if perfmodel.checkpoint_weight_dtype(model) == w:
        notes.add(
            f"{model} is a pre-quantized {w} checkpoint: the engines read its quantization "
            "from its config (no --quantization flag)"
        )
        return model, None
    q = flag_table(engine)["maps"]["quantization"].get(w)
    if q is None:
        notes.add(f"{_NAMES[engine]} {flag_table(engine)['version']} has no {w} weights")
        return model, None
    if q["online"]:
        notes.add(
            f"{w} weights: {_NAMES[engine]} quantizes the checkpoint at load "
            f"(--quantization {q['value']})"
        )
        return model, q["value"]
    if checkpoint:
        return checkpoint, q["value"]
    notes.group(
        f"checkpoint-{w}",
        f"{w} weights need a pre-quantized checkpoint served in place of {model} "
        "(name it as --model, e.g. its -FP8 or -AWQ id; checkpoint= in the API)",
        engine,
        q["checkpoint"] + (f", --quantization {q['value']}" if q["value"] else ""),
    )
    return model, q["value"]


def _kv(engine: str, config: dict, notes: _Notes) -> str | None:
    """The KV-cache dtype value, or None (with a note) when the engine version has none."""
    kv = config["kv_dtype"]
    table = flag_table(engine)
    value = table["maps"]["kv_cache_dtype"].get(kv)
    if value is None:
        notes.add(
            f"{_NAMES[engine]} {table['version'].split(' ')[0]} has no {kv} KV cache: it keeps the "
            "model's dtype, so fewer tokens fit than recommended"
        )
    elif kv in table["maps"]["kv_cache_dtype_notes"]:
        notes.add(table["maps"]["kv_cache_dtype_notes"][kv])
    return value


def _expert_parallel(config: dict) -> tuple[int, int]:
    return int(config.get("dp", 1) or 1), int(config.get("ep", 1) or 1)


def _attention_dp(config: dict) -> int:
    """Attention data-parallel groups among the TP ranks (``describe_config``'s
    ``attention_dp``; 1 = attention split by TP)."""
    return int(config.get("attention_dp", 1) or 1)


def _render(argv: list[str], env: dict[str, str] | None = None, prelude: str = "") -> str:
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return f"{prelude}{prefix}{shlex.join(argv)}"


def _json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _poll_interval(config: dict) -> int:
    """Decode iterations between the scheduler's polls the prediction assumed (1: every one)."""
    return int(config.get("scheduler_recv_interval", 1))


def _polls_every_iteration(engine: str, config: dict, notes: _Notes) -> None:
    """vLLM and TensorRT-LLM look for new requests at every iteration: a prediction priced with
    a poll every k > 1 iterations (SGLang's ``--scheduler-recv-interval``) overstates their TTFT."""
    polls = _poll_interval(config)
    if polls > 1:
        notes.add(
            f"{_NAMES[engine]} polls for requests every iteration: the prediction's TTFT includes "
            f"a poll every {polls} iterations (SGLang's --scheduler-recv-interval)"
        )


def _vllm(model, config, role, checkpoint, memory, notes) -> str:
    _polls_every_iteration("vllm", config, notes)
    maps = flag_table("vllm")["maps"]
    tp, pp = config["tp"], config["pp"]
    dp, ep = _expert_parallel(config)
    # vLLM's attention data parallelism: DP ranks of TP / a GPUs each, the MoE layers spanning
    # all of them (vllm/config/parallel.py: data_parallel_size with an MoE model)
    attention = _attention_dp(config)
    tp, dp = tp // attention, dp * attention
    mnbt, seqs = config["max_num_batched_tokens"], config["max_num_seqs"]
    chunk = config.get("chunk_size") or mnbt
    model_id, quant = _weights("vllm", model, config, checkpoint, notes)
    util, _, _ = _memory_fractions(config, memory)
    argv = ["vllm", "serve", model_id]
    env = {}
    if role:
        argv += ["--port", str(maps["disaggregation"]["ports"][role])]
    argv += ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    if dp > 1:
        argv += ["--data-parallel-size", str(dp)]
    if ep > 1:
        argv += ["--enable-expert-parallel"]
        if ep != tp * dp:
            notes.add(
                f"vLLM's --enable-expert-parallel shards experts over all TP x DP = {tp * dp} "
                f"ranks, not EP={ep}"
            )
    argv += [
        "--max-model-len",
        str(int(config.get("max_model_len", DEFAULT_MAX_MODEL_LEN))),
        "--gpu-memory-utilization",
        _fraction(util),
        "--max-num-batched-tokens",
        str(mnbt),
        "--max-num-seqs",
        str(seqs),
        "--enable-chunked-prefill",
    ]
    if chunk < mnbt:
        argv += ["--long-prefill-token-threshold", str(chunk)]
    kv = _kv("vllm", config, notes)
    if kv is not None:
        argv += ["--kv-cache-dtype", kv]
    if quant:
        argv += ["--quantization", quant]
    spec = _spec(config, notes)
    if spec:
        mtp, k, draft = spec
        cfg = {"method": maps["speculative_method"]["mtp" if mtp else "draft"]}
        if not mtp:
            cfg["model"] = draft
        cfg["num_speculative_tokens"] = k
        argv += ["--speculative-config", _json(cfg)]
    if role:
        d = maps["disaggregation"]
        kvt = {"kv_connector": d["kv_connector"], "kv_role": d["roles"][role]}
        argv += ["--kv-transfer-config", _json(kvt)]
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(d["side_channel_ports"][role])
    return _render(argv, env)


def _sglang(model, config, role, checkpoint, memory, notes) -> str:
    maps = flag_table("sglang")["maps"]
    tp, pp = config["tp"], config["pp"]
    dp, ep = _expert_parallel(config)
    mnbt, seqs = config["max_num_batched_tokens"], config["max_num_seqs"]
    chunk = config.get("chunk_size") or mnbt
    model_id, quant = _weights("sglang", model, config, checkpoint, notes)
    util, static, _ = _memory_fractions(config, memory)
    if static is None:
        static = util
        notes.add(
            "SGLang --mem-fraction-static set to the share of HBM; it excludes activations, so "
            "pass memory (hbm/weight/workspace bytes) for (util * HBM - workspace) / HBM"
        )
    argv = ["python", "-m", "sglang.launch_server", "--model-path", model_id]
    if role:
        argv += ["--port", str(maps["disaggregation"]["ports"][role])]
    argv += ["--tp-size", str(tp), "--pp-size", str(pp)]
    attention = _attention_dp(config)
    if attention > 1:
        if dp > 1:
            notes.add(
                f"SGLang's --dp-size is the attention DP {attention} here: run DP={dp} instances"
            )
        argv += ["--dp-size", str(attention), "--enable-dp-attention"]
    elif dp > 1:
        argv += ["--dp-size", str(dp)]
    if ep > 1:
        if tp % ep == 0:
            argv += ["--ep-size", str(ep)]
        else:
            notes.add(f"SGLang's --ep-size must divide --tp-size {tp}: EP={ep} left out")
    argv += [
        "--context-length",
        str(int(config.get("max_model_len", DEFAULT_MAX_MODEL_LEN))),
        "--mem-fraction-static",
        _fraction(static),
        "--chunked-prefill-size",
        str(chunk),
        "--max-prefill-tokens",
        str(mnbt),
        "--max-running-requests",
        str(seqs),
    ]
    kv = _kv("sglang", config, notes)
    if kv is not None:
        argv += ["--kv-cache-dtype", kv]
    if role is None and not config.get("prefill_first", False):
        argv += ["--enable-mixed-chunk"]
    polls = _poll_interval(config)
    if polls > 1:
        argv += ["--scheduler-recv-interval", str(polls)]
    if quant:
        argv += ["--quantization", quant]
    spec = _spec(config, notes)
    if spec:
        mtp, k, draft = spec
        algorithm = maps["speculative_algorithm"]["mtp" if mtp else "draft"]
        argv += ["--speculative-algorithm", algorithm]
        if not mtp:
            argv += ["--speculative-draft-model-path", draft]
        argv += [
            "--speculative-num-steps",
            str(k),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(k + 1),
        ]
    if role:
        argv += [
            "--disaggregation-mode",
            role,
            "--disaggregation-transfer-backend",
            maps["disaggregation"]["transfer_backend"],
        ]
    return _render(argv)


def _trtllm(model, config, role, checkpoint, memory, notes) -> str:
    _polls_every_iteration("trtllm", config, notes)
    maps = flag_table("trtllm")["maps"]
    tp, pp = config["tp"], config["pp"]
    dp, ep = _expert_parallel(config)
    mnbt, seqs = config["max_num_batched_tokens"], config["max_num_seqs"]
    chunk = config.get("chunk_size") or mnbt
    model_id, _ = _weights("trtllm", model, config, checkpoint, notes)
    _, _, free = _memory_fractions(config, memory)
    argv = ["trtllm-serve", model_id]
    if role:
        argv += ["--host", "localhost", "--port", str(maps["disaggregation"]["ports"][role])]
    argv += ["--tp_size", str(tp), "--pp_size", str(pp)]
    if ep > 1:
        if tp % ep == 0:
            argv += ["--ep_size", str(ep)]
        else:
            notes.add(f"TensorRT-LLM's --ep_size must divide --tp_size {tp}: EP={ep} left out")
    if dp > 1:
        notes.add(
            f"trtllm-serve has no replica data parallelism: run DP={dp} instances behind a load "
            "balancer"
        )
    argv += [
        "--max_batch_size",
        str(seqs),
        "--max_num_tokens",
        str(mnbt),
        "--max_seq_len",
        str(int(config.get("max_model_len", DEFAULT_MAX_MODEL_LEN))),
    ]
    if free is not None:
        argv += ["--kv_cache_free_gpu_memory_fraction", _fraction(free)]
    elif memory:
        notes.add("TensorRT-LLM: no HBM is left for KV after weights and workspace")
    else:
        notes.add(
            "TensorRT-LLM --kv_cache_free_gpu_memory_fraction is of the memory free after weights: "
            "(util * HBM - weights - workspace) / (HBM - weights); pass memory to get it"
        )
    argv += ["--enable_chunked_prefill"]
    if chunk < mnbt:
        notes.add(
            f"TensorRT-LLM has no per-request prefill chunk below --max_num_tokens (chunk {chunk})"
        )
    options: dict = {}
    attention = _attention_dp(config)
    if attention == tp and tp > 1:
        options["enable_attention_dp"] = True
    elif attention > 1:
        notes.add(
            f"TensorRT-LLM's enable_attention_dp runs attention data-parallel on all {tp} ranks, "
            f"not in {attention} groups: left off"
        )
    kv = _kv("trtllm", config, notes)
    kv_cfg = {}
    if kv not in (None, "auto"):
        kv_cfg["dtype"] = kv
    if kv_cfg and free is not None:
        kv_cfg["free_gpu_memory_fraction"] = float(_fraction(free))  # the YAML replaces the flag's
    if kv_cfg:
        options["kv_cache_config"] = kv_cfg
    spec = _spec(config, notes)
    if spec:
        mtp, k, draft = spec
        dec = maps["speculative_decoding_type"]["mtp" if mtp else "draft"]
        options["speculative_config"] = (
            {"decoding_type": dec, "num_nextn_predict_layers": k}
            if mtp
            else {"decoding_type": dec, "max_draft_len": k, "speculative_model": draft}
        )
    if role:
        options["cache_transceiver_config"] = {
            "backend": maps["disaggregation"]["cache_transceiver_backend"]
        }
    prelude = ""
    if options:
        path = f"trtllm_{role or 'options'}.yaml"
        prelude = f"echo {shlex.quote(json.dumps(options))} > {path} && "
        argv += ["--extra_llm_api_options", path]
    return _render(argv, prelude=prelude)


def _trtllm_router(pools: dict) -> str:
    """``trtllm-serve disaggregated`` over the pools' engines (one host:port per engine)."""
    d = flag_table("trtllm")["maps"]["disaggregation"]

    def servers(role):
        n = int(pools[role]["replicas"])
        return {
            "num_instances": n,
            "urls": [f"localhost:{d['ports'][role] + i}" for i in range(n)],
        }

    cfg = {
        "hostname": "localhost",
        "port": d["router_port"],
        "context_servers": servers("prefill"),
        "generation_servers": servers("decode"),
    }
    return (
        f"echo {shlex.quote(json.dumps(cfg))} > trtllm_disagg.yaml && "
        "trtllm-serve disaggregated -c trtllm_disagg.yaml"
    )
