"""The simulator and the closed-form closed loop against measured closed-loop serving runs.

The discrete-event simulator uses the same step model as the closed form the
calibration fits, so it is checked against real serving rows too.  Runs are the closed-loop
measurements of ``data/measurements/aic_serving_h100.csv`` (aiperf, fixed lengths) and
``inferencemax_nvidia.csv.gz`` (``benchmark_serving.py``, lengths uniform in [0.8 L, L]): one run
= one measured configuration with a mean TTFT and a mean TPOT row.  Each run is built exactly as
the fitting path builds its rows (``fitting.serving_row_specs``: data-parallel replicas, the
benchmark's length law, requests per client, ``max_num_seqs`` = concurrency, the default token
budget and dtypes), at the posterior-median efficiencies of the bundled posterior for its GPU
(as ``fitting.add_serving_stage`` takes them: the per-field median of 64 draws,
``time_scale`` 1) and without any end-to-end (cut-stage) offset, then predicted twice:

* closed form: ``perfmodel.dynamics.closed_loop_metrics`` (what ``fitting.predict_log``'s
  closed-loop block evaluates);
* simulator: ``perfmodel.simulator.simulate`` in closed loop at the run's concurrency (as
  ``servingmath simulate --concurrency N``), requests_per_client x N requests (capped at
  ``--max-requests``), seeded; its means are over every served request, as the benchmarks
  average over all their prompts (the first wave included).

Both are the physics alone.  A third predictor is what ``explain`` and ``optimize`` answer for a
lab they never saw: the closed form times the TTFT / TPOT scales (``perfmodel.dynamics.
engine_scaled``) that ``fitting.efficiency_draws`` gives for the run's engine from an end-to-end
stage refitted without the run's lab (``fitting.add_serving_stage`` on the other labs' rows,
posterior median of 64 draws): the held-out figure of the product's answers.

Prints one row per run and a summary per source and pooled: median predicted / measured and
median APE of mean TTFT and mean TPOT for each predictor, and the median simulator / closed-form
ratio (their agreement).

    PYTHONPATH=. python benchmarks/bench_simulator_vs_measured.py [--runs 40] [--seed 0]
        [--max-requests 2000] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections import Counter

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np
import pandas as pd

import fitting
import perfmodel
from fitting import (
    ENGINE_ALL_REDUCE_CELL,
    MEDIAN_PARAM_DRAWS,
    PARAM_NAMES,
    draw_indices,
    notes_dict,
    parameter_draws,
    row_skip_reason,
    serving_row_specs,  # the fitting path's own row -> specs, workload
)
from perfmodel import Efficiency, System, Workload
from perfmodel.dynamics import closed_loop_metrics
from perfmodel.simulator import simulate
from servingmath.cli import enable_compile_cache

FILES = (
    "data/measurements/aic_serving_h100.csv",
    "data/measurements/inferencemax_nvidia.csv.gz",
)
RUN_KEYS = (
    "source",
    "engine",
    "gpu",
    "model",
    "num_gpus",
    "tp",
    "pp",
    "ep",
    "weight_dtype",
    "kv_dtype",
    "input_len",
    "output_len",
    "concurrency",
    "run_notes",
)
PER_METRIC_NOTES = ("upstream_field", "std_across_requests_s")
"""``notes`` keys that differ between the TTFT and the TPOT row of one run (dropped to pair them)."""
STRATA = ("source", "engine", "gpu")
UNKNOWN = "GPU or model missing from the catalog (rows)"
SPECULATIVE = "speculative decoding (spec_decoding=mtp...): several tokens per step"


def _run_notes(notes: str) -> str:
    parts = [p.strip() for p in str(notes).split(";")]
    return "; ".join(p for p in parts if p.split("=")[0].strip() not in PER_METRIC_NOTES)


def measured_runs(skipped: Counter) -> pd.DataFrame:
    """One row per closed-loop run: its TTFT row's columns plus ``ttft`` / ``tpot`` (measured
    means, s).  Rows and runs the model cannot cover are counted in ``skipped`` by reason."""
    result = fitting.load_measurements(list(FILES))
    for reason in (UNKNOWN, SPECULATIVE):  # listed even when no run needs them
        skipped[reason] += 0
    for s in result.skipped:
        skipped[UNKNOWN] += 1
    t = result.table
    t = t[(t["scenario"] == "serving") & (t["stat"] == "mean") & t["metric"].isin(["ttft", "tpot"])]
    t = t.assign(run_notes=t["notes"].map(_run_notes))
    runs = []
    for _, g in t.groupby(list(RUN_KEYS), dropna=False, sort=True):
        by_metric = {m: g[g["metric"] == m] for m in ("ttft", "tpot")}
        if any(len(v) != 1 for v in by_metric.values()):
            skipped["run without exactly one mean TTFT and one mean TPOT row"] += 1
            continue
        row = by_metric["ttft"].iloc[0]
        reason = row_skip_reason(row, True) or row_skip_reason(by_metric["tpot"].iloc[0], True)
        spec = notes_dict(row["notes"]).get("spec_decoding", "none")
        if reason is None and spec not in ("", "none"):
            reason = SPECULATIVE
        if reason is None and not float(row["concurrency"]) > 0:
            reason = "no concurrency recorded (not a closed loop)"
        if reason is None:
            try:
                serving_row_specs(row)
            except (perfmodel.CatalogError, KeyError, ValueError, TypeError) as exc:
                reason = f"not covered by a budget ({type(exc).__name__}: {str(exc).split(';')[0]})"
        if reason is not None:
            skipped[reason] += 1
            continue
        runs.append(
            row.to_dict()
            | {"ttft": float(row["value"]), "tpot": float(by_metric["tpot"].iloc[0]["value"])}
        )
    return pd.DataFrame(runs)


def stratified_order(runs: pd.DataFrame, seed: int) -> list[list[int]]:
    """Per (source, engine, gpu) stratum, its runs' positions in a seeded random order."""
    rng = np.random.default_rng(seed)
    queues = []
    for _, g in runs.groupby(list(STRATA), sort=True):
        idx = g.index.to_numpy()
        queues.append(list(idx[rng.permutation(len(idx))]))
    return queues


