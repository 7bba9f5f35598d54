"""GPU x group biases in the new-GPU update (``_update``): their prior and the merged draws."""

from __future__ import annotations

import numpy as np

from ._model import kernel_groups
from ._posterior import Posterior

MIN_SCALE = 1e-3
"""Floor of a prior sd (as ``_update.MIN_SCALE``)."""


def gpu_group_prior(
    posterior: Posterior, gpus, keys, *, from_population: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(mean, sd) of eta_gk for the measured GPUs x groups: a fitted pair's own draws, else the
    population N(0, tau_gpu) (zero-width for serving groups and older posterior files)."""
    loc = np.zeros((len(gpus), len(keys)))
    scale = np.full((len(gpus), len(keys)), MIN_SCALE)
    post = posterior.idata.posterior
    if "gpu_group" not in post:
        return loc, scale
    fit_gpus = [str(g) for g in post["gpu_group"].coords["gpu"].values]
    fit_keys = [str(k) for k in post["gpu_group"].coords["group"].values]
    eta = posterior.flat("gpu_group")
    tau = {
        True: float(np.sqrt(np.mean(posterior.flat("tau_gpu_kernel") ** 2))),
        False: 0.0,
    }
    for i, g in enumerate(gpus):
        for j, k in enumerate(keys):
            if k.startswith("serving:"):
                continue
            if not from_population and g in fit_gpus and k in fit_keys:
                e = eta[:, fit_gpus.index(g), fit_keys.index(k)]
                loc[i, j], scale[i, j] = float(e.mean()), max(float(e.std()), MIN_SCALE)
            else:
                scale[i, j] = max(tau[bool(kernel_groups([k])[0])], MIN_SCALE)
    return loc, scale


def merge_gpu_group(prior: Posterior, prep, new: dict, idx, gpus: list, rng):
    """GPU x group draws over ``gpus`` x (prior groups + new non-serving groups): the prior's,
    N(0, tau_gpu) for pairs neither fit saw, the update's for the measured pairs."""
    da = prior.idata.posterior["gpu_group"]
    old_gpus = [str(g) for g in da.coords["gpu"].values]
    old_keys = [str(k) for k in da.coords["group"].values]
    keys = old_keys + [
        k for k in prep.noise_keys if k not in old_keys and not k.startswith("serving:")
    ]
    old = prior.flat("gpu_group")[idx]
    tau_k, tau_s = prior.flat("tau_gpu_kernel")[idx], np.zeros(len(idx))
    out = np.empty((len(idx), len(gpus), len(keys)))
    for j, k in enumerate(keys):
        tau = tau_k if kernel_groups([k])[0] else tau_s
        for i, g in enumerate(gpus):
            if g in old_gpus and k in old_keys:
                out[:, i, j] = old[:, old_gpus.index(g), old_keys.index(k)]
            else:
                out[:, i, j] = tau * rng.standard_normal(len(idx))
    if "gpu_group" in new:
        for i, g in enumerate(prep.gpus):
            for j, k in enumerate(prep.noise_keys):
                if k in keys:
                    out[:, gpus.index(g), keys.index(k)] = new["gpu_group"][..., i, j].reshape(-1)
    return out, keys
