"""Request traces: the Azure LLM inference trace and length-only files, bundled or the user's own.

Formats (``../shared/data/README.md``, "traces/"):

* Azure (Patel et al., Splitwise, ISCA 2024): ``TIMESTAMP,ContextTokens,GeneratedTokens`` with
  wall-clock arrivals ``YYYY-MM-DD HH:MM:SS.fffffff``.
* Length files (ShareGPT via sarathi-serve, arXiv via vidur): ``num_prefill_tokens,
  num_decode_tokens`` (other columns ignored), no arrival times.
* Mooncake (Qin et al., FAST 2025), JSON lines: ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids`` (chained prompt-block identities, 512 tokens each; equal ids
  are a reusable KV prefix).  Kept as ``Trace.block_hashes`` for the simulator's prefix cache.

A user's CSV with either set of columns goes through the same code.  Malformed input raises
``CatalogError`` naming the file, line and column.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
from pathlib import Path

import numpy as np

from ._catalog import CatalogError, data_dir
from ._workload import Workload

PRESETS: dict[str, str] = {
    "azure-code": "azure_llm_2023_code.csv",
    "azure-conv": "azure_llm_2023_conv.csv",
    "sharegpt": "sharegpt_llama2_lengths.csv",
    "arxiv": "arxiv_summarization_llama2_lengths.csv",
    "mooncake": "mooncake_conversation.jsonl",
}
"""Bundled traces by name (``data/traces/``, byte-identical to ``../shared/data/traces``)."""

MOONCAKE_HASH_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry in the Mooncake trace (its README, FAST'25 release)."""

_MOONCAKE = ("timestamp", "input_length", "output_length", "hash_ids")
_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_LENGTHS = ("num_prefill_tokens", "num_decode_tokens")


class Trace:
    """Requests of a trace as numpy arrays (not a pytree: data, not parameters).

    Attributes:
        arrival_s: arrival times in seconds from the first request (NaN when the file has none).
        prompt_tokens: prompt lengths (int64).
        output_tokens: generated tokens (int64).
        name: where it came from.
        block_hashes: per request, its prompt's chained block identities (Mooncake), or None.
        hash_block_tokens: tokens per block identity (512 for Mooncake), or None.
    """

    def __init__(
        self,
        arrival_s,
        prompt_tokens,
        output_tokens,
        name: str = "trace",
        block_hashes=None,
        hash_block_tokens: int | None = None,
    ):
        self.arrival_s = np.asarray(arrival_s, dtype=np.float64)
        self.prompt_tokens = np.asarray(prompt_tokens, dtype=np.int64)
        self.output_tokens = np.asarray(output_tokens, dtype=np.int64)
        self.name = name
        self.block_hashes = None if block_hashes is None else [tuple(h) for h in block_hashes]
        self.hash_block_tokens = hash_block_tokens

    def head(self, n: int) -> Trace:
        """The first ``n`` requests (block hashes kept)."""
        return Trace(
            self.arrival_s[:n],
            self.prompt_tokens[:n],
            self.output_tokens[:n],
            self.name,
            None if self.block_hashes is None else self.block_hashes[:n],
            self.hash_block_tokens,
        )

    def __len__(self) -> int:
        return int(self.prompt_tokens.shape[0])

    @property
    def has_arrivals(self) -> bool:
        return bool(len(self) and np.isfinite(self.arrival_s).all())


def _timestamp_s(text: str) -> float:
    date, _, clock = text.strip().partition(" ")
    whole, _, frac = clock.partition(".")
    base = _dt.datetime.fromisoformat(f"{date} {whole}").replace(tzinfo=_dt.UTC)
    return base.timestamp() + (float(f"0.{frac}") if frac else 0.0)


def trace_path(name_or_path: str | Path) -> Path:
    """A preset name (``PRESETS``) or a file path -> the file."""
    if str(name_or_path) in PRESETS:
        return data_dir() / "traces" / PRESETS[str(name_or_path)]
    path = Path(name_or_path)
    if not path.exists():
        raise CatalogError(
            f"no trace {str(name_or_path)!r}; give a CSV or Mooncake .jsonl path or a preset: "
            f"{', '.join(PRESETS)}"
        )
    return path


