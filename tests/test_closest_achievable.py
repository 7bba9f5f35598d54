"""What an infeasible answer offers instead: the smallest p95 bounds any configuration meets at
``max_replicas``.  A small grid is scanned whole; a large one (the default grid holds over a
million configurations) is searched by coordinate descent, which must reach the whole scan's
minima from any start on a grid where both can run."""

import jax
import numpy as np
import pytest

import optimize._explain as explain
from optimize import Grid, Workload, make_problem
from perfmodel import load_model

jax.config.update("jax_enable_x64", True)

GRID = Grid(
    num_gpus=2,
    tp=(1, 2, 4),
    pp=(1, 2),
    kv_dtypes=("bf16", "fp8"),
    weight_dtypes=("bf16", "fp8"),
    max_num_batched_tokens=(1024, 4096),
    max_num_seqs=(64, 256),
    pool_ratios=((1, 1),),
    max_replicas=4,
)
KEYS = ("scale", "ttft_p95_s", "tpot_p95_s", "itl_p95_s")


@pytest.fixture(scope="module")
def problem():
    workload = Workload(
        arrival_rate_per_s=20.0,
        prompt_tokens_mean=1024.0,
        output_tokens_mean=256.0,
        output_tokens_cv=1.0,
    )
    return make_problem(
        load_model("meta-llama/Llama-3.1-8B"),
        ("h100-sxm", "l40s"),
        workload,
        slo_ttft_p95_s=1e-4,
        slo_tpot_p95_s=0.05,
        grid=GRID,
        num_draws=32,
    )


def test_descent_from_any_start_reaches_the_whole_scans_minima(problem, monkeypatch):
    configs = GRID.all_configs(problem.model)
    assert explain.EXHAUSTIVE_CONFIGS >= len(configs) > 2000  # scanned whole by default
    whole = explain.closest_achievable(problem)
    assert all(np.isfinite(whole[k]) and whole[k] > 0 for k in KEYS)
    assert whole["exhaustive"]
    assert whole["configurations_scored"] == whole["configurations_in_grid"] == len(configs)
    monkeypatch.setattr(explain, "EXHAUSTIVE_CONFIGS", 0)
    for start in (0, len(configs) // 2, len(configs) - 1):
        found = explain.closest_achievable(problem, configs[start : start + 1])
        # the descent says it scored part of the grid: its minima are bounds, not the grid's
        assert not found["exhaustive"] and found["configurations_in_grid"] == len(configs)
        assert 0 < found["configurations_scored"] < len(configs)
        for k in KEYS:
            assert found[k] == pytest.approx(whole[k], rel=1e-9), (start, k)
        assert found["binding"] == whole["binding"]
        # the configuration named for a bound achieves it
        for k in ("ttft_p95_s", "tpot_p95_s"):
            row = explain._achievable_rows(problem, found["configs"][k][None, :])[0]
            assert row[KEYS.index(k)] == pytest.approx(found[k], rel=1e-9)


def test_descent_from_a_start_with_no_reachable_neighbour_still_finds_what_fits(monkeypatch):
    # Llama-3.1-405B in bf16 on one H100 is out of reach, and so is every configuration one knob
    # away (TP 4 or PP 2 alone, fp8 alone); TP 4 x PP 2 with fp8 weights fits.  The descent
    # starts from each GPU's roomiest configuration as well, so it answers what the whole scan does
    grid = GRID._replace(num_gpus=1, pool_ratios=())
    workload = Workload(arrival_rate_per_s=0.5, prompt_tokens_mean=1024.0, output_tokens_mean=128.0)
    problem = make_problem(
        load_model("meta-llama/Llama-3.1-405B"),
        ("h100-sxm",),
        workload,
        slo_ttft_p95_s=1e-4,
        grid=grid,
        num_draws=8,
    )
    configs = grid.all_configs(problem.model)
    start = configs[:1]
    assert not np.isfinite(explain._achievable_rows(problem, start)[0, 0])
    whole = explain.closest_achievable(problem)
    assert np.isfinite(whole["scale"])
    monkeypatch.setattr(explain, "EXHAUSTIVE_CONFIGS", 0)
    found = explain.closest_achievable(problem, start)
    for k in KEYS:
        assert found[k] == pytest.approx(whole[k], rel=1e-9), k
