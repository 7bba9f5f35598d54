"""Gradient search over the relaxed knobs, then rounding and exact re-check of neighbours.

Each knob is a softmax over its legal choices (GPU type, TP, PP, KV dtype, weight dtype, token
budget, sequence cap, prefill chunk, speculative k, pool split and prefill-pool GPU) plus a real
log-replica count.  The relaxed loss is
log($/hour) + ``penalty`` * softplus((confidence - P_smooth) / w) * w + far-field hinge, with
P_smooth the posterior mean of a product of logistic indicators of each constraint's log-slack
(the chance constraint, sigmoid-smoothed).  ``num_starts`` random starts run at once under
``vmap`` with ``optax.adam``; the log-replica count is kept in its box by
``optax.projections.projection_box``.  Every start is rounded (argmax per knob); the best few
distinct roundings seed a coordinate search over the exact model (each knob tried at every
value, fewest replicas by bisection) until no move lowers the cost.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from perfmodel import Array

from ._evaluate import (
    constraint_slacks,
    first_trial_costs,
    memory_slack,
    pool_metrics,
    pool_units,
    probe_trials,
)
from ._grid import (
    GPU,
    KV,
    MOE,
    POOL,
    PREFILL_GPU,
    PREFILL_PP,
    PREFILL_TP,
    TP,
    WEIGHT,
    engine_gpus,
    grid_tables,
    on_gpu_type,
    prefill_pool_weights,
)
from ._problem import Problem
from ._program_cache import cached_jit
from ._sharding import AXIS, MeshLike, device_mesh, map_rows, num_shards, pad_rows, replicate

_NEG = -1e9

SEARCH_TEMPERATURE = 0.05
"""Smoothing (``temperature``) of the load model's hard min/max laws inside the relaxed loss,
so the descent has gradients across their kinks; the exact re-check evaluates them at 0."""

SHORTFALL_WIDTH = 0.02
"""Width, in probability, of the softplus that prices the smoothed P(SLO) falling short of the
confidence: a shortfall much wider costs ``penalty`` x the shortfall, a narrower one a smooth
ramp (the loss stays differentiable where the constraint starts to bind)."""

START_LOGIT_SD = 2.0
"""Standard deviation of the starts' random knob logits (the softmax of each knob's logits is
the start's mix of its options)."""

START_GPU_LEAN = 3.0
"""Logit added to start i's GPU type i mod G, so the starts cover every GPU type."""


class SearchOptions(NamedTuple):
    """Knobs of the search itself (static).

    Attributes:
        num_starts: random starts run together under ``vmap``.
        num_steps: Adam steps.
        learning_rate: Adam step size (logits and log-replicas).
        relaxed_draws: posterior draws used by the relaxed loss (the exact re-check uses all).
        sigmoid_width: width of the logistic indicator, in log-slack units.
        penalty: weight of the chance-constraint penalty against log cost.
        num_seeds: distinct roundings that seed the exact coordinate search.
        max_rounds: coordinate-search rounds.
        pair_seeds: centres (best first) whose two-knob neighbourhood is also tried each round.
        seed: PRNG seed of the starts.
        chunk_rows: configurations scored per call of the exact check (one compiled shape).
    """

    num_starts: int = 32
    num_steps: int = 150
    learning_rate: float = 0.1
    relaxed_draws: int = 32
    sigmoid_width: float = 0.05
    penalty: float = 20.0
    num_seeds: int = 4
    max_rounds: int = 4
    pair_seeds: int = 1
    seed: int = 0
    chunk_rows: int = 32


class Relaxed(NamedTuple):
    """Relaxed knobs of one start: logits per knob and log replicas."""

    logits: tuple[Array, ...]
    log_replicas: Array