def load_trace(name_or_path: str | Path) -> Trace:
    """Read a trace by preset name or path.

    Raises:
        CatalogError: missing columns, a non-numeric, non-finite or negative cell, timestamps that
            go backwards, or a file that is not UTF-8 text — the message names the file, line and
            column.
    """
    path = trace_path(name_or_path)
    try:
        if path.suffix == ".jsonl":
            return _load_mooncake(path, str(name_or_path))
        return _load_csv(path, str(name_or_path))
    except UnicodeDecodeError:
        raise CatalogError(
            f"{path}: not a UTF-8 text file; a trace is a CSV or Mooncake .jsonl"
        ) from None


def _load_csv(path: Path, name: str) -> Trace:
    """Azure or length-only CSV columns; errors name the file, line and column."""
    try:
        # opened apart from `with fh` so that only the open itself turns OSError into CatalogError
        fh = open(path, newline="", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise CatalogError(f"cannot read {path}: {exc.strerror}; check the path") from None
    with fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        if all(c in header for c in _AZURE):
            cols, timed = _AZURE, True
        elif all(c in header for c in _LENGTHS):
            cols, timed = ("", *_LENGTHS), False
        else:
            raise CatalogError(
                f"{path}:1: missing columns; a trace needs {', '.join(_AZURE)} "
                f"or {', '.join(_LENGTHS)}"
            )
        idx = [header.index(c) if c else -1 for c in cols]
        arrivals, prompts, outputs = [], [], []
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            values = []
            for k, (col, i) in enumerate(zip(cols, idx)):
                if i < 0:
                    continue
                cell = row[i].strip() if i < len(row) else ""
                try:
                    v = _timestamp_s(cell) if k == 0 else float(cell)
                except ValueError:
                    raise CatalogError(
                        f"{path}:{line}: column {col}: cannot read {cell!r} as "
                        f"{'a timestamp YYYY-MM-DD HH:MM:SS[.f]' if k == 0 else 'a number'}"
                    ) from None
                if k > 0 and not (math.isfinite(v) and v >= 0 and v == int(v)):
                    raise CatalogError(
                        f"{path}:{line}: column {col}: {cell!r} is not a non-negative token count"
                    )
                values.append(v)
            if timed:
                if arrivals and values[0] < arrivals[-1]:
                    raise CatalogError(
                        f"{path}:{line}: column {cols[0]}: timestamps go backwards; sort the file"
                    )
                arrivals.append(values[0])
            prompts.append(max(values[-2], 1.0))
            outputs.append(max(values[-1], 1.0))
    if not prompts:
        raise CatalogError(f"{path}: no requests; the trace is empty")
    arrival = np.asarray(arrivals) - arrivals[0] if timed else np.full(len(prompts), np.nan)
    return Trace(arrival, prompts, outputs, name=name)


def _load_mooncake(path: Path, name: str) -> Trace:
    """Mooncake JSON lines (``_MOONCAKE`` keys); errors name the file, line and key."""
    arrivals, prompts, outputs, hashes = [], [], [], []
    try:
        # opened apart from `with fh` so that only the open itself turns OSError into CatalogError
        fh = open(path, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise CatalogError(f"cannot read {path}: {exc.strerror}; check the path") from None
    with fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError:
                raise CatalogError(
                    f"{path}:{line}: not a JSON object; a Mooncake trace has one per line"
                ) from None
            missing = [k for k in _MOONCAKE if not isinstance(row, dict) or k not in row]
            if missing:
                raise CatalogError(
                    f"{path}:{line}: missing key {missing[0]!r}; need {', '.join(_MOONCAKE)}"
                )
            t, p, o, h = (row[k] for k in _MOONCAKE)
            for key, v in (("timestamp", t), ("input_length", p), ("output_length", o)):
                if (
                    isinstance(v, bool)
                    or not isinstance(v, (int, float))
                    or not (math.isfinite(v) and v >= 0)
                ):
                    raise CatalogError(
                        f"{path}:{line}: key {key}: {v!r} is not a non-negative, finite number"
                    )
            if not isinstance(h, list):
                raise CatalogError(f"{path}:{line}: key hash_ids: expected a list of block ids")
            if arrivals and t * 1e-3 < arrivals[-1]:
                raise CatalogError(
                    f"{path}:{line}: key timestamp: timestamps go backwards; sort the file"
                )
            arrivals.append(t * 1e-3)
            prompts.append(max(int(p), 1))
            outputs.append(max(int(o), 1))
            hashes.append(tuple(h))
    if not prompts:
        raise CatalogError(f"{path}: no requests; the trace is empty")
    return Trace(
        np.asarray(arrivals) - arrivals[0],
        prompts,
        outputs,
        name,
        hashes,
        MOONCAKE_HASH_BLOCK_TOKENS,
    )


def _cv(x: np.ndarray) -> float:
    return float(np.std(x) / np.mean(x)) if len(x) > 1 and np.mean(x) > 0 else 0.0


def workload_from_trace(trace: Trace, arrival_rate_per_s: float | None = None) -> Workload:
    """Moment-matched ``Workload``: rate and gap CV from the arrivals, length means and CVs.

    A length-only trace needs ``arrival_rate_per_s`` (Poisson arrivals assumed); given for a
    timed trace it overrides the measured rate and keeps the measured burstiness.
    """
    if trace.has_arrivals and len(trace) > 2:
        gaps = np.diff(trace.arrival_s)
        span = float(trace.arrival_s[-1] - trace.arrival_s[0])
        rate = (len(trace) - 1) / span if span > 0 else float("inf")
        cv_a = _cv(gaps)
    else:
        rate, cv_a = float("nan"), 1.0
    if arrival_rate_per_s is not None:
        rate = float(arrival_rate_per_s)
    if not np.isfinite(rate) or rate <= 0:
        raise CatalogError(
            f"trace {trace.name!r} has no usable arrival times; give an arrival rate (--rate R)"
        )
    return Workload(
        arrival_rate_per_s=rate,
        interarrival_cv=cv_a,
        prompt_tokens_mean=float(np.mean(trace.prompt_tokens)),
        prompt_tokens_cv=_cv(trace.prompt_tokens.astype(float)),
        output_tokens_mean=float(np.mean(trace.output_tokens)),
        output_tokens_cv=_cv(trace.output_tokens.astype(float)),
    )


def rescale_arrivals(trace: Trace, rate: float) -> Trace:
    """``trace`` with its clock stretched to arrive at ``rate`` requests/s, burstiness kept.

    Every arrival time is multiplied by one factor, (n - 1) / (rate * span) for n requests over
    ``span`` seconds: the n - 1 gaps then average 1 / rate, and their shape (the gaps' CV, the
    bursts) is the trace's own.  A trace whose arrivals span no time keeps its clock.
    """
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    scale = (len(trace) - 1) / (rate * span) if span > 0 else 1.0
    return Trace(
        trace.arrival_s * scale,
        trace.prompt_tokens,
        trace.output_tokens,
        trace.name,
        trace.block_hashes,
        trace.hash_block_tokens,
    )


def poisson_arrivals(trace: Trace, rate: float, seed: int) -> Trace:
    """``trace``'s requests arriving as a Poisson process at ``rate`` requests/s (for a
    length-only trace): independent exponential gaps of mean 1 / rate drawn on ``seed``'s stream,
    the first request at time 0 (the arrival times are the gaps' running sum less the first gap).
    """
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(trace))
    return Trace(
        np.cumsum(gaps) - gaps[0],
        trace.prompt_tokens,
        trace.output_tokens,
        trace.name,
        trace.block_hashes,
        trace.hash_block_tokens,
    )
