"""Update a fitted posterior with a user's few measurements of one (possibly new) GPU.

The bundled fit already holds what many GPUs say about the population: for each parameter p the
mean mu_p and spread tau_p of u = link(theta) across GPU types.  A user's handful of rows cannot
move those, so the update conditions on them and refits only what the rows inform (an empirical-
Bayes step, Gelman et al., BDA3 ch. 5):

    u_gp ~ Normal(m_p, s_p)          per measured GPU g; (m_p, s_p) = mean and sd of
                                     mu_p + tau_p * z (a new or held-out GPU) or of the GPU's own
                                     posterior draws (a GPU the prior already fitted)
    delta_c ~ Normal(m_c, s_c)       a cell the prior fitted; an end-to-end cell of a lab it never
                                     saw, its engine's pooled cell (``stand_in_cell``); else
                                     Normal(0, tau_src or tau_kernel)
    eta_gk ~ Normal(m_gk, s_gk)      GPU x group bias: the GPU's fitted draws, else N(0, tau_gpu)
                                     for kernel groups and for every group of a new GPU, its
                                     end-to-end groups included (``gpu_group_prior``)
    sigma_k = s_k * exp(0.5 z), z ~ N(0, 1)   s_k the prior's posterior median (a new GPU's
                                     misfit may exceed what the fitted GPUs showed)
    rho_k ~ Beta(1, 1)               share of sigma_k^2 that is run to run (end-to-end groups)
    b_uk ~ Normal(0, sigma_k sqrt(rho_k))   one per benchmark run u and group k
    log y_r ~ StudentT(nu, log f_r(theta_g) + delta_c + eta_gk + b_uk, sigma_k sqrt(1 - rho_k))

One benchmark run reports a dozen end-to-end rows (mean, median and p99 of TTFT, TPOT, ITL and
end-to-end latency, and the throughput) of one configuration; where the load model misses that
configuration, all of its rows of a metric miss together.  Counted as independent draws of
sigma_k, k runs would weigh as 13 k observations: sigma_k and the efficiencies would collapse onto
the few configurations measured, and the intervals for the user's other configurations would
narrow below what k runs can pin down.  The run effect b_uk carries what rows of one run share,
so the efficiencies, eta and the run-to-run part of sigma are learned from k runs, not from 13 k
rows.  A new run of the GPU draws b afresh: the merged sigma_k is the total
sqrt(between^2 + within^2), the spread the cut stage measured (``_serving_stage``: residuals of
all runs about their cells).

End-to-end rows (``serving`` at a concurrency or a rate, ``saturated``: what a user's
``vllm bench serve`` runs of a new accelerator are) go through the closed- and open-loop load
models inside NUTS.  Their cells' offsets are held near what the prior's cut stage learned for the
engine, so the new GPU's efficiencies, not a free offset, absorb what the runs show.  Each run
costs a fixed-point solve per gradient, so above ``MAX_SERVING_ROWS`` a seeded subset is used.

NUTS on this small model takes seconds.  The result is a full ``Posterior``: every GPU, cell and
noise key of the prior (resampled draws), with the measured GPUs' parameters and the touched cells
replaced by the updated draws, so ``efficiency_draws(post, gpu=...)`` returns the update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pandas as pd

import perfmodel
from perfmodel import Efficiency

from . import _rows
from ._model import (
    PARAM_NAMES,
    PRIORS,
    STUDENT_DF,
    kernel_cells,
    prior_center_unconstrained,
    to_natural,
    to_unconstrained,
)
from ._names import noise_index
from ._posterior import Posterior, _default_value, stand_in_cell
from ._predict import compiled_predict_log, fitted_efficiency, prepare
from ._serving_stage import E2E_SCENARIOS
from ._update_groups import (
    MIN_SCALE,
    gpu_group_prior as _gpu_group_prior,
    merge_gpu_group as _merge_gpu_group,
)

SIGMA_LOG_SD = 0.5
"""Log-scale sd of each noise group's sigma around the prior's median: the prior's sigma describes
GPUs it fitted; a new GPU's misfit may be larger, and pinning sigma at the median left the updated
90 % intervals covering only 72-74 % of a held-out A40's rows."""

