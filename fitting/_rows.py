"""Host side of the predictions: measurement rows -> numbers for the vectorised blocks.

Each row of the tidy table (``../shared/data/SCHEMA.md``) is classified (``gemm``, ``elementwise``,
``attention``, ``collective``, ``step``, ``serving``), its shapes are derived from the model config,
TP degree and ``notes``, and it gets a GPU index, a noise group and (where identifiable) a
(source, group) offset cell.  Rows no budget covers are returned with a reason, never dropped.
``fitting._predict`` evaluates the blocks in JAX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import jax
import numpy as np
import pandas as pd

import perfmodel
from perfmodel import Deployment, Efficiency, HardwareSpec, ModelSpec
from perfmodel._constants import DTYPE_BYTES
from perfmodel._ops import KernelEfficiency

from ._features import (  # noqa: F401  (re-exported)
    ACT_BYTES,
    LOW_PRECISION,
    _collective_features,
    _f,
    _model,
    _op_features,
    mlp_shape,
)
from ._groups import (  # noqa: F401  (re-exported: row grouping lives in _groups)
    COMM_GROUP,
    ELEMENTWISE_CLASS,
    ELEMENTWISE_OPS,
    GEMM_OPS,
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
STEP_METRICS = {
    ("prefill", "time"): 0,
    ("decode_step", "time"): 1,
    ("static_batch", "ttft"): 0,
    ("static_batch", "tpot"): 1,
    ("static_batch", "latency"): 2,
    ("static_batch", "output_throughput"): 3,
}
SERVING_REASON = (
    "serving rows are fitted in the second (cut) stage, not by NUTS (closed-loop solve too costly)"
)
SERVING_METRICS = {"ttft": 0, "tpot": 1, "itl": 1, "e2e_latency": 2, "output_throughput": 3}
SERVING_STATS = {"mean": 0, "": 0, "p50": 1, "median": 1, "p95": 2, "p99": 3}


@lru_cache(maxsize=64)
def _hardware(gpu: str) -> HardwareSpec:
    return perfmodel.load_hardware(gpu)


@lru_cache(maxsize=256)
def _row_specs(model_id: str, gpu: str, tp: float, pp: float, wdt: str, kvdt: str):
    """Specs of one step row, renamed to a common static name so rows stack for ``vmap``."""
    m, h = _model(model_id), _hardware(gpu)
    m = ModelSpec(
        name="row", **{f: getattr(m, f) for f in ModelSpec.__dataclass_fields__ if f != "name"}
    )
    h = HardwareSpec(
        name="row", **{f: getattr(h, f) for f in HardwareSpec.__dataclass_fields__ if f != "name"}
    )
    dep = Deployment.create(tp=int(tp), pp=int(pp), weight_dtype=wdt, kv_dtype=kvdt)
    return m, h, dep


def _step_features(row: pd.Series) -> tuple[tuple, dict[str, float]]:
    key = (row["scenario"], row["metric"])
    if key not in STEP_METRICS:
        raise ValueError(f"no prediction for {row['scenario']} metric {row['metric']!r}")
    wdt = row["weight_dtype"] if row["weight_dtype"] in DTYPE_BYTES else "bf16"
    kvdt = (
        row["kv_dtype"]
        if row["kv_dtype"] in DTYPE_BYTES
        else (wdt if DTYPE_BYTES[wdt] >= 2 else "bf16")
    )
    tp, pp = (
        _f(row["tp"]) if _f(row["tp"]) > 0 else 1.0,
        _f(row["pp"]) if _f(row["pp"]) > 0 else 1.0,
    )
    specs = _row_specs(row["model"], row["gpu"], tp, pp, wdt, kvdt)
    inp, out = _f(row["input_len"]), _f(row["output_len"])
    out = 1.0 if not out > 0 else out
    b = _f(row["batch_size"])
    if not (inp > 0 and b > 0):
        raise ValueError("step rows need input_len and batch_size")
    ctx = _f(row["context_len"])
    ctx = inp + out / 2.0 if not ctx >= 0 else ctx
    return specs, {
        "inp": inp,
        "out": out,
        "batch": b,
        "ctx": ctx,
        "metric": float(STEP_METRICS[key]),
        "low": float(wdt in LOW_PRECISION),
    }


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
    return specs, {
        "inp": feats["inp"],
        "out": _f(row["output_len"]),
        "low": feats["low"],
        "conc": conc if conc > 0 else 0.0,
        "rate": rate if rate > 0 else 1.0,
        "metric": float(SERVING_METRICS[metric]),
        "stat": float(SERVING_STATS[stat]),
    }


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


def prepare(
    table: pd.DataFrame,
    *,
    gpus: tuple[str, ...] | None = None,
    cells: tuple[str, ...] | None = None,
    noise_keys: tuple[str, ...] | None = None,
    serving: bool = True,
) -> Prepared:
    """Turn measurement rows into prediction inputs; label sets extend the given ones (a fitted
    posterior's), so indices stay aligned with its parameters.  ``serving=False`` skips
    ``serving`` rows (the fit does: their closed-loop solve is costly inside NUTS)."""
    rows: dict[str, list] = {
        "gemm": [],
        "elementwise": [],
        "attention": [],
        "collective": [],
        "step": [],
        "serving": [],
    }
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
                msg = (
                    str(exc).split(";")[0]
                    if isinstance(exc, perfmodel.CatalogError)
                    else f"{type(exc).__name__}: {exc}"
                )
                skipped.append((idx, f"not covered by a budget ({msg})"))
        else:
            skipped.append((idx, reason))
    kept_table = table.loc[kept]
    blocks = {
        k: {c: np.asarray([r[c] for r in v], dtype=float) for c in v[0]}
        for k, v in rows.items()
        if v
    }
    for b in blocks.values():
        b["pos"] = b["pos"].astype(int)
    for name, specs in (("step", step_specs), ("serving", serving_specs)):
        if specs:
            blocks[name]["specs"] = jax.tree.map(
                lambda *xs: np.stack([np.asarray(x) for x in xs]), *specs
            )

    def labels(values: list[str], given):
        out = list(given or ())
        out += sorted(set(values) - set(out))
        return tuple(out), np.asarray([out.index(v) for v in values], dtype=int)

    gpus_, gi = labels(list(kept_table["gpu"]), gpus)
    nks = [noise_key(r) for _, r in kept_table.iterrows()]
    cell_rows = [
        (f"{source_key(r)}|{k}" if has_offset(k, source_key(r)) else None)
        for (_, r), k in zip(kept_table.iterrows(), nks)
    ]
    comm_rows = [comm_cell(r) for _, r in kept_table.iterrows()]
    used = [c for c in cell_rows + comm_rows if c is not None]
    src_, _ = labels(used, cells)

    def index(names: list) -> np.ndarray:
        return np.asarray([src_.index(c) if c is not None else -1 for c in names], dtype=int)

    nk_, ni = labels(nks, noise_keys)
    return Prepared(
        kept_table,
        blocks,
        gpus_,
        src_,
        nk_,
        gi,
        index(cell_rows),
        ni,
        np.log(kept_table["value"].to_numpy(float)),
        skipped,
        comm_idx=index(comm_rows),
    )