def median_efficiencies(gpus: list[str]) -> dict[str, Efficiency]:
    """Posterior-median ``Efficiency`` per GPU, as the cut stage takes it (seed 0, 64 draws;
    population draws for a GPU the NUTS stage never saw; ``time_scale`` 1: no offset; the TP
    all-reduce latencies at the engines' custom all-reduce, ``ENGINE_ALL_REDUCE_CELL``)."""
    post = fitting.load_posterior()
    names = tuple(post.gpus) + tuple(sorted(set(gpus) - set(post.gpus)))
    rng = np.random.default_rng(0)
    idx = draw_indices(post, MEDIAN_PARAM_DRAWS, rng)
    draws = parameter_draws(post, names, idx, rng)
    offsets = post.flat("cell_offset")
    latency = float(np.exp(np.median(offsets[:, post.cells.index(ENGINE_ALL_REDUCE_CELL)])))
    out = {}
    for g in gpus:
        j = names.index(g)
        fields = {f: float(np.median(draws[f][:, j])) for f in PARAM_NAMES}
        out[g] = Efficiency(**fields, time_scale=1.0).with_collective_latency_scale(latency)
    return out


E2E_FILES = FILES + ("data/measurements/mlperf_v41.csv.gz",)
"""Every file with end-to-end rows: the held-out stages are fitted on the other labs' rows."""


