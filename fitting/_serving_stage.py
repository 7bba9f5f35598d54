"""Second-stage ("cut") calibration of end-to-end rows: engine offsets and noise on the fit.

Serving and saturated (offline) runs are predicted through the load models (closed loop,
``perfmodel._closed_loop``; open loop, ``perfmodel.serving_metrics``) on top of the same step the
NUTS stage calibrates.  The efficiencies come from the NUTS stage alone, and end-to-end rows
inform only their own terms (a cut posterior, Plummer 2015): with r = log y - log f(theta_hat) at
the posterior-median parameters (population medians for a GPU the NUTS stage never saw),

    delta_c | r ~ Normal(mean_c(r), s_c / sqrt(n_c))      per (source:engine, serving:metric) cell
    sigma_k^2 | r ~ s_k^2 (n_k - 1) / chi2(n_k - 1)       per serving metric k (scaled inverse chi2)

s = 1.4826 * MAD (robust to the odd outlier run).  The offset carries what the load model misses
about an engine's scheduler and the benchmark; sigma is the spread around it.

One physical parameter is identified here rather than by NUTS: the per-iteration host overhead
``step_overhead_s`` (scheduling, sampling, launch).  It belongs to the engine and its host, not
to the GPU, and the NUTS stage sees it only through a few static-batch and decode-step rows of
2023-era engines, where a multiplicative cell offset can mimic it; serving engines that overlap
their scheduler with the GPU (SGLang's overlap scheduler, vLLM's async scheduling, TensorRT-LLM's
overlap scheduler) pay much less of it.  Its additive shape (a fixed cost per iteration, a
larger share of a short decode step than of a long one) is what the end-to-end rows pin across
models, TP degrees and concurrencies, so the stage profiles it (Murphy & van der Vaart 2000):
one value g for every GPU, the one that maximises the profile log likelihood of the offsets and
spreads above,

    l(g) = - sum_k n_k log s_k(g) + log p(g)       s_k: the robust sd of group k's residuals
                                                   about their cells' centres at overhead g;
                                                   p: the fit's spec prior of the overhead

on a geometric grid (``OVERHEAD_GRID_S``), refined by a parabola through the best point and its
neighbours in log g (rows that say nothing leave g at the prior's median); the offsets and sigma
are then those at g.  Pooled
``engine:<engine>|<group>`` cells (and ``engine:*|<group>`` for an engine never seen) are the
random-effects predictive of the seen sources' offsets, the physics counting as one source
(``population_offset``): a lab never seen draws from them (``cell_offset_draws``), so it inherits
a bias every seen lab shows and a wider interval where the labs disagree.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from ._model import PARAM_NAMES, PRIORS, prior_center_unconstrained, to_unconstrained
from ._names import E2E_SCENARIOS
from ._posterior import (
    ANY_ENGINE,
    ENGINE_PREFIX,
    Posterior,
    draw_indices,
    named_stream,
    parameter_draws,
)
from ._predict import fitted_efficiency, predict_log, prepare

PARAM_DRAWS = 64
"""Posterior draws whose median gives the parameters of a GPU (population draws if unseen)."""

PER_CELL = 400
"""End-to-end rows used per (source, engine, gpu, metric) cell (seeded; a closed-loop row costs
a few microseconds per draw, so this is a bound on memory, not on time)."""

MIN_ROWS = 3
"""Fewest rows that fit a cell's offset (fewer: the cell stays unseen, offset ~ N(0, tau_src))."""

OVERHEAD_GRID_S = tuple(0.05e-3 * 2.0 ** (k / 2.0) for k in range(11))
"""Per-iteration host overheads (seconds) the profile tries: 0.05 to 1.6 ms, ratio sqrt(2) (a
CUDA-graph decode step with an overlapped scheduler up to an eager Python loop's)."""


