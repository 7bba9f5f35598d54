"""The throughput-interactivity frontier: output tokens/s per GPU against tokens/s per user.

Serving engines are compared at a closed loop of N clients (InferenceMAX, aiconfigurator,
``vllm bench serve --max-concurrency N``): each point of the sweep is a configuration (GPU, TP,
PP, MoE layout, weight and KV dtypes) run at concurrency N with the engine's batch limit ``max_num_seqs = N``,
evaluated by the one load model (``perfmodel.serving_metrics`` with ``closed_loop=True``, i.e.
``perfmodel._closed_loop``) in every posterior draw of ``Efficiency``:

* tokens/s per GPU = output tokens/s of the engine / (TP x PP);
* tokens/s per user = 1 / mean TPOT (the rate one request's tokens stream at);
* $ per million output tokens = $/hour / (3600 x output tokens/s) x 10^6 (``cost_per_hour``:
  catalog prices, quality surcharges included).

The frontier is the set of points no other point beats on both axes (posterior medians); each
point carries the 90 % interval of every number over the draws.  Concurrency is the grid's
``max_num_seqs`` column, so the whole sweep (configurations x concurrencies x draws) is one
static-shape ``vmap`` and one compile.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import perfmodel
from perfmodel import Array, HardwareSpec, ModelSpec, System, max_concurrent_requests

from ._evaluate import cost_per_hour, meets_confidence
from ._grid import GPU, Grid
from ._metrics import Workload
from ._pareto_points import ParetoResult, ParetoSweep, frontier_points
from ._problem import Problem, make_problem
from ._program_cache import cached_jit
from ._verify import _per_draw, verdict_deployment, verdict_hardware

DEFAULT_CONCURRENCIES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Clients in flight swept by default (a doubling sweep, as InferenceMAX's 4..256)."""

DEFAULT_TOKEN_BUDGET = 8192
"""``max_num_batched_tokens`` of every point (``perfmodel.Deployment``'s default)."""


def pareto_grid(
    num_gpus: int,
    concurrencies: tuple[int, ...] = DEFAULT_CONCURRENCIES,
    *,
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8"),
    weight_dtypes: tuple[str, ...] = ("bf16", "fp8"),
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    moe_layouts: tuple[str, ...] = ("tp",),
) -> Grid:
    """The sweep's grid: ``Grid``'s TP and PP, the given dtypes and MoE layouts, one token
    budget, colocated engines without speculation, and the concurrencies as ``max_num_seqs``
    (batch limit = N)."""
    return Grid(
        num_gpus=num_gpus,
        moe_layouts=tuple(moe_layouts),
        kv_dtypes=tuple(kv_dtypes),
        weight_dtypes=tuple(weight_dtypes),
        max_num_batched_tokens=(int(token_budget),),
        max_num_seqs=tuple(int(n) for n in concurrencies),
        max_replicas=1,
    )


def _closed_loop(problem: Problem, hardware, deployment, efficiency, chunk):
    """``perfmodel.serving_metrics`` of one engine at concurrency = its ``max_num_seqs``."""
    del chunk  # a closed loop's prefill budget is the token budget itself
    load = eqx.tree_at(lambda w: w.concurrency, problem.workload, deployment.max_num_seqs)
    m = perfmodel.serving_metrics(
        System(problem.model, hardware, deployment, efficiency), load, closed_loop=True
    )
    return m.output_tokens_per_s, m.tpot_s.mean, m.ttft_s.mean, m.tpot_s.p95, m.ttft_s.p95


@cached_jit
def sweep(problem: Problem, configs: Array) -> ParetoSweep:
    """Every row of ``configs`` (a ``pareto_grid`` problem) in every draw: one flat ``vmap`` over
    rows x draws (``_verify._per_draw``), one compile per grid shape."""
    ones = jnp.ones(configs.shape[0])
    thr, tpot, ttft, tpot95, ttft95 = _per_draw(
        problem, configs, ones, lambda *a: _closed_loop(problem, *a)
    )
    wl = problem.workload

    def static(config):
        hw, dep = verdict_hardware(problem, config), verdict_deployment(problem, config, 1.0)
        seats = max_concurrent_requests(
            problem.model, hw, dep, wl.prompt_tokens_mean + wl.output_tokens_mean
        )
        return seats >= 1.0, dep.tp * dep.pp, cost_per_hour(problem, config, 1.0)

    fits, gpus, cost = jax.vmap(static)(configs)
    return ParetoSweep(configs, fits, gpus, cost, thr, tpot, ttft, tpot95, ttft95)


