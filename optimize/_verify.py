"""The verdict: the best search results re-checked with the dearer closed forms, every kind.

* colocated, k = 0: ``perfmodel.dynamics.serving_metrics`` (chunked prefill at the config's
  chunk);
* colocated, k > 0: ``perfmodel.features.speculative_serving_metrics``;
* p:d pool split: ``perfmodel.features.split_serving`` (prefill pool a packing M/G/1 with its
  prompt-length tail, KV hand-off, orchestration, decode-pool entry and seat wait;
  interference-free decode fixed point), with k > 0 its decode iterations drafting and
  verifying (``DecodeCost``).

Each program is compiled only when a candidate of its kind can still win, with one static shape
(``num_verified`` rows, a few bisection rounds).
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from perfmodel import System, max_concurrent_requests
from perfmodel.dynamics import QUANTILES, DecodeCost
from perfmodel.features import speculative_serving_metrics, split_serving

from ._evaluate import (
    constraint_slacks,
    constraints_hold,
    context_fit,
    cost_per_hour,
    meets_confidence,
    mix_gpu,
    served_workload,
    split_itl,
)
from ._grid import (
    GPU,
    POOL,
    SPEC,
    chunk_from_weights,
    deployment_from_weights,
    grid_tables,
    one_hot_weights,
    prefill_pool_config,
)
from ._metrics import SloMetrics, served_max_model_len, serving_slo_metrics
from ._problem import Problem
from ._program_cache import cached_jit

VERIFY_FACTORS = (0.5, 1.0, 1.5, 2.0)
"""Replica counts the verdict model tries around the search model's count R: R*f, R-1, R+1, R+2."""

VERIFY_WIDTH = len(VERIFY_FACTORS) + 3
"""Trials per candidate (padded: one compiled shape whatever R is)."""

VERDICT_MODELS = {
    "colocated": "perfmodel.dynamics.serving_metrics",
    "speculative": "perfmodel.features.speculative_serving_metrics",
    "split": "perfmodel.features.split_serving",
    "split_speculative": "perfmodel.features.split_serving (speculative decode cost)",
}
"""Which closed form produced a verified answer's numbers, by kind (``kind_of``)."""
KINDS = tuple(VERDICT_MODELS)

ONE_OFF = {"xla_backend_optimization_level": 0}
"""XLA options of programs compiled in the answer's critical path and run on a few rows: compile
time dominates them, so the backend's optimisation passes are skipped (~2x faster compile)."""


def kind_of(problem: Problem, config) -> str:
    """The verdict model that checks ``config`` (a key of ``VERDICT_MODELS``)."""
    spec = problem.grid.spec_k[int(config[SPEC])] > 0
    if int(config[POOL]) > 0:
        return "split_speculative" if spec else "split"
    return "speculative" if spec else "colocated"


def verdict_deployment(problem: Problem, config, replicas):
    """The ``Deployment`` of ``config``'s engines: its context admits every request of the
    workload (``served_max_model_len``) and is at least the problem's ``max_model_len_tokens``;
    it runs the problem's engine's scheduler (``prefill_first``)."""
    w = one_hot_weights(config, problem.grid)
    dep = deployment_from_weights(w, grid_tables(problem.grid), replicas)
    context = jnp.maximum(served_max_model_len(problem.workload), problem.max_model_len_tokens)
    return eqx.tree_at(
        lambda d: (d.max_model_len, d.prefill_first), dep, (context, problem.prefill_first)
    )


def verdict_hardware(problem: Problem, config):
    """The ``HardwareSpec`` of ``config``'s (decode-pool) GPU type."""
    return mix_gpu(problem.hardware, one_hot_weights(config, problem.grid)[GPU])


def verdict_engine(problem: Problem, config, replicas):
    """(hardware, deployment, efficiency draws, prefill chunk) of one engine of ``config``
    (``verdict_hardware``, ``verdict_deployment``)."""
    w = one_hot_weights(config, problem.grid)
    dep = verdict_deployment(problem, config, replicas)
    chunk = chunk_from_weights(w, grid_tables(problem.grid))
    return mix_gpu(problem.hardware, w[GPU]), dep, mix_gpu(problem.efficiency, w[GPU]), chunk


def _open_loop(problem: Problem) -> Problem:
    """The problem with a concrete ``concurrency = 0`` (the optimiser's load is an arrival rate,
    as in the search model): ``serving_metrics`` then sees an open loop at trace time and skips
    compiling the closed-loop rate solve (half its program)."""
    return eqx.tree_at(lambda p: p.workload.concurrency, problem, 0.0)


def _per_draw(problem: Problem, configs, replicas, fn):
    """``fn(hardware, deployment, efficiency, chunk)`` per (row, draw) under one flat ``vmap``
    over rows x draws (one batching level: half the tracing of nested maps)."""
    hw, dep, eff, chunk = jax.vmap(lambda c, r: verdict_engine(problem, c, r))(configs, replicas)
    rows, draws = configs.shape[0], problem.num_draws

    def rep(x):
        return jnp.repeat(x, draws, axis=0)

    out = jax.vmap(fn)(
        jax.tree_util.tree_map(rep, hw),
        jax.tree_util.tree_map(rep, dep),
        jax.tree_util.tree_map(lambda x: x.reshape((rows * draws,) + x.shape[2:]), eff),
        rep(chunk),
    )
    return jax.tree_util.tree_map(lambda x: x.reshape((rows, draws) + x.shape[1:]), out)


