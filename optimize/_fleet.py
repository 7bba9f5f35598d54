"""Fleet mix: request-size classes served by a mix of GPU types (Melange, Griggs et al. 2024).

Each class c (prompt/output length, arrival rate lambda_c) has, on each GPU type g, a cheapest
configuration whose single replica serves at most ``capacity[c, g]`` requests/s under the SLO
with the stated confidence (``class_capacities``).  A class's load can be split over any replicas
serving it, so the fleet problem is the integer program

    min  sum_{c,g} n[c,g] * replica_cost[c,g]
    s.t. sum_g capacity[c,g] * n[c,g] >= lambda_c             (every class served)
         sum_c replica_gpus[c,g] * n[c,g] <= max_gpus[g]       (availability)
         n integer >= 0.

``fleet_milp`` solves it exactly with ``scipy.optimize.milp``; ``fleet_gradient`` relaxes n to
softplus(theta) * lambda_c / capacity[c, g] (scale-free) and runs Adam on cost plus quadratic penalties from many starts at once (vmap),
then rounds up and improves the integer answer by exact local moves (drop a replica; trade
replicas of one type for the fewest of another that keep the class served).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from perfmodel import RATE_FLOOR_PER_S

ROUNDING_TOLERANCE = 1e-9
"""Relative slack of the integer plan's checks and roundings (replicas, GPUs, served rates):
ceil(x - tol) and floor(x + tol) keep a count that floating point puts a hair past an integer
at that integer."""

DESCENT_LEARNING_RATE, DESCENT_STEPS = 0.05, 300
"""Adam step size on the replica logits and the number of steps of the relaxed fleet descent."""

CONSTRAINT_PENALTY = 1000.0
"""Weight of the squared unserved share and the squared excess over a GPU limit in the relaxed
fleet loss, against its cost (normalised to about 1)."""

NO_LIMIT_GPUS = 1e12
"""A GPU type without an availability limit (``--max-gpus``) counts as having this many."""

START_LOGIT_MEAN, START_OFF_LOGIT, START_ON_LOGIT = -1.0, -3.0, 1.0
"""Starting replica logits: random starts around -1 (softplus ~0.3 of what a type would carry
alone); the first starts put every class on its k-th cheapest type (logit 1, softplus ~1.3) and
almost nothing elsewhere (logit -3, softplus ~0.05)."""


class FleetProblem(NamedTuple):
    """Per-class capacities and costs (numpy, shapes (C,) and (C, G)).

    Attributes:
        rates: requests/s of each class.
        capacity: requests/s one replica of class c's configuration on type g serves (0 = cannot).
        replica_cost: $/hour of one such replica.
        replica_gpus: GPUs in one such replica.
        max_gpus: GPUs available per type (inf = unlimited), shape (G,).
    """

    rates: np.ndarray
    capacity: np.ndarray
    replica_cost: np.ndarray
    replica_gpus: np.ndarray
    max_gpus: np.ndarray


class FleetPlan(NamedTuple):
    """Replicas per class and type, total $/hour (inf when infeasible)."""

    replicas: np.ndarray
    cost_per_hour: float


def plan_cost(fp: FleetProblem, n: np.ndarray) -> float:
    """Exact cost of an integer plan, ``inf`` if it leaves a class short or exceeds availability."""
    served = (fp.capacity * n).sum(axis=1) >= fp.rates * (1 - ROUNDING_TOLERANCE)
    used = (fp.replica_gpus * n).sum(axis=0) <= fp.max_gpus + ROUNDING_TOLERANCE
    if not (served.all() and used.all()):
        return float("inf")
    return float((fp.replica_cost * n).sum())


def _violation(fp: FleetProblem, n: np.ndarray) -> float:
    """Relative shortfall of every class plus relative excess over every availability limit."""
    short = np.maximum(0.0, 1.0 - (fp.capacity * n).sum(axis=1) / fp.rates).sum()
    limit = np.where(np.isfinite(fp.max_gpus), fp.max_gpus, np.inf)
    over = np.maximum(0.0, (fp.replica_gpus * n).sum(axis=0) - limit) / np.maximum(
        np.where(np.isfinite(limit), limit, 1.0), 1.0
    )
    return float(short + over.sum())


def fleet_milp(fp: FleetProblem) -> FleetPlan:
    """The exact integer optimum (``scipy.optimize.milp``, HiGHS branch and bound)."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # ~0.4 s; only the fleet needs it

    c_count, g_count = fp.capacity.shape
    usable = fp.capacity > 0
    upper = np.where(usable, np.ceil(fp.rates[:, None] / np.where(usable, fp.capacity, 1.0)), 0.0)
    serve = np.zeros((c_count, c_count * g_count))
    avail = np.zeros((g_count, c_count * g_count))
    for c in range(c_count):
        serve[c, c * g_count : (c + 1) * g_count] = fp.capacity[c]
    for g in range(g_count):
        avail[g, g::g_count] = fp.replica_gpus[:, g]
    cons = [LinearConstraint(serve, lb=fp.rates, ub=np.inf)]
    finite = np.isfinite(fp.max_gpus)
    if finite.any():
        cons.append(LinearConstraint(avail[finite], lb=-np.inf, ub=fp.max_gpus[finite]))
    res = milp(
        c=fp.replica_cost.reshape(-1),
        constraints=cons,
        integrality=np.ones(c_count * g_count),
        bounds=Bounds(0, upper.reshape(-1)),
    )
    if res.x is None:
        return FleetPlan(np.zeros_like(fp.capacity), float("inf"))
    n = np.round(res.x).reshape(c_count, g_count)
    return FleetPlan(n, plan_cost(fp, n))


