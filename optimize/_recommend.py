"""The answer a person reads: cheapest verified configuration, its cost, metrics and reasons.

``recommend`` runs the gradient search on the search model, re-checks the best distinct
configurations with the verdict model (``perfmodel.dynamics.serving_metrics``; fewest replicas
by bisection), ranks them by verified cost, and explains the winner.  An infeasible problem is a
value: ``feasible = False`` with the closest achievable SLO.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from perfmodel import BINDING_BUDGETS, Efficiency, budget_sheet

from ._describe import _select, describe
from ._engine_args import engine_args
from ._evaluate import (
    constraint_slacks,
    cost_per_hour,
    costs_at_min_replicas,
    draw_metrics,
    holds,
    meets_confidence,
)
from ._explain import SENSITIVITIES, binding_constraint, closest_achievable, cost_elasticities
from ._grid import (
    POOL,
    PREFILL_GPU,
    SPEC,
    deployment_from_weights,
    grid_tables,
    one_hot_weights,
)
from ._metrics import serving_slo_metrics
from ._problem import Problem
from ._search import SearchOptions, search

SECONDS_PER_HOUR = 3600.0


class Recommendation(NamedTuple):
    """A verified answer (``to_json`` gives the CLI's ``--json`` object)."""

    feasible: bool
    config: dict[str, Any] | None
    cost_per_hour: float
    cost_per_million_output_tokens: float
    slo_probability: float
    ttft_s: dict[str, float] | None
    tpot_s: dict[str, float] | None
    binding_constraint: str | None
    binding_budget: str | None
    shadow_prices: dict[str, float]
    cost_elasticities: dict[str, float]
    engine_args: dict[str, str] | None
    alternatives: list[dict[str, Any]]
    closest_achievable: dict[str, Any] | None
    search_seconds: float
    simulator: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        c = self.config or {}
        return {
            "feasible": self.feasible,
            **{
                k: c.get(k)
                for k in (
                    "gpu",
                    "num_gpus",
                    "tp",
                    "pp",
                    "replicas",
                    "max_num_batched_tokens",
                    "chunk_size",
                    "max_num_seqs",
                    "kv_dtype",
                    "weight_dtype",
                    "speculative",
                )
            },
            "disaggregation": c.get("disaggregation"),
            "cost_per_hour": _num(self.cost_per_hour),
            "cost_per_million_output_tokens": _num(self.cost_per_million_output_tokens),
            "slo_probability": self.slo_probability,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "binding_constraint": self.binding_constraint,
            "binding_budget": self.binding_budget,
            "shadow_prices": self.shadow_prices,
            "cost_elasticities": self.cost_elasticities,
            "engine_args": self.engine_args,
            "alternatives": self.alternatives,
            "closest_achievable": self.closest_achievable,
            "simulator": self.simulator,
        }


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _per_million(problem: Problem, cost: float) -> float:
    w = problem.workload
    tokens_per_hour = float(w.arrival_rate_per_s * w.output_tokens_mean) * SECONDS_PER_HOUR
    return cost / tokens_per_hour * 1e6


def _candidates(problem: Problem, found, count: int) -> np.ndarray:
    """The cheapest search results, at most one per (GPU, TP, PP, pool split, prefill GPU),
    ``count`` rows (padded)."""
    picked, seen = [], set()
    for c, k in zip(found.configs, found.cost_per_hour):
        key = (c[0], c[1], c[2], c[POOL], c[PREFILL_GPU])
        if np.isfinite(k) and key not in seen:
            seen.add(key)
            picked.append(c)
        if len(picked) == count:
            break
    while len(picked) < count:
        picked.append(picked[-1] if picked else found.configs[0])
    return np.asarray(picked, dtype=np.int32)


def recommend(
    problem: Problem,
    gpus: tuple[str, ...],
    model_name: str,
    *,
    options: SearchOptions = SearchOptions(),  # noqa: B008 (an immutable NamedTuple)
    num_verified: int = 4,
    verify: bool = True,
    simulate_requests: int = 0,
    draft_name: str | None = None,
) -> Recommendation:
    """Cheapest configuration meeting the chance constraints, verified and explained.

    Args:
        problem: from ``make_problem``.
        gpus: hardware ids in the problem's GPU order (labels).
        model_name: Hugging Face id (for engine command lines).
        options: search options.
        num_verified: distinct configurations re-checked with the verdict model.
        verify: re-check with ``perfmodel.dynamics.serving_metrics`` (False: search model only).
        simulate_requests: > 0 runs the discrete-event simulator (``perfmodel.dynamics.simulate``)
            on that many requests at the posterior-median efficiency and reports its percentiles.
        draft_name: the speculative draft model's id (engine flags), when it is not MTP.
    """
    t0 = time.perf_counter()
    found = search(problem, options)
    feasible_any = bool(len(found.cost_per_hour)) and np.isfinite(found.cost_per_hour[0])
    if not feasible_any:
        return _infeasible(problem, gpus, time.perf_counter() - t0)
    cands = _candidates(problem, found, num_verified)
    reps, costs = costs_at_min_replicas(problem, jnp.asarray(cands))
    reps, costs = np.asarray(reps), np.asarray(costs)
    verdict = None
    if verify:
        reps, costs, verdict = verify_replicas(problem, cands, reps)
    order = np.argsort(costs, kind="stable")
    uniq = []
    for i in order:
        if not any(np.array_equal(cands[i], cands[j]) for j in uniq):
            uniq.append(i)
    best = uniq[0]
    if not np.isfinite(costs[best]):
        return _infeasible(problem, gpus, time.perf_counter() - t0)
    config, r = cands[best], int(reps[best])
    metrics = None if verdict is None else jax.tree_util.tree_map(lambda x: x[best], verdict)
    out = _explain(problem, gpus, model_name, config, r, float(costs[best]), metrics, draft_name)
    alternatives = []
    for i in uniq[1:]:
        if np.isfinite(costs[i]):
            d = describe(problem, gpus, cands[i], int(reps[i]))
            alternatives.append(
                {
                    **d,
                    "cost_per_hour": float(costs[i]),
                    "cost_per_million_output_tokens": _per_million(problem, float(costs[i])),
                }
            )
    sim = None
    if simulate_requests > 0:
        plain = int(config[POOL]) == 0 and problem.grid.spec_k[int(config[SPEC])] == 0
        sim = (
            simulate_check(problem, config, r, simulate_requests)
            if plain
            else {
                "requests": 0,
                "skipped": "the simulator check covers colocated engines without "
                "speculation; run `servingmath simulate --disagg/--spec-draft` on this answer",
            }
        )
    return out._replace(
        alternatives=alternatives, search_seconds=time.perf_counter() - t0, simulator=sim
    )


def simulate_check(problem: Problem, config: np.ndarray, replicas: int, num_requests: int) -> dict:
    """The recommendation in the discrete-event simulator at the posterior-median efficiency:
    its TTFT/TPOT percentiles and whether they meet the SLO bounds."""
    from perfmodel.dynamics import simulate
    from perfmodel.simulator import summarize

    weights = one_hot_weights(jnp.asarray(config), problem.grid)
    dep = deployment_from_weights(weights, grid_tables(problem.grid), float(replicas))
    hw = _select(problem.hardware, int(config[0]))
    eff = _select(problem.efficiency, int(config[0]))
    eff = Efficiency(**{k: jnp.median(getattr(eff, k)) for k in eff.__dataclass_fields__})
    res = summarize(
        simulate(problem.model, hw, dep, eff, problem.workload, num_requests=num_requests)
    )
    ttft = {k: float(res["ttft_s"][k]) for k in ("p50", "p95", "p99")}
    tpot = {k: float(res["tpot_s"][k]) for k in ("p50", "p95", "p99")}
    return {
        "requests": num_requests,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "meets_slo": bool(
            ttft["p95"] <= float(problem.slo_ttft_p95_s)
            and tpot["p95"] <= float(problem.slo_tpot_p95_s)
        ),
    }


VERIFY_FACTORS = (0.5, 1.0, 1.5, 2.0)
"""Replica counts the verdict model tries around the search model's count R: R*f, R-1, R+1, R+2."""


@eqx.filter_jit
def _verdict(problem: Problem, configs: jnp.ndarray, replicas: jnp.ndarray):
    """Verdict-model metrics (per draw) and SLO probability of each (config, replicas) pair."""

    def one(c, r):
        m = draw_metrics(problem, one_hot_weights(c, problem.grid), r, 0.0, serving_slo_metrics)
        return m, jnp.mean(holds(constraint_slacks(problem, m)).astype(float))

    return jax.vmap(one)(configs, replicas)


def verify_replicas(problem: Problem, configs: np.ndarray, search_replicas: np.ndarray):
    """Fewest replicas meeting the chance constraints under the verdict model, among counts near
    the search model's (one flat batch: one compile); ``inf`` cost where none of them does.

    Returns (replicas, costs, metrics): ``metrics`` are the verdict ``SloMetrics`` per draw of
    each config at its returned count (leaves (configs, draws))."""
    trials = []
    for r in search_replicas:
        r = int(min(r, problem.grid.max_replicas))
        near = {max(1, int(np.ceil(r * f))) for f in VERIFY_FACTORS} | {max(1, r - 1), r + 1, r + 2}
        trials.append(sorted(near))
    width = max(len(t) for t in trials)
    trials = [t + [t[-1]] * (width - len(t)) for t in trials]
    flat_c = np.repeat(configs, width, axis=0)
    flat_r = np.asarray(trials, dtype=float).reshape(-1)
    metrics, prob = _verdict(problem, jnp.asarray(flat_c), jnp.asarray(flat_r))
    ok = np.asarray(meets_confidence(np.asarray(prob), float(problem.confidence))).reshape(
        len(configs), width
    )
    pick = np.where(ok.any(axis=1), ok.argmax(axis=1), width - 1)
    reps = np.where(ok.any(axis=1), np.asarray(trials)[np.arange(len(configs)), pick], 0)
    flat_pick = np.arange(len(configs)) * width + pick
    metrics = jax.tree_util.tree_map(lambda x: np.asarray(x)[flat_pick], metrics)
    costs = np.asarray(
        [
            float(cost_per_hour(problem, jnp.asarray(c), float(r))) if r > 0 else np.inf
            for c, r in zip(configs, reps)
        ]
    )
    return reps, costs, metrics


def _summary(q: np.ndarray) -> dict[str, float]:
    """Posterior median of each reported quantile (p50, p95, p99)."""
    med = np.median(np.asarray(q), axis=0)
    return {k: _num(float(v)) for k, v in zip(("p50", "p95", "p99"), med)}


def _explain(
    problem, gpus, model_name, config, replicas, cost, metrics, draft_name=None
) -> Recommendation:
    """Explain ``config``: ``metrics`` are its per-draw verdict metrics (None: search model)."""
    cfg = jnp.asarray(config)
    weights = one_hot_weights(cfg, problem.grid)
    m = metrics if metrics is not None else _search_metrics(problem, cfg, float(replicas))
    slacks = np.asarray(constraint_slacks(problem, m))
    ok = np.all(np.where(np.arange(4)[:, None] == 2, slacks > 0, slacks >= 0), axis=0)
    _, elastic = cost_elasticities(problem, cfg)
    elastic = {k: float(v) for k, v in zip(SENSITIVITIES, np.asarray(elastic))}
    shadow = {}
    for name in ("slo_ttft_p95_s", "slo_tpot_p95_s"):
        bound = float(getattr(problem, name))
        shadow[name.removeprefix("slo_")] = (
            cost * elastic[name] / bound if math.isfinite(bound) else 0.0
        )
    described = describe(problem, gpus, config, replicas)
    if described["speculative"] and draft_name:
        described["speculative"]["draft_model"] = draft_name
    hw = _select(problem.hardware, int(config[0]))
    eff = _select(problem.efficiency, int(config[0]))
    eff = Efficiency(**{k: jnp.median(getattr(eff, k)) for k in eff.__dataclass_fields__})
    dep = deployment_from_weights(weights, grid_tables(problem.grid), float(replicas))
    sheet = budget_sheet(
        problem.model,
        hw,
        dep,
        eff,
        problem.workload.prompt_tokens_mean,
        problem.workload.output_tokens_mean,
    )
    return Recommendation(
        feasible=True,
        config=described,
        cost_per_hour=cost,
        cost_per_million_output_tokens=_per_million(problem, cost),
        slo_probability=float(np.mean(ok)),
        ttft_s=_summary(np.asarray(m.ttft_quantiles_s)),
        tpot_s=_summary(np.asarray(m.tpot_quantiles_s)),
        binding_constraint=binding_constraint(problem, slacks),
        binding_budget=BINDING_BUDGETS[int(sheet.binding_budget)],
        shadow_prices=shadow,
        cost_elasticities=elastic,
        engine_args=engine_args(model_name, described),
        alternatives=[],
        closest_achievable=None,
        search_seconds=0.0,
    )


@eqx.filter_jit
def _search_metrics(problem: Problem, config: jnp.ndarray, replicas: float):
    return draw_metrics(problem, one_hot_weights(config, problem.grid), replicas)


def _infeasible(problem: Problem, gpus: tuple[str, ...], seconds: float) -> Recommendation:
    near = closest_achievable(problem)
    r = problem.grid.max_replicas
    near["configs"] = {k: describe(problem, gpus, c, r) for k, c in near.get("configs", {}).items()}
    return Recommendation(
        feasible=False,
        config=None,
        cost_per_hour=math.inf,
        cost_per_million_output_tokens=math.inf,
        slo_probability=0.0,
        ttft_s=None,
        tpot_s=None,
        binding_constraint=near.pop("binding"),
        binding_budget=None,
        shadow_prices={},
        cost_elasticities={},
        engine_args=None,
        alternatives=[],
        closest_achievable=near,
        search_seconds=seconds,
    )
