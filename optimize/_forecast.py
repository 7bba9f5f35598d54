"""Procurement forecast: GPUs per type and period, with intervals from demand x posterior.

For each candidate GPU type the configuration (TP, PP, dtypes, token budget) is the cheapest the
search finds at the peak expected demand; then, per period, every posterior draw d is paired with a
demand draw lambda_d ~ Normal(rate, sd) truncated at 0, and the fewest replicas R_d meeting every
constraint in that draw is found by bisection (each constraint improves with R).  GPUs needed
= R_d * TP * PP; the 50 % / 80 % / 95 % intervals are quantiles of that joint sample.
"""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from perfmodel import System

from ._evaluate import (
    constraint_slacks,
    constraints_hold,
    costs_at_min_replicas,
    gpus_per_replica,
    spec_step,
)
from ._grid import (
    chunk_from_weights,
    deployment_from_weights,
    grid_tables,
    on_gpu_type,
    one_hot_weights,
)
from ._metrics import slo_metrics
from ._problem import Problem
from ._program_cache import cached_jit
from ._search import SearchResult, search
from ._sharding import MeshLike, device_mesh, num_shards, shard_draws, shard_rows
from ._verify import ONE_OFF

INTERVALS = {"p80": (0.10, 0.90), "p95": (0.025, 0.975)}
"""Central intervals reported besides the median."""


class DemandError(ValueError):
    """A malformed demand CSV; the message names the file, line and field."""


class DemandPeriod(NamedTuple):
    period: str
    requests_per_s: float
    requests_per_s_sd: float