def _replicas(theta, rates, capacity):
    """Relaxed replicas: softplus(theta) is the share of class c that type g would carry alone."""
    need = jnp.where(capacity > 0, rates[:, None] / jnp.maximum(capacity, RATE_FLOOR_PER_S), 0.0)
    return jax.nn.softplus(theta) * need


def _relaxed_loss(theta, rates, capacity, cost, gpus, max_gpus, scale):
    n = _replicas(theta, rates, capacity)
    short = jax.nn.relu(1.0 - (capacity * n).sum(axis=1) / rates)
    over = jax.nn.relu((gpus * n).sum(axis=0) - max_gpus) / jnp.maximum(max_gpus, 1.0)
    penalty = jnp.square(short).sum() + jnp.square(over).sum()
    return (cost * n).sum() / scale + CONSTRAINT_PENALTY * penalty


@jax.jit
def _descend(theta0, rates, capacity, cost, gpus, max_gpus):
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes int and float
        return _descend_body(theta0, rates, capacity, cost, gpus, max_gpus)


def _descend_body(theta0, rates, capacity, cost, gpus, max_gpus):
    scale = jnp.sum(
        jnp.min(
            jnp.where(capacity > 0, cost / jnp.maximum(capacity, RATE_FLOOR_PER_S), jnp.inf), axis=1
        )
        * rates
    )
    opt = optax.adam(DESCENT_LEARNING_RATE)
    grad = jax.vmap(jax.grad(_relaxed_loss), in_axes=(0, None, None, None, None, None, None))

    def step(carry, _):
        th, st = carry
        g = grad(th, rates, capacity, cost, gpus, max_gpus, scale)
        up, st = opt.update(g, st, th)
        return (optax.apply_updates(th, up), st), None

    (theta, _), _ = jax.lax.scan(step, (theta0, opt.init(theta0)), None, length=DESCENT_STEPS)
    return jax.vmap(_replicas, in_axes=(0, None, None))(theta, rates, capacity)


def _within_limits(fp: FleetProblem, n: np.ndarray) -> np.ndarray:
    """Drop replicas (largest counts first) from any type over its availability limit."""
    n = n.copy()
    for g in range(n.shape[1]):
        while (fp.replica_gpus[:, g] * n[:, g]).sum() > fp.max_gpus[g] + ROUNDING_TOLERANCE:
            n[int(np.argmax(n[:, g])), g] -= 1
    return n


