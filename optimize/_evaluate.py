"""Exact evaluation of discrete configurations: SLO probability, fewest replicas, cost.

A configuration holds in posterior draw d when p95 TTFT <= SLO, p95 TPOT <= SLO, p95 ITL <= SLO,
utilisation < 1 (throughput >= demand) and one sequence's KV fits (of the mean prompt + output,
and of the ``max_model_len`` the problem asks every engine to admit).  Its SLO probability is
the share of draws in which it holds; each of those conditions improves with more replicas (each
serves rate / R), so the fewest replicas meeting the confidence is found by bisection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from perfmodel import (
    POSITIVE_FLOOR,
    Array,
    System,
    kv_bytes_per_sequence,
    kv_sequence_share,
    max_concurrent_requests,
    weight_bytes_per_gpu,
    workspace_bytes_per_gpu,
)
from perfmodel.features import expected_tokens_per_step, prefix_workload

from ._grid import (
    GPU,
    KV,
    POOL,
    PP,
    PREFILL_GPU,
    PREFILL_PP,
    PREFILL_TP,
    SPEC,
    TP,
    WEIGHT,
    chunk_from_weights,
    deployment_from_weights,
    grid_tables,
    one_hot_weights,
    prefill_pool_weights,
)
from ._metrics import SloMetrics, SpecStep, slo_metrics
from ._problem import Problem
from ._program_cache import cached_jit
from ._split import split_slo_metrics

MetricsFn = Callable[..., SloMetrics]

CONSTRAINTS: tuple[str, ...] = ("ttft_p95", "tpot_p95", "stability", "memory_fit", "itl_p95")
"""Names of the per-draw constraints, in the order of ``constraint_slacks`` (the ITL bound last:
the memory fit keeps its index 3, which the search overwrites with its smooth form)."""


def context_fit(problem: Problem, m: SloMetrics, hardware, deployment, temperature=0.0):
    """``m`` with ``concurrent_requests`` capped by the sequences of ``max_model_len_tokens``
    whose KV fits (``max_concurrent_requests``; vLLM refuses to start below one), unchanged when
    the problem sets no context (0)."""
    context = problem.max_model_len_tokens
    fits = max_concurrent_requests(
        problem.model, hardware, deployment, jnp.maximum(context, 1.0), temperature
    )
    capped = jnp.where(context > 0, jnp.minimum(m.concurrent_requests, fits), m.concurrent_requests)
    return dataclasses.replace(m, concurrent_requests=capped)


def mix_gpu(tree, weights: Array):
    """Weight-average the leading (GPU) axis of every leaf: exact selection at one-hot weights."""
    return jax.tree_util.tree_map(lambda x: jnp.tensordot(weights, x, axes=1), tree)


def spec_step(problem: Problem, weights: tuple[Array, ...]) -> SpecStep | None:
    """k and tokens per step E(alpha_k, k) of the (relaxed) speculative choice; None when the grid
    offers no speculation (static)."""
    if not problem.grid.speculative:
        return None
    ks = grid_tables(problem.grid)["spec_k"]
    e = expected_tokens_per_step(problem.spec_acceptance, ks)
    return SpecStep(
        weights[SPEC] @ ks, weights[SPEC] @ e, problem.draft_model, problem.draft_is_mtp
    )


def pool_units(problem: Problem, weights: tuple[Array, ...]) -> tuple[Array, Array]:
    """(prefill, decode) engines per replica unit of the split choices, weight-averaged over the
    split options only (the colocated weight is mixed in by the caller)."""
    tables = grid_tables(problem.grid)
    w = weights[POOL][1:]
    total = jnp.sum(w)
    some = (
        total > 1e-12
    )  # a colocated one-hot config: any split (1:1) keeps the unused branch finite
    w = jnp.where(some, w / jnp.where(some, total, 1.0), 1.0 / w.shape[0])
    return w @ tables["prefill_units"][1:], w @ tables["decode_units"][1:]


def served_workload(problem: Problem, hardware, deployment, efficiency, workload=None):
    """(the ``Workload`` the prefill path serves, prompt tokens already in KV): the problem's load
    as is, or with its shared prefix served from this configuration's prefix cache
    (``perfmodel.features.prefix_workload``: the uncached prompts, the cached prefix read by every
    iteration)."""
    wl = problem.workload if workload is None else workload
    if not problem.prefix_cache:
        return wl, jnp.zeros(())
    served, cost = prefix_workload(
        System(problem.model, hardware, deployment, efficiency),
        wl,
        shared_fraction=problem.prefix_shared_fraction,
        prefix_tokens=problem.prefix_tokens,
    )
    return served, cost.cached_prompt_tokens


def colocated_metrics(
    problem: Problem,
    weights: tuple[Array, ...],
    replicas: Array,
    temperature: float = 0.0,
    metrics_fn: MetricsFn = slo_metrics,
) -> SloMetrics:
    """Colocated serving metrics in every posterior draw (leaves (draws,)).  ``metrics_fn``: the
    search model by default, ``serving_slo_metrics`` for the verdict (which has no speculation: a
    k > 0 choice keeps the search model; its chunk is the verdict's token budget)."""
    tables = grid_tables(problem.grid)
    deployment = deployment_from_weights(weights, tables, replicas)
    chunk = chunk_from_weights(weights, tables)
    spec = spec_step(problem, weights)
    hardware = mix_gpu(problem.hardware, weights[GPU])

    def one(eff):
        wl, cached = served_workload(problem, hardware, deployment, eff)
        m = slo_metrics(
            System(problem.model, hardware, deployment, eff),
            wl,
            temperature,
            chunk_tokens=chunk,
            spec=spec,
            cached_prompt_tokens=cached,
        )
        m = context_fit(problem, m, hardware, deployment, temperature)
        if metrics_fn is slo_metrics:
            return m
        dep = eqx.tree_at(lambda d: d.max_num_batched_tokens, deployment, chunk)
        v = metrics_fn(
            System(problem.model, hardware, dep, eff), wl, temperature, cached_prompt_tokens=cached
        )
        v = context_fit(problem, v, hardware, deployment, temperature)
        if spec is None:
            return v
        return jax.tree_util.tree_map(lambda a, b: jnp.where(spec.draft_tokens > 0, a, b), m, v)

    return jax.vmap(one)(mix_gpu(problem.efficiency, weights[GPU]))


def split_metrics(
    problem: Problem, weights: tuple[Array, ...], replicas: Array, temperature: float = 0.0
) -> SloMetrics:
    """Metrics of the p:d split (``split_slo_metrics``) in every posterior draw; ``replicas``
    counts replica units (p prefill + d decode engines each)."""
    tables = grid_tables(problem.grid)
    spec = spec_step(problem, weights)
    p_units, d_units = pool_units(problem, weights)
    # each pool on its own GPU type at its own TP and PP, the other knobs shared
    prefill = prefill_pool_weights(weights)
    dep_p = deployment_from_weights(prefill, tables, replicas * p_units)
    dep_d = deployment_from_weights(weights, tables, replicas * d_units)
    hw_p = mix_gpu(problem.hardware, prefill[GPU])
    hw_d = mix_gpu(problem.hardware, weights[GPU])

    def one(ep, ed):
        m = split_slo_metrics(
            System(problem.model, hw_p, dep_p, ep),
            System(problem.model, hw_d, dep_d, ed),
            problem.workload,
            temperature,
            spec=spec,
            transfer_bytes_per_s=problem.transfer_bytes_per_s,
            transfer_latency_s=problem.transfer_latency_s,
            orchestration_s=problem.orchestration_s,
        )
        m = context_fit(problem, m, hw_p, dep_p, temperature)
        return split_itl(context_fit(problem, m, hw_d, dep_d, temperature))

    return jax.vmap(one)(
        mix_gpu(problem.efficiency, prefill[GPU]), mix_gpu(problem.efficiency, weights[GPU])
    )


def split_itl(m: SloMetrics) -> SloMetrics:
    """A decode pool's ITL: its iterations carry no prefill, so one gap is one decode iteration
    and its quantiles are the iteration's at the batch's quantiles -- the split model's TPOT
    quantiles (``_split``: the iteration at the mean and at the p95 batch)."""
    if m.itl_quantiles_s is not None:
        return m
    return dataclasses.replace(m, itl_p95_s=m.tpot_p95_s, itl_quantiles_s=m.tpot_quantiles_s)


def pool_metrics(
    problem: Problem,
    weights: tuple[Array, ...],
    replicas: Array,
    temperature: float = 0.0,
    metrics_fn: MetricsFn = slo_metrics,
) -> tuple[SloMetrics, SloMetrics | None]:
    """(colocated, split) metrics per draw; split is None when the grid has no pool split (static)."""
    col = colocated_metrics(problem, weights, replicas, temperature, metrics_fn)
    if not problem.grid.disaggregated:
        return col, None
    return col, split_metrics(problem, weights, replicas, temperature)


def draw_metrics(
    problem: Problem,
    weights: tuple[Array, ...],
    replicas: Array,
    temperature: float = 0.0,
    metrics_fn: MetricsFn = slo_metrics,
) -> SloMetrics:
    """Serving metrics in every posterior draw (leaves of shape (draws,)) of a discrete (one-hot)
    configuration: the colocated or the split system, as its ``pool_split`` says."""
    col, split = pool_metrics(problem, weights, replicas, temperature, metrics_fn)
    if split is None:
        return col
    colocated = weights[POOL][0] >= 0.5
    return jax.tree_util.tree_map(lambda a, b: jnp.where(colocated, a, b), col, split)


def constraint_slacks(problem: Problem, m: SloMetrics) -> Array:
    """Log-slack of each constraint per draw (>= 0 holds), shape (len(CONSTRAINTS), draws)."""

    def log_ratio(bound, value):
        return jnp.log(bound) - jnp.log(jnp.maximum(value, POSITIVE_FLOOR))

    # no ITL bound (also bounds without the field, such as a benchmark's namespace) is slack
    # +inf even where the latencies are inf: the constraint is absent, not undefined
    itl_bound = jnp.asarray(getattr(problem, "slo_itl_p95_s", jnp.inf))

    return jnp.stack(
        [
            log_ratio(problem.slo_ttft_p95_s, m.ttft_p95_s),
            log_ratio(problem.slo_tpot_p95_s, m.tpot_p95_s),
            -jnp.log(jnp.maximum(m.utilization, POSITIVE_FLOOR)),
            jnp.log(jnp.maximum(m.concurrent_requests, POSITIVE_FLOOR)),
            jnp.where(jnp.isfinite(itl_bound), log_ratio(itl_bound, m.itl_p95_s), jnp.inf),
        ]
    )


def memory_slack(problem: Problem, weights: tuple[Array, ...]) -> Array:
    """log(HBM the engine may use / (weights + workspace + one sequence's KV)) on one device;
    >= 0 exactly when one sequence fits (up to block rounding) -- of the mean prompt + output,
    or of the problem's ``max_model_len_tokens`` when longer.  Smooth in the relaxed knobs, so
    the search feels the memory wall even where the KV capacity is clipped at zero."""
    tables = grid_tables(problem.grid)
    dep = deployment_from_weights(weights, tables, 1.0)
    hw = mix_gpu(problem.hardware, weights[GPU])
    wl = problem.workload
    longest = jnp.maximum(
        wl.prompt_tokens_mean + wl.output_tokens_mean, problem.max_model_len_tokens
    )
    seq = kv_bytes_per_sequence(problem.model, dep.kv_bytes_per_elem, longest) * kv_sequence_share(
        problem.model, dep
    )
    need = (
        weight_bytes_per_gpu(problem.model, dep) + workspace_bytes_per_gpu(problem.model, dep) + seq
    )
    return jnp.log(hw.hbm_bytes * dep.gpu_memory_utilization) - jnp.log(need)


CONFIDENCE_TOLERANCE = 1e-6
"""A share of draws equal to the confidence meets it (float32 means of 0/1 draws round)."""


def meets_confidence(probability: Array, confidence: Array) -> Array:
    """``probability >= confidence`` up to ``CONFIDENCE_TOLERANCE`` (the one rule used everywhere)."""
    return probability >= confidence - CONFIDENCE_TOLERANCE


def constraints_hold(slacks: Array) -> Array:
    """Per-draw indicator that every constraint holds (strict for stability)."""
    strict = jnp.asarray([name == "stability" for name in CONSTRAINTS])[:, None]
    ok = jnp.where(strict, slacks > 0, slacks >= 0)
    return jnp.all(ok, axis=0)


def slo_probability(
    problem: Problem, config: Array, replicas: Array, metrics_fn: MetricsFn = slo_metrics
) -> Array:
    """Share of posterior draws in which the discrete ``config`` with ``replicas`` meets every
    constraint.

    One compiled program per problem shape, whatever the configuration and replica count (a
    host-side re-check would otherwise run the draws' serving model op by op); inside another
    trace it is traced into that program."""
    return _slo_probability(
        problem, jnp.asarray(config), jnp.asarray(replicas, dtype=float), metrics_fn
    )


@eqx.filter_jit
def _slo_probability(problem: Problem, config: Array, replicas: Array, metrics_fn: MetricsFn):
    m = draw_metrics(problem, one_hot_weights(config, problem.grid), replicas, 0.0, metrics_fn)
    return jnp.mean(constraints_hold(constraint_slacks(problem, m)).astype(float))


def gpus_per_replica(problem: Problem, config: Array) -> Array:
    """GPUs of the engines of one replica unit: tp pp colocated; p prefill_tp prefill_pp +
    d tp pp for a p:d pool split."""
    prefill_gpus, decode_gpus = pool_gpus(problem, config)
    return prefill_gpus + decode_gpus


def pool_gpus(problem: Problem, config: Array) -> tuple[Array, Array]:
    """(prefill, decode) GPUs of one replica unit: engines x TP x PP of each pool (0 prefill
    GPUs colocated)."""
    t = grid_tables(problem.grid)
    prefill = t["tp"][config[PREFILL_TP]] * t["pp"][config[PREFILL_PP]]
    decode = t["tp"][config[TP]] * t["pp"][config[PP]]
    units = t["prefill_units"][config[POOL]], t["decode_units"][config[POOL]]
    return units[0] * prefill, units[1] * decode


def cost_per_hour(problem: Problem, config: Array, replicas: Array) -> Array:
    """$/hour: replicas * (tp pp price, or p prefill_tp prefill_pp prefill price + d tp pp
    decode price for a p:d split), times (1 + KV and weight dtype quality surcharges)."""
    prices = problem.hardware.price_per_gpu_hour
    prefill_gpus, decode_gpus = pool_gpus(problem, config)
    price = decode_gpus * prices[config[GPU]] + prefill_gpus * prices[config[PREFILL_GPU]]
    surcharge = (
        1.0
        + problem.kv_penalty_fraction[config[KV]]
        + problem.weight_penalty_fraction[config[WEIGHT]]
    )
    return jnp.asarray(replicas, dtype=float) * price * surcharge


def min_replicas(problem: Problem, configs: Array, metrics_fn: MetricsFn = slo_metrics) -> Array:
    """Fewest replicas (1..max) with SLO probability >= confidence, per config; ``max + 1`` when
    even ``max_replicas`` falls short.  ``configs``: shape (n, len(KNOBS)).  The bisection of
    ``first_trial_costs`` over every count 1..max (ceil(log2(max + 1)) rounds)."""
    return costs_at_min_replicas(problem, configs, metrics_fn)[0]


PROBE_REPLICAS = (1, 2)
"""Replica counts tried first, with the most: most configurations in a search neighbourhood
meet the SLO with one or two replicas, or not even with the most (README problem: 261 of 302
with one or two)."""


@cached_jit
def first_trial_costs(
    problem: Problem,
    configs: Array,
    trials: Array,
    sizes: Array,
    steps: Array,
    metrics_fn: MetricsFn = slo_metrics,
) -> tuple[Array, Array, Array]:
    """(index, replicas, $/hour) per config: the first of its ``trials`` (a row of increasing
    replica counts, its first ``sizes`` used) whose SLO probability meets the confidence, found
    by ``steps`` rounds of bisection (ceil(log2(size + 1)) suffice: the probability does not
    fall with replicas).  index == size, replicas ``max + 1`` and cost ``inf`` when none does.

    ``steps`` is traced, so one compiled program serves every trial list of the same shape:
    the search's probes (1, 2, the most: 2 rounds) and the bisection of the few configurations
    that need more than two replicas (3..max: 6 rounds at 64)."""
    width = trials.shape[-1]

    def one(config, row, size):
        def step(_, bounds):
            lo, hi = bounds  # lo fails (-1: none tried), hi holds (size: a sentinel)
            live = hi - lo > 1
            mid = jnp.clip((lo + hi) // 2, 0, width - 1)
            ok = meets_confidence(
                slo_probability(problem, config, row[mid].astype(float), metrics_fn),
                problem.confidence,
            )
            return jnp.where(live & ~ok, mid, lo), jnp.where(live & ok, mid, hi)

        _, hi = jax.lax.fori_loop(0, steps, step, (jnp.asarray(-1), size))
        return hi

    index = jax.vmap(one)(configs, trials, sizes)
    found = index < sizes
    rows = jnp.arange(len(configs))
    reps = jnp.where(
        found, trials[rows, jnp.minimum(index, width - 1)], problem.grid.max_replicas + 1
    )
    cost = jax.vmap(lambda c, r: cost_per_hour(problem, c, r.astype(float)))(configs, reps)
    return index, reps, jnp.where(found, cost, jnp.inf)


def probe_trials(max_replicas: int) -> tuple[np.ndarray, np.ndarray]:
    """(probe row, bisection row), each ``max_replicas`` wide (padded with its last count): the
    probes ``PROBE_REPLICAS`` and the most, then every count above the probes up to the most."""
    probes = sorted({r for r in PROBE_REPLICAS if r < max_replicas} | {max_replicas})
    rest = list(range(probes[-2] + 1, max_replicas + 1)) if len(probes) > 1 else [max_replicas]

    def padded(counts):
        return np.asarray(counts + [counts[-1]] * (max_replicas - len(counts)), dtype=np.int32)

    return padded(probes), padded(rest)


def costs_at_min_replicas(
    problem: Problem, configs: Array, metrics_fn: MetricsFn = slo_metrics
) -> tuple[Array, Array]:
    """(replicas, $/hour) per config at the fewest replicas meeting the chance constraints
    (``min_replicas``); infeasible configs cost ``inf``."""
    r_max = problem.grid.max_replicas
    n = len(configs)
    trials = jnp.broadcast_to(jnp.arange(1, r_max + 1, dtype=jnp.int32), (n, r_max))
    sizes = jnp.full(n, r_max, dtype=jnp.int32)
    steps = jnp.asarray(r_max.bit_length())
    _, reps, cost = first_trial_costs(problem, configs, trials, sizes, steps, metrics_fn)
    return reps, cost
