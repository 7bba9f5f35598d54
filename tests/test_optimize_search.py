"""The gradient search agrees with exhaustive enumeration of the same grid on small instances,
never reports an infeasible configuration as feasible, and the exact re-check is consistent."""

import jax.numpy as jnp
import numpy as np
import pytest

from optimize import (
    Grid,
    SearchOptions,
    Workload,
    exhaustive_optimum,
    make_problem,
    meets_confidence,
    min_replicas,
    search,
    slo_probability,
)
from perfmodel import load_model

GRID = Grid(
    num_gpus=2, tp=(1, 2, 4), pp=(1, 2), kv_dtypes=("bf16", "fp8"), weight_dtypes=("bf16", "fp8"),
    max_num_batched_tokens=(1024, 4096), max_num_seqs=(128, 256), max_replicas=16,
)
OPTIONS = SearchOptions(num_starts=16, num_steps=80, relaxed_draws=16)

CASES = [
    ("meta-llama/Llama-3.1-8B", ("h100-sxm", "l40s"), 20.0, 1024, 256, 1.0, 0.05, 0.9),
    ("meta-llama/Llama-3.1-70B", ("a100-sxm-80gb", "h100-sxm"), 5.0, 2048, 256, 2.0, 0.08, 0.8),
    ("Qwen/Qwen2.5-7B", ("l4", "a100-sxm-80gb"), 8.0, 512, 512, None, 0.04, 0.95),
    ("mistralai/Mixtral-8x7B-v0.1", ("h100-sxm", "a100-sxm-80gb"), 3.0, 4096, 128, 1.5, None, 0.9),
]


def _problem(name, gpus, rate, i_len, o_len, ttft, tpot, conf, draws=32):
    wl = Workload(arrival_rate_per_s=rate, prompt_tokens_mean=float(i_len),
                  output_tokens_mean=float(o_len), output_tokens_cv=1.0)
    return make_problem(load_model(name), gpus, wl, slo_ttft_p95_s=ttft, slo_tpot_p95_s=tpot,
                        confidence=conf, grid=GRID, num_draws=draws, seed=1)


@pytest.mark.parametrize("case", CASES, ids=[c[0].split("/")[1] for c in CASES])
def test_search_matches_exhaustive(case):
    problem = _problem(*case)
    ref = exhaustive_optimum(problem, chunk=16)
    found = search(problem, OPTIONS)
    assert np.isfinite(ref.cost_per_hour)
    assert found.cost_per_hour[0] <= ref.cost_per_hour * 1.01
    # the answer is feasible when re-checked exactly, and not cheaper than the true optimum
    prob = slo_probability(problem, jnp.asarray(found.configs[0]), float(found.replicas[0]))
    assert meets_confidence(float(prob), float(problem.confidence))
    assert found.cost_per_hour[0] >= ref.cost_per_hour * (1 - 1e-9)


def test_min_replicas_is_the_first_feasible_count():
    problem = _problem(*CASES[0])
    configs = jnp.asarray(problem.grid.all_configs(problem.model)[:8])
    reps = np.asarray(min_replicas(problem, configs))
    for c, r in zip(configs, reps):
        probs = [float(slo_probability(problem, c, float(k))) for k in range(1, GRID.max_replicas + 1)]
        feasible = [k + 1 for k, p in enumerate(probs) if meets_confidence(p, float(problem.confidence))]
        assert r == (feasible[0] if feasible else GRID.max_replicas + 1)
        # monotone: once feasible, more replicas stay feasible
        if feasible:
            assert all(meets_confidence(p, float(problem.confidence)) for p in probs[r - 1:])


def test_impossible_slo_is_reported_infeasible():
    problem = _problem("meta-llama/Llama-3.1-70B", ("l4", "a100-sxm-80gb"), 5.0, 4096, 256, 0.001, 0.001, 0.9)
    assert exhaustive_optimum(problem, chunk=16).config is None
    found = search(problem, OPTIONS)
    assert not np.isfinite(found.cost_per_hour[0])


def test_higher_confidence_never_cheaper():
    lo = _problem(*CASES[0][:-1], 0.5)
    hi = _problem(*CASES[0][:-1], 0.99)
    assert exhaustive_optimum(hi, chunk=16).cost_per_hour >= exhaustive_optimum(lo, chunk=16).cost_per_hour