@cached_jit  # full XLA optimisation: the verdict runs 3x faster than at level 0
def colocated_verdict_metrics(problem: Problem, configs, replicas) -> SloMetrics:
    """``serving_slo_metrics`` per (row, draw) of colocated engines (speculation ignored)."""
    problem = _open_loop(problem)
    return _per_draw(
        problem,
        configs,
        replicas,
        lambda hw, dep, e, chunk: context_fit(
            problem, _verdict(problem, hw, dep, e, chunk), hw, dep
        ),
    )


def _verdict(problem: Problem, hw, dep, e, chunk) -> SloMetrics:
    """``serving_slo_metrics`` of one colocated engine and draw (its prefix cache, if any)."""
    workload, cached = served_workload(problem, hw, dep, e)
    return serving_slo_metrics(
        System(problem.model, hw, dep, e), workload, chunk_tokens=chunk, cached_prompt_tokens=cached
    )


@cached_jit(compiler_options=ONE_OFF)
def _speculative(problem: Problem, configs, replicas, mtp: bool) -> SloMetrics:
    """``speculative_serving_metrics`` per (row, draw) of colocated engines with k > 0."""
    problem = _open_loop(problem)
    ks = grid_tables(problem.grid)["spec_k"]
    wl = problem.workload

    def one(c, r):
        hw, dep, eff, chunk = verdict_engine(problem, c, r)
        k, alpha = ks[c[SPEC]], problem.spec_acceptance[c[SPEC]]
        seats = max_concurrent_requests(
            problem.model, hw, dep, wl.prompt_tokens_mean + wl.output_tokens_mean
        )

        def per_draw(e):
            system = System(problem.model, hw, dep, e)
            f = speculative_serving_metrics(
                system,
                wl,
                draft_tokens=k,
                acceptance=alpha,
                draft_model=None if mtp else problem.draft_model,
                chunk_tokens=chunk,
            )
            itl = jnp.stack([f.itl_s.p50, f.itl_s.p95, f.itl_s.p99])
            m = SloMetrics(
                ttft_p95_s=f.ttft_s.p95,
                tpot_p95_s=f.tpot_s.p95,
                utilization=f.utilization,
                concurrent_requests=seats,
                ttft_quantiles_s=f.ttft_s.at(QUANTILES),
                tpot_quantiles_s=f.tpot_s.at(QUANTILES),
                itl_p95_s=itl[1],
                itl_quantiles_s=itl,
            )
            return context_fit(problem, m, hw, dep)

        return jax.vmap(per_draw)(eff)

    return jax.vmap(one)(configs, replicas)


@cached_jit(compiler_options=ONE_OFF)
def _split(problem: Problem, configs, replicas, speculative: bool) -> SloMetrics:
    """``split_serving`` per (row, draw) of p:d splits; ``speculative`` (static): the decode
    pool drafts k tokens per sequence (MTP heads or the problem's draft model) at the choice's
    acceptance.  Each pool runs at its own GPU's efficiency draw (draw j of the prefill GPU with
    draw j of the decode GPU, as in the search model)."""
    problem = _open_loop(problem)
    tables = grid_tables(problem.grid)
    wl = problem.workload

    def one(c, r):
        hw_d, dep, eff_d, _ = verdict_engine(problem, c, r)
        # the prefill pool: its own GPU type, TP and PP
        hw_p, dep_pre, eff_p, _ = verdict_engine(problem, prefill_pool_config(c), r)
        dep_p = eqx.tree_at(lambda d: d.replicas, dep_pre, r * tables["prefill_units"][c[POOL]])
        dep_d = eqx.tree_at(lambda d: d.replicas, dep, r * tables["decode_units"][c[POOL]])
        bw = jnp.where(
            problem.transfer_bytes_per_s > 0,
            problem.transfer_bytes_per_s,
            hw_p.internode_bytes_per_s,
        )
        cost = (
            DecodeCost.speculation(
                tables["spec_k"][c[SPEC]],
                problem.spec_acceptance[c[SPEC]],
                None if problem.draft_is_mtp else problem.draft_model,
            )
            if speculative
            else None
        )

        def per_draw(e_p, e_d):
            m = split_serving(
                wl,
                prefill=System(problem.model, hw_p, dep_p, e_p),
                decode=System(problem.model, hw_d, dep_d, e_d),
                cost=cost,
                transfer_bytes_per_s=bw,
                transfer_latency_s=problem.transfer_latency_s,
                orchestration_s=problem.orchestration_s,
            )
            # a decode pool's iterations carry no prefill: one gap is one decode iteration, whose
            # quantiles over the batch's spread are the pool's TPOT quantiles (``split_itl``)
            out = SloMetrics(
                ttft_p95_s=m.ttft_s.p95,
                tpot_p95_s=m.tpot_s.p95,
                utilization=m.utilization,
                concurrent_requests=m.seats,
                ttft_quantiles_s=m.ttft_s.at(QUANTILES),
                tpot_quantiles_s=m.tpot_s.at(QUANTILES),
            )
            out = context_fit(problem, split_itl(out), hw_p, dep_p)
            return context_fit(problem, out, hw_d, dep_d)

        return jax.vmap(per_draw)(eff_p, eff_d)

    return jax.vmap(one)(configs, replicas)