def _masks(problem: Problem) -> tuple[Array, ...]:
    sizes = problem.grid.sizes()
    masks = [jnp.zeros(n) for n in sizes]
    legal = jnp.mod(problem.model.num_heads, jnp.asarray(problem.grid.tp, dtype=float)) == 0
    masks[TP] = masks[PREFILL_TP] = jnp.where(legal, 0.0, _NEG)
    plain = jnp.asarray([name == "tp" for name in problem.grid.moe_layouts])
    masks[MOE] = jnp.where(plain | problem.model.has_routed_experts, 0.0, _NEG)
    return tuple(masks)


def _smooth_feasibility(problem: Problem, m, mem: Array, w: float) -> tuple[Array, Array]:
    """(P_smooth, far-field hinge) of per-draw metrics ``m`` with memory log-slack ``mem``."""
    slacks = constraint_slacks(problem, m).at[3].set(mem)
    slacks = jnp.where(
        jnp.isnan(slacks), -10.0, jnp.clip(slacks, -10.0, 10.0)
    )  # +inf: unbounded SLO
    p_smooth = jnp.mean(jnp.prod(jax.nn.sigmoid(slacks / w), axis=0))
    far = jnp.mean(jnp.sum(jax.nn.relu(-slacks + w) ** 2, axis=0))
    return p_smooth, far


def relaxed_loss(problem: Problem, x: Relaxed, options: SearchOptions) -> Array:
    """Smooth surrogate of log(cost) + chance-constraint penalty at one relaxed point.

    With a pool split among the choices, the colocated weight w0 mixes the two systems:
    P_smooth = w0 P_colocated + (1 - w0) P_split, cost likewise (the split's p:d engines per unit
    and both pools' GPU prices weight-averaged over their softmaxes)."""
    weights = tuple(jax.nn.softmax(l + m) for l, m in zip(x.logits, _masks(problem)))
    replicas = jnp.exp(x.log_replicas)
    tables = grid_tables(problem.grid)
    prices = problem.hardware.price_per_gpu_hour
    surcharge = (
        1.0
        + weights[KV] @ problem.kv_penalty_fraction
        + weights[WEIGHT] @ problem.weight_penalty_fraction
    )

    def pool_price(knobs):  # $/hour of one engine: its GPUs at its GPU type's price
        return engine_gpus(knobs, tables) * (knobs[GPU] @ prices)

    cost = replicas * surcharge * pool_price(weights)

    sub = jax.tree_util.tree_map(lambda e: e[:, : options.relaxed_draws], problem.efficiency)
    small = eqx.tree_at(lambda p: p.efficiency, problem, sub)
    col, split = pool_metrics(small, weights, replicas, temperature=SEARCH_TEMPERATURE)
    w = options.sigmoid_width
    mem = memory_slack(small, weights)
    p_smooth, far = _smooth_feasibility(small, col, mem, w)
    if split is not None:
        p_units, d_units = pool_units(small, weights)
        prefill = prefill_pool_weights(weights)  # its own GPU type, TP and PP
        cost_split = (
            replicas * surcharge * (p_units * pool_price(prefill) + d_units * pool_price(weights))
        )
        mem_split = jnp.minimum(mem, memory_slack(small, prefill))  # both pools must fit
        p_split, far_split = _smooth_feasibility(small, split, mem_split, w)
        w0 = weights[POOL][0]
        p_smooth = w0 * p_smooth + (1.0 - w0) * p_split
        far = w0 * far + (1.0 - w0) * far_split
        cost = w0 * cost + (1.0 - w0) * cost_split
    shortfall = jax.nn.softplus((problem.confidence - p_smooth) / SHORTFALL_WIDTH) * SHORTFALL_WIDTH
    return jnp.log(cost) + options.penalty * shortfall + far


