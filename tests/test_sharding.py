"""Across 8 (forced host) devices the exhaustive referee, the multi-start search and the forecast
intervals give the one-device answers.  Two subprocesses, run side by side (the device count is
fixed before JAX initialises): one with ``--xla_force_host_platform_device_count=8`` and the
default mesh (every device), one with a single device.  Both compile with XLA's backend
optimisation off (``--xla_backend_optimization_level=0``: about half the compile time, which is
most of the test) and its CPU fusion emitters off (as ``tests/conftest.py``); the sharded and one-device programs are still compared under one setting."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
from optimize import Grid, SearchOptions, Workload, exhaustive_optimum, forecast_gpus, make_problem, search
from optimize._forecast import DemandPeriod
from optimize._search import _starts_sharding
from optimize._sharding import device_mesh, num_shards
from perfmodel import load_model

mesh = device_mesh()
grid = Grid(num_gpus=2, tp=(1, 2), pp=(1, 2), kv_dtypes=("bf16", "fp8"), weight_dtypes=("bf16",),
            max_num_batched_tokens=(1024, 4096), max_num_seqs=(256,), max_replicas=16)
wl = Workload(arrival_rate_per_s=60.0, prompt_tokens_mean=1024.0, output_tokens_mean=256.0,
              output_tokens_cv=1.0)
p = make_problem(load_model("meta-llama/Llama-3.1-8B"), ("h100-sxm", "l40s"), wl,
                 slo_ttft_p95_s=1.0, slo_tpot_p95_s=0.05, confidence=0.9, grid=grid,
                 num_draws=32, seed=1)
out = {"devices": len(jax.devices()), "shards": num_shards(mesh)}
best = exhaustive_optimum(p, chunk=16)
out["exhaustive"] = [best.config.tolist(), best.replicas, best.cost_per_hour]
opts = SearchOptions(num_starts=8, num_steps=25, relaxed_draws=8, max_rounds=2)
sharding = _starts_sharding(mesh, opts.num_starts)
out["starts_sharded"] = 1 if sharding is None else len(sharding.device_set)
found = search(p, opts)
out["search"] = [found.configs[:3].tolist(), found.replicas[:3].tolist(), found.cost_per_hour[:3].tolist()]
demand = [DemandPeriod("a", 5.0, 0.0), DemandPeriod("b", 60.0, 20.0)]
configs = {"h100-sxm": np.asarray([0, 0, 0, 0, 0, 0, 0], dtype=np.int32)}
out["forecast"] = forecast_gpus(p, configs, demand)
print("RESULT" + json.dumps(out))
"""


def _start(devices: int) -> subprocess.Popen:
    flags = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    if devices > 1:
        flags += f" --xla_force_host_platform_device_count={devices}"
    env = dict(os.environ, XLA_FLAGS=flags, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    line = next(l for l in stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def test_eight_devices_give_the_one_device_answers():
    procs = {n: _start(n) for n in (8, 1)}
    many, one = _result(procs[8]), _result(procs[1])
    assert (many["devices"], many["shards"], many["starts_sharded"]) == (8, 8, 8)
    assert (one["devices"], one["shards"], one["starts_sharded"]) == (1, 1, 1)
    assert many["exhaustive"] == one["exhaustive"]
    assert one["exhaustive"][1] > 1  # a non-trivial instance: more than one replica needed
    assert many["search"] == one["search"]
    assert one["search"][2][0] <= one["exhaustive"][2] * 1.01  # and the search finds the optimum
    assert many["forecast"] == one["forecast"]
    assert (
        one["forecast"][1]["gpus"]["h100-sxm"]["p95"][1]
        > one["forecast"][0]["gpus"]["h100-sxm"]["p50"]
    )