def _kind_metrics(problem: Problem, kind: str, configs: np.ndarray, replicas: np.ndarray):
    c, r = jnp.asarray(configs), jnp.asarray(replicas)
    if kind == "colocated":
        return colocated_verdict_metrics(problem, c, r)
    if kind == "speculative":
        return _speculative(problem, c, r, bool(problem.draft_is_mtp))
    return _split(problem, c, r, kind == "split_speculative")


@cached_jit
def _probabilities(problem: Problem, metrics: SloMetrics):
    return jax.vmap(
        lambda m: jnp.mean(constraints_hold(constraint_slacks(problem, m)).astype(float))
    )(metrics)


class Verified(NamedTuple):
    """Verdict of each candidate: replicas, $/hour (inf: no count near the search's meets the
    confidence), per-draw ``SloMetrics`` (None where not re-checked), the model that made them."""

    replicas: np.ndarray
    cost_per_hour: np.ndarray
    metrics: list
    model: list


def verify_replicas(problem: Problem, configs: np.ndarray, search_replicas: np.ndarray):
    """Fewest replicas meeting the chance constraints under the verdict model of each
    candidate's kind, among counts near the search model's (``VERIFY_FACTORS``).

    Kinds are checked colocated first; a kind whose cheapest trial of every candidate cannot
    undercut the best verified cost is not compiled at all: those candidates keep the search
    model's count and cost (they cannot win; ``model`` says "search model")."""
    configs = np.asarray(configs, dtype=np.int32)
    n = len(configs)
    trials, sizes, first_probe = [], [], []
    for r in search_replicas:
        r = int(min(max(r, 1), problem.grid.max_replicas))
        near = {max(1, int(np.ceil(r * f))) for f in VERIFY_FACTORS} | {max(1, r - 1), r + 1, r + 2}
        t = sorted(near)
        sizes.append(len(t))
        first_probe.append(t.index(r))
        trials.append(t + [t[-1]] * (VERIFY_WIDTH - len(t)))
    trials, sizes, first_probe = np.asarray(trials), np.asarray(sizes), np.asarray(first_probe)
    price = np.asarray(jax.vmap(lambda c: cost_per_hour(problem, c, 1.0))(jnp.asarray(configs)))
    kinds = np.asarray([kind_of(problem, c) for c in configs])
    reps = np.asarray(search_replicas, dtype=int).copy()
    costs = price * reps
    costs = np.where(reps <= problem.grid.max_replicas, costs, np.inf)
    metrics, model = [None] * n, ["search model"] * n
    best = np.inf
    for kind in KINDS:
        rows = kinds == kind
        if not rows.any() or (
            kind != "colocated" and np.all(price[rows] * trials[rows, 0] >= best)
        ):
            continue
        # the first trial meeting the confidence (it improves with replicas): the search
        # model's own count first, then its neighbour on the side the verdict points to, then
        # bisection; where the two models agree, 2 rounds of len(configs) rows settle it (one
        # compiled shape)
        lo, hi = np.full(n, -1), sizes.copy()
        probe, first = first_probe, True
        while np.any(rows & (hi - lo > 1)):
            live = rows & (hi - lo > 1)
            mid = (lo + hi) // 2
            if probe is not None:
                mid = np.where((lo < probe) & (probe < hi), probe, mid)
            mid = np.where(live, mid, 0)
            m = _kind_metrics(problem, kind, configs, trials[np.arange(n), mid].astype(float))
            m = jax.tree_util.tree_map(np.asarray, m)
            ok = meets_confidence(np.asarray(_probabilities(problem, m)), float(problem.confidence))
            for i in np.flatnonzero(live):
                if ok[i]:
                    hi[i] = mid[i]
                    metrics[i] = jax.tree_util.tree_map(lambda x, i=i: x[i], m)
                else:
                    lo[i] = mid[i]
            probe, first = (np.where(ok, mid - 1, mid + 1) if first else None), False
        for i in np.flatnonzero(rows):
            feasible = hi[i] < sizes[i]
            reps[i] = trials[i, hi[i]] if feasible else 0
            costs[i] = price[i] * reps[i] if feasible else np.inf
            metrics[i] = metrics[i] if feasible else None
            model[i] = VERDICT_MODELS[kind]
        best = min(best, float(np.min(costs[rows])))
    return Verified(reps, costs, metrics, model)