def _init(problem: Problem, key: Array, options: SearchOptions) -> Relaxed:
    sizes = problem.grid.sizes()
    keys = jax.random.split(key, len(sizes) + 1)
    logits = [
        START_LOGIT_SD * jax.random.normal(k, (options.num_starts, n)) for k, n in zip(keys, sizes)
    ]
    # spread the starts over the GPU types: start i leans towards GPU i mod G
    lean = jnp.eye(sizes[0])[jnp.arange(options.num_starts) % sizes[0]]
    logits[0] = logits[0] + START_GPU_LEAN * lean
    logits = tuple(logits)
    log_r = jax.random.uniform(
        keys[-1], (options.num_starts,), maxval=jnp.log(problem.grid.max_replicas)
    )
    return Relaxed(logits, log_r)


@cached_jit
def relaxed_descent(
    problem: Problem, options: SearchOptions, key: Array, sharding=None
) -> tuple[Relaxed, Array]:
    """Run Adam from ``num_starts`` random starts (drawn with ``key``) at once; returns the final
    points and their losses.  ``options.seed`` is ignored here (the key is traced: no recompile).
    ``sharding`` (a ``NamedSharding`` over the starts axis, static) splits the starts over devices;
    the starts are drawn before the split, so the answer does not depend on it."""
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes int and float
        return _descent(problem, options, key, sharding)


def _descent(
    problem: Problem, options: SearchOptions, key: Array, sharding=None
) -> tuple[Relaxed, Array]:
    opt = optax.adam(options.learning_rate)
    x0 = _init(problem, key, options)
    if sharding is not None:
        x0 = jax.lax.with_sharding_constraint(x0, sharding)
    loss_grad = jax.vmap(jax.value_and_grad(lambda x: relaxed_loss(problem, x, options)))
    hi = jnp.log(float(problem.grid.max_replicas))

    def step(carry, _):
        x, state = carry
        loss, grad = loss_grad(x)
        grad = jax.tree_util.tree_map(lambda g: jnp.where(jnp.isfinite(g), g, 0.0), grad)
        updates, state = opt.update(grad, state, x)
        x = optax.apply_updates(x, updates)
        x = x._replace(log_replicas=optax.projections.projection_box(x.log_replicas, 0.0, hi))
        return (x, state), loss

    (x, _), _losses = jax.lax.scan(step, (x0, opt.init(x0)), None, length=options.num_steps)
    return x, jax.vmap(lambda xi: relaxed_loss(problem, xi, options))(x)


def round_relaxed(problem: Problem, x: Relaxed) -> np.ndarray:
    """Argmax of every knob's (masked) logits, made legal (``Grid.canonical``): (starts, len(KNOBS))."""
    cols = [np.asarray(jnp.argmax(l + m, axis=-1)) for l, m in zip(x.logits, _masks(problem))]
    return problem.grid.canonical(np.stack(cols, axis=-1).astype(np.int32), problem.model)


def _live_knobs(problem: Problem) -> tuple[int, ...]:
    """Knob columns a move can change: more than one choice, and the prefill-pool GPU only when
    pool splits are offered (static per grid, so the neighbour batches keep one shape)."""
    sizes = problem.grid.sizes()
    pool_only = (PREFILL_GPU, PREFILL_TP, PREFILL_PP)
    return tuple(
        k
        for k, n in enumerate(sizes)
        if n > 1 and (k not in pool_only or problem.grid.disaggregated)
    )


def _line_neighbours(problem: Problem, centres: np.ndarray) -> np.ndarray:
    """Every config that differs from a centre in one knob (each knob at every value), made legal
    (``Grid.canonical``: an illegal TP moves to the nearest legal one, a chunk above the budget
    to the largest legal chunk)."""
    out = []
    live = _live_knobs(problem)
    for c in centres:
        for k, n in enumerate(problem.grid.sizes()):
            if k not in live:
                continue
            for v in range(n):
                row = c.copy()
                row[k] = v
                out.append(row)
    return problem.grid.canonical(np.asarray(out, dtype=np.int32), problem.model)


