"""Host side of the predictions: measurement rows -> numbers for the vectorised blocks.

Each row of the tidy table (``../shared/data/SCHEMA.md``) is classified (``gemm``, ``elementwise``,
``attention``, ``collective``, ``step``, ``serving``), its shapes are derived from the model config,
TP degree and ``notes``, and it gets a GPU index, a noise group and (where identifiable) a
(source, group) offset cell.  Rows no budget covers are returned with a reason, never dropped.
``fitting._predict`` evaluates the blocks in JAX.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache

import jax
import numpy as np
import pandas as pd

import perfmodel
from perfmodel import Deployment, Efficiency, HardwareSpec, ModelSpec
from perfmodel._constants import DTYPE_BYTES
from perfmodel._ops import COLLECTIVE_KINDS, KernelEfficiency, prefill_attention_flops

from ._groups import (  # noqa: F401  (re-exported: row grouping lives in _groups)
    ELEMENTWISE_CLASS,
    ELEMENTWISE_OPS,
    GEMM_OPS,
    COMM_GROUP,
    LATENCY_ANCHOR_SOURCES,
    OFFSET_OP_GROUPS,
    comm_cell,
    has_offset,
    latency_cells,
    noise_key,
    notes_dict,
    source_key,
)

EFFICIENCY_FIELDS = tuple(Efficiency.__dataclass_fields__)
KERNEL_FIELDS = tuple(KernelEfficiency.__dataclass_fields__)
ACT_BYTES = 2.0  # fp16/bf16 activations in every profiled kernel (vidur fp16, aic bf16)
_UNGATED = {"phi", "gpt2", "gptj", "gpt_neox", "bloom", "falcon", "opt"}
_LOW_PRECISION = {"fp8", "fp8_block", "fp4", "int8"}
STEP_METRICS = {("prefill", "time"): 0, ("decode_step", "time"): 1, ("static_batch", "ttft"): 0,
                ("static_batch", "tpot"): 1, ("static_batch", "latency"): 2,
                ("static_batch", "output_throughput"): 3}
SERVING_REASON = "serving rows are fitted in the second (cut) stage, not by NUTS (closed-loop solve too costly)"
SERVING_METRICS = {"ttft": 0, "tpot": 1, "itl": 1, "e2e_latency": 2, "output_throughput": 3}
SERVING_STATS = {"mean": 0, "": 0, "p50": 1, "median": 1, "p95": 2, "p99": 3}


@lru_cache(maxsize=64)
def _hardware(gpu: str) -> HardwareSpec:
    return perfmodel.load_hardware(gpu)


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


def _op_features(row: pd.Series, hw: HardwareSpec) -> tuple[str, dict[str, float]]:
    """Block name and numbers of one ``op`` row (raises KeyError/ValueError when not covered)."""
    op, notes = row["op"], notes_dict(row["notes"])
    peak_bf16, bw = float(hw.dense_flops_per_s[0]), float(hw.hbm_bytes_per_s)
    if op == "gemm":
        dt = notes["gemm_dtype"]
        low = dt in _LOW_PRECISION
        peak = float(hw.dense_flops_per_s[1]) if low else peak_bf16
        return "gemm", {"m": _f(row["num_tokens"]), "n": _f(notes["n"]), "k": _f(notes["k"]),
                            "in_bytes": 1.0 if low else ACT_BYTES, "peak": peak, "bw": bw, "low": float(low)}
    if op in ("attn_prefill", "attn_decode"):
        h, hkv, d = (_f(notes[k]) for k in ("num_heads", "num_kv_heads", "head_dim"))
        b = _f(row["batch_size"])
        kv_b = DTYPE_BYTES.get(row["kv_dtype"], ACT_BYTES)
        if op == "attn_prefill":
            s = _f(row["input_len"])
            flops = float(prefill_attention_flops(b, s, h, d, _f(notes.get("window_size", 0))))
            moved = b * s * (2 * h * d * ACT_BYTES + 2 * hkv * d * (ACT_BYTES + kv_b))
            q = s
        else:
            c = _f(row["context_len"]) + 1.0
            w = _f(notes.get("window_size", 0))
            c = min(c, w) if w > 0 else c  # a sliding-window layer reads only the last W keys
            flops = b * c * 2.0 * 2.0 * h * d
            moved = b * c * 2 * hkv * d * kv_b + b * 2 * h * d * ACT_BYTES
            q = c
        return "attention", {"flops": flops, "bytes": moved, "q": q, "peak": peak_bf16, "bw": bw}
    # vidur per-layer ops of a model's TP shard
    spec = _model(row["model"])
    tp, m = _f(row["tp"]), _f(row["num_tokens"])
    hidden, heads = float(spec.hidden_size), float(spec.num_heads)
    kv, hd = float(spec.num_kv_heads), float(spec.head_dim)
    inter, gated = mlp_shape(row["model"])
    up = (2.0 if gated else 1.0) * inter / tp
    gemms = {"attn_pre_proj": ((heads + 2 * kv) * hd / tp, hidden),
             "attn_post_proj": (hidden, heads * hd / tp),
             "mlp_up_proj": (up, hidden), "mlp_down_proj": (hidden, inter / tp)}
    if op in gemms:
        n, k = gemms[op]
        return "gemm", {"m": m, "n": n, "k": k, "in_bytes": ACT_BYTES, "peak": peak_bf16, "bw": bw, "low": 0.0}
    widths = {"emb": 2 * hidden, "input_layernorm": 2 * hidden,
              "post_attention_layernorm": 2 * hidden, "add": 3 * hidden,
              "attn_rope": 2 * (heads + kv) * hd / tp, "mlp_act": (up + inter / tp)}
    return "elementwise", {"bytes": m * widths[op] * ACT_BYTES, "bw": bw}


def _collective_features(row: pd.Series, hw: HardwareSpec) -> dict[str, float]:
    cross = "cross-node" in str(row["notes"])
    link = float(hw.internode_bytes_per_s) if cross else float(hw.link_bytes_per_s)
    if not math.isfinite(link):
        raise ValueError("hardware row has no link bandwidth")
    return {"kind": float(COLLECTIVE_KINDS[row["op"]]), "msg": _f(row["message_bytes"]),
                "p": _f(row["num_gpus"]), "link": link, "cross": float(cross)}


@lru_cache(maxsize=256)
def _row_specs(model_id: str, gpu: str, tp: float, pp: float, wdt: str, kvdt: str):
    """Specs of one step row, renamed to a common static name so rows stack for ``vmap``."""
    m, h = _model(model_id), _hardware(gpu)
    m = ModelSpec(name="row", **{f: getattr(m, f) for f in ModelSpec.__dataclass_fields__ if f != "name"})
    h = HardwareSpec(name="row", **{f: getattr(h, f) for f in HardwareSpec.__dataclass_fields__ if f != "name"})
    dep = Deployment.create(tp=int(tp), pp=int(pp), weight_dtype=wdt, kv_dtype=kvdt)
    return m, h, dep


def _step_features(row: pd.Series) -> tuple[tuple, dict[str, float]]:
    key = (row["scenario"], row["metric"])
    if key not in STEP_METRICS:
        raise ValueError(f"no prediction for {row['scenario']} metric {row['metric']!r}")
    wdt = row["weight_dtype"] if row["weight_dtype"] in DTYPE_BYTES else "bf16"
    kvdt = row["kv_dtype"] if row["kv_dtype"] in DTYPE_BYTES else (wdt if DTYPE_BYTES[wdt] >= 2 else "bf16")
    tp, pp = _f(row["tp"]) if _f(row["tp"]) > 0 else 1.0, _f(row["pp"]) if _f(row["pp"]) > 0 else 1.0
    specs = _row_specs(row["model"], row["gpu"], tp, pp, wdt, kvdt)
    inp, out = _f(row["input_len"]), _f(row["output_len"])
    out = 1.0 if not out > 0 else out
    b = _f(row["batch_size"])
    if not (inp > 0 and b > 0):
        raise ValueError("step rows need input_len and batch_size")
    ctx = _f(row["context_len"])
    ctx = inp + out / 2.0 if not ctx >= 0 else ctx
    return specs, {"inp": inp, "out": out, "batch": b, "ctx": ctx, "metric": float(STEP_METRICS[key]),
                       "low": float(wdt in _LOW_PRECISION)}


@dataclass
class Prepared:
    """Rows a budget covers, in table order, with the numbers ``predict`` needs.

    Attributes:
        table: the covered rows (original index kept).
        blocks: per block name, a dict of arrays; ``pos`` places each row in ``table``.
        gpus, cells, noise_keys: labels behind ``gpu_idx``, ``cell_idx``, ``noise_idx``; a cell is
            ``"<source>:<engine>|<noise key>"``, the unit of the source/discrepancy offset;
            ``cell_idx`` is -1 for rows of groups without an offset (``has_offset``).
        comm_idx: per row, the cell (``COMM_GROUP``) whose offset scales the collective latencies
            inside a multi-GPU whole-model prediction, or -1 (None: no such cells).
        log_value: log of the measured value per covered row.
        skipped: (original index, reason) of rows no budget covers.
    """

    table: pd.DataFrame
    blocks: dict[str, dict[str, np.ndarray]]
    gpus: tuple[str, ...]
    cells: tuple[str, ...]
    noise_keys: tuple[str, ...]
    gpu_idx: np.ndarray
    cell_idx: np.ndarray
    noise_idx: np.ndarray
    log_value: np.ndarray
    skipped: list[tuple[object, str]] = field(default_factory=list)
    comm_idx: np.ndarray | None = None


def _serving_features(row: pd.Series) -> tuple[tuple, dict[str, float]]:
    """Closed-loop (``concurrency``) or open-loop (``request_rate``) serving row -> the inputs of
    ``perfmodel.serving_metrics`` (one replica of tp x pp; ``ep``/attention-DP not modelled)."""
    metric, stat = row["metric"], row["stat"] if isinstance(row["stat"], str) else ""
    if metric not in SERVING_METRICS or stat not in SERVING_STATS:
        raise ValueError(f"no serving prediction for metric {metric!r} stat {stat!r}")
    as_step = row.copy()
    as_step["scenario"], as_step["metric"], as_step["batch_size"] = "prefill", "time", 1.0
    specs, feats = _step_features(as_step)
    conc, rate = _f(row["concurrency"]), _f(row["request_rate"])
    if not (conc > 0 or (rate > 0 and math.isfinite(rate))):
        raise ValueError("serving rows need a concurrency or a finite request_rate")
    return specs, {"inp": feats["inp"], "out": _f(row["output_len"]), "low": feats["low"],
                       "conc": conc if conc > 0 else 0.0, "rate": rate if rate > 0 else 1.0,
                       "metric": float(SERVING_METRICS[metric]), "stat": float(SERVING_STATS[stat])}


def _skip_reason(row: pd.Series, serving: bool) -> str | None:
    notes = str(row.get("notes", ""))
    if row["scenario"] == "serving" and not serving:
        return SERVING_REASON
    if "e2e_check=MISMATCH" in notes:
        return "source flags e2e_check=MISMATCH (data README: not usable as is)"
    if "POWER-CAPPED" in notes:
        return "power-capped H100 run (a different operating point than the catalog row)"
    if "duplicate_of=" in notes:
        return "duplicate of another row (data README)"
    if "pairwise" in notes and "cross-node" not in notes and _f(row.get("num_gpus")) <= 2:
        return "pairwise NVLink bridge: its bandwidth is not in the hardware catalog"
    if not (_f(row["value"]) > 0):
        return "value is not a positive number"
    return None


def prepare(table: pd.DataFrame, *, gpus: tuple[str, ...] | None = None,
            cells: tuple[str, ...] | None = None,
            noise_keys: tuple[str, ...] | None = None, serving: bool = True) -> Prepared:
    """Turn measurement rows into prediction inputs; label sets extend the given ones (a fitted
    posterior's), so indices stay aligned with its parameters.  ``serving=False`` skips
    ``serving`` rows (the fit does: their closed-loop solve is costly inside NUTS)."""
    rows: dict[str, list] = {"gemm": [], "elementwise": [], "attention": [], "collective": [], "step": [],
                             "serving": []}
    step_specs: list[tuple] = []
    serving_specs: list[tuple] = []
    kept, skipped = [], []
    for idx, row in table.iterrows():
        reason = _skip_reason(row, serving)
        if reason is None:
            try:
                hw = _hardware(row["gpu"])
                if row["scenario"] == "op":
                    block, feats = _op_features(row, hw)
                elif row["scenario"] == "collective":
                    block, feats = "collective", _collective_features(row, hw)
                elif row["scenario"] == "serving":
                    block, (specs, feats) = "serving", _serving_features(row)
                    serving_specs.append(specs)
                else:
                    block, (specs, feats) = "step", _step_features(row)
                    step_specs.append(specs)
                if not all(math.isfinite(v) for v in feats.values()):
                    raise ValueError("a needed column is empty")
                feats["pos"] = len(kept)
                rows[block].append(feats)
                kept.append(idx)
            except (perfmodel.CatalogError, KeyError, ValueError, TypeError) as exc:
                msg = str(exc).split(";")[0] if isinstance(exc, perfmodel.CatalogError) else f"{type(exc).__name__}: {exc}"
                skipped.append((idx, f"not covered by a budget ({msg})"))
        else:
            skipped.append((idx, reason))
    kept_table = table.loc[kept]
    blocks = {k: {c: np.asarray([r[c] for r in v], dtype=float) for c in v[0]} for k, v in rows.items() if v}
    for b in blocks.values():
        b["pos"] = b["pos"].astype(int)
    for name, specs in (("step", step_specs), ("serving", serving_specs)):
        if specs:
            blocks[name]["specs"] = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *specs)

    def labels(values: list[str], given):
        out = list(given or ())
        out += sorted(set(values) - set(out))
        return tuple(out), np.asarray([out.index(v) for v in values], dtype=int)

    gpus_, gi = labels(list(kept_table["gpu"]), gpus)
    nks = [noise_key(r) for _, r in kept_table.iterrows()]
    cell_rows = [(f"{source_key(r)}|{k}" if has_offset(k, source_key(r)) else None)
                 for (_, r), k in zip(kept_table.iterrows(), nks)]
    comm_rows = [comm_cell(r) for _, r in kept_table.iterrows()]
    used = [c for c in cell_rows + comm_rows if c is not None]
    src_, _ = labels(used, cells)

    def index(names: list) -> np.ndarray:
        return np.asarray([src_.index(c) if c is not None else -1 for c in names], dtype=int)

    nk_, ni = labels(nks, noise_keys)
    return Prepared(kept_table, blocks, gpus_, src_, nk_, gi, index(cell_rows), ni,
                    np.log(kept_table["value"].to_numpy(float)), skipped, comm_idx=index(comm_rows))
