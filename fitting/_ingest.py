"""Read measurement files into one tidy, validated table (``data/measurements/SCHEMA.md``).

Tidy ``.csv``/``.csv.gz`` files and benchmark-tool outputs (``_formats``) all become the same
columns.  Malformed input raises ``MeasurementFormatError`` naming file, line and field; rows
whose GPU or model the catalog does not know are returned as ``SkippedRow``s with the reason.
Checks are vectorized, and catalog look-ups are made once per distinct value.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import perfmodel

from . import _formats as F
from ._ingest_catalog import (
    SkippedRow,
    catalog_filter as _catalog_filter,
    catalog_lookups as _catalog,
)
from ._ingest_checks import (
    MeasurementFormatError,  # re-exported: errors.py looks here
    check_labels as _check_labels,
    numbers as _numbers,
    si_units as _si_units,
    stat_aliases as _stat_aliases,
)

TABLE_SUFFIXES = (".csv", ".csv.gz")
TOOL_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")


@dataclass(frozen=True)
class IngestResult:
    """The tidy table (SCHEMA.md columns, ``Int64``/``float64``/``str``) and the rows left out."""

    table: pd.DataFrame
    skipped: list[SkippedRow] = field(default_factory=list)
    files: tuple[str, ...] = ()


def bundled_measurements() -> list[Path]:
    """The measurement files shipped with servingmath (``data/measurements``), sorted."""
    return _expand([perfmodel.data_dir() / "measurements"])


def _expand(paths: Iterable[str | PathLike[str]]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(q for q in p.iterdir() if q.name.endswith(TABLE_SUFFIXES + TOOL_SUFFIXES))
        elif not p.is_file():
            raise MeasurementFormatError(f"{p}: no such file or folder; check the path")
        else:
            out.append(p)
    return out


BAD_GZIP = (gzip.BadGzipFile, EOFError, zlib.error)
"""What reading a ``.gz`` file that is not (or no longer) gzip data raises."""


def _unreadable(path: Path, exc: Exception) -> MeasurementFormatError:
    """The one-line error for bytes that are not the text or gzip their name promises."""
    if isinstance(exc, BAD_GZIP):
        return MeasurementFormatError(
            f"{path}: not gzip data although the name ends in .gz; recompress it or drop the .gz"
        )
    return MeasurementFormatError(
        f"{path}: not UTF-8 text; pass SCHEMA.md CSVs or vLLM/SGLang/GenAI-Perf JSON results"
    )


def _read_text(path: Path) -> str:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            return fh.read()
    except (UnicodeDecodeError, *BAD_GZIP) as exc:
        raise _unreadable(path, exc) from None


def _json_records(path: Path) -> list[tuple[int, Any]]:
    text = _read_text(path)
    try:
        whole = json.loads(text)
        return [(1, r) for r in (whole if isinstance(whole, list) else [whole])]
    except json.JSONDecodeError:
        pass
    records = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if raw.strip():
            try:
                records.append((line, json.loads(raw)))
            except json.JSONDecodeError as exc:
                raise MeasurementFormatError(
                    f"{path}:{line}: not valid JSON ({exc.msg}); write one JSON object per line"
                ) from None
    return records


def _tool_frame(path: Path, skipped: list[SkippedRow]) -> tuple[pd.DataFrame, np.ndarray]:
    rows, lines = [], []
    for line, record in _json_records(path):

        def fail(msg: str, line: int = line) -> MeasurementFormatError:
            return MeasurementFormatError(f"{path}:{line}: {msg}")

        tool = F.detect(record) if isinstance(record, dict) else None
        if tool is None:
            raise fail(
                "not a known benchmark result; expected a vLLM --save-result JSON, an SGLang "
                "bench_serving JSONL line or a GenAI-Perf profile_export_genai_perf.json"
            )
        if tool == "genai-perf":
            got = F.convert_genai_perf(record, fail)
        else:
            got = F.convert_vllm_or_sglang(tool, record, fail)
        if not got:
            skipped.append(SkippedRow(str(path), line, f"{tool} result with no completed request"))
        rows += [{**row, "source_ref": str(path)} for row in got]
        lines += [line] * len(got)
    frame = pd.DataFrame(rows, columns=list(F.COLUMNS))
    for col in F.STR_COLUMNS:
        frame[col] = frame[col].astype(object).fillna("").astype(str)
    for col in F.INT_COLUMNS + F.FLOAT_COLUMNS:
        frame[col] = frame[col].astype("float64")
    return frame, np.asarray(lines, dtype=np.int64)


def _csv_frame(path: Path, fills: dict[str, Any]) -> tuple[pd.DataFrame, np.ndarray]:
    """All cells as text (``""`` when empty); line numbers assume no newline inside a cell."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)
    except pd.errors.EmptyDataError:
        raise MeasurementFormatError(f"{path}:1: empty file; write the SCHEMA.md header") from None
    except (UnicodeDecodeError, *BAD_GZIP) as exc:
        raise _unreadable(path, exc) from None
    except pd.errors.ParserError as exc:
        raise MeasurementFormatError(f"{path}: not a readable CSV ({exc}); check quoting") from None
    unknown = [c for c in frame.columns if c not in F.COLUMNS]
    if unknown:
        raise MeasurementFormatError(
            f"{path}:1: column {unknown[0]!r} is not in the measurement schema; rename it to a "
            "SCHEMA.md column or move its content into 'notes'"
        )
    for col in F.REQUIRED_COLUMNS:
        if col not in frame.columns and fills.get(col) is None:
            raise MeasurementFormatError(
                f"{path}:1: missing required column {col!r}; the header needs "
                f"{', '.join(F.REQUIRED_COLUMNS)} (see SCHEMA.md)"
            )
    frame = frame.reindex(columns=list(F.COLUMNS), fill_value="")
    frame["source"] = frame["source"].where(frame["source"] != "", path.name.split(".")[0])
    return frame, np.arange(len(frame), dtype=np.int64) + 2  # line 1 is the header


