"""Where the closed form's slot (seat) wait comes from, against the simulator, at saved grid points.

For each point of a ``bench_queueing_vs_sim.py --save`` file (or those named by ``--only``), runs
the simulator's engine loop once (``run_engine``: every iteration priced through
``step_function``, no fast-forward) and prints, next to the closed form's own figures
(``open_loop``'s running count and seat wait):

* the running count N (first token to finish): time-average mean and sd, and the share of
  arrivals that find every seat busy (the seat wait's probability);
* the iteration mix: the share of iterations carrying prefill, the decode batch in carrying and in
  decode-only iterations, and the mean gap per iteration against the gap a decoding request sees
  (weighted by the decodes in each iteration: E[N dt] / E[N], which sets N by Little's law).

    PYTHONPATH=. python benchmarks/diagnose_seats.py b.json [--only Llama-3.1-8B:on:16384:1.0]
        [--requests 40000] [--seed 7] [--quick]

A diagnostic for where the closed form and the simulator part near utilisation 0.9; not a test.
"""

from __future__ import annotations

import argparse
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

from fitting.queueing_corrections import agreement_workload as workload
from perfmodel import Deployment, Efficiency, System, load_hardware, load_model
from perfmodel.dynamics import DecodeCost, EngineConfig, LoadPoint, open_loop
from perfmodel.simulator import EngineHooks, simulate

open_loop_compiled = eqx.filter_jit(open_loop)
"""The closed form's open loop as one compiled program (run op by op it dispatches ~700)."""


def key_of(p):
    return f"{p['model'].split('/')[1]}:{'on' if p['chunked'] else 'off'}:{p['budget']}:{p['cv']}"


def recorded_run(model, gpu, dep, eff, w, requests, seed, chunked):
    """One replica's simulated run (``simulate``) with every iteration's (prefill tokens,
    decodes, seconds) recorded (``EngineHooks.iteration``, which prices each one by one).
    Returns the ``SimResult`` and the iterations after the first tenth (the warm-up)."""
    log = []
    hooks = EngineHooks(iteration=lambda p_tok, d_seq, dt: log.append((p_tok, d_seq, dt)))
    run = simulate(
        System(model, gpu, dep, eff),
        w,
        num_requests=requests,
        seed=seed,
        chunked_prefill=chunked,
        hooks=hooks,
    )
    return run, np.asarray(log[len(log) // 10 :])


def running_law(r, seats):
    """Time-average mean and sd of the running count, and the share of arrivals finding it full."""
    first, finish = r.first_token_s, r.finish_s
    ok = np.isfinite(first) & np.isfinite(finish)
    t = np.concatenate([first[ok], finish[ok]])
    step = np.concatenate([np.ones(ok.sum()), -np.ones(ok.sum())])
    order = np.argsort(t, kind="stable")
    t, n = t[order], np.cumsum(step[order])
    dt = np.diff(t)
    w = dt / dt.sum()
    mean = float(np.sum(w * n[:-1]))
    sd = float(np.sqrt(np.sum(w * (n[:-1] - mean) ** 2)))
    at = np.searchsorted(t, r.arrival_s[ok], side="right") - 1
    seen = np.where(at >= 0, n[np.clip(at, 0, len(n) - 1)], 0.0)
    return mean, sd, float(np.mean(seen >= seats - 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("points", help="a bench_queueing_vs_sim.py --save file")
    ap.add_argument("--only", default="", help="comma-separated model:on|off:budget:cv keys")
    ap.add_argument("--requests", type=int, default=40000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="the file's first point, 1,000 requests")
    args = ap.parse_args()
    want = set(filter(None, args.only.split(",")))
    eff = Efficiency()
    with open(args.points) as fh:
        points = json.load(fh)
    if args.quick:
        points, args.requests = points[:1], 1000
    for p in points:
        if want and key_of(p) not in want:
            continue
        model, gpu = load_model(p["model"]), load_hardware(p["gpu"])
        dep = Deployment.create(tp=p["tp"], max_num_batched_tokens=float(p["budget"]))
        w = workload(p["rate"], p["cv"])
        point = LoadPoint(
            system=System(model, gpu, dep, eff),
            workload=w,
            config=EngineConfig(chunked_prefill=p["chunked"]),
            cost=DecodeCost(),
            ca2=jnp.asarray(1.0),
        )
        cf = open_loop_compiled(point, jnp.asarray(p["rate"]))
        s = cf.steady
        n_cf, var_cf = float(cf.running_mean), float(cf.running_var)
        p_cf, w_cf = float(cf.seat_wait_prob), float(cf.seat_wait_s)
        seats = float(s.seats)
        r, it = recorded_run(model, gpu, dep, eff, w, args.requests, args.seed, p["chunked"])
        n_sim, sd_sim, full_sim = running_law(r, seats)
        carry = it[:, 0] > 0
        dec, dt = it[:, 1], it[:, 2]
        # a prefill-only iteration (unchunked) stalls the batch of the iteration before it
        idx = np.where(dec > 0, np.arange(len(dec)), 0)
        held = dec[np.maximum.accumulate(idx)]
        stepped = dec > 0
        print(f"{key_of(p)} at {p['rate']:.2f}/s, {seats:.0f} seats, {args.requests} requests")
        print(
            f"  running N: sim {n_sim:.1f} sd {sd_sim:.1f}, P(arrival finds seats full) "
            f"{full_sim:.3f} | closed form {n_cf:.1f} sd {np.sqrt(var_cf):.1f}, P(seat wait) "
            f"{p_cf:.3f}, E[W | wait] {w_cf:.2f} s"
        )
        print(
            f"  iterations: carrying prefill {carry.mean():.3f}, decodes in mixed "
            f"{dec[carry & stepped].mean() if (carry & stepped).any() else 0:.0f} / decode-only "
            f"{dec[~carry].mean():.0f}; time per decode step {dt.sum() / stepped.sum() * 1e3:.2f} "
            f"ms, as a decoding request sees it {np.sum(held * dt) / np.sum(dec) * 1e3:.2f} ms "
            f"| closed form {float(s.tpot) * 1e3:.2f} ms at n_d {float(s.n_d):.1f}"
        )


if __name__ == "__main__":
    main()