def serving_subsample(table: pd.DataFrame, per_cell: int, seed: int) -> pd.DataFrame:
    """At most ``per_cell`` serving rows per (source, engine, gpu, metric), seeded."""
    rows = table[table["scenario"].isin(E2E_SCENARIOS)]
    shuffled = rows.sample(frac=1.0, random_state=seed)
    keys = ["source", "engine", "gpu", "metric"]
    return shuffled.groupby(keys, dropna=False, sort=False).head(per_cell).sort_index()


def _robust_sd(r: np.ndarray) -> float:
    return float(max(1.4826 * np.median(np.abs(r - np.median(r))), 1e-3))


def _centred(resid: np.ndarray, sel: np.ndarray, cell_idx: np.ndarray) -> np.ndarray:
    """Residuals of the rows ``sel`` about their own cell's median (the cell offset's centre)."""
    if not sel.any():
        return np.zeros(0)
    cells = (resid[sel & (cell_idx == c)] for c in np.unique(cell_idx[sel]))
    return np.concatenate([r - np.median(r) for r in cells])


def profile_loglik(resid: np.ndarray, ok: np.ndarray, prep, overhead_s: float) -> float:
    """l = - sum_k n_k log s_k + log p(g) over the noise groups k with ``MIN_ROWS`` or more rows,
    s_k the robust sd of the group's residuals about their cells' centres, p the fit's prior of
    ``step_overhead_s`` (lognormal; see the module doc)."""
    u = to_unconstrained("step_overhead_s", overhead_s)
    z = (u - prior_center_unconstrained("step_overhead_s")) / PRIORS["step_overhead_s"].scale
    total = -0.5 * float(z) ** 2
    for j in np.unique(prep.noise_idx[ok]):
        centred = _centred(resid, ok & (prep.noise_idx == j), prep.cell_idx)
        if len(centred) >= MIN_ROWS:
            total -= len(centred) * np.log(_robust_sd(centred))
    return total


def profile_step_overhead(loglik, grid=OVERHEAD_GRID_S) -> tuple[float, list[float]]:
    """The overhead g (seconds) that maximises ``loglik(g)`` over ``grid``, refined by the vertex
    of a parabola through the best point and its neighbours in log g (kept at the grid point when
    the best is at an end).  Returns (g, the log likelihood at each grid point)."""
    values = [float(loglik(g)) for g in grid]
    i = int(np.argmax(values))
    if 0 < i < len(grid) - 1:
        x = np.log(np.asarray(grid[i - 1 : i + 2]))
        a, b, _ = np.polyfit(x, np.asarray(values[i - 1 : i + 2]), 2)
        if a < 0:
            return float(np.exp(np.clip(-b / (2.0 * a), x[0], x[2]))), values
    return float(grid[i]), values


def population_offset(centres: list[float]) -> tuple[float, float]:
    """Centre and predictive spread of the offset of a cell never seen, from the centres c_1..c_n
    of the seen cells of its group (a normal random-effects model, DerSimonian & Laird 1986).

    The physics (offset 0) counts as one more cell, a prior worth one lab:
    mu = sum(c) / (n + 1), tau^2 = (sum (c - mu)^2 + mu^2) / n, and a new cell draws from
    N(mu, tau^2 (1 + 1 / (n + 1))) (its own spread plus the error of mu).  With the seen labs
    agreeing on a bias the centre moves to it; with one lab it moves half-way; with labs that
    disagree the interval widens instead."""
    c = np.asarray(centres, dtype=float)
    n = len(c)
    mu = float(c.sum() / (n + 1))
    tau2 = float((np.square(c - mu).sum() + mu**2) / max(n, 1))
    return mu, float(np.sqrt(max(tau2, MIN_SPREAD**2) * (1.0 + 1.0 / (n + 1))))


MIN_SPREAD = 0.05
"""Floor on a pooled cell's spread (log units): labs never agree closer than run-to-run noise."""


