"""The calibrated posterior: load/save (ArviZ netCDF), per-GPU ``Efficiency`` draws, predictive draws.

A GPU or source the fit never saw gets the population: u = mu_p + tau_p * z, z ~ N(0, 1), on each
parameter's unconstrained scale (``_model``), and a cell offset delta ~ N(0, tau_src).  So a new
accelerator is predicted from its spec sheet with the pooled efficiencies, and a new lab or engine
widens the interval instead of shifting it (Gelman et al., BDA3 ch. 5).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import perfmodel
from perfmodel import Efficiency
from perfmodel._ops import KernelEfficiency

from ._model import PARAM_NAMES, STUDENT_DF, kernel_cells, kernel_groups, to_natural
from ._predict import EFFICIENCY_FIELDS, KERNEL_FIELDS, Prepared, predict_log

DEFAULT_POSTERIOR = "posteriors/default.nc"
"""Bundled posterior, relative to ``perfmodel.data_dir()``."""

_LOW_PRECISION = {"fp8", "fp4", "int8"}

SERVING_ROW_DRAWS_PER_CHUNK = 256
"""Row x draw evaluations of ``serving_metrics`` per chunk (bounds memory near 0.3 GB)."""


class PosteriorError(ValueError):
    """A posterior file that cannot be read or lacks what is asked of it; the message says why."""


@dataclass(frozen=True)
class Posterior:
    """A fitted (or prior-only) calibration: ArviZ ``InferenceData`` plus its labels.

    Attributes:
        idata: the ``InferenceData``; group ``posterior`` holds ``mu_<p>``, ``tau_<p>``, the per-GPU
            ``<p>`` (natural units, dim ``gpu``), ``tau_source``, ``cell_offset`` (dim ``cell``,
            ``"<source>:<engine>|<group>"``) and ``sigma`` (dim ``noise_key``).
        path: the file it came from (None when built in memory).
    """

    idata: object
    path: str | None = None

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(str(g) for g in self.idata.posterior["gpu"].values)

    @property
    def cells(self) -> tuple[str, ...]:
        return tuple(str(s) for s in self.idata.posterior["cell"].values)

    @property
    def sources(self) -> tuple[str, ...]:
        """Source/engine labels (``vidur:sarathi``) the fit saw."""
        return tuple(sorted({c.split("|")[0] for c in self.cells}))

    @property
    def noise_keys(self) -> tuple[str, ...]:
        return tuple(str(k) for k in self.idata.posterior["noise_key"].values)

    @property
    def num_draws(self) -> int:
        p = self.idata.posterior
        return int(p.sizes["chain"] * p.sizes["draw"])

    def flat(self, var: str) -> np.ndarray:
        """Draws of ``var`` with chain and draw merged into one leading axis."""
        v = np.asarray(self.idata.posterior[var].values)
        return v.reshape((-1,) + v.shape[2:])


def default_posterior_path() -> Path:
    return perfmodel.data_dir() / DEFAULT_POSTERIOR


def load_posterior(path: str | Path | None = None) -> Posterior:
    """Read a posterior netCDF (default: the bundled ``data/posteriors/default.nc``).

    Raises:
        PosteriorError: missing or unreadable file, or not a servingmath posterior.
    """
    import arviz as az

    p = Path(path) if path is not None else default_posterior_path()
    if not p.is_file():
        raise PosteriorError(
            f"no posterior at {p}; pass --posterior FILE or run `python -m fitting.fit_bundled`"
        )
    try:
        idata = az.from_netcdf(str(p))
    except Exception as exc:  # noqa: BLE001  (h5py/xarray raise many types for a bad file)
        raise PosteriorError(
            f"cannot read posterior {p} ({type(exc).__name__}); is it a netCDF from `servingmath fit`?"
        ) from None
    needed = [n for n in PARAM_NAMES if n not in OPTIONAL_PARAMS]
    missing = [v for v in (*needed, "sigma", "cell_offset") if v not in idata.posterior]
    if missing:
        raise PosteriorError(
            f"{p} lacks posterior variables {missing[:3]}; refit with `servingmath fit`"
        )
    return Posterior(idata, str(p))


def save_posterior(posterior: Posterior | object, path: str | Path) -> Path:
    """Write the ``InferenceData`` (compressed netCDF, h5netcdf engine)."""
    idata = posterior.idata if isinstance(posterior, Posterior) else posterior
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    idata.to_netcdf(str(path))
    return path


OPTIONAL_PARAMS = (
    "collective_base_latency_s",
    "attention_overhead_s",
    "attention_cta_s",
    "collective_ll_bandwidth_ratio",
    "collective_simple_latency_s",
    "attention_tile_share",
    "elementwise_launch_overlap",
)
"""Parameters added after the first posteriors were written: a file without one uses the
field's default (``Efficiency`` / ``KernelEfficiency``), so older posteriors keep loading."""


