"""The referee: every point of the discrete grid, every replica count, the same model.

Used to prove the gradient search (``benchmarks/bench_optimize.py``, ``tests/test_optimize_search.py``);
it evaluates the SLO probability of all (configuration, replicas) pairs, with no monotonicity
assumption, and returns the cheapest feasible one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._evaluate import cost_per_hour, meets_confidence, slo_probability
from ._problem import Problem
from ._program_cache import cached_jit
from ._sharding import MeshLike, device_mesh, num_shards, pad_rows, replicate, shard_rows


class GridOptimum(NamedTuple):
    """Cheapest feasible grid point (``config`` is None when nothing is feasible)."""

    config: np.ndarray | None
    replicas: int
    cost_per_hour: float
    evaluated: int


@cached_jit
def _chunk_costs(problem: Problem, configs: jnp.ndarray) -> jnp.ndarray:
    reps = jnp.arange(1, problem.grid.max_replicas + 1, dtype=float)

    def one(config):
        prob = jax.vmap(lambda r: slo_probability(problem, config, r))(reps)
        cost = jax.vmap(lambda r: cost_per_hour(problem, config, r))(reps)
        return jnp.where(meets_confidence(prob, problem.confidence), cost, jnp.inf)

    return jax.vmap(one)(configs)


def exhaustive_costs(
    problem: Problem, *, chunk: int = 32, mesh: MeshLike = None
) -> tuple[np.ndarray, np.ndarray]:
    """(configs, costs): every legal configuration of ``problem.grid`` (n, len(KNOBS)) and its
    $/hour at each replica count 1..max (n, max_replicas), ``inf`` where the chance constraints
    fail; enumerated in chunks of ``chunk`` configurations (static shape: the last chunk is padded
    with the first config).

    With several devices (``mesh``: see ``optimize._sharding.device_mesh``) each chunk is split
    over them (``chunk`` rounded up to a multiple of the device count); the answer is the same.
    """
    mesh = device_mesh(mesh)
    chunk = -(-chunk // num_shards(mesh)) * num_shards(mesh)
    problem = replicate(problem, mesh)
    configs = problem.grid.all_configs(problem.model)
    n = len(configs)
    padded = pad_rows(configs, chunk)
    costs = np.concatenate(
        [
            np.asarray(_chunk_costs(problem, shard_rows(jnp.asarray(padded[i : i + chunk]), mesh)))
            for i in range(0, len(padded), chunk)
        ]
    )[:n]
    return configs, costs


def exhaustive_optimum(problem: Problem, *, chunk: int = 32, mesh: MeshLike = None) -> GridOptimum:
    """The cheapest (configuration, replicas) of ``exhaustive_costs`` (same arguments)."""
    configs, costs = exhaustive_costs(problem, chunk=chunk, mesh=mesh)
    flat = int(np.argmin(costs))
    i, r = divmod(flat, costs.shape[1])
    best = float(costs[i, r])
    evaluated = costs.size
    if not np.isfinite(best):
        return GridOptimum(None, 0, float("inf"), evaluated)
    return GridOptimum(configs[i], r + 1, best, evaluated)
