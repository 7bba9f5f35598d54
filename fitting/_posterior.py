"""The calibrated posterior: load/save (ArviZ netCDF), per-GPU ``Efficiency`` draws, predictive draws.

A GPU or source the fit never saw gets the population: u = mu_p + tau_p * z, z ~ N(0, 1), on each
parameter's unconstrained scale (``_model``), and a cell offset delta ~ N(0, tau_src).  So a new
accelerator is predicted from its spec sheet with the pooled efficiencies, and a new lab or engine
widens the interval instead of shifting it (Gelman et al., BDA3 ch. 5).
"""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import perfmodel
from perfmodel import KERNEL_FIELDS, Efficiency

from ._names import (  # noqa: F401  (EFFICIENCY_FIELDS re-exported: the draw path's names)
    EFFICIENCY_FIELDS,
    ENGINE_ALL_REDUCE_CELL,
    LOCKSTEP_TTFT_GROUP,
    PARAM_NAMES,
    fitted_efficiency,
    stand_in_group,
)

DEFAULT_POSTERIOR = "posteriors/default.nc"
"""Bundled posterior, relative to ``perfmodel.data_dir()``."""

_LOW_PRECISION = {"fp8", "fp4", "int8"}


class PosteriorError(ValueError):
    """A posterior file that cannot be read or lacks what is asked of it; the message says why."""


class Posterior:
    """A fitted (or prior-only) calibration: ArviZ ``InferenceData`` plus its labels.

    Attributes:
        idata: the ``InferenceData``; group ``posterior`` holds ``mu_<p>``, ``tau_<p>``, the per-GPU
            ``<p>`` (natural units, dim ``gpu``), ``tau_source``, ``cell_offset`` (dim ``cell``,
            ``"<source>:<engine>|<group>"``) and ``sigma`` (dim ``noise_key``).  A posterior read
            from the compact draw cache (``load_posterior(..., cache_dir=...)``) holds the
            posterior group's arrays instead and reads the netCDF only when ``idata`` is asked
            for (attributes, groups other than ``posterior``, xarray selections).
        path: the file it came from (None when built in memory).
    """

    def __init__(self, idata: object = None, path: str | None = None, *, arrays=None):
        if idata is None and (arrays is None or path is None):
            raise ValueError(
                "Posterior needs an InferenceData, or arrays and the file they came from"
            )
        self._idata = idata
        self.path = path
        self._arrays: dict[str, np.ndarray] | None = arrays

    def __repr__(self) -> str:
        return f"Posterior(path={self.path!r}, draws={self.num_draws})"

    @property
    def idata(self):
        if self._idata is None:
            self._idata = _read_netcdf(Path(self.path))
        return self._idata

    def has(self, var: str) -> bool:
        """Whether the posterior group holds variable ``var``."""
        if self._arrays is not None:
            return f"{_VAR}{var}" in self._arrays
        return var in self.idata.posterior

    def values(self, var: str) -> np.ndarray:
        """Draws of ``var`` as stored: (chain, draw, ...)."""
        if self._arrays is not None:
            try:
                return self._arrays[f"{_VAR}{var}"]
            except KeyError:
                raise KeyError(var) from None
        return np.asarray(self.idata.posterior[var].values)

    def _coord(self, dim: str) -> tuple[str, ...]:
        if self._arrays is not None:
            try:
                return tuple(str(v) for v in self._arrays[f"{_COORD}{dim}"])
            except KeyError:
                raise KeyError(dim) from None
        return tuple(str(v) for v in self.idata.posterior[dim].values)

    @property
    def gpus(self) -> tuple[str, ...]:
        return self._coord("gpu")

    @property
    def cells(self) -> tuple[str, ...]:
        return self._coord("cell")

    @property
    def sources(self) -> tuple[str, ...]:
        """Source/engine labels (``vidur:sarathi``) the fit saw."""
        return tuple(sorted({c.split("|")[0] for c in self.cells}))

    @property
    def noise_keys(self) -> tuple[str, ...]:
        return self._coord("noise_key")

    @property
    def num_draws(self) -> int:
        if self._arrays is not None:
            chains, draws = self._arrays[_SIZES]
            return int(chains * draws)
        p = self.idata.posterior
        return int(p.sizes["chain"] * p.sizes["draw"])

    def flat(self, var: str) -> np.ndarray:
        """Draws of ``var`` with chain and draw merged into one leading axis."""
        v = self.values(var)
        return v.reshape((-1,) + v.shape[2:])


