"""The tidy measurement schema and the benchmark-tool outputs that convert to it.

The schema is ``data/measurements/SCHEMA.md``: one measured value per row, SI units.  Three tool
layouts convert to ``scenario = serving`` rows, one per metric and statistic, milliseconds to
seconds:

* vLLM ``vllm bench serve --save-result`` (and ``benchmarks/benchmark_serving.py``): one JSON
  object, or several one per line with ``--append-result``; keys ``{mean,median,std,pNN}_{ttft,
  tpot,itl,e2el}_ms``, ``request_throughput``, ``output_throughput``, ``model_id``, ``backend``.
* SGLang ``python -m sglang.bench_serving``: JSONL, one object per run; keys
  ``{mean,median,std,pNN}_{ttft,tpot,itl,e2e_latency}_ms``; the configured concurrency is
  ``max_concurrency`` (its ``concurrency`` key is the *measured* mean, kept in ``notes``).
* NVIDIA GenAI-Perf ``profile_export_genai_perf.json`` (AIPerf's ``profile_export_aiperf.json``
  has the same layout): metric objects ``{"unit": "ms", "avg": .., "p50": .., ...}`` and
  ``input_config``.  GenAI-Perf's ``inter_token_latency`` is ``(latency - ttft) / (osl - 1)`` per
  request, which is this schema's ``tpot``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

INT_COLUMNS = (
    "num_gpus",
    "tp",
    "pp",
    "ep",
    "num_tokens",
    "batch_size",
    "input_len",
    "output_len",
    "context_len",
    "message_bytes",
    "n_repeats",
)
FLOAT_COLUMNS = ("concurrency", "request_rate", "value", "value_std")
COLUMNS = (
    "source",
    "source_ref",
    "gpu",
    "num_gpus",
    "tp",
    "pp",
    "ep",
    "model",
    "weight_dtype",
    "kv_dtype",
    "engine",
    "engine_version",
    "scenario",
    "op",
    "num_tokens",
    "batch_size",
    "input_len",
    "output_len",
    "context_len",
    "message_bytes",
    "concurrency",
    "request_rate",
    "metric",
    "stat",
    "value",
    "unit",
    "value_std",
    "n_repeats",
    "notes",
)
"""Columns of the tidy table, in SCHEMA.md order."""
STR_COLUMNS = tuple(c for c in COLUMNS if c not in INT_COLUMNS + FLOAT_COLUMNS)
REQUIRED_COLUMNS = ("gpu", "scenario", "metric", "value", "unit")
"""Columns a file must have (``gpu`` may come from the ``gpu=`` argument instead)."""

SCENARIO_METRICS: Mapping[str, frozenset[str]] = {
    "op": frozenset({"time"}),
    "collective": frozenset({"time"}),
    "prefill": frozenset({"time"}),
    "decode_step": frozenset({"time"}),
    "static_batch": frozenset({"latency", "ttft", "tpot", "output_throughput"}),
    "saturated": frozenset({"output_throughput", "total_throughput", "request_throughput"}),
    "serving": frozenset(
        {"ttft", "tpot", "itl", "e2e_latency", "output_throughput", "request_throughput"}
    ),
}
"""Metrics each scenario may carry (SCHEMA.md, "Scenarios and their metrics")."""
MODEL_FREE_SCENARIOS = frozenset({"op", "collective"})
"""Scenarios whose rows may leave ``model`` empty (the shape is in the row; e.g. GEMM n/k)."""
UNITS = ("s", "tokens/s", "requests/s", "bytes")
METRIC_UNIT = {
    "time": "s",
    "latency": "s",
    "ttft": "s",
    "tpot": "s",
    "itl": "s",
    "e2e_latency": "s",
    "output_throughput": "tokens/s",
    "total_throughput": "tokens/s",
    "request_throughput": "requests/s",
}
"""The unit each metric's ``value`` must be in."""
DTYPES = ("", "fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")
STAT_PATTERN = re.compile(r"|mean|median|min|max|p\d{1,2}(\.\d+)?")
"""Allowed ``stat``: empty (one measurement), mean, median, min, max or a percentile pNN."""

MS = 1e-3
"""Seconds per millisecond."""
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": MS, "us": 1e-6, "ns": 1e-9}
_RATE_UNITS = {
    "tokens/sec": "tokens/s",
    "tokens/s": "tokens/s",
    "requests/sec": "requests/s",
    "requests/s": "requests/s",
}
_STAT_KEY = re.compile(
    r"(mean|median|std|min|max|p\d{1,2}(?:\.\d+)?)_(ttft|tpot|itl|e2el|e2e_latency)_ms"
)
_SERVING_METRIC = {
    "ttft": "ttft",
    "tpot": "tpot",
    "itl": "itl",
    "e2el": "e2e_latency",
    "e2e_latency": "e2e_latency",
}
_GENAI_METRIC = {
    "time_to_first_token": "ttft",
    "inter_token_latency": "tpot",
    "request_latency": "e2e_latency",
    "output_token_throughput": "output_throughput",
    "request_throughput": "request_throughput",
}
_ENGINES = {
    "tensorrtllm": "trtllm",
    "trt": "trtllm",
    "trtllm": "trtllm",
    "vllm": "vllm",
    "sglang": "sglang",
    "lmdeploy": "lmdeploy",
    "tgi": "tgi",
    "textgenerationinference": "tgi",
}


