"""Posterior predictive draws of measurement rows: log y = log f(theta_g; delta_cell) + eta_gk + noise.

Split from ``_posterior`` (which loads the posterior and draws its parameters); the draws are
evaluated in chunks of one compiled shape (``map_chunks``), since each serving row is a
closed-loop queueing solve per draw.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._model import STUDENT_DF, population_bias
from ._names import noise_index
from ._posterior import Posterior, cell_offset_draws, draw_indices, parameter_draws
from ._predict import Prepared, fitted_efficiency, predict_log

SERVING_ROW_DRAWS_PER_CHUNK = 256
"""Row x draw evaluations of ``serving_metrics`` per chunk (bounds memory near 0.3 GB)."""


def gpu_group_draws(
    posterior: Posterior,
    gpus: tuple[str, ...],
    keys: tuple[str, ...],
    idx: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """GPU x group bias draws eta_gk on log time, (draws, gpus, keys): fitted pairs keep theirs,
    the others draw N(0, tau_gpu) or 0 as ``population_bias`` says (an unseen GPU's kernel,
    whole-model and end-to-end groups: its own bias, unknown; a fitted GPU's whole-model groups
    and anchor groups: 0, so in-sample intervals are unchanged); older posterior files without
    the term get 0."""
    out = np.zeros((len(idx), len(gpus), len(keys)))
    post = posterior.idata.posterior
    if "gpu_group" not in post:
        return out
    eta = np.asarray(post["gpu_group"].values)
    eta = eta.reshape((-1,) + eta.shape[2:])[idx]
    fit_gpus = [str(g) for g in post["gpu_group"].coords["gpu"].values]
    fit_keys = [str(k) for k in post["gpu_group"].coords["group"].values]
    tau_k, zero = posterior.flat("tau_gpu_kernel")[idx], np.zeros(len(idx))
    for j, k in enumerate(keys):
        for i, g in enumerate(gpus):
            if g in fit_gpus and k in fit_keys:
                out[:, i, j] = eta[:, fit_gpus.index(g), fit_keys.index(k)]
            else:
                tau = tau_k if population_bias(k, new_gpu=g not in fit_gpus) else zero
                out[:, i, j] = tau * rng.standard_normal(len(idx))
    return out


PROMPT_STREAM = 1
"""Second seed word of the generator that draws unrecorded prompt means (``prompt_z``)."""

CLOSED_ROWS_PER_OPEN_ROW = 100
"""Memory of one open-loop row's evaluation in closed-loop rows (quadrature nodes vs a scan)."""


def map_chunks(fn, xs, batch: int) -> np.ndarray:
    """``vmap(fn)`` over the leading axis of the pytree ``xs``, ``batch`` entries per call.

    One program of static shape is compiled and called once per chunk (the last chunk padded
    with copies of its first entry, then cut).  Not a ``lax.map`` inside one ``jit``: XLA took
    2.3x longer to compile the closed-loop queueing solve nested in that scan (55 vs 24 s in the
    bundled validate, same chunk shape, same numbers).
    """
    xs = jax.tree_util.tree_map(np.asarray, xs)  # host-side slicing: no program per slice
    n = int(jax.tree_util.tree_leaves(xs)[0].shape[0])
    f = jax.jit(jax.vmap(fn))
    outs = []
    for start in range(0, n, batch):
        k = min(batch, n - start)

        def cut(a, start=start, k=k):
            part = a[start : start + k]
            return part if k == batch else np.concatenate([part, np.repeat(part[:1], batch - k, 0)])

        outs.append(np.asarray(f(*jax.tree_util.tree_map(cut, xs)))[:k])
    return np.concatenate(outs, axis=0)


def predictive_log_draws(
    posterior: Posterior, prep: Prepared, num_draws: int = 200, *, seed: int = 0, noise: bool = True
) -> np.ndarray:
    """Posterior predictive draws of log value for every row of ``prep``: (num_draws, rows).

    log y = log f(theta_g; delta_cell) + eta_gk + sigma_group * t_nu (the cell offset adds to
    log time, or scales a collective's latency); unseen GPUs and cells take population draws (an
    unseen group's sigma is its stand-in group's, ``STAND_IN_GROUPS``, else the largest fitted
    one), and a prompt mean the row does not record is drawn from its log-normal
    (``MLPERF_PROMPT_LOG_SD``).
    """
    rng = np.random.default_rng(seed)
    idx = draw_indices(posterior, num_draws, rng)
    params = parameter_draws(posterior, prep.gpus, idx, rng)
    offsets = (
        np.stack([cell_offset_draws(posterior, c, idx, rng) for c in prep.cells], axis=1)
        if prep.cells
        else np.zeros((len(idx), 0))
    )
    keys = posterior.noise_keys
    sig_all = posterior.flat("sigma")[idx]
    found = [noise_index(keys, k) for k in prep.noise_keys]
    sig = np.stack([sig_all[:, j] if j is not None else sig_all.max(axis=1) for j in found], axis=1)
    # the prompt mean an MLPerf row does not record, one standard-normal draw per posterior draw
    # (its own stream: the parameter and noise draws stay those of the same seed)
    prompt_z = np.random.default_rng((seed, PROMPT_STREAM)).standard_normal(len(idx))
    xs = (
        fitted_efficiency(params),
        jnp.asarray(offsets),
        jnp.asarray(prompt_z),
    )
    # the open-loop closed form holds ~1 MB of quadrature nodes per row and draw, a closed-loop
    # row a few kB: chunk the draws so one chunk stays near SERVING_ROW_DRAWS_PER_CHUNK row-draws
    blocks = prep.blocks
    n_open = blocks.open.num_configurations if blocks.open is not None else 0
    n_closed = blocks.closed.num_configurations if blocks.closed is not None else 0
    n_serving = n_open + n_closed // CLOSED_ROWS_PER_OPEN_ROW
    batch = max(1, SERVING_ROW_DRAWS_PER_CHUNK // n_serving) if n_serving else num_draws
    loc = map_chunks(lambda p, o, z: predict_log(prep, p, o, z), xs, min(batch, num_draws))
    eta = gpu_group_draws(posterior, prep.gpus, prep.noise_keys, idx, rng)
    loc = loc + eta[:, prep.gpu_idx, prep.noise_idx]
    if not noise:
        return loc
    eps = rng.standard_t(STUDENT_DF, size=loc.shape)
    return loc + sig[:, prep.noise_idx] * eps
