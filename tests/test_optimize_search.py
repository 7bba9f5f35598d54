"""The gradient search agrees with exhaustive enumeration of the same grid on small instances,
never reports an infeasible configuration as feasible, and the exact re-check is consistent."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from optimize import (
    Grid,
    SearchOptions,
    Workload,
    exhaustive_costs,
    exhaustive_optimum,
    make_problem,
    meets_confidence,
    min_replicas,
    search,
    slo_probability,
)
from optimize._evaluate import draw_metrics, probe_trials
from optimize._grid import KNOBS, one_hot_weights
from optimize._search import _score_new
from perfmodel import load_model

GRID = Grid(
    num_gpus=2,
    tp=(1, 2, 4),
    pp=(1, 2),
    kv_dtypes=("bf16", "fp8"),
    weight_dtypes=("bf16", "fp8"),
    max_num_batched_tokens=(1024, 4096),
    max_num_seqs=(128, 256),
    max_replicas=16,
    moe_layouts=("tp", "ep", "ep/2", "ep+dp"),  # Mixtral chooses among them; dense models take tp
)
OPTIONS = SearchOptions(num_starts=16, num_steps=80, relaxed_draws=16)

CASES = [
    ("meta-llama/Llama-3.1-8B", ("h100-sxm", "l40s"), 20.0, 1024, 256, 1.0, 0.05, 0.9),
    ("meta-llama/Llama-3.1-70B", ("a100-sxm-80gb", "h100-sxm"), 5.0, 2048, 256, 2.0, 0.08, 0.8),
    ("Qwen/Qwen2.5-7B", ("l4", "a100-sxm-80gb"), 8.0, 512, 512, None, 0.04, 0.95),
    ("mistralai/Mixtral-8x7B-v0.1", ("h100-sxm", "a100-sxm-80gb"), 3.0, 4096, 128, 1.5, None, 0.9),
]


def _problem(name, gpus, rate, i_len, o_len, ttft, tpot, conf, draws=32):
    wl = Workload(
        arrival_rate_per_s=rate,
        prompt_tokens_mean=float(i_len),
        output_tokens_mean=float(o_len),
        output_tokens_cv=1.0,
    )
    return make_problem(
        load_model(name),
        gpus,
        wl,
        slo_ttft_p95_s=ttft,
        slo_tpot_p95_s=tpot,
        confidence=conf,
        grid=GRID,
        num_draws=draws,
        seed=1,
    )


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
    # slo_probability at every (config, count 1..max) in one compiled program, not 128 eager runs
    counts = jnp.arange(1.0, GRID.max_replicas + 1.0)
    table = eqx.filter_jit(jax.vmap(jax.vmap(slo_probability, (None, None, 0)), (None, 0, None)))(
        problem, configs, counts
    )
    for r, row in zip(reps, np.asarray(table)):
        probs = [float(p) for p in row]
        feasible = [
            k + 1 for k, p in enumerate(probs) if meets_confidence(p, float(problem.confidence))
        ]
        assert r == (feasible[0] if feasible else GRID.max_replicas + 1)
        # monotone: once feasible, more replicas stay feasible
        if feasible:
            assert all(meets_confidence(p, float(problem.confidence)) for p in probs[r - 1 :])
    # the search scores by probes (1, 2, the most) then a bisection over the rest: same counts
    scored: dict = {}
    _score_new(problem, np.asarray(configs), scored, None, OPTIONS.chunk_rows)
    for c, r in zip(np.asarray(configs), reps):
        assert scored[tuple(int(v) for v in c)][0] == r


def test_probe_trials_are_the_probes_then_every_count_above_them():
    probes, rest = probe_trials(8)
    assert probes.tolist() == [1, 2, 8, 8, 8, 8, 8, 8]
    assert rest.tolist() == [3, 4, 5, 6, 7, 8, 8, 8]
    assert [r.tolist() for r in probe_trials(2)] == [[1, 2], [2, 2]]


def test_impossible_slo_is_reported_infeasible():
    problem = _problem(
        "meta-llama/Llama-3.1-70B", ("l4", "a100-sxm-80gb"), 5.0, 4096, 256, 0.001, 0.001, 0.9
    )
    assert exhaustive_optimum(problem, chunk=16).config is None
    found = search(problem, OPTIONS)
    assert not np.isfinite(found.cost_per_hour[0])


def test_higher_confidence_never_cheaper():
    lo = _problem(*CASES[0][:-1], 0.5)
    hi = _problem(*CASES[0][:-1], 0.99)
    assert (
        exhaustive_optimum(hi, chunk=16).cost_per_hour
        >= exhaustive_optimum(lo, chunk=16).cost_per_hour
    )


# ------------------------------------------------------------ pool split, speculation, chunk knobs

FEATURE_GRID = Grid(
    num_gpus=1,
    tp=(1, 2),
    pp=(1,),
    kv_dtypes=("bf16",),
    weight_dtypes=("bf16",),
    max_num_batched_tokens=(2048, 8192),
    max_num_seqs=(256,),
    chunk_sizes=(512, 2048, 8192),
    spec_k=(0, 1, 3),
    pool_ratios=((1, 1), (2, 1), (1, 2)),
    max_replicas=16,
)
"""One grid for every feature test (one compile): pool split, MTP speculation and chunk knobs."""


def _feature_problem(i_len, o_len, rate, ttft, tpot, acceptance=0.0):
    wl = Workload(
        arrival_rate_per_s=rate,
        prompt_tokens_mean=float(i_len),
        output_tokens_mean=float(o_len),
        output_tokens_cv=1.0,
    )
    return make_problem(
        load_model("meta-llama/Llama-3.1-8B"),
        ("h100-sxm",),
        wl,
        slo_ttft_p95_s=ttft,
        slo_tpot_p95_s=tpot,
        confidence=0.9,
        grid=FEATURE_GRID,
        num_draws=16,
        seed=2,
        spec_draft="mtp",
        spec_acceptance=acceptance,
    )


def _col(name, config):
    return int(config[KNOBS.index(name)])


def test_long_prompts_tight_tpot_pick_a_pool_split():
    """8k-token prompts with 256-token outputs and a 15 ms TPOT bound: a prefill chunk in every
    decode iteration breaks the TPOT bound unless the colocated engines are spread thin; split
    pools meet it for less, and both the referee and the search pick a split."""
    problem = _feature_problem(8192, 256, 10.0, 3.0, 0.015)
    every, costs = exhaustive_costs(problem, chunk=16)  # every config x replica count
    split = every[:, KNOBS.index("pool_split")] > 0
    best_split, best_colocated = float(costs[split].min()), float(costs[~split].min())
    assert np.isfinite(best_split) and best_split < best_colocated
    found = search(problem, OPTIONS)
    assert found.cost_per_hour[0] <= best_split * 1.01 and _col("pool_split", found.configs[0]) > 0


def test_short_prompts_stay_colocated():
    """256-token prompts under a loose TPOT bound fit one colocated engine; a split needs two."""
    problem = _feature_problem(256, 256, 5.0, 1.0, 0.05)
    ref = exhaustive_optimum(problem, chunk=16)
    found = search(problem, OPTIONS)
    assert _col("pool_split", ref.config) == 0 and _col("pool_split", found.configs[0]) == 0
    assert found.cost_per_hour[0] <= ref.cost_per_hour * 1.01


def test_speculation_is_chosen_only_when_it_pays():
    """MTP drafts at acceptance 0.9 (E = (1 - 0.9^4) / 0.1 = 3.44 tokens/step at k = 3) let fewer
    engines meet an 8 ms TPOT bound; at acceptance 0 (E = 1) every k > 0 only adds draft and
    verify work, so k = 0 wins wherever anything is feasible."""
    good = _feature_problem(512, 512, 2.0, 2.0, 0.008, acceptance=0.9)
    bad = _feature_problem(512, 512, 2.0, 2.0, 0.008, acceptance=0.0)
    ref_good, ref_bad = exhaustive_optimum(good, chunk=16), exhaustive_optimum(bad, chunk=16)
    assert ref_good.config is not None and _col("spec_k", ref_good.config) > 0
    assert ref_bad.config is None or _col("spec_k", ref_bad.config) == 0
    found = search(good, OPTIONS)
    assert found.cost_per_hour[0] <= ref_good.cost_per_hour * 1.01


def test_smaller_chunk_lowers_p95_tpot_and_chunks_stay_within_the_budget():
    """Same engine and load: a 512-token chunk instead of 8192 cuts the prefill share of the p95
    iteration, so p95 TPOT falls in every draw; a chunk above the token budget is not a legal
    configuration (the referee skips it, rounding clips it to the largest legal chunk)."""
    problem = _feature_problem(8192, 256, 1.0, None, None)
    base = np.zeros(len(problem.grid.sizes()), dtype=np.int32)
    base[KNOBS.index("max_num_batched_tokens")] = 1  # budget 8192
    small, large = base.copy(), base.copy()
    large[KNOBS.index("chunk_size")] = 2
    metrics = eqx.filter_jit(draw_metrics)  # one program for both configurations
    m_small = metrics(problem, one_hot_weights(jnp.asarray(small), problem.grid), 1.0)
    m_large = metrics(problem, one_hot_weights(jnp.asarray(large), problem.grid), 1.0)
    assert np.all(np.asarray(m_small.tpot_p95_s) < np.asarray(m_large.tpot_p95_s))
    over = large.copy()
    over[KNOBS.index("max_num_batched_tokens")] = 0  # budget 2048 < chunk 8192
    assert problem.grid.canonical(over[None], problem.model)[0][KNOBS.index("chunk_size")] == 1
    every = problem.grid.all_configs(problem.model)
    chunk = np.asarray(problem.grid.chunk_sizes)[every[:, KNOBS.index("chunk_size")]]
    budget = np.asarray(problem.grid.max_num_batched_tokens)[
        every[:, KNOBS.index("max_num_batched_tokens")]
    ]
    # tp 1|2 x (2048: 512, 2048; 8192: all 3) x k 0|1|3 x (colocated + 3 splits, each with
    # its prefill pool at tp 1|2)
    assert np.all(chunk <= budget) and len(every) == 2 * 5 * 3 * (1 + 3 * 2)


@pytest.mark.parametrize("model_id", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B"])
@pytest.mark.parametrize(
    "grid",
    [
        Grid(num_gpus=2, tp=(1, 2, 3, 4, 8)),
        Grid(num_gpus=2, pool_ratios=((1, 1), (2, 1)), chunk_sizes=(0, 512, 4096), spec_k=(0, 2)),
        Grid(num_gpus=1, pool_ratios=((1, 2),), moe_layouts=("tp", "ep", "ep/2", "ep+dp")),
        Grid(num_gpus=1, tp=(1, 2), pp=(1,), moe_layouts=("ep", "ep+dp")),
    ],
    ids=["illegal tp", "pools, chunks, speculation", "pools and layouts", "no tp layout"],
)
def test_the_grid_count_is_the_number_of_distinct_canonical_configurations(model_id, grid):
    """``count_configs`` counts what ``all_configs`` lists: every row legal and canonical (its own
    ``canonical`` form) and listed once."""
    model = load_model(model_id)
    rows = grid.all_configs(model)
    assert grid.count_configs(model) == len(rows)
    np.testing.assert_array_equal(grid.canonical(rows, model), rows)
    assert len(np.unique(rows, axis=0)) == len(rows)