def _engine_cells(cells: list[str], offsets: list[np.ndarray], seed: int, n_draw: int):
    """Pooled cells for sources never seen: ``engine:*|<group>`` per group (any engine) and
    ``engine:<engine>|<group>`` per (engine, group).  The any-engine cell is the random-effects
    predictive of the seen cells of its group (``population_offset``); an engine's cell shrinks
    that engine's seen cells towards it, the group centre counting as one cell, with the group's
    spread.  A lab never seen thus inherits a bias every seen lab shows (closed-loop TTFT is
    longer than the step and load models give in every lab and engine measured) and a wider
    interval where the labs disagree."""
    by_key: dict[str, list[float]] = {}
    by_engine: dict[str, list[float]] = {}
    for c, o in zip(cells, offsets):
        source, key = c.split("|", 1)
        centre = float(np.median(o))
        by_key.setdefault(key, []).append(centre)
        engine = source.split(":")[-1] if ":" in source else ""
        if engine:
            by_engine.setdefault(f"{ENGINE_PREFIX}{engine}|{key}", []).append(centre)

    names, draws = [], []
    group = {key: population_offset(centres) for key, centres in by_key.items()}
    for name, centres in by_engine.items():
        mu, spread = group[name.split("|", 1)[1]]
        centre = (sum(centres) + mu) / (len(centres) + 1)
        names.append(name)
        draws.append(centre + spread * named_stream(seed, name).standard_normal(n_draw))
    for key, (mu, spread) in group.items():
        name = f"{ENGINE_PREFIX}{ANY_ENGINE}|{key}"
        names.append(name)
        draws.append(mu + spread * named_stream(seed, name).standard_normal(n_draw))
    return names, draws


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
    if not len(prep.log_value):
        return idata, 0
    # per-GPU medians; a GPU the NUTS stage never saw takes the population's (its spec sheet
    # supplies the peaks), so its runs still inform their engine's offsets
    rng0 = np.random.default_rng(seed)
    pobj = Posterior(idata)
    idx = draw_indices(pobj, PARAM_DRAWS, rng0)
    draws0 = parameter_draws(pobj, prep.gpus, idx, rng0)
    params = fitted_efficiency({n: np.median(v, axis=0) for n, v in draws0.items()})
    # the NUTS cells' median offsets (the engine all-reduce latency the runs' steps read); the
    # runs' own cells are new here and start at zero
    fitted = np.median(np.asarray(post["cell_offset"].values).reshape(-1, len(cells)), axis=0)
    offsets = np.concatenate([fitted, np.zeros(len(prep.cells) - len(cells))])
    # compile-bound: XLA's backend optimisation off halves the compile (as optimize does); the
    # parameters are arguments, so every overhead the profile tries reuses one executable
    run_once = jax.jit(
        lambda p, o: predict_log(prep, p, o),
        compiler_options={"xla_backend_optimization_level": 0},
    )
    off = jnp.asarray(offsets)

    def residuals(overhead_s: float) -> np.ndarray:
        p = dataclasses.replace(
            params, step_overhead_s=jnp.full_like(params.step_overhead_s, overhead_s)
        )
        return prep.log_value - np.asarray(run_once(p, off))

    at_grid = {g: residuals(g) for g in OVERHEAD_GRID_S}
    common = np.logical_and.reduce([np.isfinite(r) for r in at_grid.values()])
    overhead_s, profile = profile_step_overhead(
        lambda g: profile_loglik(at_grid[g], common, prep, g)
    )
    # at a grid point (the floor, where the bundled rows put it) its residuals are already known
    resid = at_grid[overhead_s] if overhead_s in at_grid else residuals(overhead_s)
    ok = np.isfinite(resid)
    chains, draws = int(post.sizes["chain"]), int(post.sizes["draw"])
    n_draw = chains * draws

    new_cells, new_off = [], []
    for j in range(len(cells), len(prep.cells)):
        r = resid[ok & (prep.cell_idx == j)]
        if len(r) >= MIN_ROWS:
            new_cells.append(prep.cells[j])
            new_off.append(
                np.median(r)
                + _robust_sd(r)
                / np.sqrt(len(r))
                * named_stream(seed, prep.cells[j]).standard_normal(n_draw)
            )
    pooled_cells, pooled_off = _engine_cells(new_cells, new_off, seed, n_draw)
    new_cells, new_off = new_cells + pooled_cells, new_off + pooled_off
    sig = {}
    for j, k in enumerate(prep.noise_keys):
        if k in keys:
            continue
        sel = ok & (prep.noise_idx == j)
        # residuals about each row's own cell offset (its cell centre)
        centred = _centred(resid, sel, prep.cell_idx)
        if len(centred) >= MIN_ROWS:
            s, dof = _robust_sd(centred), len(centred) - 1
            sig[k] = s * np.sqrt(dof / named_stream(seed, k).chisquare(dof, n_draw))
    if not new_cells and not sig:
        return idata, 0

    def shaped(a: np.ndarray) -> np.ndarray:
        return a.reshape((chains, draws) + a.shape[1:])

    out = {v: np.asarray(post[v].values) for v in post.data_vars}
    # the profiled host overhead, one value for every GPU (a GPU never fitted draws it too)
    out["step_overhead_s"] = np.full_like(out["step_overhead_s"], overhead_s)
    out["mu_step_overhead_s"] = np.full_like(
        out["mu_step_overhead_s"], to_unconstrained("step_overhead_s", overhead_s)
    )
    out["tau_step_overhead_s"] = np.zeros_like(out["tau_step_overhead_s"])
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
        "cut: offsets and sigma of serving cells at the posterior-median parameters, "
        "step_overhead_s profiled"
    )
    new.attrs["serving_step_overhead_s"] = overhead_s
    new.attrs["serving_overhead_profile"] = " ".join(
        f"{g * 1e3:.3g}ms:{v:.1f}" for g, v in zip(OVERHEAD_GRID_S, profile)
    )
    return new, int(ok.sum())


