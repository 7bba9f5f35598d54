"""The answer a person reads: cheapest verified configuration, its cost, metrics and reasons.

``recommend`` runs the gradient search on the search model, re-checks the best distinct
configurations with the verdict model of their kind (``_verify``: ``serving_metrics``, its
speculative form, or the two-pool decomposition; fewest replicas among counts near the search
model's), ranks them by verified cost, explains the winner and, on request, runs it in the
simulator (``_simcheck``).  An infeasible problem is a value: ``feasible = False`` with the
closest achievable SLO.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from perfmodel import (
    BINDING_BUDGETS,
    Efficiency,
    System,
    budget_sheet,
    weight_bytes_per_gpu,
    workspace_bytes_per_gpu,
)

from ._describe import _select, describe_config
from ._engine_args import engine_args
from ._evaluate import constraint_slacks, constraints_hold, draw_metrics
from ._explain import SENSITIVITIES, binding_constraint, closest_achievable, cost_elasticities
from ._grid import (
    GPU,
    MOE,
    POOL,
    PP,
    PREFILL_GPU,
    PREFILL_PP,
    PREFILL_TP,
    TP,
    deployment_from_weights,
    grid_tables,
    one_hot_weights,
    prefill_pool_weights,
)
from ._pareto_points import TOKENS_PER_MILLION
from ._problem import Problem
from ._program_cache import cached_jit
from ._search import SearchOptions, search
from ._simcheck import simulate_check
from ._verify import verify_replicas

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
    metrics_model: str | None = None
    itl_s: dict[str, float] | None = None

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
                    "moe_layout",
                    "ep",
                    "attention_dp",
                    "replicas",
                    "max_num_batched_tokens",
                    "chunk_size",
                    "max_num_seqs",
                    "kv_dtype",
                    "weight_dtype",
                    "speculative",
                    "max_model_len",
                )
            },
            "disaggregation": c.get("disaggregation"),
            "cost_per_hour": _num(self.cost_per_hour),
            "cost_per_million_output_tokens": _num(self.cost_per_million_output_tokens),
            "slo_probability": self.slo_probability,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "itl_s": self.itl_s,
            "binding_constraint": self.binding_constraint,
            "binding_budget": self.binding_budget,
            "shadow_prices": self.shadow_prices,
            "cost_elasticities": self.cost_elasticities,
            "engine_args": self.engine_args,
            "alternatives": self.alternatives,
            "closest_achievable": self.closest_achievable,
            "simulator": self.simulator,
            "metrics_model": self.metrics_model,
        }


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _per_million(problem: Problem, cost: float) -> float:
    w = problem.workload
    tokens_per_hour = float(w.arrival_rate_per_s * w.output_tokens_mean) * SECONDS_PER_HOUR
    return cost / tokens_per_hour * TOKENS_PER_MILLION


def _group(config: np.ndarray) -> tuple[int, ...]:
    """(GPU, TP, PP, pool split, prefill GPU, MoE layout, prefill TP and PP): the runner-ups
    name one configuration of each."""
    return tuple(
        int(config[k]) for k in (GPU, TP, PP, POOL, PREFILL_GPU, MOE, PREFILL_TP, PREFILL_PP)
    )


def _candidates(found, count: int) -> np.ndarray:
    """Rows of the cheapest search results, at most one per ``_group``, ``count`` of them
    (padded by repeats: one compiled verdict shape)."""
    picked, seen = [], set()
    for i, (c, k) in enumerate(zip(found.configs, found.cost_per_hour)):
        key = _group(c)
        if np.isfinite(k) and key not in seen:
            seen.add(key)
            picked.append(i)
        if len(picked) == count:
            break
    return _padded(picked or [0], count)


def _padded(rows: list[int], count: int) -> np.ndarray:
    """``rows`` repeated at the end up to ``count`` (the verdict's one compiled shape)."""
    return np.asarray(rows + rows[-1:] * (count - len(rows)), dtype=int)


RECHECK_ROUNDS = 2
"""Further verdict rounds after the first, each over the next cheapest search results."""


def _undercutting(found, checked: set[int], below: float, count: int) -> np.ndarray:
    """Rows of the search results not yet re-checked that the search model prices strictly
    below ``below`` (the best verified cost), cheapest first, at most ``count`` (padded by
    repeats: the verdict's one compiled shape); empty when there are none.

    The search model and the verdict can disagree on configurations the search ranks as ties:
    many settings of the token budget, chunk and sequence cap cost the same replica count in
    the search model, while the verdict's per-draw tails (a long prefill chunk stalling decode
    iterations) need one more replica for some of them.  The first round checks one of each
    tie; when the verdict raises it, another configuration the search priced lower may still
    hold at that count."""
    picked = [
        i
        for i in np.flatnonzero(found.cost_per_hour < below * (1.0 - 1e-9))
        if int(i) not in checked
    ][:count]
    return _padded(picked, count) if picked else np.zeros(0, dtype=int)


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
    progress: Callable[[str], None] | None = None,
) -> Recommendation:
    """Cheapest configuration meeting the chance constraints, verified and explained.

    Args:
        problem: from ``make_problem``.
        gpus: hardware ids in the problem's GPU order (labels).
        model_name: Hugging Face id (for engine command lines).
        options: search options.
        num_verified: distinct configurations re-checked with the verdict model.
        verify: re-check with the verdict model of each kind (``_verify.VERDICT_MODELS``; False:
            search model only); ``metrics_model`` names the one that produced the numbers.
        simulate_requests: > 0 runs the simulator of the answer's kind (colocated, speculative,
            two pools: ``_simcheck``) on that many requests at the posterior-median efficiency.
        draft_name: the speculative draft model's id (engine flags), when it is not MTP.
        progress: called with the name of each phase as it starts (a terminal's progress line).
    """
    t0 = time.perf_counter()
    say = progress if progress is not None else (lambda phase: None)
    say(f"searching {problem.grid.count_configs(problem.model):,} configurations (compiling first)")
    # the verdict compiles after the search, not beside it: two XLA compiles at once took the
    # README problem's cold run to 4.4 GB (2.9 GB in series) and saved no wall time on 2 cores
    found = search(problem, options)
    feasible_any = bool(len(found.cost_per_hour)) and np.isfinite(found.cost_per_hour[0])
    if not feasible_any:
        return _infeasible(problem, gpus, time.perf_counter() - t0, found.configs)
    rows = _candidates(found, num_verified)  # the search's own exact costs: no re-evaluation
    cands = found.configs[rows]
    reps, costs = found.replicas[rows], found.cost_per_hour[rows]
    models = ["search model"] * len(rows)
    verdict = [None] * len(rows)
    if verify:
        say(f"re-checking {len(rows)} candidates over the posterior draws")
        reps, costs, verdict, models = verify_replicas(problem, cands, reps)
        checked = {int(i) for i in rows}
        for _ in range(RECHECK_ROUNDS):
            more = _undercutting(found, checked, float(np.min(costs)), num_verified)
            if not len(more):
                break
            say(f"re-checking {len(set(more.tolist()))} more the search priced lower")
            checked |= {int(i) for i in more}
            more_reps, more_costs, more_verdict, more_models = verify_replicas(
                problem, found.configs[more], found.replicas[more]
            )
            cands = np.concatenate([cands, found.configs[more]])
            reps = np.concatenate([reps, more_reps])
            costs = np.concatenate([costs, more_costs])
            verdict, models = [*verdict, *more_verdict], [*models, *more_models]
    verified = np.asarray([m != "search model" for m in models])
    order = np.lexsort((~verified, costs))  # cheapest first; a re-checked answer wins a tie
    uniq = []
    for i in order:
        if not any(np.array_equal(cands[i], cands[j]) for j in uniq):
            uniq.append(i)
    best = uniq[0]
    if not np.isfinite(costs[best]):
        return _infeasible(problem, gpus, time.perf_counter() - t0, found.configs)
    config, r = cands[best], int(reps[best])
    metrics = verdict[best]
    say("shadow prices and cost elasticities of the answer")
    out = _explain(problem, gpus, model_name, config, r, float(costs[best]), metrics, draft_name)
    alternatives, groups = [], {_group(config)}
    for i in uniq[1:]:
        if np.isfinite(costs[i]) and _group(cands[i]) not in groups:
            groups.add(_group(cands[i]))
            d = describe_config(problem, gpus, cands[i], int(reps[i]))
            alternatives.append(
                {
                    **d,
                    "cost_per_hour": float(costs[i]),
                    "cost_per_million_output_tokens": _per_million(problem, float(costs[i])),
                    "metrics_model": models[i],
                }
            )
    sim = None
    if simulate_requests > 0:
        say(f"simulating {simulate_requests:,} requests on the answer")
        sim = simulate_check(problem, config, r, simulate_requests)
    return out._replace(
        alternatives=alternatives,
        search_seconds=time.perf_counter() - t0,
        simulator=sim,
        metrics_model=models[best],
    )


