"""Engine command lines for a recommended configuration (vLLM, SGLang, TensorRT-LLM).

Flag names as documented by each engine: ``vllm serve`` (--tensor-parallel-size,
--pipeline-parallel-size, --max-num-batched-tokens, --max-num-seqs, --kv-cache-dtype,
--enable-chunked-prefill, --quantization), SGLang ``launch_server`` (--tp, --pp-size,
--chunked-prefill-size, --max-running-requests, --kv-cache-dtype, --quantization) and
``trtllm-serve`` (--tp_size, --pp_size, --max_num_tokens, --max_batch_size; the KV dtype goes in
the ``kv_cache_config`` of an ``--extra_llm_api_options`` YAML).
"""

from __future__ import annotations

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
    kv, w = config["kv_dtype"], config["weight_dtype"]
    notes = []
    vllm = (
        f"vllm serve {model} --tensor-parallel-size {tp} --pipeline-parallel-size {pp} "
        f"--max-num-batched-tokens {mnbt} --max-num-seqs {seqs} "
        f"--kv-cache-dtype {_VLLM_KV.get(kv, kv)} --enable-chunked-prefill"
    )
    sglang = (
        f"python -m sglang.launch_server --model-path {model} --tp {tp} --pp-size {pp} "
        f"--chunked-prefill-size {mnbt} --max-running-requests {seqs} "
        f"--kv-cache-dtype {_SGLANG_KV.get(kv, kv)}"
    )
    trtllm = (
        f"trtllm-serve {model} --tp_size {tp} --pp_size {pp} --max_num_tokens {mnbt} "
        f"--max_batch_size {seqs}"
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
    return {"vllm": vllm, "sglang": sglang, "trtllm": trtllm, "notes": "; ".join(notes)}
