"""Explanations: cost elasticities against finite differences of the exact optimum, signs of
shadow prices, engine flags naming the recommended knobs."""

import jax.numpy as jnp
import numpy as np

from optimize import KNOBS, Grid, Workload, make_problem
from optimize._engine_args import engine_args
from optimize._evaluate import costs_at_min_replicas
from optimize._explain import SENSITIVITIES, cost_elasticities
from perfmodel import load_model

GRID = Grid(
    num_gpus=1,
    tp=(1,),
    pp=(1,),
    kv_dtypes=("bf16",),
    weight_dtypes=("bf16",),
    max_num_batched_tokens=(2048,),
    max_num_seqs=(256,),
    max_replicas=512,
)


def _problem(rate, ttft=None):
    wl = Workload(
        arrival_rate_per_s=rate,
        prompt_tokens_mean=512.0,
        output_tokens_mean=256.0,
        output_tokens_cv=1.0,
    )
    return make_problem(
        load_model("meta-llama/Llama-3.1-8B"),
        ("h100-sxm",),
        wl,
        slo_ttft_p95_s=ttft,
        grid=GRID,
        num_draws=32,
    )


def test_throughput_bound_cost_scales_one_for_one_with_rate():
    config = jnp.zeros(len(KNOBS), dtype=jnp.int32)
    r_star, el = cost_elasticities(_problem(200.0), config)
    el = dict(zip(SENSITIVITIES, np.asarray(el)))
    # only stability binds (no SLO): replicas ~ rate, so d log cost / d log rate ~ 1
    assert abs(el["arrival_rate_per_s"] - 1.0) < 0.05
    assert el["hbm_bytes_per_s"] < 0 and el["slo_ttft_p95_s"] == 0.0
    # and the exact integer optimum agrees: only stability binds, so replicas = ceil(rate / c) and
    # doubling the rate gives ceil(2 x) in {2 ceil(x) - 1, 2 ceil(x)} (a log-ratio tolerance is
    # at the mercy of rounding at ~5 replicas)
    reps = [float(costs_at_min_replicas(_problem(r), config[None])[0][0]) for r in (200.0, 400.0)]
    assert 2 * reps[0] - 1 <= reps[1] <= 2 * reps[0]
    assert abs(float(r_star) - reps[0]) <= 0.1 * reps[0] + 1


def test_tighter_ttft_slo_costs_more():
    config = jnp.zeros(len(KNOBS), dtype=jnp.int32)
    _, el = cost_elasticities(_problem(50.0, ttft=0.2), config)
    el = dict(zip(SENSITIVITIES, np.asarray(el)))
    assert el["slo_ttft_p95_s"] <= 0.0  # loosening the bound never costs more


def test_engine_flags_name_the_knobs():
    args = engine_args(
        "m",
        {
            "tp": 4,
            "pp": 2,
            "max_num_batched_tokens": 4096,
            "max_num_seqs": 128,
            "kv_dtype": "fp8",
            "weight_dtype": "bf16",
        },
    )
    assert "--tensor-parallel-size 4 --pipeline-parallel-size 2" in args["vllm"]
    assert "--kv-cache-dtype fp8" in args["vllm"] and "--enable-chunked-prefill" in args["vllm"]
    assert "--tp-size 4" in args["sglang"] and "--chunked-prefill-size 4096" in args["sglang"]
    assert "--tp_size 4" in args["trtllm"] and "--max_num_tokens 4096" in args["trtllm"]
    assert "--max_batch_size 128" in args["trtllm"]
