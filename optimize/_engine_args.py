"""Engine command lines for a recommended configuration (vLLM, SGLang, TensorRT-LLM).

Flag names as documented by each engine: ``vllm serve`` (--tensor-parallel-size,
--pipeline-parallel-size, --max-num-batched-tokens, --max-num-seqs, --kv-cache-dtype,
--enable-chunked-prefill, --quantization), SGLang ``launch_server`` (--tp, --pp-size,
--chunked-prefill-size, --max-running-requests, --kv-cache-dtype, --quantization) and
``trtllm-serve`` (--tp_size, --pp_size, --max_num_tokens, --max_batch_size; the KV dtype goes in
the ``kv_cache_config`` of an ``--extra_llm_api_options`` YAML).

A prefill chunk below the token budget is vLLM's --long-prefill-token-threshold and SGLang's
--chunked-prefill-size; speculation is vLLM's --speculative-config (method mtp, or a draft model)
and SGLang's --speculative-algorithm/--speculative-num-steps/--speculative-num-draft-tokens; a
pool split launches one engine per pool, vLLM with --kv-transfer-config roles kv_producer /
kv_consumer (P2pNcclConnector) and SGLang with --disaggregation-mode prefill|decode.
"""

from __future__ import annotations

import json

_VLLM_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8"}
_SGLANG_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8_e4m3"}
_TRTLLM_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8", "int8": "int8"}
_QUANT = {"fp8": "fp8", "int4": "awq", "int8": "w8a8", "fp4": "modelopt_fp4"}


def engine_args(model: str, config: dict) -> dict[str, str]:
    """Command lines per engine, with a ``notes`` entry for dtypes an engine cannot run.

    Args:
        model: Hugging Face id.
        config: a described configuration (``tp``, ``pp``, ``max_num_batched_tokens``,
            ``max_num_seqs``, ``kv_dtype``, ``weight_dtype``).
    """
    tp, pp = config["tp"], config["pp"]
    mnbt, seqs = config["max_num_batched_tokens"], config["max_num_seqs"]
    chunk = config.get("chunk_size") or mnbt
    kv, w = config["kv_dtype"], config["weight_dtype"]
    notes = []
    vllm = (
        f"vllm serve {model} --tensor-parallel-size {tp} --pipeline-parallel-size {pp} "
        f"--max-num-batched-tokens {mnbt} --max-num-seqs {seqs} "
        f"--kv-cache-dtype {_VLLM_KV.get(kv, kv)} --enable-chunked-prefill"
    )
    if chunk < mnbt:
        vllm += f" --long-prefill-token-threshold {chunk}"
    sglang = (
        f"python -m sglang.launch_server --model-path {model} --tp {tp} --pp-size {pp} "
        f"--chunked-prefill-size {chunk} --max-running-requests {seqs} "
        f"--kv-cache-dtype {_SGLANG_KV.get(kv, kv)}"
    )
    if chunk < mnbt:
        sglang += f" --max-prefill-tokens {mnbt}"
    trtllm = (
        f"trtllm-serve {model} --tp_size {tp} --pp_size {pp} --max_num_tokens {mnbt} "
        f"--max_batch_size {seqs}"
    )
    spec = config.get("speculative")
    if spec:
        k, draft = spec["k"], spec.get("draft_model") or spec["draft"]
        mtp = spec["draft"] == "mtp"
        cfg = (
            {"method": "mtp", "num_speculative_tokens": k}
            if mtp
            else {"model": draft, "num_speculative_tokens": k}
        )
        vllm += f" --speculative-config '{json.dumps(cfg, separators=(',', ':'))}'"
        sglang += (
            f" --speculative-algorithm {'NEXTN' if mtp else 'EAGLE'} --speculative-num-steps {k} "
            f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"
        )
        if not mtp:
            sglang += f" --speculative-draft-model-path {draft}"
        notes.append(
            f"speculative k={k}: trtllm-serve takes it as speculative_config "
            f"(decoding_type {'MTP' if mtp else 'Eagle'}) in --extra_llm_api_options"
        )
    if w in _QUANT:
        vllm += f" --quantization {_QUANT[w]}"
        sglang += f" --quantization {_QUANT[w]}"
        notes.append(f"{w} weights: serve a {w}-quantized checkpoint (e.g. {_QUANT[w]})")
    if kv not in ("bf16", "fp16"):
        notes.append(
            f"KV cache {kv}: trtllm-serve takes it as kv_cache_config.dtype={_TRTLLM_KV.get(kv, kv)} "
            "in --extra_llm_api_options"
        )
    if kv not in _VLLM_KV:
        notes.append(f"vLLM and SGLang have no {kv} KV cache; use TensorRT-LLM or fp8")
    out = {"vllm": vllm, "sglang": sglang, "trtllm": trtllm}
    pools = config.get("disaggregation")
    if pools:
        for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
            pool = pools[role]
            kvt = json.dumps(
                {"kv_connector": "P2pNcclConnector", "kv_role": kv_role}, separators=(",", ":")
            )
            out[f"vllm_{role}"] = f"{vllm} --kv-transfer-config '{kvt}'"
            out[f"sglang_{role}"] = (
                f"{sglang} --disaggregation-mode {role} --disaggregation-transfer-backend nixl"
            )
            notes.append(f"{role} pool: {pool['replicas']} engine(s) on {pool['gpu']}")
        out["vllm"] = f"{out['vllm_prefill']}\n  {out['vllm_decode']}"
        out["sglang"] = f"{out['sglang_prefill']}\n  {out['sglang_decode']}"
        out["trtllm"] = (
            f"trtllm-serve disaggregated -c disagg.yaml  # context/generation servers: {trtllm}"
        )
        notes.append("route requests through a P/D proxy (vLLM's disagg proxy, SGLang's mini_lb)")
    out["notes"] = "; ".join(notes)
    return out
