"""Score a posterior on measurements: absolute percentage error and predictive-interval coverage.

Point prediction = median of the posterior predictive; APE = |pred - measured| / measured.
Coverage = share of measurements inside the central 50 % and 90 % predictive intervals (an honest
90 % interval covers about 90 % of held-out rows; Gneiting & Raftery 2007).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._fit import STRATA, skipped_summary, subsample
from ._posterior import Posterior
from ._predict import prepare
from ._predictive import predictive_log_draws

MAX_SERVING_ROWS = None
"""Serving rows scored per call: all of them (a closed-loop row costs microseconds per draw)."""

BREAKDOWNS = (
    ("by_scenario", "scenario"),
    ("by_gpu", "gpu"),
    ("by_source", "source"),
    ("by_metric", "metric"),
    ("by_engine", "engine"),
)
"""The report's breakdowns: result key and the table column it groups by."""


OVERLOADED_LOG_DRAW = 1.0e6
"""Log value that ranks an overloaded (+inf) draw above every finite one when taking quantiles."""


def _scores(ape: np.ndarray, in50: np.ndarray, in90: np.ndarray) -> dict[str, float | int | None]:
    """n, median and mean APE, 50/90 % coverage and the ``overloaded`` count.  A measured run the
    model calls overloaded (infinite APE) is a miss: it counts in n, ranks above every finite APE
    in the median and lies outside both intervals; the mean is over the finite APEs (an infinite
    mean says nothing), and a median that falls on an overloaded row is None."""
    n = len(ape)
    if n == 0:
        return {
            "n": 0,
            "median_ape": None,
            "mape": None,
            "coverage_50": None,
            "coverage_90": None,
            "overloaded": 0,
        }
    finite = np.isfinite(ape)
    median = float(np.median(ape))
    return {
        "n": n,
        "median_ape": median if np.isfinite(median) else None,
        "mape": float(np.mean(ape[finite])) if finite.any() else None,
        "coverage_50": float(np.mean(in50)),
        "coverage_90": float(np.mean(in90)),
        "overloaded": int(n - finite.sum()),
    }


def predictive_quantiles(log_draws: np.ndarray, probs) -> np.ndarray:
    """Quantiles ``probs`` of predictive log draws (draws, rows) -> (len(probs), rows).  An
    overloaded draw (+inf) ranks above every finite one, and a quantile that takes any share of
    one is +inf (never nan: interpolating between two infinite draws would give inf - inf)."""
    # a finite stand-in for +inf while interpolating; no run lasts e^1000 s
    ranked = np.where(np.isposinf(log_draws), OVERLOADED_LOG_DRAW, log_draws)
    q = np.quantile(ranked, list(probs), axis=0)
    return np.where(q >= OVERLOADED_LOG_DRAW * 1e-3, np.inf, q)