MAX_SERVING_ROWS = 60
"""End-to-end rows NUTS conditions on at most (a seeded subset above it): each run is a 40-step
closed-loop fixed point (``perfmodel._closed_loop``) differentiated at every leapfrog step."""

RUN_SHARE_PRIOR = (1.0, 1.0)
"""Beta(a, b) prior of rho_k, the run-to-run share of an end-to-end group's noise variance: the
cut stage measures only the total, so the split is unknown (uniform).  A group whose statistics
of one run move together (TPOT's mean, median and p99) then puts most of sigma_k between runs,
rather than shrinking sigma_k to the small spread within a run."""

RUN_KEYS = (
    "engine",
    "model",
    "tp",
    "input_len",
    "output_len",
    "concurrency",
    "request_rate",
    "scenario",
    "run_id",
)
"""Columns whose values one benchmark invocation shares (``run_id``: the GitHub Actions run id in
``notes``, where there is one)."""

MAX_TREE_DEPTH = 8
"""NUTS tree depth cap of an update (NumPyro's default is 10): updates on a few end-to-end runs
took 127-255 leapfrog steps per draw, each a closed-loop solve and its gradient per run, so 255
bounds the cost without cutting the trajectories they need."""


def gpu_prior(
    posterior: Posterior, gpu: str, *, from_population: bool
) -> dict[str, tuple[float, float]]:
    """(mean, sd) of each parameter's unconstrained value for ``gpu`` under ``posterior``.

    ``from_population`` (or a GPU the posterior lacks) uses the population predictive
    mu_p + tau_p * z: mean E[mu], sd sqrt(E[tau^2] + Var[mu]); else the GPU's own draws.
    """
    out = {}
    for name in PARAM_NAMES:
        if name not in posterior.idata.posterior:  # an older file: the spec-sheet prior
            out[name] = (prior_center_unconstrained(name), PRIORS[name].scale)
            continue
        if from_population or gpu not in posterior.gpus:
            mu, tau = posterior.flat(f"mu_{name}"), posterior.flat(f"tau_{name}")
            m, s = float(mu.mean()), float(np.sqrt(np.mean(tau**2) + mu.var()))
        else:
            u = to_unconstrained(name, posterior.flat(name)[:, posterior.gpus.index(gpu)])
            m, s = float(u.mean()), float(u.std())
        out[name] = (m, max(s, MIN_SCALE))
    return out


def _cell_prior(posterior: Posterior, cell: str) -> tuple[float, float]:
    """(mean, sd) of a cell's offset: the draws of its stand-in (the cell itself, or for an
    end-to-end cell of a lab the prior never saw its engine's pooled cell, as
    ``cell_offset_draws`` picks it), else N(0, tau_kernel or tau_source)."""
    found = stand_in_cell(posterior, cell)
    if found is not None:
        d = posterior.flat("cell_offset")[:, posterior.cells.index(found)]
        return float(d.mean()), max(float(d.std()), MIN_SCALE)
    tau = posterior.flat("tau_kernel" if kernel_cells([cell])[0] else "tau_source")
    return 0.0, max(float(np.sqrt(np.mean(tau**2))), MIN_SCALE)


def _sigma(posterior: Posterior, keys: tuple[str, ...]) -> np.ndarray:
    med = np.median(posterior.flat("sigma"), axis=0)
    known = posterior.noise_keys
    found = [noise_index(known, k) for k in keys]
    return np.asarray([med[j] if j is not None else med.max() for j in found])


def run_labels(rows: pd.DataFrame) -> pd.Series:
    """One label per benchmark invocation (``RUN_KEYS``): rows sharing it are one run."""
    keyed = rows.assign(
        run_id=rows["notes"].astype(str).str.extract(r"gha_run_id=(\d+)", expand=False)
    )
    return keyed[list(RUN_KEYS)].astype("string").fillna("").agg("|".join, axis=1)


def run_units(prep) -> tuple[np.ndarray, np.ndarray]:
    """The (GPU, source, run, group) units of ``prep``'s end-to-end rows: per row the index of
    its unit (-1 for a kernel or step row), and per unit the index of its noise group."""
    unit = np.full(len(prep.log_value), -1)
    e2e = prep.table["scenario"].isin(E2E_SCENARIOS).to_numpy()
    if not e2e.any():
        return unit, np.zeros(0, dtype=int)
    rows = prep.table[e2e]
    labels = (
        rows["gpu"].astype(str)
        + "|"
        + rows["source"].astype(str)
        + "|"
        + run_labels(rows)
        + "|"
        + pd.Series(prep.noise_idx[e2e], index=rows.index).astype(str)
    )
    codes, uniques = pd.factorize(labels)
    unit[e2e] = codes
    first = np.asarray([np.flatnonzero(codes == u)[0] for u in range(len(uniques))])
    return unit, prep.noise_idx[e2e][first]