def read_demand(path: str | Path) -> list[DemandPeriod]:
    """Read ``period,requests_per_s[,requests_per_s_sd]`` rows (header required)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise DemandError(f"cannot read demand file {path}: {exc.strerror}") from None
    rows = list(csv.DictReader(text.splitlines()))
    fields = set(rows[0].keys()) if rows else set()
    for need in ("period", "requests_per_s"):
        if need not in fields:
            raise DemandError(
                f"{path}: missing column {need!r}; the header must be "
                "period,requests_per_s[,requests_per_s_sd]"
            )
    out, seen = [], set()
    for line, row in enumerate(rows, start=2):
        period = (row.get("period") or "").strip()
        if not period:
            raise DemandError(f"{path}:{line}: field 'period' is empty; name every period")
        if period in seen:
            raise DemandError(f"{path}:{line}: period {period!r} appears twice")
        seen.add(period)
        values = {}
        for field, required in (("requests_per_s", True), ("requests_per_s_sd", False)):
            raw = (row.get(field) or "").strip()
            if not raw:
                if required:
                    raise DemandError(f"{path}:{line}: field {field!r} is empty (a gap); fill it")
                values[field] = 0.0
                continue
            try:
                v = float(raw)
            except ValueError:
                raise DemandError(
                    f"{path}:{line}: field {field!r} = {raw!r} is not a number"
                ) from None
            if not math.isfinite(v) or v < 0:
                raise DemandError(f"{path}:{line}: field {field!r} = {raw!r} must be >= 0")
            values[field] = v
        out.append(DemandPeriod(period, values["requests_per_s"], values["requests_per_s_sd"]))
    if not out:
        raise DemandError(f"{path}: no rows; add period,requests_per_s lines")
    _check_no_missing_period(path, [r.period for r in out])
    return out


def _period_index(period: str) -> int | None:
    """An integer position for integer periods (``3``), quarters (``2027-Q2``) and months
    (``2027-03``); None otherwise."""
    text = period.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    year, sep, month = text.partition("-")
    if sep and year.isdigit() and len(year) == 4:
        if month.isdigit() and 1 <= int(month) <= 12:
            return int(year) * 12 + int(month) - 1
        if month.upper() in ("Q1", "Q2", "Q3", "Q4"):
            return int(year) * 4 + int(month[1]) - 1
    return None


def _check_no_missing_period(path: Path, periods: list[str]) -> None:
    """Integer, YYYY-Qn or YYYY-MM periods must advance by one step each row (a skipped period is a gap);
    other labels (dates, names) are taken in file order."""
    idx = [_period_index(p) for p in periods]
    if len(idx) < 2 or any(i is None for i in idx):
        return
    for row, (a, b) in enumerate(itertools.pairwise(idx), start=3):
        if b != a + 1:
            what = "is missing (a gap)" if b > a + 1 else "is out of order"
            raise DemandError(
                f"{path}:{row}: period {periods[row - 2]!r} follows {periods[row - 3]!r}: "
                f"the period between {what}; add one row per period, in order"
            )


@cached_jit(compiler_options=ONE_OFF)  # a few rows per call: compile-bound
def replicas_per_draw(problem: Problem, config: jnp.ndarray, rates: jnp.ndarray) -> jnp.ndarray:
    """Fewest replicas (1..max_replicas) meeting every constraint in each draw d at arrival rate
    ``rates[d]``; ``max_replicas + 1`` where even that falls short; 0 where the rate is 0."""
    weights = one_hot_weights(config, problem.grid)
    tables = grid_tables(problem.grid)
    hw = jax.tree_util.tree_map(lambda x: x[config[0]], problem.hardware)
    eff = jax.tree_util.tree_map(lambda x: x[config[0]], problem.efficiency)
    r_max = problem.grid.max_replicas
    chunk, spec = chunk_from_weights(weights, tables), spec_step(problem, weights)

    def ok(e, rate, replicas):
        dep = deployment_from_weights(weights, tables, replicas)
        wl = eqx.tree_at(lambda w: w.arrival_rate_per_s, problem.workload, jnp.maximum(rate, 1e-9))
        m = slo_metrics(System(problem.model, hw, dep, e), wl, chunk_tokens=chunk, spec=spec)
        slack = constraint_slacks(problem, jax.tree_util.tree_map(lambda x: x[None], m))
        return constraints_hold(slack)[0]

    def one(e, rate):
        ok_max = ok(e, rate, float(r_max))

        def step(_, b):
            lo, hi = b
            mid = (lo + hi) // 2
            good = ok(e, rate, mid.astype(float))
            return jnp.where(good, lo, mid), jnp.where(good, mid, hi)

        steps = max(1, (r_max - 1).bit_length())
        _, hi = jax.lax.fori_loop(0, steps, step, (jnp.asarray(0), jnp.asarray(r_max)))
        return jnp.where(rate <= 0, 0, jnp.where(ok_max, hi, r_max + 1))

    return jax.vmap(one)(eff, rates)


def demand_draws(period: DemandPeriod, num_draws: int, seed: int) -> np.ndarray:
    """Normal(rate, sd) draws truncated at 0 (resampled, not clipped, where sd > 0)."""
    rng = np.random.default_rng(seed)
    if period.requests_per_s_sd <= 0:
        return np.full(num_draws, period.requests_per_s)
    draws = rng.normal(period.requests_per_s, period.requests_per_s_sd, size=num_draws)
    for _ in range(20):
        bad = draws < 0
        if not bad.any():
            break
        draws[bad] = rng.normal(
            period.requests_per_s, period.requests_per_s_sd, size=int(bad.sum())
        )
    return np.maximum(draws, 0.0)


def summarize(samples: np.ndarray) -> dict:
    """p50 and the 80 % / 95 % central intervals of a sample (integers stay integers)."""

    def q(p):
        return float(np.quantile(samples, p, method="inverted_cdf"))

    return {"p50": q(0.5), **{k: [q(lo), q(hi)] for k, (lo, hi) in INTERVALS.items()}}


def cheapest_per_gpu(
    problem: Problem, gpus: tuple[str, ...], found: SearchResult | None = None
) -> dict[str, np.ndarray]:
    """The cheapest configuration of each GPU type at the problem's load (``forecast_gpus``'s
    ``configs``, found at the peak demand).

    A type's configuration is the cheapest feasible one on that type alone (``on_gpu_type``: a
    pool split's prefill pool too) among the search's ranked configurations (``found``;
    ``search(problem)`` when None); where the search kept none of a type, it is the cheapest of
    every grid configuration of that type at its fewest replicas
    meeting the chance constraints (``costs_at_min_replicas``).  A type with no feasible
    configuration up to ``problem.grid.max_replicas`` replicas is left out, so the answer is
    empty when nothing is feasible.

    Args:
        problem: one-GPU-type-per-slot problem.
        gpus: the GPU id of each type, in the problem's order (the config's GPU column).
        found: a ``search`` result of ``problem`` (cheapest first), or None to search here.
    """
    if found is None:
        found = search(problem)
    configs, every = {}, None
    for g, name in enumerate(gpus):
        row = found.cheapest_on_gpu_type(g)
        if row is not None:
            configs[name] = found.configs[row]
            continue
        if every is None:  # listed once, for every type the search kept nothing on
            every = problem.grid.all_configs(problem.model)
        on_type = every[on_gpu_type(every, g)]
        _, cost = costs_at_min_replicas(problem, on_type)
        cost = np.asarray(cost)
        if np.isfinite(cost.min()):
            configs[name] = on_type[int(np.argmin(cost))]
    return configs


def forecast_gpus(
    problem: Problem,
    configs: dict[str, np.ndarray],
    demand: list[DemandPeriod],
    *,
    seed: int = 0,
    mesh: MeshLike = None,
) -> list[dict]:
    """Per period: GPUs per type (p50 and intervals) and $/hour of the cheapest type at p50.

    Args:
        problem: one-GPU-type-per-slot problem (``configs`` index into it).
        configs: ``{gpu id: config index vector}`` (its GPU column selects the type).
        demand: periods from ``read_demand``.
        seed: demand-draw seed.
        mesh: devices to split the posterior x demand draws over (``optimize._sharding``); the
            default uses every local device when there are several and the draw count divides.
    """
    mesh = device_mesh(mesh)
    if mesh is not None and problem.num_draws % num_shards(mesh):
        mesh = None
    problem_on_devices = shard_draws(problem, mesh)
    out = []
    for k, period in enumerate(demand):
        rates = demand_draws(period, problem.num_draws, seed + k)
        gpus, costs = {}, {}
        for name, config in configs.items():
            reps = np.asarray(
                replicas_per_draw(
                    problem_on_devices, jnp.asarray(config), shard_rows(jnp.asarray(rates), mesh)
                )
            )
            per = float(gpus_per_replica(problem, jnp.asarray(config)))
            n = np.where(reps > problem.grid.max_replicas, np.inf, reps * per)
            price = float(problem.hardware.price_per_gpu_hour[int(config[0])])
            gpus[name] = summarize(n)
            costs[name] = n * price
        best = min(costs, key=lambda g: np.quantile(costs[g], 0.5))
        c = summarize(costs[best])
        out.append(
            {
                "period": period.period,
                "requests_per_s": period.requests_per_s,
                "requests_per_s_sd": period.requests_per_s_sd,
                "gpus": gpus,
                "recommended_gpu": best,
                "cost_per_hour": {"p50": c["p50"], "p95": c["p95"]},
            }
        )
    return out