def _e2e_label(label: str) -> bool:
    group = label.split("|")[-1]
    return group.startswith(tuple(f"{s}:" for s in E2E_SCENARIOS))


def without_serving_stage(idata):
    """``idata`` with every end-to-end cell offset and noise key removed: the NUTS stage alone,
    to which ``add_serving_stage`` can add the cut stage of another set of runs.  The host
    overhead keeps the value its last cut stage profiled; the next one profiles it afresh from
    its own runs (``profile_step_overhead`` does not read it), so no held-out run leaks in."""
    import arviz as az

    post = idata.posterior
    cells = [str(c) for c in post["cell"].values]
    keys = [str(k) for k in post["noise_key"].values]
    keep_c = [i for i, c in enumerate(cells) if not _e2e_label(c)]
    keep_k = [i for i, k in enumerate(keys) if not _e2e_label(k)]
    out = {v: np.asarray(post[v].values) for v in post.data_vars}
    out["cell_offset"] = out["cell_offset"][..., keep_c]
    out["sigma"] = out["sigma"][..., keep_k]
    coords = {
        "gpu": [str(g) for g in post["gpu"].values],
        "cell": [cells[i] for i in keep_c],
        "noise_key": [keys[i] for i in keep_k],
    }
    dims = {n: ["gpu"] for n in PARAM_NAMES} | {"cell_offset": ["cell"], "sigma": ["noise_key"]}
    if "gpu_group" in post:
        groups = [str(g) for g in post["gpu_group"].coords["group"].values]
        keep_g = [i for i, g in enumerate(groups) if not _e2e_label(g)]
        out["gpu_group"] = out["gpu_group"][..., keep_g]
        coords["group"] = [groups[i] for i in keep_g]
        dims["gpu_group"] = ["gpu", "group"]
    new = az.from_dict(posterior=out, coords=coords, dims=dims)
    new.attrs.update(idata.attrs)
    return new
