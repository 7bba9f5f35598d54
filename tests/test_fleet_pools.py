"""Pool splits in ``fleet`` and ``forecast``: both count and cap GPUs per type, so a split they
use keeps its prefill and decode pools on one GPU type (``optimize.on_gpu_type``)."""

import numpy as np
import pytest

from optimize import KNOBS, Grid, RequestClass, Workload, make_problem
from optimize._grid import GPU, POOL, PREFILL_GPU, on_gpu_type
from optimize._search import SearchResult
from perfmodel import load_model
from servingmath.cli import main
from servingmath.reports.optimize import describe_short

BASE = ["--model", "meta-llama/Llama-3.1-8B", "--ttft-p95", "2", "--tpot-p95", "0.05"]


def _config(gpu, pool=0, prefill_gpu=0):
    c = np.zeros(len(KNOBS), dtype=np.int32)
    c[GPU], c[POOL], c[PREFILL_GPU] = gpu, pool, prefill_gpu
    return c


def test_on_gpu_type_keeps_colocated_engines_and_same_type_splits():
    rows = np.stack([_config(0), _config(1), _config(0, 1, 1), _config(0, 1, 0), _config(1, 2, 1)])
    assert on_gpu_type(rows, 0).tolist() == [True, False, False, True, False]
    assert on_gpu_type(rows, 1).tolist() == [False, True, False, False, True]
    assert bool(on_gpu_type(rows[2], 0)) is False  # one row: the prefill pool is type 1


def test_fleet_problem_takes_each_types_cheapest_single_type_configuration(monkeypatch):
    """The search ranks a cross-type split first (prefill on type 1, decode on type 0); the
    fleet skips it for type 0 (its prefill GPUs would be counted as type 0's) and takes the
    same-type split, and for type 1 the colocated engine; each unit costs its GPUs at its own
    type's price."""
    import optimize._classes as classes

    problem = make_problem(
        load_model("meta-llama/Llama-3.1-8B"),
        ("h100-sxm", "l40s"),
        Workload(arrival_rate_per_s=1.0, prompt_tokens_mean=1024.0, output_tokens_mean=128.0),
        slo_ttft_p95_s=2.0,
        slo_tpot_p95_s=0.05,
        grid=Grid(num_gpus=2, pool_ratios=((1, 1),)),
        num_draws=8,
    )
    ranked = np.stack([_config(0, 1, 1), _config(0, 1, 0), _config(1)])
    found = SearchResult(ranked, np.array([1, 1, 1]), np.array([1.0, 2.0, 3.0]), 3)
    monkeypatch.setattr(classes, "search", lambda *a, **k: found)
    monkeypatch.setattr(classes, "replica_capacity", lambda p, c: 5.0)
    monkeypatch.setattr(classes, "gpus_per_replica", lambda p, c: 1.0 + float(c[POOL] > 0))
    fleet, configs = classes.fleet_problem(
        problem, [RequestClass(1024.0, 128.0, 1.0)], 1.0, np.array([np.inf, np.inf])
    )
    assert configs[0, 0].tolist() == ranked[1].tolist()
    assert configs[0, 1].tolist() == ranked[2].tolist()
    prices = np.asarray(problem.hardware.price_per_gpu_hour)
    np.testing.assert_allclose(fleet.replica_gpus[0], [2.0, 1.0])
    np.testing.assert_allclose(fleet.replica_cost[0], [2.0 * prices[0], prices[1]])