def default_posterior_path() -> Path:
    return perfmodel.data_dir() / DEFAULT_POSTERIOR


def load_posterior(
    path: str | Path | None = None, *, cache_dir: str | Path | None = None
) -> Posterior:
    """Read a posterior netCDF (default: the bundled ``data/posteriors/default.nc``).

    With ``cache_dir``, the posterior group's draws are also kept there as an uncompressed
    ``.npz`` keyed by the file's resolved path, size, mtime and inode: a later call with the same
    unchanged file reads those arrays with NumPy (tens of milliseconds) instead of importing
    ArviZ/xarray and decoding the netCDF (seconds), and gets the very same numbers.  A changed
    file misses (its old entry is removed); an unreadable or unwritable cache falls back to the
    netCDF.

    Raises:
        PosteriorError: missing or unreadable file, or not a servingmath posterior.
    """
    p = Path(path) if path is not None else default_posterior_path()
    if not p.is_file():
        raise PosteriorError(
            f"no posterior at {p}; pass --posterior FILE or run `python -m fitting.fit_bundled`"
        )
    entry = _cache_entry(p, Path(cache_dir)) if cache_dir is not None else None
    if entry is not None:
        arrays = _read_cache(entry)
        if arrays is not None:
            _check_variables(p, lambda v: f"{_VAR}{v}" in arrays)
            return Posterior(None, str(p), arrays=arrays)
    idata = _read_netcdf(p)
    _check_variables(p, lambda v: v in idata.posterior)
    if entry is not None:
        _write_cache(idata, entry)
    return Posterior(idata, str(p))


def _read_netcdf(p: Path):
    import arviz as az

    try:
        return az.from_netcdf(str(p))
    except Exception as exc:  # noqa: BLE001  (h5py/xarray raise many types for a bad file)
        raise PosteriorError(
            f"cannot read posterior {p} ({type(exc).__name__}); is it a netCDF from `servingmath fit`?"
        ) from None


def _check_variables(p: Path, present) -> None:
    needed = [n for n in PARAM_NAMES if n not in OPTIONAL_PARAMS]
    missing = [v for v in (*needed, "sigma", "cell_offset") if not present(v)]
    if missing:
        raise PosteriorError(
            f"{p} lacks posterior variables {missing[:3]}; refit with `servingmath fit`"
        )


POSTERIOR_CACHE_FORMAT = 1
"""Part of every cache key: a change to what the ``.npz`` holds invalidates the old entries."""
_VAR, _COORD, _SIZES = "var:", "coord:", "sizes"
"""``.npz`` keys: ``var:<name>`` (chain, draw, ...) arrays, ``coord:<dim>`` labels (unicode),
``sizes`` = (chains, draws)."""


def _cache_entry(p: Path, cache_dir: Path) -> Path | None:
    """``<cache_dir>/<hash of the path>-<hash of size, mtime, inode, format>.npz``; None when the
    file cannot be stat'ed."""
    try:
        st = p.stat()
        where = str(p.resolve())
    except OSError:
        return None
    state = f"{POSTERIOR_CACHE_FORMAT}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    key = hashlib.sha256(where.encode()).hexdigest()[:16]
    return cache_dir / f"{key}-{hashlib.sha256(state.encode()).hexdigest()[:16]}.npz"


def _read_cache(entry: Path) -> dict[str, np.ndarray] | None:
    try:
        with np.load(entry, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001  (a truncated or foreign file: read the netCDF instead)
        return None
    return arrays if _SIZES in arrays else None


def _write_cache(idata, entry: Path) -> None:
    """Write the posterior group's arrays to ``entry`` (atomically: a temporary file renamed),
    then remove the entries of older versions of the same file.  Failure leaves no cache."""
    post = idata.posterior
    arrays = {f"{_VAR}{k}": np.asarray(v.values) for k, v in post.data_vars.items()}
    if any(a.dtype == object for a in arrays.values()):
        return  # object arrays would need pickle to load back: keep reading the netCDF
    for dim in post.coords:
        if dim not in ("chain", "draw"):
            arrays[f"{_COORD}{dim}"] = np.asarray([str(v) for v in post[dim].values], dtype=str)
    arrays[_SIZES] = np.asarray([post.sizes["chain"], post.sizes["draw"]], dtype=np.int64)
    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, entry)
        for old in entry.parent.glob(f"{entry.name.split('-')[0]}-*.npz"):
            if old != entry:
                old.unlink(missing_ok=True)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


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
    return float(getattr(Efficiency(), name))


