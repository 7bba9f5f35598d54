"""Fleet mix: the relaxed gradient plan is feasible, never beats the exact milp optimum, and is
within 2 % of it on nearly every random instance; availability limits are respected."""

import numpy as np

from optimize import FleetProblem, fleet_gradient, fleet_milp, plan_cost


def _random(rng):
    c_count, g_count = rng.integers(2, 4), rng.integers(2, 4)
    price = rng.uniform(0.5, 8.0, g_count)
    gpus = rng.choice([1, 2, 4], size=(c_count, g_count)).astype(float)
    capacity = rng.uniform(0.2, 20.0, (c_count, g_count)) * (rng.random((c_count, g_count)) > 0.15)
    capacity[:, 0] = np.maximum(capacity[:, 0], 0.2)
    rates = rng.uniform(1.0, 100.0, c_count)
    limits = np.where(rng.random(g_count) < 0.3, rng.integers(4, 64, g_count).astype(float), np.inf)
    return FleetProblem(rates, capacity, gpus * price[None, :], gpus, limits)


def test_gradient_plan_matches_milp_on_random_instances():
    rng = np.random.default_rng(7)
    within, total = 0, 20
    for i in range(total):
        fp = _random(rng)
        a, b = fleet_gradient(fp, num_starts=8, seed=i), fleet_milp(fp)
        if not np.isfinite(b.cost_per_hour):
            assert not np.isfinite(a.cost_per_hour)
            within += 1
            continue
        assert np.isfinite(a.cost_per_hour)
        assert plan_cost(fp, a.replicas) == a.cost_per_hour
        assert a.cost_per_hour >= b.cost_per_hour * (1 - 1e-9)  # milp is the optimum
        within += a.cost_per_hour <= b.cost_per_hour * 1.02
    assert within >= 0.9 * total


def test_small_requests_go_to_the_cheap_gpu_and_limits_bind():
    # class 0 (short) is cheapest per request on GPU 1; class 1 (long) only fits GPU 0
    fp = FleetProblem(
        rates=np.array([30.0, 5.0]),
        capacity=np.array([[10.0, 6.0], [1.0, 0.0]]),
        replica_cost=np.array([[4.0, 1.0], [4.0, 1.0]]),
        replica_gpus=np.array([[1.0, 1.0], [1.0, 1.0]]),
        max_gpus=np.array([np.inf, np.inf]),
    )
    plan = fleet_gradient(fp, num_starts=4)
    assert plan.replicas[0, 1] == 5 and plan.replicas[0, 0] == 0
    assert plan.replicas[1, 0] == 5
    limited = fp._replace(max_gpus=np.array([np.inf, 3.0]))
    a, b = fleet_gradient(limited, num_starts=4), fleet_milp(limited)
    assert (limited.replica_gpus * a.replicas).sum(axis=0)[1] <= 3
    assert np.isclose(a.cost_per_hour, b.cost_per_hour)


def test_impossible_availability_is_infeasible():
    fp = FleetProblem(
        np.array([50.0]), np.array([[1.0]]), np.array([[2.0]]), np.array([[1.0]]), np.array([10.0])
    )
    assert not np.isfinite(fleet_milp(fp).cost_per_hour)
    assert not np.isfinite(fleet_gradient(fp, num_starts=2).cost_per_hour)