_budget_sheet = cached_jit(budget_sheet)
"""The answer's budget sheet as one program, its trace kept on disk (op by op: ~1 s warm)."""


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
    ok = np.asarray(constraints_hold(jnp.asarray(slacks)))
    _, elastic = cost_elasticities(problem, cfg)
    elastic = {k: float(v) for k, v in zip(SENSITIVITIES, np.asarray(elastic))}
    if not math.isfinite(float(problem.slo_itl_p95_s)):  # no ITL bound: no ITL sensitivity
        elastic.pop("slo_itl_p95_s")
    shadow = {}
    for name in ("slo_ttft_p95_s", "slo_tpot_p95_s", "slo_itl_p95_s"):
        bound = float(getattr(problem, name))
        if name == "slo_itl_p95_s" and not math.isfinite(bound):
            continue  # reported only when the ITL bound is set
        shadow[name.removeprefix("slo_")] = (
            cost * elastic[name] / bound if math.isfinite(bound) else 0.0
        )
    described = describe_config(problem, gpus, config, replicas)
    if described["speculative"] and draft_name:
        described["speculative"]["draft_model"] = draft_name
    hw = _select(problem.hardware, int(config[0]))
    eff = _select(problem.efficiency, int(config[0]))
    eff = Efficiency(**{k: jnp.median(getattr(eff, k)) for k in eff.__dataclass_fields__})
    dep = deployment_from_weights(weights, grid_tables(problem.grid), float(replicas))
    sheet = _budget_sheet(
        System(problem.model, hw, dep, eff),
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
        itl_s=_summary(np.asarray(m.itl_quantiles_s)),
        binding_constraint=binding_constraint(problem, slacks),
        binding_budget=BINDING_BUDGETS[int(sheet.binding_budget)],
        shadow_prices=shadow,
        cost_elasticities=elastic,
        engine_args=engine_args(
            model_name, described, memory=_engine_memory(problem, gpus, described, weights)
        ),
        alternatives=[],
        closest_achievable=None,
        search_seconds=0.0,
    )


