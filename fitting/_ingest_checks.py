"""Checks of ingest (``_ingest``): labels (scenario, metric, unit, dtype, stat) and numbers, each
failure raising ``MeasurementFormatError`` with file, line, field and the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from . import _formats as F


class MeasurementFormatError(ValueError):
    """A measurement file is malformed; the message names file, line, field and the fix."""


UNIT_SCALES: dict[str, tuple[str, float]] = {
    "ms": ("s", 1e-3),
    "msec": ("s", 1e-3),
    "milliseconds": ("s", 1e-3),
    "us": ("s", 1e-6),
    "sec": ("s", 1.0),
    "seconds": ("s", 1.0),
    "tok/s": ("tokens/s", 1.0),
    "tokens/sec": ("tokens/s", 1.0),
    "req/s": ("requests/s", 1.0),
    "requests/sec": ("requests/s", 1.0),
}
"""Units a lab may write that say exactly what they are, with the schema's unit and the factor
to it (a TTFT in ``ms`` is 1e-3 of the same number in ``s``)."""


STAT_ALIASES = {"avg": "mean", "average": "mean"}
"""Statistics a lab may name otherwise, with the schema's name."""


def stat_aliases(frame: pd.DataFrame) -> pd.DataFrame:
    """``avg`` / ``average`` read as ``mean``, the schema's word for the same statistic."""
    aliased = frame["stat"].isin(list(STAT_ALIASES)).to_numpy()
    if aliased.any():
        frame.loc[aliased, "stat"] = frame.loc[aliased, "stat"].map(STAT_ALIASES)
    return frame


def si_units(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in a ``UNIT_SCALES`` unit rewritten in the schema's (``value`` and ``value_std``
    scaled); a cell that is not a number is left for the number checks to name."""
    other = (~frame["unit"].isin(F.UNITS)).to_numpy()
    if not other.any():  # the schema's units throughout (every bundled file): nothing to scale
        return frame
    spelled = frame["unit"].where(other, "").str.strip().str.lower().to_numpy()
    for unit, (si, scale) in UNIT_SCALES.items():
        rows = spelled == unit
        if not rows.any():
            continue
        for col in ("value", "value_std"):
            if frame[col].dtype.kind in "fiu":
                frame.loc[rows, col] = frame.loc[rows, col] * scale
                continue
            numbers = pd.to_numeric(frame.loc[rows, col], errors="coerce")
            scaled = (numbers * scale).map(lambda v: repr(float(v)))
            scaled = scaled.where(numbers.notna(), frame.loc[rows, col])
            frame.loc[rows, col] = scaled
        frame.loc[rows, "unit"] = si
    return frame


def check_labels(frame: pd.DataFrame, lines: np.ndarray, path: Path) -> None:
    def fail(mask: pd.Series, col: str, msg: str) -> None:
        i = np.flatnonzero(mask.to_numpy())[0]
        value = frame[col].to_numpy()[i]
        raise MeasurementFormatError(f"{path}:{int(lines[i])}: column {col!r} = {value!r} {msg}")

    dtype_fix = f"is not a dtype; use one of {', '.join(F.DTYPES[1:])} or leave it empty"
    unit_fix = (
        f"is not a unit; use one of {', '.join(F.UNITS)} "
        f"(or {', '.join(UNIT_SCALES)}, converted when read)"
    )
    scenario_fix = f"is not a scenario; use one of {', '.join(F.SCENARIO_METRICS)}"
    for col, allowed, fix in (
        ("scenario", F.SCENARIO_METRICS, scenario_fix),
        ("unit", F.UNITS, unit_fix),
        ("weight_dtype", F.DTYPES, dtype_fix),
        ("kv_dtype", F.DTYPES, dtype_fix),
    ):
        bad = [v for v in frame[col].unique() if v not in allowed]
        if bad:
            fail(frame[col].isin(bad), col, fix)
    bad_stats = [v for v in frame["stat"].unique() if not F.STAT_PATTERN.fullmatch(v)]
    if bad_stats:
        fix = "is not a statistic; use mean, median, min, max, pNN (e.g. p99) or leave it empty"
        fail(frame["stat"].isin(bad_stats), "stat", fix + " for a single measurement")
    pairs = frame[["scenario", "metric", "unit"]].drop_duplicates()
    for scenario, metric, unit in pairs.itertuples(index=False):
        here = (frame["scenario"] == scenario) & (frame["metric"] == metric)
        if metric not in F.SCENARIO_METRICS[scenario]:
            fail(
                here,
                "metric",
                f"is not a metric of scenario {scenario!r}; use one of "
                f"{', '.join(sorted(F.SCENARIO_METRICS[scenario]))}",
            )
        if F.METRIC_UNIT[metric] != unit:
            fail(
                here & (frame["unit"] == unit),
                "unit",
                f"does not fit metric {metric!r}; write it in {F.METRIC_UNIT[metric]}",
            )


def _parse_numbers(raw: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values, which cells are given) of one column read as text.

    A cell is given unless it is empty or only whitespace; a given cell that is not a number
    (``"x"``, ``"nan"``) is NaN in the values.  ``pd.to_numeric`` reads surrounding whitespace,
    so only the cells it cannot read are stripped to tell whitespace from text: a column of
    tens of thousands of cells is parsed in one vectorised pass.
    """
    if raw.dtype.kind in "fiu":
        values = raw.to_numpy(dtype="float64", na_value=np.nan)
        return values, ~np.isnan(values)
    cells = raw.to_numpy(dtype=object)
    given = cells != ""
    if not given.any():
        return np.full(len(cells), np.nan), given
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype="float64")
    for i in np.flatnonzero(given & np.isnan(values)):
        given[i] = str(cells[i]).strip() != ""
    return values, given


def numbers(frame: pd.DataFrame, lines: np.ndarray, path: Path) -> pd.DataFrame:
    for col in F.INT_COLUMNS + F.FLOAT_COLUMNS:
        raw = frame[col]
        values, given = _parse_numbers(raw)
        num = pd.Series(values, index=frame.index)
        checks = [
            (
                np.isnan(values) & given,
                "is not a number; write "
                + ("it in its unit (seconds, tokens/s, ...)" if col == "value" else "it")
                + " as a plain number",
            )
        ]
        with np.errstate(invalid="ignore"):
            if col in F.INT_COLUMNS:
                checks.append(
                    (
                        given & ~(np.isfinite(values) & (values == np.round(values))),
                        "is not a whole number; write a count",
                    )
                )
                low = 1 if col in ("num_gpus", "tp", "pp", "ep") else 0
                checks.append((given & (values < low), f"must be at least {low}"))
            elif col in ("value", "concurrency", "request_rate"):
                finite = col != "request_rate"  # an open-loop rate may be inf (saturation)
                checks.append(
                    (
                        given & ~((values > 0) & (np.isfinite(values) | (not finite))),
                        "must be a positive number" + (" (finite)" if finite else ""),
                    )
                )
            else:
                checks.append((given & ~(np.isfinite(values) & (values >= 0)), "must be >= 0"))
        if col == "value":
            checks.insert(0, (~given, "is empty; every row needs its measured value"))
        for bad, msg in checks:
            if bad.any():
                i = np.flatnonzero(bad)[0]
                shown = raw.to_numpy()[i]
                raise MeasurementFormatError(
                    f"{path}:{int(lines[i])}: column {col!r} = {shown!r} {msg}"
                )
        frame[col] = num.round().astype("Int64") if col in F.INT_COLUMNS else num
    return frame