def _complete_greedy(fp: FleetProblem, base: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """Top up short classes one by one (largest residual first), each on its cheapest option
    given what is left of every type's availability: one type, or type g up to its limit and the
    rest on type h."""
    n = base.copy()
    g_count = n.shape[1]
    for c in np.argsort(-residual):
        r = fp.rates[c] - (fp.capacity[c] * n[c]).sum()
        if r <= ROUNDING_TOLERANCE * fp.rates[c]:
            continue
        left = fp.max_gpus - (fp.replica_gpus * n).sum(axis=0)
        room = np.floor(
            np.where(np.isfinite(left), left, NO_LIMIT_GPUS) / fp.replica_gpus[c]
            + ROUNDING_TOLERANCE
        )
        best, best_cost = None, np.inf
        for g in range(g_count):
            if fp.capacity[c, g] <= 0:
                continue
            need = np.ceil(r / fp.capacity[c, g] - ROUNDING_TOLERANCE)
            if need <= room[g]:
                cost = need * fp.replica_cost[c, g]
                if cost < best_cost:
                    best, best_cost = [(g, need)], cost
                continue
            take = max(room[g], 0.0)
            rest = r - take * fp.capacity[c, g]
            for h in range(g_count):
                if h == g or fp.capacity[c, h] <= 0:
                    continue
                more = np.ceil(rest / fp.capacity[c, h] - ROUNDING_TOLERANCE)
                if more <= room[h]:
                    cost = take * fp.replica_cost[c, g] + more * fp.replica_cost[c, h]
                    if cost < best_cost:
                        best, best_cost = [(g, take), (h, more)], cost
        for g, k in best or []:
            n[c, g] += k
    return n


def _complete(fp: FleetProblem, base: np.ndarray) -> np.ndarray:
    """Cheapest way to serve what ``base`` leaves short: each short class tops up on one type
    (the fewest replicas of it that cover the residual); all G^C choices are tried exactly."""
    c_count, g_count = base.shape
    residual = fp.rates - (fp.capacity * base).sum(axis=1)
    options = []
    for c in range(c_count):
        if residual[c] <= ROUNDING_TOLERANCE * fp.rates[c]:
            options.append([None])
            continue
        options.append([g for g in range(g_count) if fp.capacity[c, g] > 0])
    greedy = _complete_greedy(fp, base, residual)
    best, best_score = greedy, (_violation(fp, greedy), float((fp.replica_cost * greedy).sum()))
    for choice in itertools.product(*options):
        trial = base.copy()
        for c, g in enumerate(choice):
            if g is not None:
                trial[c, g] += np.ceil(residual[c] / fp.capacity[c, g] - ROUNDING_TOLERANCE)
        sc = (_violation(fp, trial), float((fp.replica_cost * trial).sum()))
        if sc < best_score:
            best, best_score = trial, sc
    return best


def _improve(fp: FleetProblem, n: np.ndarray, max_passes: int = 6) -> np.ndarray:
    """Exact local moves while (violation, cost) falls lexicographically: remove one or two
    replicas of a (class, type), or all of them, and re-complete every short class exactly."""

    def score(m):
        return (round(_violation(fp, m), 12), float((fp.replica_cost * m).sum()))

    best = score(n)
    for _ in range(max_passes):
        improved = False
        for c, g in zip(*np.nonzero(n)):
            for k in sorted({1, 2, int(n[c, g])}):
                if n[c, g] < k:
                    continue
                trial = n.copy()
                trial[c, g] -= k
                trial = _complete(fp, trial)
                sc = score(trial)
                if sc[0] < best[0] or (sc[0] == best[0] and sc[1] < best[1] - ROUNDING_TOLERANCE):
                    n, best, improved = trial, sc, True
        if not improved:
            break
    return n


def fleet_gradient(fp: FleetProblem, *, num_starts: int = 16, seed: int = 0) -> FleetPlan:
    """Relaxed gradient solution from ``num_starts`` starts, rounded up and improved exactly."""
    cap = np.asarray(fp.capacity, dtype=float)
    big = np.where(np.isfinite(fp.max_gpus), fp.max_gpus, NO_LIMIT_GPUS)
    key = jax.random.PRNGKey(seed)
    theta0 = np.asarray(jax.random.normal(key, (num_starts, *cap.shape))) + START_LOGIT_MEAN
    # the first starts put each class on its k-th cheapest type per request served
    per_request = np.where(cap > 0, fp.replica_cost / np.where(cap > 0, cap, 1.0), np.inf)
    rank = np.argsort(per_request, axis=1)
    for k in range(min(cap.shape[1], num_starts)):
        theta0[k] = START_OFF_LOGIT
        theta0[k, np.arange(cap.shape[0]), rank[:, k]] = START_ON_LOGIT
    theta0 = jnp.asarray(theta0)
    x = np.asarray(
        _descend(
            theta0,
            jnp.asarray(fp.rates, dtype=float),
            jnp.asarray(cap),
            jnp.asarray(fp.replica_cost, dtype=float),
            jnp.asarray(fp.replica_gpus, dtype=float),
            jnp.asarray(big),
        )
    )
    best = FleetPlan(np.zeros_like(cap), float("inf"))
    for xi in x:
        n = _complete(fp, _within_limits(fp, np.where(cap > 0, np.floor(xi + 1e-6), 0.0)))
        n = _improve(fp, n)
        cost = plan_cost(fp, n)
        if cost < best.cost_per_hour:
            best = FleetPlan(n, cost)
    return best