def _pair_neighbours(problem: Problem, centre: np.ndarray) -> np.ndarray:
    """Every config that differs from ``centre`` in exactly two knobs (trades such as TP x2 with
    replicas /2, or colocated -> split with a prefill GPU, need two moves at once), made legal."""
    sizes = problem.grid.sizes()
    live = _live_knobs(problem)
    out = []
    for a in live:
        for b in (k for k in live if k > a):
            for va in range(sizes[a]):
                for vb in range(sizes[b]):
                    row = centre.copy()
                    row[a], row[b] = va, vb
                    out.append(row)
    return problem.grid.canonical(np.asarray(out, dtype=np.int32), problem.model)


class SearchResult(NamedTuple):
    """Ranked distinct configurations the exact re-check found (cheapest first); ``evaluated``
    counts them (each scored once, however many neighbourhoods it was in)."""

    configs: np.ndarray
    replicas: np.ndarray
    cost_per_hour: np.ndarray
    evaluated: int

    def cheapest_on_gpu_type(self, gpu: int) -> int | None:
        """Row of the cheapest feasible configuration with every engine on GPU type ``gpu``
        (``on_gpu_type``), or None when the search kept none."""
        if not len(self.configs):
            return None
        ok = on_gpu_type(self.configs, gpu) & np.isfinite(np.asarray(self.cost_per_hour))
        rows = np.flatnonzero(ok)
        return int(rows[0]) if rows.size else None


def _starts_sharding(mesh, num_starts: int):
    if mesh is None or num_starts % num_shards(mesh):
        return None
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(mesh.axis_names[0] if mesh.axis_names else AXIS))


def _score_new(
    problem: Problem,
    cand: np.ndarray,
    table: dict[tuple[int, ...], tuple[int, float]],
    mesh,
    chunk_rows: int,
) -> None:
    """Add (replicas, $/hour) of every configuration in ``cand`` not yet in ``table``.

    A round's neighbourhoods repeat themselves (legalising folds many moves onto one
    configuration: the README problem's 686 rows are 294 configurations) and later rounds mostly
    revisit the earlier ones (16 new, then none), so only new configurations are scored, in
    chunks of ``chunk_rows`` (one compiled shape; the last chunk padded with its first row).
    Each configuration's cost is its own (a ``vmap`` over rows), whatever else is in the chunk.
    Most need one or two replicas or are infeasible, so each is first tried at 1, 2 and the most
    replicas (2 bisection rounds over the 200 draws); only those that need more than two go on
    to a bisection over 3..max (6 rounds at 64), in the same compiled program
    (``first_trial_costs``).
    """
    keys = dict.fromkeys(tuple(int(v) for v in c) for c in cand)
    new = np.asarray([k for k in keys if k not in table], dtype=np.int32).reshape(
        -1, cand.shape[-1]
    )
    probes, rest = probe_trials(problem.grid.max_replicas)
    n_probes = len(set(probes.tolist()))
    # counts lie between the last small probe and the most: holding at the most alone says
    # only that the fewest is somewhere in between
    gap = n_probes > 1 and probes[n_probes - 1] - probes[n_probes - 2] > 1
    unsettled = []
    for rows, (index, reps, cost) in _in_chunks(problem, new, probes, n_probes, mesh, chunk_rows):
        for c, i, r, k in zip(rows, index, reps, cost):
            if gap and i == n_probes - 1:
                unsettled.append(c)
            else:
                table[tuple(int(v) for v in c)] = (int(r), float(k))
    more = np.asarray(unsettled, dtype=np.int32).reshape(-1, cand.shape[-1])
    n_rest = len(set(rest.tolist()))
    for rows, (_, reps, cost) in _in_chunks(problem, more, rest, n_rest, mesh, chunk_rows):
        for c, r, k in zip(rows, reps, cost):
            table[tuple(int(v) for v in c)] = (int(r), float(k))


