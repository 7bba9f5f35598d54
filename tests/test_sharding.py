"""Across 8 (forced host) devices the exhaustive referee, the multi-start search and the forecast
intervals give the one-device answers.  Runs in a subprocess: the device count is fixed before
JAX initialises."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
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
one, many = exhaustive_optimum(p, chunk=16, mesh=False), exhaustive_optimum(p, chunk=16)
out["exhaustive"] = [[one.config.tolist(), one.replicas, one.cost_per_hour],
                     [many.config.tolist(), many.replicas, many.cost_per_hour]]
opts = SearchOptions(num_starts=8, num_steps=25, relaxed_draws=8, max_rounds=2)
out["starts_sharded"] = len(_starts_sharding(mesh, opts.num_starts).device_set)
s1, s8 = search(p, opts, mesh=False), search(p, opts)
out["search"] = [[s1.configs[:3].tolist(), s1.replicas[:3].tolist(), s1.cost_per_hour[:3].tolist()],
                 [s8.configs[:3].tolist(), s8.replicas[:3].tolist(), s8.cost_per_hour[:3].tolist()]]
demand = [DemandPeriod("a", 5.0, 0.0), DemandPeriod("b", 60.0, 20.0)]
configs = {"h100-sxm": one.config}
out["forecast"] = [forecast_gpus(p, configs, demand, mesh=False), forecast_gpus(p, configs, demand)]
print("RESULT" + json.dumps(out))
'''


def test_eight_devices_give_the_one_device_answers():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, check=False,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    out = json.loads(line[len("RESULT"):])
    assert out["devices"] == 8 and out["shards"] == 8
    one, many = out["exhaustive"]
    assert one == many
    assert one[1] > 1  # a non-trivial instance: more than one replica needed
    assert out["starts_sharded"] == 8  # the starts really were split over the devices
    assert out["search"][0] == out["search"][1]
    assert out["search"][0][2][0] <= one[2] * 1.01
    assert out["forecast"][0] == out["forecast"][1]