def held_out_scales(
    sources: list[str], engines: list[str], *, closed_loop_only: bool = False
) -> dict[tuple[str, str, bool], tuple]:
    """(source, engine, lockstep) -> (TTFT scale, TPOT scale) an answer takes for ``engine``
    from an end-to-end stage fitted without ``source``'s rows (posterior median of 64 draws);
    a lockstep run's TTFT scale is the lockstep runs' (``fitting.efficiency_draws``).
    ``closed_loop_only`` (``--quick``): fit the stage on the closed-loop TTFT / TPOT rows alone,
    the groups the scales read (the same estimator over another seeded subsample of rows per
    cell; no open-loop program to compile)."""
    base = fitting.load_posterior()
    nuts = fitting.without_serving_stage(base.idata)
    table = fitting.load_measurements(list(E2E_FILES)).table
    e2e = table[table["scenario"].isin(fitting.E2E_SCENARIOS)]
    if closed_loop_only:
        e2e = e2e[
            (e2e["scenario"] == "serving")
            & e2e["metric"].isin(["ttft", "tpot"])
            & (e2e["concurrency"].astype(float) > 0)
        ]
    out = {}
    for source in sources:
        idata, _ = fitting.add_serving_stage(nuts, e2e[e2e["source"] != source], seed=0)
        post = fitting.Posterior(idata)
        for engine, lockstep in itertools.product(engines, (False, True)):
            e = fitting.efficiency_draws(
                post, "h100-sxm", MEDIAN_PARAM_DRAWS, engine=engine, lockstep=lockstep
            )
            out[source, engine, lockstep] = (
                float(np.median(np.asarray(e.ttft_scale))),
                float(np.median(np.asarray(e.tpot_scale))),
            )
    return out


@jax.jit
def _closed_form(system, workload):
    r = closed_loop_metrics(system, workload)
    return r.ttft_s[0], r.tpot_s[0]  # column 0: the mean


def predict(run: dict, eff: Efficiency, max_requests: int, seed: int) -> dict:
    """Closed-form and simulated mean TTFT / TPOT of one run (s), and the time each took."""
    (model, hardware, deployment), f = serving_row_specs(pd.Series(run))
    workload = Workload(
        arrival_rate_per_s=1.0,
        concurrency=f["concurrency"],
        interarrival_cv=1.0,
        prompt_tokens_mean=f["prompt_tokens_mean"],
        prompt_tokens_cv=f["prompt_tokens_cv"],
        output_tokens_mean=f["output_tokens_mean"],
        output_tokens_cv=f["output_tokens_cv"],
        requests_per_client=f["requests_per_client"],
    )
    t0 = time.perf_counter()
    system = System(model, hardware, deployment, eff)
    cf_ttft, cf_tpot = (float(x) for x in _closed_form(system, workload))
    t1 = time.perf_counter()
    conc = round(f["concurrency"])
    n = int(min(max(f["requests_per_client"] * conc, conc), max(max_requests, conc)))
    r = simulate(
        system,
        workload,
        num_requests=n,
        seed=seed,
        concurrency=conc,
    )
    t2 = time.perf_counter()
    served = ~r.rejected if r.rejected is not None else np.ones(len(r.arrival_s), bool)
    if np.isinf(r.finish_s).any() or not served.any():
        raise ValueError("the simulator could not serve every request (KV cache or length)")
    return {
        "cf_ttft": cf_ttft,
        "cf_tpot": cf_tpot,
        "sim_ttft": float(np.nanmean(r.ttft_s[served])),
        "sim_tpot": float(np.nanmean(r.tpot_s[served])),
        "requests": n,
        "replicas": int(r.replicas),
        "cf_s": t1 - t0,
        "sim_s": t2 - t1,
    }


def _ms(x: float) -> str:
    return f"{1e3 * x:,.1f}" if math.isfinite(x) else "inf"


def _row(run: dict, p: dict) -> str:
    L = f"{int(run['input_len'])}/{int(run['output_len'])}"
    return (
        f"| {run['source']} | {run['engine']} | {run['gpu']} | {run['model'].split('/')[-1]} "
        f"| {int(run['tp'])} | {int(run['concurrency'])} | {L} "
        f"| {_ms(run['ttft'])} / {_ms(p['cf_ttft'])} / {_ms(p['sim_ttft'])} / {_ms(p['ans_ttft'])} "
        f"| {_ms(run['tpot'])} / {_ms(p['cf_tpot'])} / {_ms(p['sim_tpot'])} / {_ms(p['ans_tpot'])} "
        f"| {p['requests']:,} | {p['cf_s']:.1f} / {p['sim_s']:.1f} |"
    )


RUN_HEADER = (
    "| source | engine | gpu | model | TP | N | in/out "
    "| mean TTFT ms: measured / closed form / simulator / answer "
    "| mean TPOT ms: measured / closed form / simulator / answer | sim. requests "
    "| s: closed / sim. |\n"
    "| --- | --- | --- | --- | ---: | ---: | --- | --- | --- | ---: | ---: |"
)


