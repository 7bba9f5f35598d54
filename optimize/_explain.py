"""Why an answer is what it is: binding constraint, shadow prices, cost gradients, closest SLO.

Shadow prices and cost gradients come from the implicit function theorem on the sigmoid-smoothed
chance constraint P_s(r, theta) = confidence at the recommended configuration, with the replica
count r relaxed to a real number: d log r / d theta = -(dP_s/d theta) / (dP_s/d log r).  Cost is
proportional to r, so d log cost / d log theta (an elasticity) is d log r / d log theta, and the
shadow price of an SLO bound S is d cost / d S = cost * (d log r / d log S) / S.  They are
marginal values of the continuous requirement (the integer replica count moves in steps).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from perfmodel import DTYPE_BYTES, Array

from ._evaluate import (
    CONSTRAINTS,
    colocated_metrics,
    constraint_slacks,
    constraints_hold,
    draw_metrics,
    split_metrics,
)
from ._grid import GPU, KNOBS, KV, MNBT, POOL, PP, SEQS, TP, WEIGHT, one_hot_weights
from ._problem import Problem
from ._program_cache import cached_jit
from ._search import _line_neighbours
from ._sharding import pad_rows

SENSITIVITIES: tuple[str, ...] = (
    "peak_flops_per_s",
    "hbm_bytes_per_s",
    "hbm_bytes",
    "link_bytes_per_s",
    "arrival_rate_per_s",
    "prompt_tokens_mean",
    "output_tokens_mean",
    "slo_ttft_p95_s",
    "slo_tpot_p95_s",
    "slo_itl_p95_s",
)
"""Quantities the cost is differentiated against (hardware budgets, workload, SLO bounds)."""

_SIGMOID_WIDTH = 0.05

ELASTICITY_TEMPERATURE = 0.02
"""Smoothing of the load model's min/max laws where the elasticities differentiate it (narrower
than the search's: the derivative is read at one configuration, not followed across kinks)."""

SLACK_CLIP = 10.0
"""Log-slacks are clipped to +-10 (an unbounded SLO, +inf, counts as met) before the sigmoid."""

REPLICA_BISECTIONS = 40
"""Bisection steps on log r for the continuous replicas r* (the bracket [1e-3, 4 x max_replicas]
narrows by 2^-40)."""

LOWEST_REPLICAS, HIGHEST_REPLICAS_FACTOR = 1e-3, 4.0
"""The bracket of r*: from a thousandth of a replica to 4 x the grid's ``max_replicas``."""


def _scaled(problem: Problem, log_scales: Array) -> Problem:
    s = jnp.exp(log_scales)
    h, w = problem.hardware, problem.workload
    return eqx.tree_at(
        lambda p: (
            p.hardware.dense_flops_per_s,
            p.hardware.hbm_bytes_per_s,
            p.hardware.hbm_bytes,
            p.hardware.link_bytes_per_s,
            p.workload.arrival_rate_per_s,
            p.workload.prompt_tokens_mean,
            p.workload.output_tokens_mean,
            p.slo_ttft_p95_s,
            p.slo_tpot_p95_s,
            p.slo_itl_p95_s,
        ),
        problem,
        (
            h.dense_flops_per_s * s[0],
            h.hbm_bytes_per_s * s[1],
            h.hbm_bytes * s[2],
            h.link_bytes_per_s * s[3],
            w.arrival_rate_per_s * s[4],
            w.prompt_tokens_mean * s[5],
            w.output_tokens_mean * s[6],
            problem.slo_ttft_p95_s * s[7],
            problem.slo_tpot_p95_s * s[8],
            problem.slo_itl_p95_s * s[9],
        ),
    )


def _metrics(problem: Problem, config: Array, replicas: Array, temperature: float, split: bool):
    """Per-draw metrics of the colocated (``split`` False) or split system; the choice is static
    (a traced ``where`` would send NaN gradients back from the branch not taken, and one branch
    compiles in half the time)."""
    w = one_hot_weights(config, problem.grid)
    if split:
        return split_metrics(problem, w, replicas, temperature)
    return colocated_metrics(problem, w, replicas, temperature)


def _smooth_probability(
    problem: Problem, config: Array, log_r: Array, log_scales: Array, split: bool
) -> Array:
    p = _scaled(problem, log_scales)
    m = _metrics(p, config, jnp.exp(log_r), ELASTICITY_TEMPERATURE, split)
    slacks = constraint_slacks(p, m)
    slacks = jnp.where(
        jnp.isnan(slacks), -SLACK_CLIP, jnp.clip(slacks, -SLACK_CLIP, SLACK_CLIP)
    )  # +inf: unbounded SLO
    return jnp.mean(jnp.prod(jax.nn.sigmoid(slacks / _SIGMOID_WIDTH), axis=0))


def cost_elasticities(problem: Problem, config: Array) -> tuple[Array, Array]:
    """(continuous replicas r*, d log cost / d log theta for ``SENSITIVITIES``) at ``config``
    (concrete: whether it is a pool split picks the compiled branch)."""
    return _elasticities(problem, jnp.asarray(config), bool(int(np.asarray(config)[POOL]) > 0))