def _in_chunks(problem: Problem, rows: np.ndarray, trials: np.ndarray, size: int, mesh, chunk_rows):
    """``(chunk, first_trial_costs as numpy)`` for each ``chunk_rows`` slice of ``rows``, every
    row trying the first ``size`` counts of ``trials`` (padded with its first row to one
    compiled shape; the padding's outputs dropped)."""
    steps = jnp.asarray(int(size).bit_length())
    # every chunk is padded to ``chunk_rows`` rows and tries the same counts: built once
    tried = jnp.asarray(np.broadcast_to(trials, (chunk_rows, len(trials))))
    sizes = jnp.full(chunk_rows, size, dtype=jnp.int32)
    for i in range(0, len(rows), chunk_rows):
        chunk = rows[i : i + chunk_rows]
        padded = pad_rows(chunk, chunk_rows)
        if mesh is None:
            out = first_trial_costs(problem, jnp.asarray(padded), tried, sizes, steps)
        else:
            out = map_rows(
                lambda p, x: first_trial_costs(p, x, tried, sizes, steps),
                padded,
                mesh,
                problem=problem,
            )
        yield chunk, tuple(np.asarray(a)[: len(chunk)] for a in out)


def search(
    problem: Problem,
    options: SearchOptions = SearchOptions(),  # noqa: B008 (an immutable NamedTuple)
    *,
    mesh: MeshLike = None,
) -> SearchResult:
    """Relaxed multi-start descent, rounding, then exact coordinate search from the best roundings.

    With several devices (``mesh``: see ``optimize._sharding.device_mesh``) the starts (when their
    number divides by the device count) and every batch of exact re-checks are split over them.
    """
    mesh = device_mesh(mesh)
    x, losses = relaxed_descent(
        replicate(problem, mesh),
        options._replace(seed=0),
        jax.random.PRNGKey(options.seed),
        _starts_sharding(mesh, options.num_starts),
    )
    rounded = round_relaxed(problem, x)
    order = np.argsort(np.asarray(losses))
    seeds, seen = [], set()
    seeded_gpus = set()
    for i in order:  # the best rounding on each GPU type first, best loss first
        if rounded[i][0] not in seeded_gpus and len(seeds) < options.num_seeds:
            seeded_gpus.add(rounded[i][0])
            seen.add(tuple(rounded[i]))
            seeds.append(rounded[i])
    for i in order:
        if len(seeds) >= options.num_seeds:
            break
        key = tuple(rounded[i])
        if key not in seen:
            seen.add(key)
            seeds.append(rounded[i])
    while len(seeds) < options.num_seeds:
        seeds.append(seeds[-1])
    centres = np.asarray(seeds)
    table: dict[tuple[int, ...], tuple[int, float]] = {}
    for _ in range(options.max_rounds):
        lines = _line_neighbours(problem, centres)
        pairs = np.concatenate(
            [_pair_neighbours(problem, c) for c in centres[: options.pair_seeds]]
        )
        cand = np.concatenate([lines, pairs])
        _score_new(problem, cand, table, mesh, options.chunk_rows)
        cost = np.asarray([table[tuple(int(v) for v in c)][1] for c in cand])
        per = cost[: len(lines)].reshape(len(centres), -1)
        best = lines.reshape(len(centres), -1, lines.shape[-1])[
            np.arange(len(centres)), per.argmin(1)
        ]
        pair_cost = cost[len(lines) :].reshape(min(options.pair_seeds, len(centres)), -1)
        pair_best = pairs.reshape(len(pair_cost), -1, pairs.shape[-1])
        for j in range(len(pair_cost)):
            if pair_cost[j].min() < per[j].min():
                best[j] = pair_best[j, pair_cost[j].argmin()]
        if np.array_equal(best, centres):
            break
        centres = best
    ranked = sorted(table.items(), key=lambda kv: kv[1][1])
    return SearchResult(
        configs=np.asarray([k for k, _ in ranked], dtype=np.int32),
        replicas=np.asarray([v[0] for _, v in ranked]),
        cost_per_hour=np.asarray([v[1] for _, v in ranked]),
        evaluated=len(table),
    )