def _default_value(name: str) -> float:
    obj = Efficiency() if name in EFFICIENCY_FIELDS else KernelEfficiency()
    return float(getattr(obj, name))


def _draw_indices(posterior: Posterior, num_draws: int, rng: np.random.Generator) -> np.ndarray:
    total = posterior.num_draws
    return rng.choice(total, size=num_draws, replace=num_draws > total)


def parameter_draws(
    posterior: Posterior, gpus: tuple[str, ...], idx: np.ndarray, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Every parameter for ``gpus`` at posterior draws ``idx``: shape (len(idx), len(gpus));
    a GPU the posterior lacks is drawn from the population mu_p + tau_p * z, z from a stream of
    its own (``rng`` and the CRC-32 of its name), so unseen GPUs are independent of each other."""
    known = {g: i for i, g in enumerate(posterior.gpus)}
    unseen = [g for g in gpus if g not in known]
    # each unseen GPU's population draws come from its own stream, keyed by a stable hash of its
    # name: two GPUs drawn with the same seed (in one call or two) are independent, not equal
    base = int(rng.integers(2**32)) if unseen else 0
    streams = {g: np.random.default_rng([base, zlib.crc32(g.encode())]) for g in unseen}
    out = {}
    for name in PARAM_NAMES:
        if name not in posterior.idata.posterior:  # an older file: the field's default
            out[name] = np.full((len(idx), len(gpus)), _default_value(name))
            continue
        per_gpu = posterior.flat(name)[idx]
        pooled = f"mu_{name}" in posterior.idata.posterior
        if pooled:
            mu, tau = posterior.flat(f"mu_{name}")[idx], posterior.flat(f"tau_{name}")[idx]
        cols = []
        for g in gpus:
            if g in known:
                cols.append(per_gpu[:, known[g]])
            elif not pooled:  # an update of an older file: no population for this field
                cols.append(np.full(len(idx), _default_value(name)))
            else:
                z = streams[g].standard_normal(len(idx))
                cols.append(np.asarray(to_natural(name, jnp.asarray(mu + tau * z))))
        out[name] = np.stack(cols, axis=1) if cols else np.zeros((len(idx), 0))
    return out


def _cell_offsets(
    posterior: Posterior, cell: str, idx: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Offset draws of one cell; an unseen cell draws from N(0, tau_src)."""
    if cell in posterior.cells:
        return posterior.flat("cell_offset")[idx, posterior.cells.index(cell)]
    tau = "tau_kernel" if kernel_cells([cell])[0] else "tau_source"
    return posterior.flat(tau)[idx] * rng.standard_normal(len(idx))


def _source_offsets(
    posterior: Posterior, source: str | None, idx: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """A source's offset for whole-model budgets: the mean of its step-level cells (prefill,
    decode, static batch, serving), else of all its cells; None/unseen: N(0, tau_src)."""
    cells = [i for i, c in enumerate(posterior.cells) if c.split("|")[0] == source]
    step = [
        i
        for i in cells
        if not posterior.cells[i].split("|")[1].startswith(("op:", "collective:", "comm:"))
    ]
    use = step or cells
    if source is None or not use:
        return posterior.flat("tau_source")[idx] * rng.standard_normal(len(idx))
    return posterior.flat("cell_offset")[idx][:, use].mean(axis=1)


def efficiency_draws(
    posterior: Posterior,
    gpu: str,
    num_draws: int,
    *,
    seed: int = 0,
    source: str | None = None,
    weight_dtype: str = "bf16",
) -> Efficiency:
    """``num_draws`` posterior draws of ``perfmodel.Efficiency`` for ``gpu`` (leading axis).

    An unseen ``gpu`` draws from the population (mu, tau).  ``source`` (``"vidur:sarathi"``,
    ``"trtllm-docs-v0.9:trtllm"``, ... as in ``posterior.sources``) folds that source's offset
    delta into the fractions (divided by e^delta) and fixed costs (times e^delta), which scales
    every roofline/collective time by e^delta exactly; None or an unseen source draws delta from
    N(0, tau_src), widening the spread.  FP8/FP4/INT8 ``weight_dtype`` derates
    ``compute_fraction_max`` by the fitted ``low_precision_compute_ratio``.
    """
    rng = np.random.default_rng(seed)
    idx = _draw_indices(posterior, num_draws, rng)
    p = {k: v[:, 0] for k, v in parameter_draws(posterior, (gpu,), idx, rng).items()}
    scale = np.exp(_source_offsets(posterior, source, idx, rng))
    fields = {f: p[f] for f in EFFICIENCY_FIELDS}
    for f in ("compute_fraction_max", "bandwidth_fraction", "collective_bandwidth_fraction"):
        fields[f] = fields[f] / scale
    for f in ("step_overhead_s", "collective_latency_s", "collective_base_latency_s"):
        fields[f] = fields[f] * scale
    comm = f"{source}|comm:latency"
    if source is not None and comm in posterior.cells:  # the source's own TP all-reduce latency
        lat = np.exp(posterior.flat("cell_offset")[idx, posterior.cells.index(comm)])
        for f in ("collective_latency_s", "collective_base_latency_s"):
            fields[f] = fields[f] * lat
    if weight_dtype in _LOW_PRECISION:
        fields["compute_fraction_max"] = (
            fields["compute_fraction_max"] * p["low_precision_compute_ratio"]
        )
    return Efficiency(**{k: jnp.asarray(v) for k, v in fields.items()})


def kernel_efficiency_draws(
    posterior: Posterior, gpu: str, num_draws: int, *, seed: int = 0
) -> KernelEfficiency:
    """``num_draws`` draws of ``KernelEfficiency`` for ``gpu`` (population for an unseen GPU)."""
    rng = np.random.default_rng(seed)
    idx = _draw_indices(posterior, num_draws, rng)
    p = parameter_draws(posterior, (gpu,), idx, rng)
    return KernelEfficiency(**{f: jnp.asarray(p[f][:, 0]) for f in KERNEL_FIELDS})


def gpu_group_draws(
    posterior: Posterior,
    gpus: tuple[str, ...],
    keys: tuple[str, ...],
    idx: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """GPU x group bias draws eta_gk on log time, (draws, gpus, keys): fitted pairs keep theirs,
    an unseen GPU or kernel group draws N(0, tau_gpu) (its own bias, unknown); a fitted GPU's
    whole-model groups, anchor groups, serving groups and older posterior files without the term
    get 0.

    An unseen GPU's whole-model groups (prefill, decode step, static batch) also draw
    N(0, tau_gpu): their (source, scenario) offsets were learned on the GPUs each source measured
    (most sources measured one), so how the same engine fares on another GPU is a GPU x scenario
    bias the fit cannot see, of the size the kernel groups' GPU biases show.  Fitted GPUs keep 0
    (their rows pinned the offsets), so in-sample intervals are unchanged."""
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
        if k.startswith("serving:"):
            continue
        kernel = kernel_groups([k])[0]
        whole_model = not k.startswith(("op:", "collective:"))
        for i, g in enumerate(gpus):
            if g in fit_gpus and k in fit_keys:
                out[:, i, j] = eta[:, fit_gpus.index(g), fit_keys.index(k)]
            else:
                unseen_gpu_step = whole_model and g not in fit_gpus
                tau = tau_k if kernel or unseen_gpu_step else zero
                out[:, i, j] = tau * rng.standard_normal(len(idx))
    return out


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

    log y = log f(theta_g; delta_cell) + eta_gk + sigma_group * t_nu (the cell offset adds to log time, or
    scales a collective's latency); unseen GPUs and cells take population draws (an unseen group's
    sigma is the largest fitted one).
    """
    rng = np.random.default_rng(seed)
    idx = _draw_indices(posterior, num_draws, rng)
    params = parameter_draws(posterior, prep.gpus, idx, rng)
    offsets = (
        np.stack([_cell_offsets(posterior, c, idx, rng) for c in prep.cells], axis=1)
        if prep.cells
        else np.zeros((len(idx), 0))
    )
    keys = posterior.noise_keys
    sig_all = posterior.flat("sigma")[idx]
    sig = np.stack(
        [sig_all[:, keys.index(k)] if k in keys else sig_all.max(axis=1) for k in prep.noise_keys],
        axis=1,
    )
    xs = ({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(offsets))
    n_serving = len(prep.blocks["serving"]["pos"]) if "serving" in prep.blocks else 0
    # serving_metrics holds ~1 MB of quadrature nodes per row and draw: chunk the draws so one
    # chunk stays near SERVING_ROW_DRAWS_PER_CHUNK row-draws
    batch = max(1, SERVING_ROW_DRAWS_PER_CHUNK // n_serving) if n_serving else num_draws
    loc = map_chunks(lambda p, o: predict_log(prep, p, o), xs, min(batch, num_draws))
    eta = gpu_group_draws(posterior, prep.gpus, prep.noise_keys, idx, rng)
    loc = loc + eta[:, prep.gpu_idx, prep.noise_idx]
    if not noise:
        return loc
    eps = rng.standard_t(STUDENT_DF, size=loc.shape)
    return loc + sig[:, prep.noise_idx] * eps