def _med(x) -> float:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


def _spread(x) -> str:
    """Median (10-90 %) of finite values."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if not x.size:
        return "n/a"
    lo, mid, hi = np.quantile(x, [0.1, 0.5, 0.9])
    return f"{mid:.2f} ({lo:.2f}-{hi:.2f})"


QUICK_SOURCE = "inferencemax"
"""The lab ``--quick`` scores (its runs span three engines and three GPUs)."""

PREDICTORS = (
    ("closed form", "cf"),
    ("simulator", "sim"),
    ("answer, lab held out", "ans"),
)
"""(label, column prefix) of each predictor in the summary."""


def summary(done: pd.DataFrame) -> str:
    lines = [
        "| source | runs | predictor | TTFT pred / meas | TTFT APE | TPOT pred / meas | TPOT APE |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    groups = [(s, g) for s, g in done.groupby("source", sort=True)] + [("**pooled**", done)]
    for name, g in groups:
        for label, p in PREDICTORS:
            rt, rp = g[f"{p}_ttft"] / g["ttft"], g[f"{p}_tpot"] / g["tpot"]
            lines.append(
                f"| {name} | {len(g)} | {label} | {_med(rt):.2f} | {100 * _med(abs(rt - 1)):.1f} % "
                f"| {_med(rp):.2f} | {100 * _med(abs(rp - 1)):.1f} % |"
            )
        at, ap = g["sim_ttft"] / g["cf_ttft"], g["sim_tpot"] / g["cf_tpot"]
        lines.append(
            f"| {name} | {len(g)} | simulator / closed form | {_spread(at)} | | {_spread(ap)} | |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40, help="runs to score (default 40)")
    ap.add_argument("--seed", type=int, default=0, help="sample and simulator seed")
    ap.add_argument(
        "--max-requests",
        type=int,
        default=2000,
        help="cap on simulated requests per run (default 2000; at least the concurrency)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"4 runs of {QUICK_SOURCE}'s, at most 200 requests each",
    )
    args = ap.parse_args()
    enable_compile_cache()  # a second run loads its compiled programs
    if args.quick:
        args.runs, args.max_requests = 4, 200
    start = time.perf_counter()
    skipped: Counter = Counter()
    runs = measured_runs(skipped)
    if args.quick:  # one lab's runs: one held-out end-to-end stage to fit
        runs = runs[runs["source"] == QUICK_SOURCE].reset_index(drop=True)
    print(f"{len(runs):,} measured closed-loop runs covered; not covered, by reason:")
    for reason, n in skipped.most_common():
        print(f"  {n:5d}  {reason}")
    queues = stratified_order(runs, args.seed)
    effs = median_efficiencies(sorted(runs["gpu"].unique()))
    scales = held_out_scales(
        sorted(runs["source"].unique()),
        sorted(runs["engine"].unique()),
        closed_loop_only=args.quick,
    )
    print(f"\n{RUN_HEADER}", flush=True)
    done, failed = [], Counter()
    while len(done) < args.runs and any(queues):
        for q in queues:
            if len(done) >= args.runs or not q:
                continue
            run = runs.loc[q.pop(0)].to_dict()
            try:
                p = predict(run, effs[run["gpu"]], args.max_requests, args.seed)
            except (ValueError, FloatingPointError) as exc:
                failed[str(exc)] += 1
                continue
            s_f, s_t = scales[run["source"], run["engine"], fitting.lockstep(pd.Series(run))]
            p |= {"ans_ttft": s_f * p["cf_ttft"], "ans_tpot": s_t * p["cf_tpot"]}
            done.append(run | p)
            print(_row(run, p), flush=True)
    for reason, n in failed.most_common():
        print(f"(skipped at run time, {n}: {reason})")
    table = pd.DataFrame(done)
    print(f"\n{summary(table)}")
    print(
        f"\n{len(table)} runs, {time.perf_counter() - start:.0f} s "
        f"(closed form {table['cf_s'].sum():.0f} s, simulator {table['sim_s'].sum():.0f} s)"
    )


if __name__ == "__main__":
    main()