# ---------------------------------------------------------------- public --------------------


def _fill(frame: pd.DataFrame, fills: dict[str, Any], tool: bool) -> pd.DataFrame:
    """Put the caller's ``gpu=``/``model=``/... into the cells the file left empty."""
    for col, value in fills.items():
        if value is None:
            continue
        if tool and col == "model":  # the served name a tool records is often a local path
            recorded = frame["model"]
            noted = frame["notes"] + ";recorded_model=" + recorded
            frame["notes"] = frame["notes"].where(recorded == "", noted)
            frame["model"] = str(value)
        elif frame[col].dtype.kind in "fiu":  # numbers of a tool output
            frame[col] = frame[col].fillna(float(value))
        else:  # text of a CSV, numbers included
            empty = frame[col] == ""
            if col == "model":  # op/collective rows legitimately have no model
                empty &= ~frame["scenario"].isin(F.MODEL_FREE_SCENARIOS)
            frame[col] = frame[col].where(~empty, str(value))
    return frame


def _note_default(frame: pd.DataFrame, key: str, value: object) -> pd.DataFrame:
    """``key=value`` appended to the notes of rows whose notes do not give ``key``."""
    if value is None:
        return frame
    unsaid = ~frame["notes"].str.contains(f"{key}=", regex=False)
    noted = (frame["notes"] + f";{key}={value}").str.lstrip(";")
    frame["notes"] = frame["notes"].where(~unsaid, noted)
    return frame


