"""``forecast``'s answer: JSON-ready values, the periods in words, and the CSV of ``--csv-out``."""

from __future__ import annotations

import csv
import math

from .optimize import describe_short
from .render import table

FAN_CAPTION = "GPUs needed per period and type: median, 80 % and 95 % intervals."
"""The report's caption of the fan chart."""


def forecast_report(problem, gpus, configs: dict, periods: list[dict]) -> dict:
    """The forecast as JSON keys: each type's configuration in words (``configs``, found at the
    peak demand) and the periods of ``optimize.forecast_gpus``."""
    return {
        "configurations": {g: describe_short(problem, gpus, c) for g, c in configs.items()},
        "periods": periods,
    }


def json_ready(x):
    """``x`` with every non-finite float (nested in dicts and lists) as None (JSON ``null``)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_ready(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_ready(v) for v in x]
    return x


def _n(x) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def render(result: dict) -> str:
    """GPUs per period and type in words (median [80 % interval]), the cost on the recommended
    type, then each type's configuration."""
    rows = []
    for p in result["periods"]:
        cells = []
        for g, s in p["gpus"].items():
            lo, hi = s["p80"]
            cells.append(f"{g} {_n(s['p50'])} [{_n(lo)}-{_n(hi)}]")
        cost = p["cost_per_hour"]
        rows.append(
            (
                f"{p['period']} ({p['requests_per_s']:g} req/s)",
                "; ".join(cells) + f"; ${_n(cost['p50'])}/h on {p['recommended_gpu']}",
            )
        )
    lines = ["GPUs per period: median [80% interval]\n" + table(rows)]
    for g, c in result["configurations"].items():
        lines.append(f"  {g}: {c}")
    return "\n".join(lines)


def write_csv(path: str, result: dict) -> None:
    """The forecast as CSV: one row per period and GPU type, its median and 80 / 95 % intervals."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["period", "requests_per_s", "gpu", "p50", "p80_lo", "p80_hi", "p95_lo", "p95_hi"]
        )
        for p in result["periods"]:
            for g, s in p["gpus"].items():
                w.writerow([p["period"], p["requests_per_s"], g, s["p50"], *s["p80"], *s["p95"]])