def canonical_engine(name: str) -> str:
    """The engine id a name spells (``TensorRT-LLM``, ``trt_llm`` -> ``trtllm``; ``vLLM`` ->
    ``vllm``), so rows of one engine share its fitted offsets; another name in lower case."""
    key = re.sub(r"[\s_\-.]", "", name.strip().lower())
    return _ENGINES.get(key, name.strip().lower())


Fail = Callable[[str], Exception]
"""Builds the error for one record; the caller adds ``file:line``."""


def detect(record: Mapping[str, Any]) -> str | None:
    """Which tool wrote ``record``: ``"genai-perf"``, ``"sglang"``, ``"vllm"`` or ``None``."""
    if "input_config" in record or any(
        isinstance(v, Mapping) and "unit" in v for v in record.values()
    ):
        return "genai-perf"
    if any("e2e_latency_ms" in k for k in record) or "total_output_tokens_retokenized" in record:
        return "sglang"
    if (
        "total_token_throughput" in record
        or "model_id" in record
        or any(_STAT_KEY.fullmatch(k) for k in record)
    ):
        return "vllm"
    return None


def _number(record: Mapping[str, Any], key: str, fail: Fail, label: str = "") -> float | None:
    value = record.get(key)
    if value is None:
        return None
    try:
        return float(value)  # "inf" and JSON Infinity are valid request rates
    except (TypeError, ValueError):
        raise fail(
            f"key {label or key!r} = {value!r} is not a number; write it as a plain number"
        ) from None


def _mean_lengths(
    total_in: float | None, total_out: float | None, completed: float | None, notes: list[str]
) -> dict[str, int | None]:
    if not completed:
        return {"input_len": None, "output_len": None}
    out: dict[str, int | None] = {}
    for name, total in (("input_len", total_in), ("output_len", total_out)):
        if total is None:
            out[name] = None
            continue
        notes.append(f"mean_{name}={total / completed:.6g}")
        out[name] = round(total / completed)
    return out


def _serving_rows(record: Mapping[str, Any], base: dict[str, Any], fail: Fail) -> Iterator[dict]:
    """vLLM and SGLang share the ``{stat}_{metric}_ms`` layout."""
    std: dict[str, float] = {}
    for key in record:
        match = _STAT_KEY.fullmatch(key)
        if match and match.group(1) == "std":
            value = _number(record, key, fail)
            if value is not None and math.isfinite(value):
                std[match.group(2)] = value * MS
    for key in record:
        match = _STAT_KEY.fullmatch(key)
        if not match or match.group(1) == "std":
            continue
        value = _number(record, key, fail)
        if value is None or not math.isfinite(value):
            continue  # a metric the run could not compute (e.g. TPOT with 1 output token)
        stat, metric = match.groups()
        notes = base["notes"]
        if stat == "mean" and metric in std:
            notes = f"{notes};std_s={std[metric]:.6g}"
        yield {
            **base,
            "metric": _SERVING_METRIC[metric],
            "stat": stat,
            "value": value * MS,
            "unit": "s",
            "notes": notes,
        }
    for key, metric, unit in (
        ("request_throughput", "request_throughput", "requests/s"),
        ("output_throughput", "output_throughput", "tokens/s"),
    ):
        value = _number(record, key, fail)
        if value is not None and math.isfinite(value) and value > 0:
            yield {**base, "metric": metric, "stat": "", "value": value, "unit": unit}


def _run_base(tool: str, record: Mapping[str, Any], fail: Fail) -> tuple[dict[str, Any], float]:
    notes: list[str] = [f"tool={tool}"]
    completed = _number(record, "completed", fail)
    if completed is not None:
        notes.append(f"completed={completed:g}")
    lengths = _mean_lengths(
        _number(record, "total_input_tokens", fail),
        _number(record, "total_output_tokens", fail),
        completed,
        notes,
    )
    if tool == "sglang" and (measured := _number(record, "concurrency", fail)) is not None:
        notes.append(f"measured_concurrency={measured:.6g}")
    for key in (
        "failed",
        "num_prompts",
        "dataset_name",
        "random_range_ratio",
        "date",
        "label",
        "burstiness",
    ):
        if record.get(key) not in (None, ""):
            notes.append(f"{key}={record[key]}")
    backend = str(record.get("backend") or "")
    base = {
        "source": f"{tool}-bench-serve" if tool == "vllm" else "sglang-bench-serving",
        "model": str(record.get("model_id") or record.get("model") or ""),
        "engine": _ENGINES.get(canonical_engine(backend), ""),
        "scenario": "serving",
        "concurrency": _number(record, "max_concurrency", fail),
        "request_rate": _number(record, "request_rate", fail),
        "notes": ";".join(notes + ([f"backend={backend}"] if backend else [])),
        **lengths,
    }
    return base, completed if completed is not None else math.nan


