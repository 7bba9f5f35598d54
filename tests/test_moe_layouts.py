"""The MoE layout knob of the search grid: which configurations exist, the Deployment each one
is, what the recommendation reports and launches, and the search choosing between layouts."""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from optimize import (
    KNOBS,
    MOE_LAYOUTS,
    Grid,
    Workload,
    describe_config,
    make_problem,
    one_hot_weights,
)
from optimize._engine_args import engine_args
from optimize._grid import MOE, TP, deployment_from_weights, grid_tables
from perfmodel import load_model

MOE_MODEL = load_model("Qwen/Qwen3-30B-A3B")
DENSE = load_model("meta-llama/Llama-3.1-8B")
GRID = Grid(
    num_gpus=1,
    tp=(1, 2, 4),
    pp=(1,),
    kv_dtypes=("bf16",),
    weight_dtypes=("bf16",),
    max_num_batched_tokens=(2048,),
    max_num_seqs=(256,),
    max_replicas=8,
    moe_layouts=tuple(MOE_LAYOUTS),
)


def _layouts(rows):
    return {(GRID.tp[r[TP]], GRID.moe_layouts[r[MOE]]) for r in rows}


def test_a_moe_model_takes_every_layout_where_it_differs_from_tp():
    rows = GRID.all_configs(MOE_MODEL)
    # at TP 2, ep/2 is EP 1 with attention split by TP: the tp layout itself
    expected = {(1, "tp"), (2, "tp"), (2, "ep"), (2, "ep+dp")}
    assert _layouts(rows) == expected | {(4, n) for n in ("tp", "ep", "ep/2", "ep+dp")}
    assert len(rows) == 1 + 3 + 4


def test_a_dense_model_and_tp_1_are_tp_only():
    assert _layouts(GRID.all_configs(DENSE)) == {(1, "tp"), (2, "tp"), (4, "tp")}
    row = np.zeros(len(KNOBS), dtype=np.int32)
    row[MOE] = GRID.moe_layouts.index("ep+dp")
    assert GRID.canonical(row[None], MOE_MODEL)[0, MOE] == GRID.moe_layouts.index("tp")
    row[TP] = GRID.tp.index(4)
    assert GRID.canonical(row[None], DENSE)[0, MOE] == GRID.moe_layouts.index("tp")
    assert GRID.canonical(row[None], MOE_MODEL)[0, MOE] == GRID.moe_layouts.index("ep+dp")
    row[TP], row[MOE] = GRID.tp.index(2), GRID.moe_layouts.index("ep/2")
    assert GRID.canonical(row[None], MOE_MODEL)[0, MOE] == GRID.moe_layouts.index("tp")
    row[TP] = GRID.tp.index(4)
    assert GRID.canonical(row[None], MOE_MODEL)[0, MOE] == GRID.moe_layouts.index("ep/2")


@pytest.mark.parametrize(
    ("layout", "ep", "dp"), [("tp", 1, 1), ("ep", 4, 1), ("ep/2", 2, 1), ("ep+dp", 4, 4)]
)
def test_each_layout_is_exactly_its_deployment(layout, ep, dp):
    row = np.zeros(len(KNOBS), dtype=np.int32)
    row[TP], row[MOE] = GRID.tp.index(4), GRID.moe_layouts.index(layout)
    dep = deployment_from_weights(one_hot_weights(jnp.asarray(row), GRID), grid_tables(GRID), 1.0)
    assert float(dep.tp) == 4.0
    assert float(dep.expert_parallel) == ep and float(dep.attention_dp) == dp


def test_relaxed_layout_weights_mix_the_degrees_in_log():
    weights = list(one_hot_weights(jnp.zeros(len(KNOBS), dtype=jnp.int32), GRID))
    weights[TP] = jnp.asarray([0.0, 0.0, 1.0])
    weights[MOE] = jnp.asarray([0.5, 0.5, 0.0, 0.0])  # half tp, half ep: EP share 1/2 of TP 4
    dep = deployment_from_weights(tuple(weights), grid_tables(GRID), 1.0)
    assert float(dep.expert_parallel) == pytest.approx(2.0)
    assert float(dep.attention_dp) == 1.0
    weights[MOE] = jnp.asarray([0.0, 0.5, 0.5, 0.0])  # half ep (4), half ep/2 (2): 4 / 2^(1/2)
    dep = deployment_from_weights(tuple(weights), grid_tables(GRID), 1.0)
    assert float(dep.expert_parallel) == pytest.approx(4.0 / 2.0**0.5)


def _problem(layouts, rate=40.0):
    return make_problem(
        MOE_MODEL,
        ("h100-sxm",),
        Workload(
            arrival_rate_per_s=rate,
            prompt_tokens_mean=1024.0,
            output_tokens_mean=256.0,
            output_tokens_cv=1.0,
        ),
        slo_ttft_p95_s=2.0,
        slo_tpot_p95_s=0.1,
        grid=GRID._replace(moe_layouts=layouts),
        num_draws=16,
    )


def _described_at_tp_4(layout: str, replicas: int) -> dict:
    row = np.zeros(len(KNOBS), dtype=np.int32)
    row[TP], row[MOE] = GRID.tp.index(4), GRID.moe_layouts.index(layout)
    return describe_config(_problem(tuple(MOE_LAYOUTS)), ("h100-sxm",), row, replicas)


def test_the_recommendation_reports_and_launches_its_layout():
    described = _described_at_tp_4("ep+dp", 2)
    assert described["moe_layout"] == "ep+dp"
    assert described["ep"] == 4 and described["attention_dp"] == 4
    out = engine_args(MOE_MODEL.name, described)
    assert "--enable-dp-attention" in out["sglang"] and "--ep-size 4" in out["sglang"]
    assert "--data-parallel-size 4" in out["vllm"] and "--tensor-parallel-size 1" in out["vllm"]


def test_ep_over_two_launches_half_the_tp_ranks_as_expert_groups():
    described = _described_at_tp_4("ep/2", 1)
    assert described["moe_layout"] == "ep/2"
    assert described["ep"] == 2 and described["attention_dp"] == 1
    out = engine_args(MOE_MODEL.name, described)
    assert "--tp-size 4" in out["sglang"] and "--ep-size 2" in out["sglang"]
    assert "--enable-dp-attention" not in out["sglang"]
    assert "--tp_size 4" in out["trtllm"] and "--ep_size 2" in out["trtllm"]


def test_cli_refuses_an_unknown_layout_and_a_layout_a_dense_model_cannot_take():
    base = [sys.executable, "-m", "servingmath", "optimize", "--gpus", "h100-sxm", "--rate", "1"]
    base += ["--ttft-p95", "1", "--tpot-p95", "0.1"]
    for model, layouts, words in (
        ("Qwen/Qwen3-30B-A3B", "ep,bogus", "unknown layout 'bogus'"),
        ("meta-llama/Llama-3.1-8B", "ep", "no routed experts"),
    ):
        run = subprocess.run(
            [*base, "--model", model, "--moe-layouts", layouts],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 2, run.stderr
        assert words in run.stderr and len(run.stderr.strip().splitlines()) == 1
        assert "Traceback" not in run.stderr
