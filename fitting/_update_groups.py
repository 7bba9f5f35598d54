"""GPU x group biases in the new-GPU update (``_update``): their prior and the merged draws."""

from __future__ import annotations

import numpy as np

from ._model import population_bias
from ._posterior import Posterior

MIN_SCALE = 1e-3
"""Floor of a prior sd on the unconstrained scale (keeps NUTS off a degenerate normal): the
new-GPU update's priors, its efficiencies' and its GPU x group biases' alike."""


def gpu_group_prior(
    posterior: Posterior, gpus, keys, *, from_population: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(mean, sd) of eta_gk for the measured GPUs x groups: a fitted pair's own draws, else
    N(0, tau_gpu) where the predictive draws one for the pair (``population_bias``: kernel
    groups, and every whole-model and end-to-end group of a GPU started from the population),
    else 0 (older posterior files without the term: 0 throughout).

    A new GPU's end-to-end groups thus carry a bias of its own (its TTFT across all its runs may
    sit off what the engine's offset learned on other GPUs says), so the few runs measured move
    that bias, not the efficiencies TPOT also reads, and the update's prior is the spec-sheet
    predictive ``gpu_group_draws`` gives the GPU before any run."""
    loc = np.zeros((len(gpus), len(keys)))
    scale = np.full((len(gpus), len(keys)), MIN_SCALE)
    post = posterior.idata.posterior
    if "gpu_group" not in post:
        return loc, scale
    fit_gpus = [str(g) for g in post["gpu_group"].coords["gpu"].values]
    fit_keys = [str(k) for k in post["gpu_group"].coords["group"].values]
    eta = posterior.flat("gpu_group")
    tau = float(np.sqrt(np.mean(posterior.flat("tau_gpu_kernel") ** 2)))
    for i, g in enumerate(gpus):
        new_gpu = from_population or g not in fit_gpus
        for j, k in enumerate(keys):
            if not new_gpu and k in fit_keys:
                e = eta[:, fit_gpus.index(g), fit_keys.index(k)]
                loc[i, j], scale[i, j] = float(e.mean()), max(float(e.std()), MIN_SCALE)
            elif population_bias(k, new_gpu=new_gpu):
                scale[i, j] = max(tau, MIN_SCALE)
    return loc, scale


def merge_gpu_group(prior: Posterior, prep, new: dict, idx, gpus: list, rng):
    """GPU x group draws over ``gpus`` x (prior groups + the update's new groups): the prior's,
    N(0, tau_gpu) or 0 for pairs neither fit saw (``population_bias``: a GPU new to the prior
    keeps the spread its spec-sheet predictive had on the groups its rows did not measure), the
    update's for the measured pairs."""
    da = prior.idata.posterior["gpu_group"]
    old_gpus = [str(g) for g in da.coords["gpu"].values]
    old_keys = [str(k) for k in da.coords["group"].values]
    keys = old_keys + [k for k in prep.noise_keys if k not in old_keys]
    old = prior.flat("gpu_group")[idx]
    tau_k, zero = prior.flat("tau_gpu_kernel")[idx], np.zeros(len(idx))
    out = np.empty((len(idx), len(gpus), len(keys)))
    for j, k in enumerate(keys):
        for i, g in enumerate(gpus):
            if g in old_gpus and k in old_keys:
                out[:, i, j] = old[:, old_gpus.index(g), old_keys.index(k)]
            else:
                tau = tau_k if population_bias(k, new_gpu=g not in old_gpus) else zero
                out[:, i, j] = tau * rng.standard_normal(len(idx))
    if "gpu_group" in new:
        for i, g in enumerate(prep.gpus):
            for j, k in enumerate(prep.noise_keys):
                if k in keys:
                    out[:, gpus.index(g), keys.index(k)] = new["gpu_group"][..., i, j].reshape(-1)
    return out, keys
