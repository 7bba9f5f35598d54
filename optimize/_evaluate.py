"""Exact evaluation of discrete configurations: SLO probability, fewest replicas, cost.

A configuration holds in posterior draw d when p95 TTFT <= SLO, p95 TPOT <= SLO, utilisation < 1
(throughput >= demand) and one sequence's KV fits.  Its SLO probability is the share of draws in
which it holds; each of those conditions improves with more replicas (each serves rate / R), so
the fewest replicas meeting the confidence is found by bisection.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from perfmodel import kv_bytes_per_sequence, weight_bytes_per_gpu, workspace_bytes_per_gpu
from perfmodel._memory import kv_shard_fraction

from ._grid import deployment_from_weights, grid_tables, one_hot_weights
from ._metrics import SloMetrics, slo_metrics

MetricsFn = Callable[..., SloMetrics]
from ._problem import Problem

Array = jnp.ndarray

CONSTRAINTS: tuple[str, ...] = ("ttft_p95", "tpot_p95", "stability", "memory_fit")
"""Names of the per-draw constraints, in the order of ``constraint_slacks``."""


def mix_gpu(tree, weights: Array):
    """Weight-average the leading (GPU) axis of every leaf: exact selection at one-hot weights."""
    return jax.tree_util.tree_map(lambda x: jnp.tensordot(weights, x, axes=1), tree)


def draw_metrics(
    problem: Problem,
    weights: tuple[Array, ...],
    replicas: Array,
    temperature: float = 0.0,
    metrics_fn: MetricsFn = slo_metrics,
) -> SloMetrics:
    """Serving metrics in every posterior draw (leaves of shape (draws,)), by ``metrics_fn``
    (the search model by default; ``serving_slo_metrics`` for the verdict)."""
    tables = grid_tables(problem.grid)
    deployment = deployment_from_weights(weights, tables, replicas)
    hardware = mix_gpu(problem.hardware, weights[0])
    efficiency = mix_gpu(problem.efficiency, weights[0])
    return jax.vmap(
        lambda eff: metrics_fn(
            problem.model, hardware, deployment, eff, problem.workload, temperature
        )
    )(efficiency)


def constraint_slacks(problem: Problem, m: SloMetrics) -> Array:
    """Log-slack of each constraint per draw (>= 0 holds), shape (len(CONSTRAINTS), draws)."""
    def log_ratio(bound, value):
        return jnp.log(bound) - jnp.log(jnp.maximum(value, 1e-30))

    return jnp.stack([
        log_ratio(problem.slo_ttft_p95_s, m.ttft_p95_s),
        log_ratio(problem.slo_tpot_p95_s, m.tpot_p95_s),
        -jnp.log(jnp.maximum(m.utilization, 1e-30)),
        jnp.log(jnp.maximum(m.concurrent_requests, 1e-30)),
    ])


def memory_slack(problem: Problem, weights: tuple[Array, ...]) -> Array:
    """log(HBM the engine may use / (weights + workspace + one sequence's KV)) on one device;
    >= 0 exactly when one sequence fits (up to block rounding).  Smooth in the relaxed knobs, so
    the search feels the memory wall even where the KV capacity is clipped at zero."""
    tables = grid_tables(problem.grid)
    dep = deployment_from_weights(weights, tables, 1.0)
    hw = mix_gpu(problem.hardware, weights[0])
    wl = problem.workload
    seq = kv_bytes_per_sequence(
        problem.model, dep.kv_bytes_per_elem, wl.prompt_tokens_mean + wl.output_tokens_mean
    ) * kv_shard_fraction(problem.model, dep.tp, dep.pp)
    need = weight_bytes_per_gpu(problem.model, dep) + workspace_bytes_per_gpu(problem.model, dep) + seq
    return jnp.log(hw.hbm_bytes * dep.gpu_memory_utilization) - jnp.log(need)


CONFIDENCE_TOLERANCE = 1e-6
"""A share of draws equal to the confidence meets it (float32 means of 0/1 draws round)."""


def meets_confidence(probability: Array, confidence: Array) -> Array:
    """``probability >= confidence`` up to ``CONFIDENCE_TOLERANCE`` (the one rule used everywhere)."""
    return probability >= confidence - CONFIDENCE_TOLERANCE


def holds(slacks: Array) -> Array:
    """Per-draw indicator that every constraint holds (strict for stability)."""
    strict = jnp.asarray([False, False, True, False])[:, None]
    ok = jnp.where(strict, slacks > 0, slacks >= 0)
    return jnp.all(ok, axis=0)


def slo_probability(
    problem: Problem, config: Array, replicas: Array, metrics_fn: MetricsFn = slo_metrics
) -> Array:
    """Share of posterior draws in which the discrete ``config`` with ``replicas`` meets every
    constraint."""
    m = draw_metrics(problem, one_hot_weights(config, problem.grid), replicas, 0.0, metrics_fn)
    return jnp.mean(holds(constraint_slacks(problem, m)).astype(float))


def gpus_per_replica(problem: Problem, config: Array) -> Array:
    """tp * pp of a discrete config."""
    g = problem.grid
    return jnp.asarray(g.tp, dtype=float)[config[1]] * jnp.asarray(g.pp, dtype=float)[config[2]]


def cost_per_hour(problem: Problem, config: Array, replicas: Array) -> Array:
    """$/hour: replicas * tp * pp * price, times (1 + KV and weight dtype quality surcharges)."""
    price = problem.hardware.price_per_gpu_hour[config[0]]
    surcharge = 1.0 + problem.kv_penalty_fraction[config[3]] + problem.weight_penalty_fraction[config[4]]
    return jnp.asarray(replicas, dtype=float) * gpus_per_replica(problem, config) * price * surcharge


def _bisection_steps(max_replicas: int) -> int:
    return max(1, (max_replicas - 1).bit_length())


@eqx.filter_jit
def min_replicas(problem: Problem, configs: Array, metrics_fn: MetricsFn = slo_metrics) -> Array:
    """Fewest replicas (1..max) with SLO probability >= confidence, per config; ``max + 1`` when
    even ``max_replicas`` falls short.  ``configs``: shape (n, len(KNOBS))."""
    r_max = problem.grid.max_replicas

    def one(config):
        ok_max = meets_confidence(slo_probability(problem, config, float(r_max), metrics_fn), problem.confidence)

        def step(_, bounds):
            lo, hi = bounds  # lo fails (0 = none tried), hi holds
            mid = (lo + hi) // 2
            ok = meets_confidence(
                slo_probability(problem, config, mid.astype(float), metrics_fn), problem.confidence
            )
            return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

        _, hi = jax.lax.fori_loop(0, _bisection_steps(r_max), step, (jnp.asarray(0), jnp.asarray(r_max)))
        return jnp.where(ok_max, hi, r_max + 1)

    return jax.vmap(one)(configs)


@eqx.filter_jit
def costs_at_min_replicas(
    problem: Problem, configs: Array, metrics_fn: MetricsFn = slo_metrics
) -> tuple[Array, Array]:
    """(replicas, $/hour) per config; infeasible configs cost ``inf``."""
    reps = min_replicas(problem, configs, metrics_fn)
    cost = jax.vmap(lambda c, r: cost_per_hour(problem, c, r.astype(float)))(configs, reps)
    return reps, jnp.where(reps <= problem.grid.max_replicas, cost, jnp.inf)
