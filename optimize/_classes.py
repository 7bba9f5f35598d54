"""Per-class capacities for the fleet mix: request-size classes x GPU types.

A class is a (prompt, output) length pair with a share of the arrivals, read from a histogram or
binned from a trace.  On each GPU type the class gets the configuration the search finds cheapest
for it, and that configuration's single-replica capacity is the largest arrival rate at which
every constraint still holds with the stated confidence (bisection on log rate; the SLO
probability falls as the rate rises).
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._evaluate import gpus_per_replica, meets_confidence, slo_probability
from ._fleet import FleetProblem
from ._problem import Problem
from ._program_cache import cached_jit
from ._search import SearchOptions, search
from ._verify import ONE_OFF

_RATE_RANGE = (1e-4, 1e5)


class RequestClass(NamedTuple):
    """Requests of one size class: mean prompt and output tokens, share of the arrivals."""

    prompt_tokens: float
    output_tokens: float
    share: float


def classes_from_trace(
    prompt: np.ndarray, output: np.ndarray, num_classes: int = 3
) -> list[RequestClass]:
    """Bin requests by prompt length into ``num_classes`` equal-count classes (means per bin)."""
    order = np.argsort(prompt, kind="stable")
    out = []
    for chunk in np.array_split(order, num_classes):
        if len(chunk):
            out.append(
                RequestClass(
                    float(prompt[chunk].mean()),
                    float(output[chunk].mean()),
                    len(chunk) / len(prompt),
                )
            )
    return out


@cached_jit(compiler_options=ONE_OFF)  # a few rows per call: compile-bound
def replica_capacity(problem: Problem, config: jnp.ndarray) -> jnp.ndarray:
    """Largest arrival rate (requests/s) one replica of ``config`` serves within the chance
    constraints; 0 if even the smallest rate in range fails."""
    lo0, hi0 = jnp.log(_RATE_RANGE[0]), jnp.log(_RATE_RANGE[1])

    def ok(log_rate):
        p = eqx.tree_at(lambda q: q.workload.arrival_rate_per_s, problem, jnp.exp(log_rate))
        return meets_confidence(slo_probability(p, config, 1.0), problem.confidence)

    def step(_, b):
        lo, hi = b
        mid = 0.5 * (lo + hi)
        good = ok(mid)
        return jnp.where(good, mid, lo), jnp.where(good, hi, mid)

    lo, _ = jax.lax.fori_loop(0, 40, step, (lo0, hi0))
    return jnp.where(ok(lo0), jnp.exp(lo), 0.0)


def class_problem(problem: Problem, cls: RequestClass, total_rate: float) -> Problem:
    """``problem`` with the workload of one class at its share of ``total_rate`` (each leaf keeps
    its dtype and weak type: the class searches reuse the compiled search)."""
    wl = problem.workload
    return eqx.tree_at(
        lambda p: (
            p.workload.arrival_rate_per_s,
            p.workload.prompt_tokens_mean,
            p.workload.output_tokens_mean,
        ),
        problem,
        (
            jax.lax.full_like(wl.arrival_rate_per_s, total_rate * cls.share),
            jax.lax.full_like(wl.prompt_tokens_mean, cls.prompt_tokens),
            jax.lax.full_like(wl.output_tokens_mean, cls.output_tokens),
        ),
    )


DEFAULT_OPTIONS = SearchOptions()
"""The search settings a fleet problem uses unless told otherwise."""


def fleet_problem(
    problem: Problem,
    classes: list[RequestClass],
    total_rate: float,
    max_gpus: np.ndarray,
    options: SearchOptions = DEFAULT_OPTIONS,
) -> tuple[FleetProblem, np.ndarray]:
    """Per-class capacities on every GPU type; returns the ``FleetProblem`` and the chosen
    configurations, shape (classes, gpus, len(KNOBS)) (rows of unusable pairs are -1).  A type's
    configuration is the cheapest the search found with every engine on that type
    (``on_gpu_type``: a pool split's prefill pool too), so its GPUs count against that type."""
    g_count = problem.grid.num_gpus
    capacity = np.zeros((len(classes), g_count))
    cost = np.zeros_like(capacity)
    gpus = np.ones_like(capacity)
    configs = -np.ones((len(classes), g_count, len(problem.grid.sizes())), dtype=np.int32)
    prices = np.asarray(problem.hardware.price_per_gpu_hour)
    for c, cls in enumerate(classes):
        p = class_problem(problem, cls, total_rate)
        found = search(p, options)
        for g in range(g_count):
            row = found.cheapest_on_gpu_type(g)
            if row is None:
                continue
            cfg = jnp.asarray(found.configs[row])
            capacity[c, g] = float(replica_capacity(p, cfg))
            gpus[c, g] = float(gpus_per_replica(p, cfg))
            cost[c, g] = gpus[c, g] * prices[g]
            configs[c, g] = found.configs[row]
    rates = np.asarray([total_rate * cls.share for cls in classes])
    return FleetProblem(rates, capacity, cost, gpus, np.asarray(max_gpus, dtype=float)), configs