@pytest.mark.parametrize("command", ["fleet", "forecast"])
def test_fleet_and_forecast_offer_pool_splits_when_asked(command, problem_of, capsys):
    """Colocated by default; --pool-ratios 1:1,2:1 offers those splits and --transfer-bw sets their
    KV hand-off bandwidth (none given: the inter-node network's); a bad ratio or bandwidth is one
    line and exit 2 before any work."""
    load = ["--rate", "5"] if command == "fleet" else ["--demand", "data/examples/demand.csv"]
    argv = [command, *BASE, "--gpus", "h100-sxm,l40s", *load]
    problems = [problem_of([*argv, *ratios]) for ratios in ([], ["--pool-ratios", "1:1,2:1"])]
    grids = [p.grid for p in problems]
    assert grids[0].pool_ratios == () and not grids[0].disaggregated
    assert grids[1].pool_ratios == ((1, 1), (2, 1)) and grids[1].disaggregated
    gpus = ("h100-sxm", "l40s")
    line = describe_short(problems[1], gpus, _config(1, 2, 1))  # a 2:1 split, both on l40s
    assert line.startswith("TP 1 PP 1, 2:1 prefill:decode engines, weights")
    assert "prefill:decode" not in describe_short(problems[1], gpus, _config(1))
    handoff = problem_of([*argv, "--pool-ratios", "1:1", "--transfer-bw", "5e10"])
    assert float(handoff.transfer_bytes_per_s) == 5e10
    assert float(problems[1].transfer_bytes_per_s) <= 0  # none given: the network's
    capsys.readouterr()
    for bad, flag in (
        (["--pool-ratios", "0:1"], "--pool-ratios"),
        (["--transfer-bw", "-1"], "--transfer-bw"),
    ):
        assert main([*argv, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and flag in err


def test_each_pool_of_a_split_runs_and_pays_for_its_own_tp_and_pp():
    """A 2:1 split with prefill engines at TP 2 x PP 2 on l40s and decode engines at TP 4 x PP 1
    on h100-sxm: per replica unit 2 x 4 + 1 x 4 = 12 GPUs; $/hour = replicas x (8 l40s + 4
    h100-sxm prices) x the dtype surcharge; each pool's launch command carries its own TP and
    PP; a colocated row's canonical prefill TP and PP are its own."""
    import jax.numpy as jnp

    from optimize import cost_per_hour, describe_config
    from optimize._engine_args import engine_args
    from optimize._evaluate import gpus_per_replica
    from optimize._grid import PP, PREFILL_PP, PREFILL_TP, TP

    gpus = ("h100-sxm", "l40s")
    problem = make_problem(
        load_model("meta-llama/Llama-3.1-8B"),
        gpus,
        Workload(arrival_rate_per_s=1.0, prompt_tokens_mean=1024.0, output_tokens_mean=128.0),
        grid=Grid(num_gpus=2, pool_ratios=((2, 1),)),
        num_draws=2,
    )
    c = _config(0, 1, 1)
    c[TP], c[PP], c[PREFILL_TP], c[PREFILL_PP] = 2, 0, 1, 1  # decode TP 4 PP 1, prefill TP 2 PP 2
    prices = np.asarray(problem.hardware.price_per_gpu_hour)
    surcharge = 1.0 + float(problem.kv_penalty_fraction[0] + problem.weight_penalty_fraction[0])
    assert float(gpus_per_replica(problem, jnp.asarray(c))) == 12.0
    np.testing.assert_allclose(
        float(cost_per_hour(problem, jnp.asarray(c), 3.0)),
        3.0 * (2 * 2 * 2 * prices[1] + 1 * 4 * 1 * prices[0]) * surcharge,
        rtol=1e-12,
    )
    d = describe_config(problem, gpus, c, 3)
    pools = d["disaggregation"]
    assert (pools["prefill"]["tp"], pools["prefill"]["pp"]) == (2, 2)
    assert (pools["decode"]["tp"], pools["decode"]["pp"]) == (4, 1)
    assert (pools["prefill"]["num_gpus"], pools["decode"]["num_gpus"], d["num_gpus"]) == (
        24,
        12,
        36,
    )
    args = engine_args("meta-llama/Llama-3.1-8B", d)
    assert "--tensor-parallel-size 2 --pipeline-parallel-size 2" in args["vllm_prefill"]
    assert "--tensor-parallel-size 4 --pipeline-parallel-size 1" in args["vllm_decode"]
    colocated = problem.grid.canonical(_config(0)[None], problem.model)[0]
    assert (colocated[PREFILL_TP], colocated[PREFILL_PP]) == (colocated[TP], colocated[PP])
