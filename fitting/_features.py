"""Kernel rows -> roofline inputs: GEMM, elementwise and attention shapes from the model config,
TP degree and ``notes``; collective message, group size and link (``_rows.prepare`` calls these).

vidur op rows are one layer of a model's TP shard on one GPU (GEMM N, K from the config);
aiconfigurator kernel rows carry their shapes in ``notes`` (``n``, ``k``, heads, window).
"""

from __future__ import annotations

import csv
import json
import math
from functools import lru_cache

import pandas as pd

import perfmodel
from perfmodel import (
    ATTENTION_QUERY_TILE as ATTN_TILE,
    COLLECTIVE_KINDS,
    DTYPE_BYTES,
    HardwareSpec,
    ModelSpec,
    attention_tile_flops,
    prefill_attention_flops,
)

from ._blocks_base import RowBlock
from ._blocks_kernel import AttentionRows, ElementwiseRows, GemmRows
from ._groups import notes_dict

ACT_BYTES = 2.0  # fp16/bf16 activations in every profiled kernel (vidur fp16, aic bf16)
_UNGATED = {"phi", "gpt2", "gptj", "gpt_neox", "bloom", "falcon", "opt"}
LOW_PRECISION = {"fp8", "fp8_block", "fp4", "int8"}
"""Weight/GEMM dtypes that run at the FP8 (or narrower) tensor-core rate."""


@lru_cache(maxsize=64)
def _model(model_id: str) -> ModelSpec:
    return perfmodel.load_model(model_id)


@lru_cache(maxsize=1)
def _model_rows() -> dict[str, dict[str, str]]:
    with open(perfmodel.data_dir() / "models.csv", newline="") as fh:
        return {r["id"]: r for r in csv.DictReader(fh)}


@lru_cache(maxsize=64)
def mlp_shape(model_id: str) -> tuple[float, bool]:
    """(per-projection FFN width, gated?) from ``models.csv`` and the config's ``model_type``."""
    row = _model_rows().get(model_id)
    if row is None or not row.get("intermediate_size"):
        raise KeyError(f"no FFN width for {model_id}")
    mt = ""
    if row.get("file"):
        cfg = json.loads((perfmodel.data_dir() / row["file"]).read_text())
        mt = str(cfg.get("model_type", cfg.get("text_config", {}).get("model_type", "")))
    return float(row["intermediate_size"]), mt not in _UNGATED


