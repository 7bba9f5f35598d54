"""Second-stage ("cut") calibration of serving rows: engine offsets and noise on top of the fit.

A serving row's prediction solves the closed-loop queueing model (``perfmodel.serving_metrics``)
for every parameter draw: far too costly inside NUTS's thousands of gradient evaluations.  So the
efficiencies come from the NUTS stage alone, and serving rows inform only their own terms (a cut
posterior, Plummer 2015): with r = log y - log f(theta_hat) at the posterior-median parameters,

    delta_c | r ~ Normal(mean_c(r), s_c / sqrt(n_c))      per (source:engine, serving:metric) cell
    sigma_k^2 | r ~ s_k^2 (n_k - 1) / chi2(n_k - 1)       per serving metric k (scaled inverse chi2)

s = 1.4826 * MAD (robust to the odd overloaded run).  The offset carries what the queueing model
misses about an engine's scheduler and the benchmark (e.g. a fixed-length closed loop where all
clients restart together, so TTFT includes the whole wave's prefill); sigma is the spread around it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from ._model import PARAM_NAMES
from ._predict import predict_log, prepare

PER_CELL = 24
"""Serving rows used per (source, engine, gpu, metric) cell (seeded)."""

MIN_ROWS = 3
"""Fewest rows that fit a cell's offset (fewer: the cell stays unseen, offset ~ N(0, tau_src))."""


def serving_subsample(table: pd.DataFrame, per_cell: int, seed: int) -> pd.DataFrame:
    """At most ``per_cell`` serving rows per (source, engine, gpu, metric), seeded."""
    rows = table[table["scenario"] == "serving"]
    shuffled = rows.sample(frac=1.0, random_state=seed)
    keys = ["source", "engine", "gpu", "metric"]
    return shuffled.groupby(keys, dropna=False, sort=False).head(per_cell).sort_index()


def _robust_sd(r: np.ndarray) -> float:
    return float(max(1.4826 * np.median(np.abs(r - np.median(r))), 1e-3))


def add_serving_stage(idata, table: pd.DataFrame, *, per_cell: int = PER_CELL, seed: int = 0):
    """``idata`` with serving cells' offsets and serving noise keys appended (see module doc).

    Returns (new ``InferenceData``, number of serving rows used)."""
    import arviz as az

    rows = serving_subsample(table, per_cell, seed)
    post = idata.posterior
    gpus = tuple(str(g) for g in post["gpu"].values)
    cells = tuple(str(c) for c in post["cell"].values)
    keys = tuple(str(k) for k in post["noise_key"].values)
    if not len(rows):
        return idata, 0
    prep = prepare(rows, gpus=gpus, cells=cells, noise_keys=keys)
    known = [i for i, g in enumerate(prep.gpus) if g in gpus]
    if not len(prep.log_value) or len(known) < len(prep.gpus):
        return idata, 0  # a serving GPU the fit never saw: leave its rows to the population
    flat = {n: np.asarray(post[n].values).reshape((-1, len(gpus))) for n in PARAM_NAMES}
    params = {n: jnp.asarray(np.median(v, axis=0)) for n, v in flat.items()}
    # one call, compile-bound: XLA's backend optimisation off halves the compile (as optimize does)
    run_once = jax.jit(
        lambda p: predict_log(prep, p, None),
        compiler_options={"xla_backend_optimization_level": 0},
    )
    loc = np.asarray(run_once(params))
    resid = prep.log_value - loc
    ok = np.isfinite(resid)
    chains, draws = int(post.sizes["chain"]), int(post.sizes["draw"])
    rng = np.random.default_rng(seed)
    n_draw = chains * draws

    new_cells, new_off = [], []
    for j in range(len(cells), len(prep.cells)):
        r = resid[ok & (prep.cell_idx == j)]
        if len(r) >= MIN_ROWS:
            new_cells.append(prep.cells[j])
            new_off.append(
                np.median(r) + _robust_sd(r) / np.sqrt(len(r)) * rng.standard_normal(n_draw)
            )
    sig = {}
    for j, k in enumerate(prep.noise_keys):
        if k in keys:
            continue
        sel = ok & (prep.noise_idx == j)
        # residuals about each row's own cell offset (its cell centre)
        centred = (
            np.concatenate(
                [
                    resid[sel & (prep.cell_idx == c)] - np.median(resid[sel & (prep.cell_idx == c)])
                    for c in np.unique(prep.cell_idx[sel])
                ]
            )
            if sel.any()
            else np.zeros(0)
        )
        if len(centred) >= MIN_ROWS:
            s, dof = _robust_sd(centred), len(centred) - 1
            sig[k] = s * np.sqrt(dof / rng.chisquare(dof, n_draw))
    if not new_cells and not sig:
        return idata, 0

    def shaped(a: np.ndarray) -> np.ndarray:
        return a.reshape((chains, draws) + a.shape[1:])

    out = {v: np.asarray(post[v].values) for v in post.data_vars}
    off = np.asarray(post["cell_offset"].values).reshape(n_draw, -1)
    out["cell_offset"] = shaped(np.concatenate([off] + [o[:, None] for o in new_off], axis=1))
    sg = np.asarray(post["sigma"].values).reshape(n_draw, -1)
    out["sigma"] = shaped(np.concatenate([sg] + [v[:, None] for v in sig.values()], axis=1))
    coords = {
        "gpu": list(gpus),
        "cell": list(cells) + new_cells,
        "noise_key": list(keys) + list(sig),
    }
    dims = {n: ["gpu"] for n in PARAM_NAMES} | {"cell_offset": ["cell"], "sigma": ["noise_key"]}
    if "gpu_group" in post:  # GPU x group biases of the NUTS groups (serving rows have none)
        coords["group"] = [str(g) for g in post["gpu_group"].coords["group"].values]
        dims["gpu_group"] = ["gpu", "group"]
    groups = {"posterior": out, "coords": coords, "dims": dims}
    if "sample_stats" in idata.groups():
        groups["sample_stats"] = {
            v: np.asarray(idata.sample_stats[v].values) for v in idata.sample_stats.data_vars
        }
    new = az.from_dict(**groups)
    new.attrs.update(idata.attrs)
    new.attrs["serving_rows"] = int(ok.sum())
    new.attrs["serving_stage"] = (
        "cut: offsets and sigma of serving cells at the posterior-median parameters"
    )
    return new, int(ok.sum())
