"""How much a GPU update learned, and where one more run would teach most ("how many runs are
enough").

After ``update_posterior`` conditions a posterior on a user's end-to-end runs of one GPU, this
module predicts a few reference points of that GPU (a closed loop of ``REFERENCE_CONCURRENCIES``
clients at the runs' median prompt and output lengths, model, TP, dtypes and engine) under the
prior (the spec sheet and the population of fitted GPUs) and under the update, and compares the
90 % predictive intervals as relative widths hi / lo (a width of 1.2x: the 95th percentile is 20 %
above the 5th).  The point whose interval stays widest after the update is where a run would help
most.  It also compares the GPU's main efficiencies (``EFFICIENCY_FIELDS``) with their prior.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pandas as pd

from ._groups import noise_key
from ._model import to_natural
from ._posterior import Posterior
from ._predictive import predictive_log_draws
from ._rows import EFFICIENCY_FIELDS, prepare
from ._update import E2E_SCENARIOS, gpu_prior, user_hardware, without_gpu
from ._update_groups import MIN_SCALE, gpu_group_prior

REFERENCE_CONCURRENCIES = (8.0, 64.0)
"""Closed-loop clients of the reference points: a lightly and a heavily batched decode."""
REFERENCE_METRICS = (("tpot", "p95", "s"), ("output_throughput", "", "tokens/s"))
"""(metric, stat, unit) predicted at each reference concurrency."""
QUANTILES = (0.05, 0.5, 0.95)
"""The 90 % central interval and the median."""
PLACEHOLDER_VALUE = 1.0
"""``value`` of a reference row: ``prepare`` needs a positive one; only predictions are read."""


@dataclass(frozen=True)
class Interval:
    """Median and 90 % central interval of a positive quantity (its own unit)."""

    lo: float
    median: float
    hi: float

    @property
    def width(self) -> float:
        """Relative width hi / lo (1.0: no uncertainty)."""
        return self.hi / self.lo


@dataclass(frozen=True)
class ReferencePoint:
    """One reference prediction of the updated GPU, before and after the update."""

    concurrency: float
    metric: str
    stat: str
    unit: str
    before: Interval
    after: Interval

    @property
    def label(self) -> str:
        what = f"{self.stat} {self.metric}" if self.stat else self.metric
        return f"{what}, {self.concurrency:g} clients"


@dataclass(frozen=True)
class ParameterShift:
    """One efficiency of the updated GPU: prior and updated median and 90 % interval."""

    name: str
    before: Interval
    after: Interval


@dataclass(frozen=True)
class UpdateReport:
    """What ``update_posterior`` learned about ``gpu``.

    Attributes:
        gpu, model, tp, engine, source: the reference deployment (the runs' most common one).
        input_len, output_len: the runs' median prompt and output lengths (tokens).
        serving_rows, serving_rows_available: end-to-end rows the update used / was given.
        points: the reference predictions (empty when the update had no end-to-end run).
        parameters: the GPU's ``EFFICIENCY_FIELDS``, prior against updated.
        biases: per end-to-end group the update measured (``serving:ttft`` ...), the factor
            exp(eta) by which the GPU's runs sit off what the step and load models with the
            engine's offsets give, prior against updated (empty for a GPU the prior fitted).
    """

    gpu: str
    model: str
    tp: int
    engine: str
    source: str
    input_len: float
    output_len: float
    serving_rows: int
    serving_rows_available: int
    points: tuple[ReferencePoint, ...]
    parameters: tuple[ParameterShift, ...]
    biases: tuple[ParameterShift, ...] = ()

    @property
    def widest(self) -> ReferencePoint | None:
        """The reference point whose updated interval is widest: where a run would help most."""
        return max(self.points, key=lambda p: p.after.width, default=None)


def _interval(values: np.ndarray) -> Interval:
    lo, med, hi = (float(v) for v in np.quantile(values, QUANTILES))
    return Interval(lo, med, hi)


def reference_rows(runs: pd.DataFrame, gpu: str) -> pd.DataFrame:
    """Closed-loop rows of ``gpu`` at ``REFERENCE_CONCURRENCIES`` x ``REFERENCE_METRICS``, at the
    deployment of its most common run (model, TP, dtypes, source, engine, notes: the length
    distribution the benchmark drew) and the runs' median lengths; no row without such a run."""
    mine = runs[(runs["gpu"] == gpu) & runs["scenario"].isin(E2E_SCENARIOS)]
    if not len(mine):
        return mine.iloc[:0]
    config = ["model", "tp", "weight_dtype", "kv_dtype", "source", "engine"]
    modal = mine.groupby(config, dropna=False, sort=False).size().idxmax()
    same = mine[
        (mine[config].astype(str) == pd.Series(modal, index=config).astype(str)).all(axis=1)
    ]
    base = same.iloc[0]
    rows = []
    for conc in REFERENCE_CONCURRENCIES:
        for metric, stat, unit in REFERENCE_METRICS:
            rows.append(
                base.to_dict()
                | {
                    "scenario": "serving",
                    "concurrency": conc,
                    "request_rate": np.nan,
                    "input_len": round(float(np.nanmedian(same["input_len"].astype(float)))),
                    "output_len": round(float(np.nanmedian(same["output_len"].astype(float)))),
                    "metric": metric,
                    "stat": stat,
                    "unit": unit,
                    "value": PLACEHOLDER_VALUE,
                }
            )
    return pd.DataFrame(rows, columns=runs.columns).astype(runs.dtypes.to_dict())


def _predict(posterior: Posterior, rows, hardware_csv, num_draws: int, seed: int) -> list:
    with user_hardware(hardware_csv):
        prep = prepare(
            rows, gpus=posterior.gpus, cells=posterior.cells, noise_keys=posterior.noise_keys
        )
    if len(prep.log_value) != len(rows):
        return []
    draws = predictive_log_draws(posterior, prep, num_draws, seed=seed)
    return [_interval(np.exp(draws[:, j])) for j in range(len(rows))]


def update_report(
    prior: Posterior,
    updated: Posterior,
    runs: pd.DataFrame,
    *,
    gpu: str | None = None,
    from_population: bool = False,
    hardware_csv: str | Path | None = None,
    num_draws: int = 200,
    seed: int = 0,
) -> UpdateReport:
    """Reference predictions and efficiencies of the updated GPU, prior against update.

    Args:
        prior: the posterior ``update_posterior`` started from.
        updated: its result.
        runs: the rows it was fitted on (``Prepared.table``).
        gpu: the GPU to report (default: the one with most end-to-end rows, else the first).
        from_population: as given to ``update_posterior`` (the prior is then the population's).
        hardware_csv: spec rows of GPUs the catalog lacks.
        num_draws, seed: predictive draws per reference point.
    """
    e2e = runs[runs["scenario"].isin(E2E_SCENARIOS)]
    if gpu is None:
        counts = (e2e if len(e2e) else runs)["gpu"].value_counts()
        gpu = str(counts.index[0])
    start = without_gpu(prior, gpu) if from_population and gpu in prior.gpus else prior
    rows = reference_rows(runs, gpu)
    points: tuple[ReferencePoint, ...] = ()
    if len(rows):
        before = _predict(start, rows, hardware_csv, num_draws, seed)
        after = _predict(updated, rows, hardware_csv, num_draws, seed)
        if before and after:
            points = tuple(
                ReferencePoint(float(r["concurrency"]), r["metric"], r["stat"], r["unit"], b, a)
                for (_, r), b, a in zip(rows.iterrows(), before, after)
            )
    z = np.asarray([-1.6448536269514722, 0.0, 1.6448536269514722])  # N(0, 1) 5/50/95 %
    params = []
    prior_u = gpu_prior(prior, gpu, from_population=from_population)
    for name in EFFICIENCY_FIELDS:
        m, s = prior_u[name]
        lo, med, hi = (float(v) for v in np.asarray(to_natural(name, jnp.asarray(m + s * z))))
        post = updated.flat(name)[:, updated.gpus.index(gpu)]
        params.append(ParameterShift(name, Interval(lo, med, hi), _interval(post)))
    attrs = updated.idata.attrs
    biases = _bias_shifts(prior, updated, gpu, e2e, from_population, z)
    base = rows.iloc[0] if len(rows) else runs[runs["gpu"] == gpu].iloc[0]
    return UpdateReport(
        gpu=gpu,
        model=str(base["model"]),
        tp=int(base["tp"]) if pd.notna(base["tp"]) else 1,
        engine=str(base["engine"]),
        source=str(base["source"]),
        input_len=float(base["input_len"]) if len(rows) else float("nan"),
        output_len=float(base["output_len"]) if len(rows) else float("nan"),
        serving_rows=int(attrs.get("update_serving_rows", len(e2e))),
        serving_rows_available=int(attrs.get("serving_rows_available", len(e2e))),
        points=points,
        parameters=tuple(params),
        biases=biases,
    )


def _bias_shifts(prior, updated, gpu, e2e, from_population, z) -> tuple[ParameterShift, ...]:
    """exp(eta) of ``gpu`` on each end-to-end group its runs measured whose prior had spread
    (``gpu_group_prior``), prior against updated."""
    post = updated.idata.posterior
    if "gpu_group" not in post or not len(e2e):
        return ()
    keys = tuple(sorted(set(e2e[e2e["gpu"] == gpu].apply(noise_key, axis=1))))
    groups = [str(k) for k in post["gpu_group"].coords["group"].values]
    loc, scale = gpu_group_prior(prior, [gpu], keys, from_population=from_population)
    shifts = []
    for j, key in enumerate(keys):
        if key not in groups or scale[0, j] <= MIN_SCALE:
            continue
        lo, med, hi = np.exp(loc[0, j] + scale[0, j] * z)
        after = updated.flat("gpu_group")[:, updated.gpus.index(gpu), groups.index(key)]
        shifts.append(ParameterShift(key, Interval(lo, med, hi), _interval(np.exp(after))))
    return tuple(shifts)
