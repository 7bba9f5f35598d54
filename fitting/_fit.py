"""Fit orchestration: read measurements, draw a stratified subsample, run NUTS/SVI, diagnose.

The bundled tables are large (vidur ops 200k rows, aiconfigurator kernels 240k); the fit uses a
seeded stratified subsample: rows shuffled with ``seed``, then at most ``per_stratum`` rows from
each (source, scenario, op, gpu, metric) cell, so every kind of measurement weighs in and the big
tables do not drown the whole-model ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ._diagnostics import Diagnostics, diagnose
from ._inference import run_nuts, run_svi, sample_prior
from ._posterior import Posterior
from ._rows import Prepared, prepare
from ._serving_stage import add_serving_stage

STRATA = ["source", "scenario", "op", "gpu", "metric"]
"""Cells of the stratified subsample."""


def read_tables(paths) -> tuple[pd.DataFrame, list]:
    """Measurement files -> (tidy table, rows ingest skipped) via ``fitting.ingest``."""
    from .ingest import load_measurements

    result = load_measurements([str(p) for p in paths])
    return result.table, list(result.skipped)


def subsample(table: pd.DataFrame, per_stratum: int, seed: int) -> pd.DataFrame:
    """At most ``per_stratum`` rows per (source, scenario, op, gpu, metric), seeded."""
    shuffled = table.sample(frac=1.0, random_state=seed)
    return shuffled.groupby(STRATA, dropna=False, sort=False).head(per_stratum).sort_index()


@dataclass
class FitResult:
    """A posterior, the rows it was fitted on, and its diagnostics (None for prior/SVI)."""

    posterior: Posterior
    prepared: Prepared
    diagnostics: Diagnostics | None


def fit_table(
    table: pd.DataFrame,
    *,
    per_stratum: int = 40,
    seed: int = 0,
    draws: int = 500,
    warmup: int = 500,
    chains: int = 2,
    svi: bool = False,
    svi_steps: int = 3000,
    prior_only: bool = False,
    progress: bool = False,
    serving: bool = True,
) -> FitResult:
    """Calibrate on (a stratified subsample of) ``table``.

    Args:
        table: tidy measurements (SCHEMA.md columns).
        per_stratum: subsample cap per cell; 0 keeps every row.
        seed: seeds the subsample and the sampler.
        draws, warmup, chains: NUTS settings (``draws`` is also the SVI/prior draw count).
        svi: use SVI (``AutoLowRankMultivariateNormal``) instead of NUTS.
        prior_only: skip the data; draws from the spec-sheet priors.
        serving: after the sampler, fit serving rows' engine offsets and noise in a second
            (cut) stage (``_serving_stage``); NUTS itself never solves the queueing model.
    """
    fit_rows = subsample(table, per_stratum, seed) if per_stratum > 0 else table
    prep = prepare(fit_rows, serving=False)
    if not len(prep.log_value):
        raise ValueError("no measurement row is covered by a budget; see the skipped reasons")
    diag = None
    if prior_only:
        idata = sample_prior(prep, num_draws=draws, seed=seed)
        method = "prior"
    elif svi:
        idata = run_svi(prep, num_draws=draws, num_steps=svi_steps, seed=seed)
        method = "svi"
    else:
        idata = run_nuts(
            prep,
            num_draws=draws,
            num_warmup=warmup,
            num_chains=chains,
            seed=seed,
            progress=progress,
        )
        diag = diagnose(idata)
        method = "nuts"
    n_serving = 0
    if serving and not prior_only:
        idata, n_serving = add_serving_stage(idata, table, seed=seed)
    idata.attrs.update(
        {
            "method": method,
            "seed": seed,
            "per_stratum": per_stratum,
            "fit_rows": len(prep.log_value),
            "table_rows": len(table),
            "subsample": f"seeded stratified: <= {per_stratum} rows per {'/'.join(STRATA)} cell",
            "skipped_rows": len(prep.skipped),
            "serving_rows": n_serving,
        }
    )
    return FitResult(Posterior(idata), prep, diag)


def skipped_summary(skipped: list) -> dict[str, int]:
    """Count of skipped rows per reason (``prepare`` tuples or ingest ``SkippedRow``s)."""
    out: dict[str, int] = {}
    for s in skipped:
        reason = s[1] if isinstance(s, tuple) else getattr(s, "reason", str(s))
        out[reason] = out.get(reason, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def bundled_files() -> list[Path]:
    """The measurement files the bundled posterior is fitted on."""
    from .ingest import bundled_measurements

    return [p for p in bundled_measurements()]
