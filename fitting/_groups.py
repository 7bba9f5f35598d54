"""Noise groups and offset cells of measurement rows (what ``_model`` pools and offsets).

A row's noise group is its scenario plus operator class (``op:gemm``, ``collective:all_reduce``,
``decode_step:time``); its offset cell is ``"<source>:<engine>|<group>"`` where a discrepancy
offset is identifiable (``has_offset``): a Kennedy & O'Hagan (2001) term per lab/engine and group.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel import engine_prefill_first

from ._names import E2E_SCENARIOS, ENGINE_ALL_REDUCE_CELL, LOCKSTEP_TTFT_GROUP

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "gemm")
ELEMENTWISE_OPS = (
    "emb",
    "input_layernorm",
    "post_attention_layernorm",
    "attn_rope",
    "mlp_act",
    "add",
)
ELEMENTWISE_CLASS = {
    "emb": "embedding",
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "attn_rope": "rope",
    "mlp_act": "activation",
    "add": "residual_add",
}
"""Noise/discrepancy group of each elementwise op (their kernels differ in passes and fusion)."""


def notes_dict(notes: object) -> dict[str, str]:
    """``key=value;...`` notes into a dict (non-pairs ignored)."""
    out = {}
    if isinstance(notes, str):
        for part in notes.split(";"):
            if "=" in part:
                k, v = part.split("=", 1)
                out[k.strip()] = v.strip()
    return out


def noise_key(row: pd.Series) -> str:
    """Noise group of a row: scenario plus operator class (or metric)."""
    op = row.get("op")
    if row["scenario"] == "op":
        if op in GEMM_OPS:
            dt = notes_dict(row.get("notes")).get("gemm_dtype", "")
            return "op:gemm" if dt in ("", "bfloat16", "float16") else f"op:gemm_{dt}"
        if op in ELEMENTWISE_OPS:
            return f"op:{ELEMENTWISE_CLASS[op]}"
        return f"op:{op}"
    if row["scenario"] == "collective":
        return f"collective:{op}"
    if row["scenario"] == "serving" and open_loop(row):
        return f"serving:{OPEN_LOOP_TAG}:{row['metric']}"
    if row["metric"] == "ttft" and lockstep(row):
        return LOCKSTEP_TTFT_GROUP
    return f"{row['scenario']}:{row['metric']}"


def prefill_first(row: pd.Series) -> float:
    """``Deployment.prefill_first`` of a run: 1 on a ``PREFILL_FIRST_ENGINES`` engine unless its
    notes say ``enable_mixed_chunk=true``, else 0."""
    mixed = "enable_mixed_chunk=true" in str(row.get("notes", "")).replace(" ", "").lower()
    return engine_prefill_first(row.get("engine", ""), mixed_chunk=mixed)


def drawn_lengths(row: pd.Series) -> bool:
    """Whether a run drew its lengths at random (InferenceMAX: uniform from 80 % of nominal,
    ``uniform`` and ``len_def=nominal`` in notes) rather than sending fixed ones."""
    notes = str(row.get("notes", ""))
    return "uniform" in notes and "len_def=nominal" in notes


def fixed_lengths(row: pd.Series) -> bool:
    """Whether every request of a run had the same prompt and output length.  A curated file's
    rows say so unless ``drawn_lengths``; a benchmark tool's own result file (``tool=`` in notes)
    records only mean lengths, and SGLang ``bench_serving`` draws them uniform from
    ``random_range_ratio`` x nominal (default 0) up, so only its ratio 1 is fixed."""
    notes = notes_dict(row.get("notes"))
    if "tool" not in notes:
        return not drawn_lengths(row)
    ratio = pd.to_numeric(notes.get("random_range_ratio"), errors="coerce")
    return notes["tool"] == "sglang" and notes.get("dataset_name") == "random" and ratio == 1.0


def lockstep(row: pd.Series) -> bool:
    """Whether a serving row is a lockstep loop (``perfmodel._closed_loop``): N clients of fixed
    lengths on a ``prefill_first`` engine."""
    return (
        row["scenario"] == "serving"
        and not open_loop(row)
        and prefill_first(row) == 1.0
        and fixed_lengths(row)
    )


OPEN_LOOP_TAG = "rate"
"""Middle part of an open-loop serving row's group (``serving:rate:ttft``).  A load at a request
rate (Poisson arrivals, MLPerf Server) and a closed loop of N clients are different regimes: the
engine's batch under an open load is set by its own policy (MLPerf submissions run far larger
batches than the rate needs), so their offsets and noise are pooled apart."""


def open_loop(row: pd.Series) -> bool:
    """Whether a serving row was driven at a request rate rather than by N clients in flight."""
    conc = pd.to_numeric(row.get("concurrency"), errors="coerce")
    return not (pd.notna(conc) and conc > 0)


OFFSET_OP_GROUPS = (
    "op:embedding",
    "op:rope",
    "op:activation",
    "op:gemm_fp8_block",
    "op:attn_decode",
)
"""Kernel groups with a discrepancy offset: elementwise kernels whose pass count the bytes formula
does not know (the residual add, a pure stream of exactly 3 x hidden values per token, anchors
``elementwise_bandwidth_fraction``; ``op:norm`` anchors ``elementwise_onchip_bytes_per_s``),
block-scaled FP8 GEMMs (scale loads and dequantisation the roofline omits; per-tensor FP8 anchors
``low_precision_compute_ratio``) and paged decode attention (split-KV reductions and page-table
walks; its bandwidth is anchored by the GEMMs' weight reads)."""


LATENCY_ANCHOR_SOURCES = ("aiconfigurator:nccl",)
"""Collective sources whose latency defines ``collective_latency_s`` (nccl-tests, the reference
NCCL benchmark); other sources' collective cells get a latency offset (eager launches timed by a
profiler, vLLM's one-shot custom all-reduce)."""


def has_offset(key: str, source: str = "") -> bool:
    """Whether rows of noise group ``key`` (from ``source``) carry a (source, group) offset.

    Whole-model scenarios do (engine and lab effects); single kernels are anchored by their own
    efficiency parameters, except ``OFFSET_OP_GROUPS``; collectives get a *latency* offset except
    from ``LATENCY_ANCHOR_SOURCES``.  Offsetting every group would make each efficiency collinear
    with the offsets of the groups it governs.
    """
    if key.startswith("collective:"):
        return source not in LATENCY_ANCHOR_SOURCES
    return not key.startswith("op:") or key.startswith(OFFSET_OP_GROUPS)


def latency_cells(cells) -> np.ndarray:
    """Mask of cells whose offset scales the collective latency alpha, not the whole time."""
    return np.asarray([c.split("|")[1].startswith("collective:") for c in cells], dtype=bool)


UNRECORDED_PROMPT_SOURCE_PREFIX = "mlperf"
"""Sources whose runs draw prompts from a fixed dataset per model and do not record their length
(MLPerf's result files): the length is uncertain (``_rows.MLPERF_PROMPT_TOKENS``)."""


def unrecorded_prompt(row: pd.Series) -> bool:
    """Whether a run's prompt length is its benchmark dataset's, unrecorded (an MLPerf row
    without ``input_len``)."""
    recorded = pd.to_numeric(row.get("input_len"), errors="coerce") > 0
    return not recorded and str(row["source"]).startswith(UNRECORDED_PROMPT_SOURCE_PREFIX)


def source_key(row: pd.Series) -> str:
    """Source-level effect key: the lab/source plus its engine (``vidur:sarathi``); a collective's
    ``backend`` note joins it (``aiconfigurator:vllm_graph``: a CUDA-graph-captured custom
    all-reduce costs ~5 us where the same kernel launched eagerly costs ~45 us).  An end-to-end
    run whose prompt length is unrecorded keys its source by the model as well
    (``mlperf-inference-v4.1/Mixtral-8x7B-v0.1:trtllm``): such a harness runs one dataset per
    model, and the dataset's unknown prompt length is a bias of that dataset's runs, not of the
    lab (MLPerf's Mixtral set mixes OpenOrca, GSM8K and MBXP; Llama-2-70B's is OpenOrca alone)."""
    eng = row.get("engine")
    source = str(row["source"])
    if row.get("scenario") in E2E_SCENARIOS and unrecorded_prompt(row):
        source = f"{source}/{str(row['model']).split('/')[-1]}"
    key = f"{source}:{eng}" if isinstance(eng, str) and eng else source
    if row.get("scenario") == "collective":
        backend = notes_dict(row.get("notes")).get("backend")
        if backend and backend != eng:
            key = f"{row['source']}:{backend}"
    return key


COMM_GROUP = "comm:latency"
"""Group of a whole-model source's collective-latency offset: engines launch their TP all-reduces
differently (eager NCCL calls from Python take ~100 us, CUDA-graph custom all-reduce ~5 us), so a
TP-8 decode step of one engine can cost 4x another's while its GEMMs match."""

COMM_SCENARIOS = ("prefill", "decode_step", "static_batch")
"""Whole-model scenarios whose rows carry a ``COMM_GROUP`` cell when tp * pp > 1 (serving rows take
their engine effects from the serving stage instead)."""


def comm_cell(row: pd.Series) -> str | None:
    """The cell whose offset scales a row's TP all-reduce latency: ``"<source>:<engine>|
    comm:latency"`` for a multi-GPU whole-model row, ``ENGINE_ALL_REDUCE_CELL`` for an end-to-end
    run, else None."""
    if row["scenario"] in E2E_SCENARIOS:
        return ENGINE_ALL_REDUCE_CELL
    if row["scenario"] not in COMM_SCENARIOS:
        return None
    tp, pp = (float(row[c]) if pd.notna(row[c]) else 1.0 for c in ("tp", "pp"))
    return f"{source_key(row)}|{COMM_GROUP}" if tp * pp > 1 else None