def convert_vllm_or_sglang(tool: str, record: Mapping[str, Any], fail: Fail) -> list[dict]:
    """Rows of one vLLM ``--save-result`` or SGLang ``bench_serving`` record (``tool`` names which).

    A run that completed no request gives no rows.

    Raises:
        Exception: built by ``fail`` for a non-numeric value.
    """
    base, completed = _run_base(tool, record, fail)
    if completed == 0:
        return []  # the run finished no request; the caller reports it as skipped
    return list(_serving_rows(record, base, fail))


def _find(tree: Any, keys: tuple[str, ...]) -> Any:
    """First value under any of ``keys`` in a nested dict (GenAI-Perf/AIPerf configs nest)."""
    if isinstance(tree, Mapping):
        for key in keys:
            if tree.get(key) not in (None, "", []):
                return tree[key]
        for value in tree.values():
            if (found := _find(value, keys)) is not None:
                return found
    return None


def convert_genai_perf(record: Mapping[str, Any], fail: Fail) -> list[dict]:
    """Rows of one GenAI-Perf ``profile_export_genai_perf.json`` (or AIPerf summary) object."""
    config = record.get("input_config") or {}
    model = _find(config, ("model", "model_names", "model_name"))
    model = model[0] if isinstance(model, list) else model
    notes = ["tool=genai-perf"]
    lengths: dict[str, int | None] = {}
    for name, key in (
        ("input_len", "input_sequence_length"),
        ("output_len", "output_sequence_length"),
    ):
        avg = _number(record.get(key) or {}, "avg", fail, f"{key}.avg")
        lengths[name] = None if avg is None else round(avg)
        if avg is not None:
            notes.append(f"mean_{name}={avg:.6g}")
    count = _number(record.get("request_count") or {}, "avg", fail, "request_count.avg")
    if count is not None:
        notes.append(f"completed={count:g}")
    backend = str(_find(config, ("backend",)) or "")
    service = _find(config, ("service_kind",))
    engine = _ENGINES.get(canonical_engine(backend), "") if service in (None, "triton") else ""
    base = {
        "source": "genai-perf",
        "model": str(model or ""),
        "scenario": "serving",
        "engine": engine,
        "concurrency": _number(
            {"c": _find(config, ("concurrency",))}, "c", fail, "input_config.concurrency"
        ),
        "request_rate": _number(
            {"r": _find(config, ("request_rate",))}, "r", fail, "input_config.request_rate"
        ),
        "notes": ";".join(notes + ([f"backend={backend}"] if backend else [])),
        **lengths,
    }
    rows = []
    for key, metric in _GENAI_METRIC.items():
        stats = record.get(key)
        if not isinstance(stats, Mapping):
            continue
        unit = str(stats.get("unit", ""))
        if metric.endswith("throughput"):
            if unit not in _RATE_UNITS:
                raise fail(
                    f"{key}.unit = {unit!r} is not a known rate unit; "
                    "expected tokens/sec or requests/sec"
                )
            scale, si_unit = 1.0, _RATE_UNITS[unit]
        else:
            if unit not in _TIME_UNITS:
                raise fail(
                    f"{key}.unit = {unit!r} is not a known time unit; expected ms, us, ns or s"
                )
            scale, si_unit = _TIME_UNITS[unit], "s"
        std = _number(stats, "std", fail, f"{key}.std")
        for name in stats:
            stat = "mean" if name == "avg" else name
            if stat in ("", "unit", "std") or not STAT_PATTERN.fullmatch(stat):
                continue  # p25/p75 are kept; counts and other keys are not statistics
            value = _number(stats, name, fail, f"{key}.{name}")
            if value is None or not math.isfinite(value):
                continue
            note = base["notes"] + (f";std_s={std * scale:.6g}" if stat == "mean" and std else "")
            rows.append(
                {
                    **base,
                    "metric": metric,
                    "value": value * scale,
                    "unit": si_unit,
                    "stat": "" if metric.endswith("throughput") and stat == "mean" else stat,
                    "notes": note,
                }
            )
    return rows