def update_model(
    prep,
    loc_u,
    scale_u,
    loc_c,
    scale_c,
    sigma,
    observed=None,
    loc_e=None,
    scale_e=None,
    unit_idx=None,
    unit_key=None,
    *,
    predict: Callable[[Efficiency, jnp.ndarray], jnp.ndarray],
) -> None:
    """NumPyro model of the user's rows with the prior's per-GPU, per-cell and GPU x group
    normals (``loc_e``/``scale_e``: (gpus, noise keys); None: no GPU x group term) and a run
    effect per (run, group) unit of end-to-end rows (``unit_idx``: per row, -1 for none;
    ``unit_key``: per unit, its noise group; None or empty: no run effects).  ``predict``:
    ``prep``'s rows as (params, cell offsets) -> log values (``compiled_predict_log``)."""
    params = {}
    for i, name in enumerate(PARAM_NAMES):
        with numpyro.plate("gpu", len(prep.gpus)):
            z = numpyro.sample(f"z_{name}", dist.Normal(0.0, 1.0))
        params[name] = numpyro.deterministic(
            name, to_natural(name, loc_u[:, i] + scale_u[:, i] * z)
        )
    if prep.cells:
        with numpyro.plate("cell", len(prep.cells)):
            zc = numpyro.sample("z_cell", dist.Normal(0.0, 1.0))
        offset = numpyro.deterministic("cell_offset", loc_c + scale_c * zc)
    else:  # only anchor-group kernel rows: no offset cell (a plate cannot be empty)
        offset = numpyro.deterministic("cell_offset", jnp.zeros(0))
    with numpyro.plate("noise_key", len(prep.noise_keys)):
        zs = numpyro.sample("z_sigma", dist.Normal(0.0, 1.0))
    sig = numpyro.deterministic("sigma", sigma * jnp.exp(SIGMA_LOG_SD * zs))
    loc = predict(fitted_efficiency(params), offset)
    row_sig = sig[prep.noise_idx]
    if unit_key is not None and len(unit_key):
        with numpyro.plate("noise_key", len(prep.noise_keys)):
            rho = numpyro.sample("run_share", dist.Beta(*RUN_SHARE_PRIOR))
        with numpyro.plate("run_unit", len(unit_key)):
            zb = numpyro.sample("z_run", dist.Normal(0.0, 1.0))
        b = sig[unit_key] * jnp.sqrt(rho[unit_key]) * zb
        in_run = jnp.asarray(unit_idx >= 0)
        loc = loc + jnp.where(in_run, b[jnp.maximum(unit_idx, 0)], 0.0)
        row_sig = row_sig * jnp.where(in_run, jnp.sqrt(1.0 - rho[prep.noise_idx]), 1.0)
    if loc_e is not None:
        with (
            numpyro.plate("gg_key", len(prep.noise_keys), dim=-1),
            numpyro.plate("gg_gpu", len(prep.gpus), dim=-2),
        ):
            ze = numpyro.sample("z_gpu_group", dist.Normal(0.0, 1.0))
        eta = numpyro.deterministic("gpu_group", loc_e + scale_e * ze)
        loc = loc + eta[prep.gpu_idx, prep.noise_idx]
    with numpyro.plate("row", len(prep.log_value)):
        numpyro.sample("log_value", dist.StudentT(STUDENT_DF, loc, row_sig), obs=observed)


@contextlib.contextmanager
def user_hardware(hardware_csv: str | Path | None):
    """Within the block, ``prepare`` looks GPUs up in ``hardware_csv`` first, then the catalog."""
    if hardware_csv is None:
        yield
        return
    original = _rows._hardware
    user_ids = set(perfmodel.hardware_ids(hardware_csv))

    def lookup(gpu: str):
        return (
            perfmodel.load_hardware(gpu, hardware_csv=hardware_csv)
            if gpu in user_ids
            else original(gpu)
        )

    _rows._hardware = lookup
    try:
        yield
    finally:
        _rows._hardware = original