def row_scores(
    log_draws: np.ndarray, log_value: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row (APE of the predictive median, inside the 50 % interval, inside the 90 %) from
    predictive draws (draws, rows).  A row without a finite median (the model calls the load
    overloaded) is a miss: APE infinite, inside neither interval.  Draws that are overloaded
    (+inf) rank above every finite one, so an interval reaching into them is open above."""
    q = predictive_quantiles(log_draws, (0.05, 0.25, 0.5, 0.75, 0.95))
    finite = np.isfinite(q[2])
    with np.errstate(over="ignore"):
        ape = np.where(
            finite, np.abs(np.exp(np.where(finite, q[2], 0.0) - log_value) - 1.0), np.inf
        )
    in50 = finite & (log_value >= q[1]) & (log_value <= q[3])
    in90 = finite & (log_value >= q[0]) & (log_value <= q[4])
    return ape, in50, in90


def score_draws(table: pd.DataFrame, log_draws: np.ndarray, log_value: np.ndarray) -> dict:
    """Scores overall and by scenario / GPU / source from predictive draws (draws, rows)."""
    ape, in50, in90 = row_scores(log_draws, log_value)
    out = _scores(ape, in50, in90)
    for key, col in BREAKDOWNS:
        labels = table[col].astype(str).to_numpy()
        out[key] = {
            lab: _scores(ape[labels == lab], in50[labels == lab], in90[labels == lab])
            for lab in sorted(set(labels))
        }
    return out


def cap_rows(
    table: pd.DataFrame, max_rows: int | None, max_serving: int, seed: int
) -> tuple[pd.DataFrame, list[str]]:
    """The rows to score: above ``max_rows``, a seeded stratified subsample (the same share of
    every source/scenario/op/gpu/metric cell); then at most ``max_serving`` serving rows (a seeded
    random subset: each costs a closed-loop solve per draw).  Returns them and a note per cut."""
    notes = []
    if max_rows is not None and len(table) > max_rows:
        cells = table.groupby(STRATA, dropna=False, sort=False).ngroups
        per = max(1, max_rows // max(cells, 1))
        table = subsample(table, per, seed)
        notes.append(
            f"seeded stratified subsample: <= {per} rows per {'/'.join(STRATA)} cell, "
            f"{len(table)} rows"
        )
    serving = table["scenario"] == "serving"
    if max_serving is not None and serving.sum() > max_serving:
        keep = table[serving].sample(max_serving, random_state=seed).index
        table = table[~serving | table.index.isin(keep)]
        notes.append(
            f"serving rows: seeded random {max_serving} of {int(serving.sum())} "
            "(each costs a closed-loop solve per draw)"
        )
    return table, notes


def validate(
    posterior: Posterior,
    table: pd.DataFrame,
    *,
    num_draws: int = 200,
    seed: int = 0,
    max_rows: int | None = 5000,
    extra_skipped: list | None = None,
) -> dict:
    """Error and coverage of ``posterior`` on ``table`` (tidy measurements).

    Args:
        posterior: a fitted (or prior-only) posterior.
        table: measurements to score.
        num_draws: posterior predictive draws per row.
        seed: seeds the row subsample and the draws.
        max_rows: above this many rows, score a seeded stratified subsample
            (``per_stratum`` rows per source/scenario/op/gpu/metric cell) and say so.
        extra_skipped: rows an earlier stage (ingest) skipped, counted in ``skipped``.

    Returns:
        dict with ``n``, ``median_ape``, ``mape``, ``coverage_50``, ``coverage_90``,
        ``overloaded`` (measured runs the model calls overloaded, scored as misses: see
        ``_scores``), ``skipped`` (count), ``skipped_reasons`` (reason -> count), ``by_scenario``,
        ``by_gpu``, ``by_source``, ``by_metric``, ``by_engine`` (each label -> the same six
        scores), ``subsample`` (None or a description).
    """
    table, notes = cap_rows(table, max_rows, MAX_SERVING_ROWS, seed)
    note = "; ".join(notes) or None
    prep = prepare(
        table, gpus=posterior.gpus, cells=posterior.cells, noise_keys=posterior.noise_keys
    )
    skipped = list(prep.skipped) + list(extra_skipped or [])
    if len(prep.log_value):
        draws = predictive_log_draws(posterior, prep, num_draws, seed=seed)
        out = score_draws(prep.table, draws, prep.log_value)
    else:
        out = _scores(np.zeros(0), np.zeros(0), np.zeros(0))
        out |= {key: {} for key, _ in BREAKDOWNS}
    out["skipped"] = len(skipped)
    out["skipped_reasons"] = skipped_summary(skipped)
    out["subsample"] = note
    return out


def format_report(result: dict) -> str:
    """Human-readable table of a ``validate`` result."""

    def pct(x: float | None) -> str:
        return f"{'overload':>9}" if x is None else f"{100 * x:>8.1f}%"

    def line(label: str, s: dict) -> str:
        if not s["n"]:
            return f"  {label:<34} {0:>6}"
        return (
            f"  {label:<34} {s['n']:>6} {pct(s['median_ape'])} {pct(s['mape'])}"
            f" {100 * s['coverage_50']:>7.0f}% {100 * s['coverage_90']:>7.0f}%"
            f" {s['overloaded']:>9}"
        )

    head = (
        f"  {'':<34} {'n':>6} {'medAPE':>9} {'MAPE':>9} {'cov50':>8} {'cov90':>8} {'overload':>9}"
    )
    rows = [head, line("overall", result)]
    for key, title in BREAKDOWNS:
        rows.append(f"  by {title}:")
        rows += [line("  " + lab, s) for lab, s in result[key].items()]
    if result["overloaded"]:
        rows.append(
            f"  {result['overloaded']} measured runs the model calls overloaded count as misses "
            "(outside both intervals; MAPE is over the others)"
        )
    if result.get("subsample"):
        rows.append(f"  note: {result['subsample']}")
    if result["skipped"]:
        rows.append(f"  skipped {result['skipped']} rows:")
        rows += [f"    {n:>6}  {reason}" for reason, n in result["skipped_reasons"].items()]
    return "\n".join(rows)