def check_fits(
    model: ModelSpec,
    gpus: Sequence[str],
    hardware: Sequence[HardwareSpec],
    grid: Grid,
    workload: Workload,
) -> None:
    """``ValueError`` naming the fix unless one sequence of the workload fits on some GPU at the
    grid's roomiest configuration (largest legal TP and PP, narrowest dtypes: the KV room only
    grows with each).  Cheap: one memory budget per GPU, before any draw is evaluated."""
    tp = max(t for t, ok in zip(grid.tp, grid.legal_tp(model)) if ok)
    weight = min(grid.weight_dtypes, key=perfmodel.DTYPE_BYTES.get)
    dep = perfmodel.Deployment.create(
        tp=tp,
        pp=max(grid.pp),
        weight_dtype=weight,
        kv_dtype=min(grid.kv_dtypes, key=perfmodel.DTYPE_BYTES.get),
        max_num_batched_tokens=float(grid.max_num_batched_tokens[0]),
    )
    seq = workload.prompt_tokens_mean + workload.output_tokens_mean
    if any(float(max_concurrent_requests(model, h, dep, seq)) >= 1.0 for h in hardware):
        return
    raise ValueError(
        f"{model.name} with {float(seq):g}-token sequences does not fit on {', '.join(gpus)} "
        f"even at TP {tp} x PP {max(grid.pp)} with {weight} weights; add a GPU with more "
        "memory, shorten the sequences or allow narrower weights (e.g. --weight-dtypes int4)"
    )


def pareto_problem(
    model: ModelSpec,
    gpus: tuple[str, ...],
    workload: Workload,
    *,
    concurrencies: tuple[int, ...] = DEFAULT_CONCURRENCIES,
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8"),
    weight_dtypes: tuple[str, ...] = ("bf16", "fp8"),
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    moe_layouts: tuple[str, ...] = ("tp",),
    **problem_options,
) -> Problem:
    """``make_problem`` on a ``pareto_grid``; ``ValueError`` naming the fix for bad input (a
    concurrency below 1, or a model that fits on none of the GPUs)."""
    concurrencies = tuple(int(n) for n in concurrencies)
    if not concurrencies or min(concurrencies) < 1:
        raise ValueError(
            f"concurrency {list(concurrencies)} must be whole numbers >= 1, e.g. 1,4,16,64"
        )
    concurrencies = tuple(sorted(set(concurrencies)))
    grid = pareto_grid(
        len(gpus),
        concurrencies,
        kv_dtypes=kv_dtypes,
        weight_dtypes=weight_dtypes,
        token_budget=token_budget,
        moe_layouts=moe_layouts,
    )
    problem = make_problem(model, gpus, workload, grid=grid, **problem_options)
    hardware = [
        jax.tree_util.tree_map(lambda x, g=g: x[g], problem.hardware) for g in range(len(gpus))
    ]
    check_fits(model, gpus, hardware, grid, workload)
    return problem


def pareto_frontier(problem: Problem, gpus: tuple[str, ...], model_name: str) -> ParetoResult:
    """Sweep a ``pareto_problem`` and find its frontiers.

    A point is eligible when the workload's sequence fits and, if the problem has p95 SLOs, the
    share of draws meeting both is at least ``problem.confidence``.

    Args:
        problem: from ``pareto_problem``.
        gpus: its hardware ids, in order.
        model_name: the model's name (for the report).
    """
    grid = problem.grid
    configs = jnp.asarray(grid.all_configs(problem.model))
    s = jax.tree_util.tree_map(np.asarray, sweep(problem, configs))
    meets = (s.ttft_p95_s <= float(problem.slo_ttft_p95_s)) & (
        s.tpot_p95_s <= float(problem.slo_tpot_p95_s)
    )
    prob = np.mean(meets, axis=1)
    finite = np.all(np.isfinite(s.output_tokens_per_s) & (s.output_tokens_per_s > 0), axis=1)
    ok = np.asarray(meets_confidence(jnp.asarray(prob), problem.confidence))
    eligible = s.fits & finite & ok
    by_gpu = {
        g: frontier_points(s, grid, gpus, eligible & (s.configs[:, GPU] == k), prob)
        for k, g in enumerate(gpus)
    }
    return ParetoResult(
        model=model_name,
        gpus=tuple(gpus),
        concurrencies=tuple(grid.max_num_seqs),
        input_len=float(problem.workload.prompt_tokens_mean),
        output_len=float(problem.workload.output_tokens_mean),
        slo_p95_s=(float(problem.slo_ttft_p95_s), float(problem.slo_tpot_p95_s)),
        confidence=float(problem.confidence),
        grid=grid,
        sweep=s,
        slo_probability=prob,
        eligible=eligible,
        frontier=frontier_points(s, grid, gpus, eligible, prob),
        frontier_by_gpu=by_gpu,
    )