def update_posterior(
    prior: Posterior,
    table: pd.DataFrame,
    *,
    from_population: bool = False,
    draws: int = 500,
    warmup: int = 500,
    chains: int = 2,
    seed: int = 0,
    hardware_csv: str | Path | None = None,
    max_serving_rows: int = MAX_SERVING_ROWS,
    max_tree_depth: int = MAX_TREE_DEPTH,
) -> tuple[Posterior, object]:
    """Condition ``prior`` on the measurements in ``table`` (a few rows of one or more GPUs).

    Args:
        prior: the fitted posterior to update (e.g. ``load_posterior()``).
        table: tidy measurements (``load_measurements(...).table``): kernel, step and end-to-end
            (``serving``, ``saturated``) rows; end-to-end rows need their ``engine``.
        from_population: start every measured GPU from the population (mu, tau) even when the
            prior fitted it (how a held-out GPU is scored); default uses its own posterior.
        draws, warmup, chains, seed: NUTS settings.
        hardware_csv: spec rows of GPUs the catalog lacks.
        max_serving_rows: end-to-end rows used at most (a seeded subset above it; the posterior's
            attributes ``update_serving_rows`` / ``serving_rows_available`` say how many).
        max_tree_depth: NUTS tree depth cap (at most 2**depth - 1 gradients per draw).

    Returns:
        (updated ``Posterior``, the ``Prepared`` rows it was fitted on).

    Raises:
        ValueError: no row of ``table`` is covered by a budget.
    """
    from numpyro.infer import MCMC, NUTS

    table, available = serving_subsample(table, max_serving_rows, seed)
    with user_hardware(hardware_csv):
        prep = prepare(table)
    if not len(prep.log_value):
        raise ValueError("no measurement row is covered by a budget; see the skipped reasons")
    gp = [gpu_prior(prior, g, from_population=from_population) for g in prep.gpus]
    loc_u = jnp.asarray([[p[n][0] for n in PARAM_NAMES] for p in gp])
    scale_u = jnp.asarray([[p[n][1] for n in PARAM_NAMES] for p in gp])
    cp = [_cell_prior(prior, c) for c in prep.cells]
    loc_c = jnp.asarray([c[0] for c in cp]).reshape(-1)
    scale_c = jnp.asarray([c[1] for c in cp]).reshape(-1)
    sigma = jnp.asarray(_sigma(prior, prep.noise_keys))
    loc_e, scale_e = (
        jnp.asarray(a)
        for a in _gpu_group_prior(
            prior, prep.gpus, prep.noise_keys, from_population=from_population
        )
    )
    unit_idx, unit_key = run_units(prep)
    mcmc = MCMC(
        NUTS(update_model, target_accept_prob=0.9, max_tree_depth=max_tree_depth),
        num_warmup=warmup,
        num_samples=draws,
        num_chains=chains,
        chain_method="sequential",
        progress_bar=False,
    )
    with jax.numpy_dtype_promotion("standard"):  # NumPyro's kernels rely on implicit promotion
        mcmc.run(
            jax.random.PRNGKey(seed),
            prep,
            loc_u,
            scale_u,
            loc_c,
            scale_c,
            sigma,
            observed=jnp.asarray(prep.log_value),
            loc_e=loc_e,
            scale_e=scale_e,
            unit_idx=unit_idx,
            unit_key=jnp.asarray(unit_key),
            predict=compiled_predict_log(prep),
            extra_fields=("diverging",),
        )
    new = {
        k: np.asarray(jax.device_get(v)) for k, v in mcmc.get_samples(group_by_chain=True).items()
    }
    diverging = np.asarray(jax.device_get(mcmc.get_extra_fields(group_by_chain=True)["diverging"]))
    idata = _merge(prior, prep, new, diverging, chains, draws, seed)
    idata.attrs.update(
        {
            "method": "update",
            "prior": str(prior.path),
            "seed": seed,
            "update_rows": len(prep.log_value),
            "update_serving_rows": int(prep.table["scenario"].isin(E2E_SCENARIOS).sum()),
            "serving_rows_available": available,
            "update_gpus": ",".join(prep.gpus),
            "from_population": int(from_population),
            "update_run_units": len(unit_key),
            "divergences": int(diverging.sum()),
        }
    )
    return Posterior(idata), prep