@cached_jit(compiler_options={"xla_backend_optimization_level": 0})  # run once: compile-bound
def _elasticities(problem: Problem, config: Array, split: bool) -> tuple[Array, Array]:
    """(continuous replicas r*, d log cost / d log theta for ``SENSITIVITIES``) at ``config``.

    r* solves the smoothed chance constraint by bisection on log r; an unbounded SLO has zero
    sensitivity.
    """
    zero = jnp.zeros(len(SENSITIVITIES))

    def gap(log_r):
        return _smooth_probability(problem, config, log_r, zero, split) - problem.confidence

    def step(_, b):
        lo, hi = b
        mid = 0.5 * (lo + hi)
        ok = gap(mid) >= 0
        return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

    bracket = (
        jnp.log(LOWEST_REPLICAS),
        jnp.log(HIGHEST_REPLICAS_FACTOR * problem.grid.max_replicas),
    )
    _lo, hi = jax.lax.fori_loop(0, REPLICA_BISECTIONS, step, bracket)
    log_r = hi
    d_log_r, d_theta = jax.grad(  # one backward pass for both
        lambda lr, ls: _smooth_probability(problem, config, lr, ls, split), argnums=(0, 1)
    )(log_r, zero)
    elasticity = jnp.where(jnp.abs(d_log_r) > 1e-12, -d_theta / d_log_r, 0.0)
    finite_slo = jnp.concatenate(
        [
            jnp.ones(7, dtype=bool),
            jnp.stack(
                [
                    jnp.isfinite(problem.slo_ttft_p95_s),
                    jnp.isfinite(problem.slo_tpot_p95_s),
                    jnp.isfinite(problem.slo_itl_p95_s),
                ]
            ),
        ]
    )
    return jnp.exp(log_r), jnp.where(finite_slo, elasticity, 0.0)


def binding_constraint(problem: Problem, slacks: np.ndarray) -> str:
    """The constraint with the least headroom at the required confidence: the one whose
    (1 - confidence)-quantile of log-slack over draws is smallest.  ``slacks``: (constraints, draws)."""
    slacks = np.asarray(slacks)
    # an unbounded SLO has slack +inf: kept out of the interpolation (inf - inf)
    slacks = np.where(np.isposinf(slacks), np.finfo(float).max, slacks)
    q = np.quantile(slacks, 1.0 - float(problem.confidence), axis=1)
    q = np.where(np.isnan(q), np.inf, q)
    return CONSTRAINTS[int(np.argmin(q))]


@cached_jit
def _achievable(problem: Problem, configs: Array) -> Array:
    """Per config at ``max_replicas``, confidence-quantiles over draws of: the common factor by
    which every SLO bound must be relaxed, p95 TTFT, p95 TPOT, p95 ITL (inf where it is unstable
    or does not fit).  Shape (n, 4)."""
    r = float(problem.grid.max_replicas)
    slos = jnp.asarray([CONSTRAINTS.index(k) for k in ("ttft_p95", "tpot_p95", "itl_p95")])

    def one(config):
        m = draw_metrics(problem, one_hot_weights(config, problem.grid), r)
        slacks = constraint_slacks(problem, m)
        hard_ok = constraints_hold(slacks.at[slos].set(0.0))
        over = jnp.exp(-jnp.minimum(slacks[slos], 0.0))  # >= 1: needed relaxation per SLO
        factor = jnp.where(hard_ok, jnp.max(over, axis=0), jnp.inf)
        ttft = jnp.where(hard_ok, m.ttft_p95_s, jnp.inf)
        tpot = jnp.where(hard_ok, m.tpot_p95_s, jnp.inf)
        itl = jnp.where(hard_ok, m.itl_p95_s, jnp.inf)
        return jnp.quantile(jnp.stack([factor, ttft, tpot, itl]), problem.confidence, axis=1)

    return jax.vmap(one)(configs)


EXHAUSTIVE_CONFIGS = 8192
"""Grids up to this many configurations are scanned whole by ``closest_achievable``; larger
ones (the default grid with pool splits and chunks holds over a million) by coordinate descent."""

ACHIEVABLE_ROWS = 512
"""Configurations per ``_achievable`` call (padded): one compiled shape, ~0.6 GB at 200 draws."""


def _achievable_rows(problem: Problem, configs: np.ndarray) -> np.ndarray:
    """``_achievable`` of ``configs`` in padded blocks of ``ACHIEVABLE_ROWS``: shape (n, 4)."""
    padded = pad_rows(configs, ACHIEVABLE_ROWS)
    return np.concatenate(
        [
            np.asarray(_achievable(problem, jnp.asarray(padded[i : i + ACHIEVABLE_ROWS])))
            for i in range(0, len(padded), ACHIEVABLE_ROWS)
        ]
    )[: len(configs)]


