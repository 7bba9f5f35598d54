"""Held-out scores of end-to-end predictions: leave one source (lab) or one GPU out.

The NUTS stage (kernels, collectives, prefill/decode steps, static batches) is kept; the cut stage
(``_serving_stage``: engine offsets and noise of serving and saturated runs) is refitted without
the held-out rows, which are then predicted.  A held-out source's cells are unseen, so they take
their engine's pooled offset (other labs' runs of that engine) or N(0, tau_src): the figures are
what a user gets on a lab's runs the calibration never saw.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._posterior import Posterior
from ._predict import prepare
from ._predictive import predictive_log_draws
from ._serving_stage import E2E_SCENARIOS, add_serving_stage, without_serving_stage
from ._validate import predictive_quantiles, row_scores

E2E_BREAKDOWN = ("scenario", "metric", "engine", "gpu")
"""Columns the held-out report groups by (with ``source``)."""


def score_rows(posterior: Posterior, rows: pd.DataFrame, *, num_draws: int, seed: int):
    """Per-row (table with the predictive median as ``predicted``, APE, in-50 %, in-90 %) of
    ``posterior``'s predictive on ``rows``; rows no budget covers are dropped (their count is
    returned).  A measured run the model calls overloaded (no finite median prediction: it
    finished, so the model is wrong) stays in, as a miss: APE infinite, inside neither
    interval."""
    prep = prepare(
        rows, gpus=posterior.gpus, cells=posterior.cells, noise_keys=posterior.noise_keys
    )
    if not len(prep.log_value):
        return (
            prep.table.iloc[:0],
            np.zeros(0),
            np.zeros(0, bool),
            np.zeros(0, bool),
            len(prep.skipped),
        )
    draws = predictive_log_draws(posterior, prep, num_draws, seed=seed)
    ape, in50, in90 = row_scores(draws, prep.log_value)
    predicted = np.exp(predictive_quantiles(draws, (0.5,))[0])  # +inf where called overloaded
    return prep.table.assign(predicted=predicted), ape, in50, in90, len(prep.skipped)


def holdout_scores(
    base: Posterior,
    table: pd.DataFrame,
    *,
    by: str = "source",
    num_draws: int = 100,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per (held-out ``by`` value x scenario x metric x engine x gpu): n, median APE and
    50/90 % coverage of the end-to-end rows of that value, predicted by a cut stage fitted on the
    other end-to-end rows (``by`` = "source" or "gpu")."""
    e2e = table[table["scenario"].isin(E2E_SCENARIOS)]
    nuts = without_serving_stage(base.idata)
    parts = []
    for value in sorted(e2e[by].astype(str).unique()):
        held = e2e[e2e[by].astype(str) == value]
        train = e2e[e2e[by].astype(str) != value]
        idata, _ = add_serving_stage(nuts, train, seed=seed)
        tab, ape, in50, in90, _ = score_rows(Posterior(idata), held, num_draws=num_draws, seed=seed)
        parts.append(tab.assign(ape=ape, in50=in50, in90=in90, held_out=value))
    scored = pd.concat(parts)
    keys = ["held_out", *E2E_BREAKDOWN]
    return (
        scored.groupby(keys, dropna=False)
        .agg(
            n=("ape", "size"),
            median_ape=("ape", "median"),
            coverage_50=("in50", "mean"),
            coverage_90=("in90", "mean"),
        )
        .reset_index()
    ), scored
