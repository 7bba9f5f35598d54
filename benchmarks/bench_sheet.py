"""Budget-sheet throughput: jit + vmap over >= 1,000,000 configurations vs a per-config loop.

Grid: every catalog model with a config x 16 GPUs x TP {1,2,4,8} x PP {1,2} x KV dtype {bf16,fp8,int8,int4}
x weight dtype {bf16,fp8,int4} x input {128,512,2048,8192,32768} x output {64,256,1024,4096}.
Evaluated in fixed-size chunks (one compilation) to stay well inside 4 GB.

    python benchmarks/bench_sheet.py [--chunk 131072] [--loop-sample 200] [--repeat 1]
    python benchmarks/bench_sheet.py --quick   # 2 models x 2 GPUs, 5 sampled (smoke)
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import perfmodel as pm
from perfmodel import System

GPUS = [
    "a100-sxm-40gb",
    "a100-sxm-80gb",
    "a100-pcie-80gb",
    "h100-sxm",
    "h100-pcie",
    "h200-sxm",
    "gh200",
    "b200",
    "b300",
    "l40s",
    "l4",
    "a10g",
    "a40",
    "mi300x",
    "mi325x",
    "gaudi2",
]
TPS = [1.0, 2.0, 4.0, 8.0]
PPS = [1.0, 2.0]
KV = ["bf16", "fp8", "int8", "int4"]
WEIGHTS = ["bf16", "fp8", "int4"]
INPUTS = [128.0, 512.0, 2048.0, 8192.0, 32768.0]
OUTPUTS = [64.0, 256.0, 1024.0, 4096.0]


def stack(specs, cls, **static):
    fields = [f for f in cls.__dataclass_fields__ if f not in static]
    return cls(
        **static, **{f: jnp.stack([jnp.asarray(getattr(s, f)) for s in specs]) for f in fields}
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk", type=int, default=131072)
    ap.add_argument("--loop-sample", type=int, default=200)
    ap.add_argument(
        "--repeat", type=int, default=1, help="grid passes; the best one is printed too (warm)"
    )
    ap.add_argument("--quick", action="store_true", help="2 models x 2 GPUs, 5 sampled (smoke)")
    args = ap.parse_args()
    gpu_ids = GPUS[:2] if args.quick else GPUS
    if args.quick:
        args.chunk, args.loop_sample = 4096, 5

    models = []
    for mid in pm.model_ids():
        try:
            models.append(pm.load_model(mid))
        except pm.CatalogError:
            pass
    models = models[:2] if args.quick else models
    gpus = [pm.load_hardware(g) for g in gpu_ids]
    model_table = stack(models, pm.ModelSpec, name="grid")
    hw_table = stack(gpus, pm.HardwareSpec, name="grid")
    eff = pm.Efficiency()

    axes = [
        len(models),
        len(gpus),
        len(TPS),
        len(PPS),
        len(KV),
        len(WEIGHTS),
        len(INPUTS),
        len(OUTPUTS),
    ]
    total = int(np.prod(axes))
    kv_bytes = jnp.asarray([pm.DTYPE_BYTES[k] for k in KV])
    w_bytes = jnp.asarray([pm.DTYPE_BYTES[w] for w in WEIGHTS])
    w_mix = jnp.stack([pm.compute_dtype_weights(w) for w in WEIGHTS])
    tps, pps, ins, outs = (
        jnp.asarray(TPS),
        jnp.asarray(PPS),
        jnp.asarray(INPUTS),
        jnp.asarray(OUTPUTS),
    )

    def one(index):
        i = jnp.unravel_index(index, axes)
        model = jax.tree.map(lambda x: x[i[0]], model_table)
        hw = jax.tree.map(lambda x: x[i[1]], hw_table)
        dep = pm.Deployment(
            tp=tps[i[2]],
            pp=pps[i[3]],
            microbatches=pps[i[3]],
            kv_bytes_per_elem=kv_bytes[i[4]],
            weight_bytes_per_param=w_bytes[i[5]],
            compute_dtype_mix=w_mix[i[5]],
            max_model_len=65536.0,
        )
        s = pm.budget_sheet(System(model, hw, dep, eff), ins[i[6]], outs[i[7]])
        return jnp.stack(
            [
                s.kv_bytes_per_token,
                s.weight_bytes_per_gpu,
                s.kv_capacity_tokens,
                s.max_concurrent_requests,
                s.prefill_s,
                s.decode_step_s_batch1,
                s.decode_step_s_max_batch,
                s.decode_tokens_per_s_max,
                s.binding_budget.astype(s.prefill_s.dtype),
            ]
        )

    batched = jax.jit(jax.vmap(one))
    n_chunks = -(-total // args.chunk)
    t0 = time.perf_counter()
    batched(jnp.arange(args.chunk)).block_until_ready()
    compile_s = time.perf_counter() - t0

    def sweep():
        """One pass over the grid; the checksum counts each configuration once (the last
        chunk's padding repeats the last index)."""
        checksum = 0.0
        t0 = time.perf_counter()
        for c in range(n_chunks):
            idx = jnp.minimum(jnp.arange(c * args.chunk, (c + 1) * args.chunk), total - 1)
            out = batched(idx)
            valid = min(args.chunk, total - c * args.chunk)
            checksum += float(jnp.nansum(out[:valid, 7]))
        return time.perf_counter() - t0, checksum

    passes = [sweep() for _ in range(args.repeat)]
    vec_s, checksum = passes[0]
    best_s = min(t for t, _ in passes)
    vec_rate = n_chunks * args.chunk / vec_s

    # The same equations, one configuration per Python call (eager JAX, as a plain loop would).
    rng = np.random.default_rng(0)
    sample = rng.integers(0, total, args.loop_sample)
    t0 = time.perf_counter()
    for index in sample:
        one(jnp.asarray(index)).block_until_ready()
    loop_s = time.perf_counter() - t0
    loop_rate = args.loop_sample / loop_s
    # and one jitted single-configuration call per Python iteration
    single = jax.jit(one)
    single(jnp.asarray(0)).block_until_ready()
    t0 = time.perf_counter()
    for index in sample:
        single(jnp.asarray(index)).block_until_ready()
    jit_loop_rate = args.loop_sample / (time.perf_counter() - t0)
    check = np.asarray(batched(jnp.asarray(np.resize(sample, args.chunk)))[: args.loop_sample])
    ref = np.stack([np.asarray(single(jnp.asarray(i))) for i in sample[:20]])
    agree = np.allclose(check[:20], ref, rtol=1e-5, equal_nan=True)

    print(f"devices: {jax.devices()}  x64: {jax.config.jax_enable_x64}")
    print(f"grid: {total:,} configurations ({' x '.join(map(str, axes))}), chunk {args.chunk:,}")
    print(f"compile: {compile_s:.2f} s (once)")
    print(f"jit+vmap: {vec_s:.2f} s -> {vec_rate:,.0f} configurations/s")
    if args.repeat > 1:
        print(
            f"jit+vmap, best of {args.repeat} passes: {best_s:.3f} s -> "
            f"{n_chunks * args.chunk / best_s:,.0f} configurations/s"
        )
    print(f"eager per-config loop ({args.loop_sample} sampled): {loop_rate:,.1f} configurations/s")
    print(f"jitted per-config loop: {jit_loop_rate:,.1f} configurations/s")
    print(
        f"ratio vs eager loop: {vec_rate / loop_rate:,.0f}x; vs jitted loop: {vec_rate / jit_loop_rate:,.0f}x"
    )
    print(f"vectorized == loop on sample: {agree}; checksum {checksum:.6e}")


if __name__ == "__main__":
    main()
