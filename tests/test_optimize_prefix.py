"""A shared prefix is a workload property the optimiser prices: the search model, the verdict and
the simulator check all serve the uncached prompt and read the cached prefix's KV
(``perfmodel.features.prefix_workload``, the function ``explain``'s prefix verdict uses)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from optimize import KNOBS, Grid, Workload, make_problem
from optimize._evaluate import draw_metrics, served_workload
from optimize._grid import deployment_from_weights, grid_tables, one_hot_weights
from optimize._simcheck import simulate_check
from perfmodel import System, load_model

GRID = Grid(
    num_gpus=1,
    tp=(1,),
    pp=(1,),
    kv_dtypes=("fp8",),
    weight_dtypes=("bf16",),
    max_num_batched_tokens=(8192,),
    max_num_seqs=(256,),
    max_replicas=8,
)
WORKLOAD = Workload(
    arrival_rate_per_s=8.0,
    prompt_tokens_mean=3000.0,
    prompt_tokens_cv=0.2,
    output_tokens_mean=128.0,
    output_tokens_cv=0.5,
)
SHARE, PREFIX = 0.9, 2000.0


def _problem(**prefix):
    return make_problem(
        load_model("meta-llama/Llama-3.1-8B"),
        ("h100-sxm",),
        WORKLOAD,
        slo_ttft_p95_s=1.0,
        slo_tpot_p95_s=0.05,
        grid=GRID,
        num_draws=4,
        **prefix,
    )


@pytest.fixture(scope="module")
def problems():
    return _problem(), _problem(prefix_reuse=SHARE, prefix_tokens=PREFIX)


def test_served_workload_is_the_uncached_prompt(problems):
    """One hot prefix (20 requests/s share it, a single 2000-token chain) stays cached: the hit
    rate is ~1, so the prefill path serves P - f R = 3000 - 0.9 x 2000 = 1200 tokens on average
    and every iteration reads the 1800 cached tokens' KV."""
    plain, cached = problems
    config = np.zeros(len(KNOBS), dtype=np.int32)
    dep = deployment_from_weights(one_hot_weights(config, GRID), grid_tables(GRID), 2.0)
    hw = jax.tree.map(lambda x: x[0], cached.hardware)
    eff = jax.tree.map(lambda x: x[0, 0], cached.efficiency)
    served, tokens = served_workload(cached, hw, dep, eff)
    assert float(served.prompt_tokens_mean) == pytest.approx(3000.0 - SHARE * PREFIX, rel=1e-3)
    assert float(tokens) == pytest.approx(SHARE * PREFIX, rel=1e-3)
    # the two-point law widens the prompt spread: sd^2 = (0.2 P)^2 + w (1 - w) R^2
    sd = np.sqrt((0.2 * 3000.0) ** 2 + SHARE * (1 - SHARE) * PREFIX**2)
    assert float(served.prompt_tokens_cv) == pytest.approx(sd / 1200.0, rel=1e-2)
    same, none = served_workload(plain, hw, dep, eff)
    assert same is plain.workload and float(none) == 0.0


def test_search_model_prices_the_served_prompt_and_the_cached_kv(problems):
    """The search's evaluation of a configuration (``draw_metrics``) is ``slo_metrics`` of the
    served workload with the cached prefix's KV read by every iteration, draw by draw."""
    from optimize._evaluate import mix_gpu
    from optimize._metrics import slo_metrics

    _, cached = problems
    config = jnp.zeros(len(KNOBS), dtype=jnp.int32)
    weights = one_hot_weights(config, GRID)
    got = draw_metrics(cached, weights, jnp.asarray(2.0))
    dep = deployment_from_weights(weights, grid_tables(GRID), 2.0)
    hw = mix_gpu(cached.hardware, weights[0])
    for d in (0, cached.num_draws - 1):
        eff = jax.tree.map(lambda x, d=d: x[0, d], cached.efficiency)
        served, tokens = served_workload(cached, hw, dep, eff)
        want = slo_metrics(System(cached.model, hw, dep, eff), served, cached_prompt_tokens=tokens)
        assert float(got.ttft_p95_s[d]) == pytest.approx(float(want.ttft_p95_s), rel=1e-9)
        assert float(got.tpot_p95_s[d]) == pytest.approx(float(want.tpot_p95_s), rel=1e-9)


def test_simulator_check_runs_the_prefix_cache(problems):
    """``--simulate`` of a prefix problem: the simulator's own LRU cache over the seeded shared
    prefixes gives a p95 TTFT below the same configuration's without them."""
    plain, cached = problems
    config = np.zeros(len(KNOBS), dtype=np.int32)
    with_cache = simulate_check(cached, config, 2, num_requests=300)
    without = simulate_check(plain, config, 2, num_requests=300)
    assert with_cache["ttft_s"]["p95"] < without["ttft_s"]["p95"]