def serving_subsample(table: pd.DataFrame, max_rows: int, seed: int) -> tuple[pd.DataFrame, int]:
    """``table`` with at most ``max_rows`` end-to-end rows (a seeded random subset, table order
    kept), and how many it had."""
    e2e = table["scenario"].isin(E2E_SCENARIOS)
    available = int(e2e.sum())
    if available <= max_rows:
        return table, available
    keep = table[e2e].sample(max_rows, random_state=seed).index
    return table[~e2e | table.index.isin(keep)], available


def _merge(prior: Posterior, prep, new: dict, diverging, chains: int, draws: int, seed: int):
    """The prior's draws (resampled to chains x draws) with the updated GPUs and cells swapped in."""
    import arviz as az

    rng = np.random.default_rng(seed)
    idx = rng.choice(prior.num_draws, size=chains * draws, replace=chains * draws > prior.num_draws)

    def shaped(a: np.ndarray) -> np.ndarray:
        return a.reshape((chains, draws) + a.shape[1:])

    gpus = list(prior.gpus) + [g for g in prep.gpus if g not in prior.gpus]
    cells = list(prior.cells) + [c for c in prep.cells if c not in prior.cells]
    keys = list(prior.noise_keys) + [k for k in prep.noise_keys if k not in prior.noise_keys]
    post = {}
    for var in prior.idata.posterior.data_vars:
        if var not in (*PARAM_NAMES, "cell_offset", "sigma", "gpu_group"):
            post[var] = shaped(prior.flat(var)[idx])
    for name in PARAM_NAMES:
        old = (
            prior.flat(name)[idx]
            if name in prior.idata.posterior
            else np.full((len(idx), len(prior.gpus)), _default_value(name))
        )
        cols = np.empty((chains * draws, len(gpus)))
        cols[:, : old.shape[1]] = old
        for j, g in enumerate(prep.gpus):
            cols[:, gpus.index(g)] = new[name][..., j].reshape(-1)
        post[name] = shaped(cols)
    off = np.empty((chains * draws, len(cells)))
    old = prior.flat("cell_offset")[idx]
    off[:, : old.shape[1]] = old
    rng_tau = prior.flat("tau_source")[idx]
    for j, c in enumerate(cells[old.shape[1] :], start=old.shape[1]):  # unseen by both: population
        off[:, j] = rng_tau * rng.standard_normal(len(idx))
    for j, c in enumerate(prep.cells):
        off[:, cells.index(c)] = new["cell_offset"][..., j].reshape(-1)
    post["cell_offset"] = shaped(off)
    sig_old = prior.flat("sigma")[idx]
    sig = np.concatenate(
        [
            sig_old,
            np.tile(np.max(sig_old, axis=1, keepdims=True), (1, len(keys) - sig_old.shape[1])),
        ],
        axis=1,
    )
    for j, k in enumerate(prep.noise_keys):
        sig[:, keys.index(k)] = new["sigma"][..., j].reshape(-1)
    post["sigma"] = shaped(sig)
    dims = {n: ["gpu"] for n in PARAM_NAMES} | {"cell_offset": ["cell"], "sigma": ["noise_key"]}
    coords = {"gpu": gpus, "cell": cells, "noise_key": keys}
    if "gpu_group" in prior.idata.posterior:
        groups = _merge_gpu_group(prior, prep, new, idx, gpus, rng)
        post["gpu_group"], coords["group"] = shaped(groups[0]), groups[1]
        dims["gpu_group"] = ["gpu", "group"]
    return az.from_dict(
        posterior=post, sample_stats={"diverging": diverging}, coords=coords, dims=dims
    )


def without_gpu(posterior: Posterior, gpu: str) -> Posterior:
    """``posterior`` with ``gpu``'s own parameters removed: it is then predicted from its spec sheet
    and the population (mu, tau), as a GPU the fit never saw (a leave-one-GPU-out baseline that
    keeps the population it helped fit)."""
    import arviz as az

    post = posterior.idata.posterior
    kept = post.sel(gpu=[g for g in posterior.gpus if g != gpu])
    return Posterior(az.InferenceData(posterior=kept), posterior.path)