def _f(x: object) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def _op_features(row: pd.Series, hw: HardwareSpec) -> tuple[type[RowBlock], dict[str, float]]:
    """Block type and numbers (by field name) of one ``op`` row (raises KeyError/ValueError when
    not covered)."""
    op, notes = row["op"], notes_dict(row["notes"])
    peak_bf16, bw = float(hw.dense_flops_per_s[0]), float(hw.hbm_bytes_per_s)
    if op == "gemm":
        dt = notes["gemm_dtype"]
        low = dt in LOW_PRECISION
        peak = float(hw.dense_flops_per_s[1]) if low else peak_bf16
        return GemmRows, {
            "m_tokens": _f(row["num_tokens"]),
            "n_out_features": _f(notes["n"]),
            "k_in_features": _f(notes["k"]),
            "input_bytes_per_elem": 1.0 if low else ACT_BYTES,
            "peak_flops_per_s": peak,
            "hbm_bytes_per_s": bw,
            "low_precision": float(low),
        }
    if op in ("attn_prefill", "attn_decode"):
        h, hkv, d = (_f(notes[k]) for k in ("num_heads", "num_kv_heads", "head_dim"))
        b = _f(row["batch_size"])
        kv_b = DTYPE_BYTES.get(row["kv_dtype"], ACT_BYTES)
        if op == "attn_prefill":
            s = _f(row["input_len"])
            win = _f(notes.get("window_size", 0))
            # the kernel computes whole 128 x 128 tiles: a window of W keys spans W / 128 KV tiles
            # plus the diagonal one, so each query row pays ~W + 128 keys (2x the window at W = 128)
            flops = float(prefill_attention_flops(b, s, h, d, win + ATTN_TILE if win > 0 else 0.0))
            moved = b * s * (2 * h * d * ACT_BYTES + 2 * hkv * d * (ACT_BYTES + kv_b))
            q, units = s, b * hkv  # the grid's (sequence, KV head) pairs, as for decode
            keys = min(s, win + ATTN_TILE) if win > 0 else s  # the last query tile's keys
            tile = float(attention_tile_flops(keys, s, d))
        else:
            c = _f(row["context_len"]) + 1.0
            w = _f(notes.get("window_size", 0))
            c = min(c, w) if w > 0 else c  # a sliding-window layer reads only the last W keys
            flops = b * c * 2.0 * 2.0 * h * d
            moved = b * c * 2 * hkv * d * kv_b + b * 2 * h * d * ACT_BYTES
            q, units = c, b * hkv  # the decode grid: one CTA per (sequence, KV head)
            tile = 0.0  # split-KV decode: no CTA spans a whole long context
        return AttentionRows, {
            "flops": flops,
            "bytes_moved": moved,
            "tokens_per_sequence": q,
            "work_units": units,
            "tile_flops": tile,
            "peak_flops_per_s": peak_bf16,
            "hbm_bytes_per_s": bw,
        }
    # vidur per-layer ops of a model's TP shard
    spec = _model(row["model"])
    tp, m = _f(row["tp"]), _f(row["num_tokens"])
    hidden, heads = float(spec.hidden_size), float(spec.num_heads)
    kv, hd = float(spec.num_kv_heads), float(spec.head_dim)
    inter, gated = mlp_shape(row["model"])
    up = (2.0 if gated else 1.0) * inter / tp
    gemms = {
        "attn_pre_proj": ((heads + 2 * kv) * hd / tp, hidden),
        "attn_post_proj": (hidden, heads * hd / tp),
        "mlp_up_proj": (up, hidden),
        "mlp_down_proj": (hidden, inter / tp),
    }
    if op in gemms:
        n, k = gemms[op]
        return GemmRows, {
            "m_tokens": m,
            "n_out_features": n,
            "k_in_features": k,
            "input_bytes_per_elem": ACT_BYTES,
            "peak_flops_per_s": peak_bf16,
            "hbm_bytes_per_s": bw,
            "low_precision": 0.0,
        }
    widths = {
        "emb": 2 * hidden,
        "input_layernorm": 2 * hidden,
        "post_attention_layernorm": 2 * hidden,
        "add": 3 * hidden,
        "attn_rope": 2 * (heads + kv) * hd / tp,
        "mlp_act": (up + inter / tp),
    }
    # a residual add streams with no per-row work: HBM-bound only (vidur: 0.83-0.96 of peak on
    # A40, A100 and H100 alike); norms, activations, rope and gathers also pay the on-chip ceiling
    onchip = 0.0 if op == "add" else 1.0
    return ElementwiseRows, {
        "bytes_moved": m * widths[op] * ACT_BYTES,
        "hbm_bytes_per_s": bw,
        "onchip_work": onchip,
    }


def _collective_features(row: pd.Series, hw: HardwareSpec) -> dict[str, float]:
    """``CollectiveRows`` numbers (by field name) of one ``collective`` row."""
    cross = "cross-node" in str(row["notes"])
    link = float(hw.internode_bytes_per_s) if cross else float(hw.link_bytes_per_s)
    if not math.isfinite(link):
        raise ValueError("hardware row has no link bandwidth")
    return {
        "kind": float(COLLECTIVE_KINDS[row["op"]]),
        "message_bytes": _f(row["message_bytes"]),
        "num_devices": _f(row["num_gpus"]),
        "link_bytes_per_s": link,
        "cross_node": float(cross),
    }
