"""Procurement forecast: demand CSV validation (line and field named), intervals nested and
growing with demand, demand uncertainty widening them."""

import jax.numpy as jnp
import numpy as np
import pytest
from demand_files import write_demand
from optimize_problems import GRID, WORKLOAD, small_problem

from optimize import (
    KNOBS,
    DemandError,
    SearchResult,
    cheapest_per_gpu,
    exhaustive_costs,
    forecast_gpus,
    make_problem,
    read_demand,
)
from optimize._forecast import DemandPeriod, replicas_per_draw
from perfmodel import load_model


def test_example_demand_reads():
    rows = read_demand("data/examples/demand.csv")
    assert len(rows) >= 4 and all(r.requests_per_s > 0 for r in rows)


@pytest.mark.parametrize(
    "text, message",
    [
        ("period,rate\n1,2\n", "missing column 'requests_per_s'"),
        ("period,requests_per_s\na,1\nb,\n", ":3: field 'requests_per_s' is empty"),
        ("period,requests_per_s\na,-1\n", ":2: field 'requests_per_s' = '-1' must be >= 0"),
        ("period,requests_per_s\na,x\n", ":2: field 'requests_per_s' = 'x' is not a number"),
        ("period,requests_per_s\na,1\na,2\n", ":3: period 'a' appears twice"),
        ("period,requests_per_s\n2027-01,1\n2027-03,2\n", ":3: period '2027-03' follows '2027-01'"),
        ("period,requests_per_s\n1,1\n2,2\n4,2\n", ":4: period '4' follows '2'"),
        ("period,requests_per_s\n2027-Q1,1\n2027-Q3,2\n", ":3: period '2027-Q3' follows '2027-Q1'"),
        ("period,requests_per_s\n,1\n", ":2: field 'period' is empty"),
    ],
)
def test_malformed_demand_names_line_and_field(tmp_path, text, message):
    path = write_demand(tmp_path, text)
    with pytest.raises(DemandError, match=message.replace("(", r"\(")):
        read_demand(path)


def _problem():
    # p95 TPOT <= 80 ms: clear of the 2048-token chunk iteration (~45-53 ms across the prior
    # draws), where a slow draw meets a 50 ms bound at no replica count and the interval's upper
    # end sits at --max-replicas whatever the demand; 256 draws keep the p95 ends' Monte Carlo
    # noise below the widening that demand uncertainty adds
    return small_problem(max_replicas=256, num_draws=256, slo_tpot_p95_s=0.08)


def test_intervals_nested_monotone_and_widened_by_demand_uncertainty():
    problem = _problem()
    config = np.zeros(len(KNOBS), dtype=np.int32)
    demand = [
        DemandPeriod("a", 5.0, 0.0),
        DemandPeriod("b", 40.0, 0.0),
        DemandPeriod("c", 40.0, 15.0),
    ]
    out = forecast_gpus(problem, {"h100-sxm": config}, demand)
    s = [p["gpus"]["h100-sxm"] for p in out]
    for x in s:
        assert x["p95"][0] <= x["p80"][0] <= x["p50"] <= x["p80"][1] <= x["p95"][1]
    assert s[1]["p50"] >= s[0]["p50"]
    width = [x["p95"][1] - x["p95"][0] for x in s]
    assert width[2] > width[1]
    assert out[0]["cost_per_hour"]["p50"] == s[0]["p50"] * float(
        problem.hardware.price_per_gpu_hour[0]
    )


def test_replicas_per_draw_is_the_first_count_that_holds():
    problem = _problem()
    config = jnp.zeros(len(KNOBS), dtype=jnp.int32)
    rates = jnp.full((problem.num_draws,), 30.0)
    reps = np.asarray(replicas_per_draw(problem, config, rates))
    assert reps.min() >= 1
    more = np.asarray(replicas_per_draw(problem, config, rates * 2))
    assert np.all(more >= reps)


def test_forecast_counts_agree_with_the_optimizer_on_a_chunked_config():
    """At the problem's own rate, the share of draws whose forecast count is <= R is the
    optimizer's SLO probability at R replicas, for a configuration whose prefill chunk (256
    tokens of the 2,048 budget) is not the budget: both read the configuration's chunk."""
    from optimize._evaluate import slo_probability

    problem = small_problem(max_replicas=16, num_draws=16, slo_tpot_p95_s=0.08)
    grid = problem.grid._replace(chunk_sizes=(0, 256))
    problem = make_problem(
        problem.model,
        ("h100-sxm",),
        problem.workload,
        slo_ttft_p95_s=0.25,
        slo_tpot_p95_s=0.08,
        grid=grid,
        num_draws=16,
    )
    config = np.zeros(len(KNOBS), dtype=np.int32)
    config[KNOBS.index("chunk_size")] = 1
    rates = jnp.full((16,), float(problem.workload.arrival_rate_per_s))
    reps = np.asarray(replicas_per_draw(problem, jnp.asarray(config), rates))
    for r in (1, 2, 4):
        p = float(slo_probability(problem, jnp.asarray(config), float(r)))
        assert np.mean(reps <= r) == pytest.approx(p)


def _two_gpu_problem(slo_tpot_p95_s: float):
    gpus = ("h100-sxm", "a100-sxm-80gb")
    grid = GRID._replace(num_gpus=2, max_replicas=16)
    model = load_model("meta-llama/Llama-3.1-8B")
    return gpus, make_problem(
        model,
        gpus,
        WORKLOAD,
        slo_ttft_p95_s=1.0,
        slo_tpot_p95_s=slo_tpot_p95_s,
        grid=grid,
        num_draws=16,
    )


def test_cheapest_per_gpu_takes_the_searchs_first_feasible_row_else_the_grid_minimum():
    """A hand-made search result: on h100-sxm an infeasible row, then two feasible ones (the
    dearer first: the ranking, not a re-sort, decides); no a100-sxm-80gb row, so a100-sxm-80gb
    gets the cheapest configuration of its type over the whole grid, the referee's minimum."""
    gpus, problem = _two_gpu_problem(0.08)
    every, costs = exhaustive_costs(problem, chunk=16)  # every config x replica count
    cheapest = costs.min(axis=1)  # each config at its cheapest feasible replica count
    h100 = np.flatnonzero((every[:, 0] == 0) & np.isfinite(cheapest))
    a100 = np.flatnonzero(every[:, 0] == 1)
    assert len(h100) >= 2 and np.isfinite(cheapest[a100]).any()
    found = SearchResult(
        configs=every[[h100[0], h100[1], h100[0]]],
        replicas=np.array([1, 2, 1]),
        cost_per_hour=np.array([np.inf, 9.0, 3.0]),
        evaluated=3,
    )
    out = cheapest_per_gpu(problem, gpus, found)
    assert list(out) == list(gpus)
    np.testing.assert_array_equal(out["h100-sxm"], every[h100[1]])
    np.testing.assert_array_equal(out["a100-sxm-80gb"], every[a100[np.argmin(cheapest[a100])]])


def test_cheapest_per_gpu_leaves_out_a_type_with_nothing_feasible():
    gpus, problem = _two_gpu_problem(1e-4)  # no TPOT this short at any replica count
    assert not np.isfinite(exhaustive_costs(problem, chunk=16)[1]).any()
    empty = SearchResult(
        configs=np.zeros((0, len(KNOBS)), dtype=np.int32),
        replicas=np.zeros(0, dtype=np.int32),
        cost_per_hour=np.zeros(0),
        evaluated=0,
    )
    assert cheapest_per_gpu(problem, gpus, empty) == {}