def _roomiest(problem: Problem) -> np.ndarray:
    """Per GPU type, the colocated configuration most likely to fit and keep up: the largest TP
    and PP, the smallest weight and KV dtypes, the largest token budget and sequence cap (made
    legal, ``Grid.canonical``).  Seeds the descent where every configuration the search scored
    is out of reach (no finite quantity to descend on)."""
    g = problem.grid
    row = np.zeros(len(KNOBS), dtype=np.int32)
    row[TP], row[PP] = len(g.tp) - 1, len(g.pp) - 1
    row[KV] = min(range(len(g.kv_dtypes)), key=lambda i: DTYPE_BYTES[g.kv_dtypes[i]])
    row[WEIGHT] = min(range(len(g.weight_dtypes)), key=lambda i: DTYPE_BYTES[g.weight_dtypes[i]])
    row[MNBT], row[SEQS] = len(g.max_num_batched_tokens) - 1, len(g.max_num_seqs) - 1
    rows = np.repeat(row[None, :], g.num_gpus, axis=0)
    rows[:, GPU] = np.arange(g.num_gpus)
    return g.canonical(rows, problem.model)


def _descend(
    problem: Problem, starts: np.ndarray, max_rounds: int
) -> tuple[np.ndarray, np.ndarray]:
    """(configs, their ``_achievable`` rows) visited by a coordinate descent of each of the four
    quantities from ``starts``: every round moves each quantity's best configuration to its best
    neighbour along one knob (``_line_neighbours``), until none improves."""
    table: dict[tuple[int, ...], np.ndarray] = {}

    def score(configs: np.ndarray) -> None:
        keys = sorted({tuple(int(v) for v in c) for c in configs} - table.keys())
        if keys:
            table.update(zip(keys, _achievable_rows(problem, np.asarray(keys, dtype=np.int32))))

    score(np.concatenate([np.asarray(starts, dtype=np.int32), _roomiest(problem)]))
    centres = None
    for _ in range(max_rounds):
        keys = list(table)
        q = np.stack([table[k] for k in keys])
        best = np.unique(np.asarray([keys[int(np.argmin(q[:, j]))] for j in range(4)]), axis=0)
        if centres is not None and np.array_equal(best, centres):
            break
        centres = best
        score(_line_neighbours(problem, centres))
    keys = list(table)
    return np.asarray(keys, dtype=np.int32), np.stack([table[k] for k in keys])


def closest_achievable(
    problem: Problem, starts: np.ndarray | None = None, max_rounds: int = 8
) -> dict:
    """What can be met with the required confidence at ``max_replicas``: the smallest p95 TTFT,
    p95 TPOT and p95 ITL bounds (each on its own), and the smallest common factor on the given bounds
    (``scale``; None where nothing fits and keeps up at all).  ``binding`` names the SLO that
    needs the larger relaxation; ``configs`` maps each of the three to the index vector that
    achieves it.  A grid of at most ``EXHAUSTIVE_CONFIGS`` configurations is scanned whole (the
    exact minima); a larger one by coordinate descent from ``starts`` (the configurations the
    search scored; None: none) and each GPU's roomiest configuration for at most ``max_rounds``
    rounds, whose minima are what the best configuration it reached achieves (a bound the whole
    grid can only lower).  ``exhaustive`` says which (``configurations_scored`` of
    ``configurations_in_grid``), so a report can say "achievable" or "found"."""
    in_grid = problem.grid.count_configs(problem.model)
    coverage = {"exhaustive": in_grid <= EXHAUSTIVE_CONFIGS, "configurations_in_grid": in_grid}
    if coverage["exhaustive"]:
        configs = problem.grid.all_configs(problem.model)
        q = _achievable_rows(problem, configs)
    else:
        none = np.zeros((0, len(KNOBS)), dtype=np.int32)
        configs, q = _descend(problem, none if starts is None else starts, max_rounds)
    coverage["configurations_scored"] = len(configs)
    best = q.min(axis=0)
    if not np.isfinite(best[0]):
        return {
            "scale": None,
            "ttft_p95_s": None,
            "tpot_p95_s": None,
            "itl_p95_s": None,
            "binding": "memory_fit_or_stability",
            "configs": {},
            **coverage,
        }
    where = {
        k: configs[int(np.argmin(q[:, j]))]
        for j, k in enumerate(("scale", "ttft_p95_s", "tpot_p95_s", "itl_p95_s"))
    }
    ratios = {}
    for name, bound, v in (
        ("ttft_p95", problem.slo_ttft_p95_s, best[1]),
        ("tpot_p95", problem.slo_tpot_p95_s, best[2]),
        ("itl_p95", problem.slo_itl_p95_s, best[3]),
    ):
        ratios[name] = v / float(bound) if np.isfinite(float(bound)) else 0.0
    return {
        "scale": float(best[0]),
        "ttft_p95_s": float(best[1]),
        "tpot_p95_s": float(best[2]),
        "itl_p95_s": float(best[3]),
        "binding": max(ratios, key=ratios.get),
        "configs": where,
        **coverage,
    }
