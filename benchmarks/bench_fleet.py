"""Fleet mix: relaxed gradient solution vs the exact ``scipy.optimize.milp`` optimum on the same
per-class capacities, on random instances (classes x GPU types x availability limits).

    python benchmarks/bench_fleet.py --instances 200
    python benchmarks/bench_fleet.py --quick           # 3 instances (smoke)
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np

from optimize import FleetProblem, fleet_gradient, fleet_milp


def random_fleet(rng: np.random.Generator) -> FleetProblem:
    """2-4 classes x 2-4 GPU types; some pairs cannot serve; ~30 % of types capacity-limited."""
    c_count, g_count = rng.integers(2, 5), rng.integers(2, 5)
    price = rng.uniform(0.5, 8.0, g_count)
    gpus = rng.choice([1, 2, 4, 8], size=(c_count, g_count)).astype(float)
    capacity = rng.uniform(0.2, 20.0, (c_count, g_count)) * (rng.random((c_count, g_count)) > 0.15)
    capacity[:, 0] = np.maximum(capacity[:, 0], 0.2)  # every class has somewhere to go
    rates = rng.uniform(1.0, 200.0, c_count)
    limits = np.where(rng.random(g_count) < 0.3, rng.integers(4, 64, g_count).astype(float), np.inf)
    return FleetProblem(rates, capacity, gpus * price[None, :], gpus, limits)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="3 instances (smoke)")
    args = ap.parse_args(argv)
    if args.quick:
        args.instances = 3
    rng = np.random.default_rng(args.seed)
    fleet_gradient(random_fleet(np.random.default_rng(999)))  # compile outside the clock
    within = both_inf = false_feasible = 0
    gaps, t_grad, t_milp = [], [], []
    for i in range(args.instances):
        fp = random_fleet(rng)
        t0 = time.perf_counter()
        a = fleet_gradient(fp, seed=i)
        t1 = time.perf_counter()
        b = fleet_milp(fp)
        t2 = time.perf_counter()
        t_grad.append(t1 - t0)
        t_milp.append(t2 - t1)
        if np.isinf(b.cost_per_hour):
            both_inf += np.isinf(a.cost_per_hour)
            false_feasible += np.isfinite(a.cost_per_hour)
            within += np.isinf(a.cost_per_hour)
            continue
        gap = a.cost_per_hour / b.cost_per_hour - 1.0
        gaps.append(gap)
        within += gap <= 0.02
    n = args.instances
    g = np.asarray(gaps)
    print(
        f"instances: {n} (both infeasible: {both_inf}; infeasible reported feasible: {false_feasible})"
    )
    print(
        f"within 2% of the milp optimum: {within}/{n} = {within / n:.1%}; "
        f"median gap {np.median(g):.2%}, worst {g.max():.2%}"
    )
    print(f"seconds per instance: gradient {np.mean(t_grad):.3f}, milp {np.mean(t_milp):.4f}")


if __name__ == "__main__":
    main()