def _engine_memory(problem: Problem, gpus: tuple[str, ...], described: dict, weights) -> dict:
    """Per-GPU HBM, weight and workspace bytes of the recommendation (per pool when split, each
    at its own TP), which turn its memory share into SGLang's and TensorRT-LLM's own fractions
    (``engine_args``); ``weights`` are the configuration's one-hot knob weights."""
    tables = grid_tables(problem.grid)

    def one(gpu: str, knobs) -> dict:
        dep = deployment_from_weights(knobs, tables, 1.0)
        return {
            "hbm_bytes": float(_select(problem.hardware, gpus.index(gpu)).hbm_bytes),
            "weight_bytes": float(weight_bytes_per_gpu(problem.model, dep)),
            "workspace_bytes": float(workspace_bytes_per_gpu(problem.model, dep)),
        }

    split = described.get("disaggregation")
    if split:
        return {
            "prefill": one(split["prefill"]["gpu"], prefill_pool_weights(weights)),
            "decode": one(split["decode"]["gpu"], weights),
        }
    return one(described["gpu"], weights)


@cached_jit
def _search_metrics(problem: Problem, config: jnp.ndarray, replicas: float):
    return draw_metrics(problem, one_hot_weights(config, problem.grid), replicas)


def _infeasible(
    problem: Problem, gpus: tuple[str, ...], seconds: float, scored: np.ndarray
) -> Recommendation:
    """The infeasible answer: what can be met at ``max_replicas``, searched from the
    configurations the search ``scored``."""
    near = closest_achievable(problem, scored)
    r = problem.grid.max_replicas
    near["configs"] = {
        k: describe_config(problem, gpus, c, r) for k, c in near.get("configs", {}).items()
    }
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