def draw_indices(posterior: Posterior, num_draws: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``num_draws`` posterior draws, at random (with replacement when it has fewer)."""
    total = posterior.num_draws
    return rng.choice(total, size=num_draws, replace=num_draws > total)


def named_stream(seed: int, name: str) -> np.random.Generator:
    """A random stream of its own for the draws of one named thing (an unseen GPU, a cut-stage
    cell or noise key): seeded by ``seed`` and the CRC-32 of ``name``, so its draws do not move
    when other names are added or dropped, only when ``seed`` does."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


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
    streams = {g: named_stream(base, g) for g in unseen}
    out = {}
    for name in PARAM_NAMES:
        if not posterior.has(name):  # an older file: the field's default
            out[name] = np.full((len(idx), len(gpus)), _default_value(name))
            continue
        per_gpu = posterior.flat(name)[idx]
        pooled = posterior.has(f"mu_{name}")
        if pooled:
            mu, tau = posterior.flat(f"mu_{name}")[idx], posterior.flat(f"tau_{name}")[idx]
        cols = []
        for g in gpus:
            if g in known:
                cols.append(per_gpu[:, known[g]])
            elif not pooled:  # an update of an older file: no population for this field
                cols.append(np.full(len(idx), _default_value(name)))
            else:
                from ._model import to_natural  # NumPyro's import only for an unseen GPU

                z = streams[g].standard_normal(len(idx))
                cols.append(np.asarray(to_natural(name, jnp.asarray(mu + tau * z))))
        out[name] = np.stack(cols, axis=1) if cols else np.zeros((len(idx), 0))
    return out


ENGINE_PREFIX = "engine:"
"""Pooled cells ``"engine:<engine>|<group>"``: the offset a source never seen draws, the
random-effects predictive of the seen sources' offsets (``_serving_stage._engine_cells``)."""
ANY_ENGINE = "*"
"""Engine of the pooled cell an engine never seen draws from (``"engine:*|<group>"``)."""


def cell_offset_draws(
    posterior: Posterior, cell: str, idx: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Offset draws of one cell; an unseen cell takes its engine's pooled cell
    (``"engine:<engine>|<group>"``, the serving stage's), else the any-engine pooled cell
    (``"engine:*|<group>"``), else N(0, tau_src)."""
    found = stand_in_cell(posterior, cell)
    if found is not None:
        return posterior.flat("cell_offset")[idx, posterior.cells.index(found)]
    from ._model import kernel_cells

    tau = "tau_kernel" if kernel_cells([cell])[0] else "tau_source"
    return posterior.flat(tau)[idx] * rng.standard_normal(len(idx))


def stand_in_cell(posterior: Posterior, cell: str) -> str | None:
    """The fitted cell whose offset draws ``cell`` takes: itself when fitted, else its engine's
    pooled cell ``"engine:<engine>|<group>"``, else ``"engine:*|<group>"``; for a group the
    posterior never fitted, the same search in its stand-in group (``STAND_IN_GROUPS``); None
    when there is none of them (the offset is then N(0, tau_src) or N(0, tau_kernel))."""
    if cell in posterior.cells:
        return cell
    source, _, key = cell.partition("|")
    engine = f"{ENGINE_PREFIX}{source.split(':')[-1]}|{key}" if ":" in source else None
    for pooled in (engine, f"{ENGINE_PREFIX}{ANY_ENGINE}|{key}"):
        if pooled in posterior.cells:
            return pooled
    if not any(c.endswith(f"|{key}") for c in posterior.cells):  # a group never fitted
        stand_in = stand_in_group(key)
        if stand_in is not None:
            return stand_in_cell(posterior, f"{source}|{stand_in}")
    return None


ENGINE_SCALE_METRICS = {"ttft_scale": "serving:ttft", "tpot_scale": "serving:tpot"}
"""``Efficiency`` field -> the end-to-end group whose fitted offset it carries: closed-loop runs,
which three engines and two labs measured (the open-loop cells are one harness's, MLPerf's, with
its prompt lengths unrecorded)."""


def engine_offset_draws(
    posterior: Posterior,
    group: str,
    idx: np.ndarray,
    source: str | None = None,
    engine: str | None = None,
) -> np.ndarray:
    """Offset draws of an end-to-end ``group`` (``"serving:ttft"``) for answers: ``source``'s own
    cell when fitted, else ``engine``'s pooled cell, else the any-engine one (the random-effects
    predictive of a lab never seen: its draws carry the labs' disagreement); zeros when the
    posterior has no end-to-end stage (the physics alone)."""
    names = [f"{source}|{group}"] if source else []
    if engine:
        names.append(f"{ENGINE_PREFIX}{engine}|{group}")
    names.append(f"{ENGINE_PREFIX}{ANY_ENGINE}|{group}")
    for name in names:
        if name in posterior.cells:
            return posterior.flat("cell_offset")[idx, posterior.cells.index(name)]
    return np.zeros(len(idx))


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
    engine: str | None = None,
    lockstep: bool = False,
) -> Efficiency:
    """``num_draws`` posterior draws of ``perfmodel.Efficiency`` for ``gpu`` (leading axis).

    An unseen ``gpu`` draws from the population (mu, tau).  ``source`` (``"vidur:sarathi"``,
    ``"trtllm-docs-v0.9:trtllm"``, ... as in ``posterior.sources``) sets ``time_scale`` to that
    source's offset e^delta, which scales every iteration's kernel and communication time; None
    or an unseen source draws delta from N(0, tau_src), widening the spread.  The TP all-reduce
    latencies take the source's ``comm:latency`` offset, else a serving engine's
    (``ENGINE_ALL_REDUCE_CELL``: CUDA-graph custom all-reduce).  ``ttft_scale`` and
    ``tpot_scale`` are e^delta of the end-to-end stage's closed-loop TTFT / TPOT offset of
    ``source``, else of ``engine``'s pooled cell, else of the any-engine pooled cell (a lab never
    seen: ``engine_scale_draws``); 1 without an end-to-end stage.  A ``lockstep`` loop (a
    prefill-first engine at fixed lengths, ``perfmodel._closed_loop``) takes its TTFT scale from
    ``LOCKSTEP_TTFT_GROUP`` instead (1 where no lockstep run was fitted: its physics prices the
    wave whole).  ``weight_dtype`` is
    accepted for compatibility: the FP8/FP4 derate is applied by the step model from the
    deployment's GEMM dtype (``low_precision_compute_ratio``).
    """
    del weight_dtype
    rng = np.random.default_rng(seed)
    idx = draw_indices(posterior, num_draws, rng)
    p = {k: v[:, 0] for k, v in parameter_draws(posterior, (gpu,), idx, rng).items()}
    scales = {"time_scale": np.exp(_source_offsets(posterior, source, idx, rng))}
    for field, metric in ENGINE_SCALE_METRICS.items():
        if lockstep and field == "ttft_scale":
            metric = LOCKSTEP_TTFT_GROUP
        scales[field] = np.exp(engine_offset_draws(posterior, metric, idx, source, engine))
    eff = fitted_efficiency(p, **scales)
    comm = f"{source}|comm:latency"
    if source is None or comm not in posterior.cells:
        comm = ENGINE_ALL_REDUCE_CELL  # a serving engine's CUDA-graph custom all-reduce
    if comm not in posterior.cells:
        return eff
    # the TP all-reduce latency of that source (or engine)
    offset = posterior.flat("cell_offset")[idx, posterior.cells.index(comm)]
    return eff.with_collective_latency_scale(jnp.asarray(np.exp(offset)))


def kernel_efficiency_draws(
    posterior: Posterior, gpu: str, num_draws: int, *, seed: int = 0
) -> Efficiency:
    """``num_draws`` draws of the kernel-level fields for ``gpu`` (population for an unseen GPU),
    in an ``Efficiency`` whose other fields are the defaults."""
    rng = np.random.default_rng(seed)
    idx = draw_indices(posterior, num_draws, rng)
    p = parameter_draws(posterior, (gpu,), idx, rng)
    return Efficiency(**{f: jnp.asarray(p[f][:, 0]) for f in KERNEL_FIELDS})