def load_measurements(
    paths: str | PathLike[str] | Sequence[str | PathLike[str]],
    *,
    hardware_ids: Collection[str] | None = None,
    model_ids: Collection[str] | None = None,
    gpu: str | None = None,
    model: str | None = None,
    tp: int | None = None,
    num_gpus: int | None = None,
    engine: str | None = None,
    stream_interval: int | None = None,
    scheduler_recv_interval: int | None = None,
) -> IngestResult:
    """Read measurement files (or folders of them) into one validated tidy table.

    Args:
        paths: files or folders.  ``.csv``/``.csv.gz`` in the SCHEMA.md layout; ``.json``/
            ``.jsonl`` written by ``vllm bench serve --save-result``, ``sglang.bench_serving`` or
            GenAI-Perf (``profile_export_genai_perf.json``), detected by content.
        hardware_ids: GPU ids to accept (default ``perfmodel.hardware_ids()``).
        model_ids: model ids to accept (default ``perfmodel.model_ids()``); a path to a
            ``config.json`` is always accepted.
        gpu, model, tp, num_gpus, engine: what the files do not record.  They fill empty cells of
            a tidy CSV; for tool outputs they set the row (``model=`` replaces the served name the
            tool recorded, which is kept in ``notes``).  ``num_gpus`` defaults to ``tp``.
        stream_interval: tokens the engine streamed per chunk (its ``--stream-interval``), for
            rows whose notes do not say: a client's ITL is the gap between chunks.
        scheduler_recv_interval: forward iterations between the engine's polls for new requests
            (SGLang's ``--scheduler-recv-interval``), for rows whose notes do not say: an
            arrival waits (k - 1) / 2 iterations on average before its prefill can start.

    Returns:
        ``IngestResult``: the table (SCHEMA.md columns; ``Int64`` counts, ``float64`` values in
        SI, ``str`` labels with ``""`` for empty; GPU and model names made canonical catalog ids)
        and the rows skipped because their GPU or model is unknown, each with file, line, reason.

    Raises:
        MeasurementFormatError: a malformed file; the message names file, line, field and fix.
    """
    fills = {
        "gpu": gpu,
        "model": model,
        "tp": tp,
        "engine": engine,
        "num_gpus": num_gpus if num_gpus is not None else tp,
    }
    files = _expand([paths] if isinstance(paths, (str, PathLike)) else paths)
    if not files:
        raise MeasurementFormatError(
            f"no measurement files in {paths}; pass .csv, .csv.gz or benchmark .json/.jsonl files"
        )
    catalog = _catalog(hardware_ids, model_ids)
    frames, skipped = [], []
    for path in files:
        tool = not path.name.endswith(TABLE_SUFFIXES) and (
            path.name.endswith(TOOL_SUFFIXES) or _read_text(path).lstrip()[:1] in ("{", "[")
        )
        frame, lines = _tool_frame(path, skipped) if tool else _csv_frame(path, fills)
        frame = _fill(frame, fills, tool)
        frame = _note_default(
            frame, "stream_interval", None if stream_interval is None else int(stream_interval)
        )
        frame = _note_default(
            frame,
            "scheduler_recv_interval",
            None if scheduler_recv_interval is None else int(scheduler_recv_interval),
        )
        codes, engines = pd.factorize(frame["engine"].fillna(""))
        if len(engines):
            frame["engine"] = np.asarray([F.canonical_engine(e) for e in engines], object)[codes]
        frame = _stat_aliases(_si_units(frame))
        _check_labels(frame, lines, path)
        frame = _numbers(frame, lines, path)
        frames.append(_catalog_filter(frame, lines, path, catalog, skipped))
    table = pd.concat(frames, ignore_index=True)
    return IngestResult(table=table, skipped=skipped, files=tuple(map(str, files)))


def describe(result: IngestResult) -> str:
    """A short human summary: rows per scenario, GPU and source; skipped rows by reason."""
    table = result.table

    def counts(col: str) -> str:
        vc = table[col].replace("", "(none)").value_counts()
        return ", ".join(f"{k} {v:,}" for k, v in vc.items())

    head = f"{len(table):,} measurements from {len(result.files)} file(s); "
    lines = [head + f"{len(result.skipped):,} skipped"]
    if len(table):
        lines += [
            f"  by scenario: {counts('scenario')}",
            f"  by gpu: {counts('gpu')}",
            f"  by source: {counts('source')}",
        ]
    if result.skipped:
        reasons = pd.Series([s.reason for s in result.skipped]).value_counts()
        lines.append("  skipped:")
        lines += [f"    {n:,} x {why}" for why, n in reasons.head(8).items()]
        if len(reasons) > 8:
            lines.append(f"    ... and {len(reasons) - 8} other reasons")
    return "\n".join(lines)
