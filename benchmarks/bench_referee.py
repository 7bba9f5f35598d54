"""The optimiser's recommendation against a referee that scores every configuration with the
full load model.

The search ranks configurations with the cheap search model (``optimize.slo_metrics``); the
verdict re-checks its best few with the full load model (``perfmodel.dynamics.serving_metrics``)
over the posterior draws.  A verdict can only correct candidates the search hands it, so this
referee asks whether a cheaper configuration that the full model accepts was missed.

For each problem (a ``servingmath optimize`` command line):

1. the pipeline of ``servingmath optimize``: the CLI's own argument parsing and problem
   (``problem_from_args``), then ``optimize.recommend`` (search + full-model verdict);
2. the referee: every legal configuration of the same knob grid at every replica count whose
   cost is at most 1.25 x the recommendation's (up to ``--max-replicas``), scored with the full
   load model over the same posterior draws, accepted when P(meets every constraint) >= the
   stated confidence (``optimize.meets_confidence``, the verdict's rule); no monotonicity in
   replicas or knobs is assumed.  Its cheapest accepted configuration is the optimum the
   recommendation is held to (within 5 %);
3. the simulator (``servingmath optimize --simulate``'s check) on the recommendation at the
   posterior-median efficiency: its p95 TTFT and TPOT against the SLO.

The referee stays affordable without dropping any point by being exact about what it skips:
points are scored cheapest first, and once one is accepted every dearer point is skipped; a point
whose engine cannot hold one sequence (``max_concurrent_requests < 1``, the memory constraint,
the same in every draw) is rejected without its draws; a point's first draws (just enough to
reject it) are scored before the rest, which only points still within the confidence get.  Every
(point, draw block) row goes through one compiled function of static shape, shared by all
problems (``serving_metrics`` per row, vmapped).

The problems are colocated engines without speculation (``--pool-ratios none``): the verdict of
a pool split or of speculative decoding is a different closed form, outside this referee.

    python benchmarks/bench_referee.py            # 9 problems, 200 draws (~10 min each)
    python benchmarks/bench_referee.py --only 0   # the 405B problem alone
    python benchmarks/bench_referee.py --quick    # 1 small problem, 10 draws, coarse grid

Wall times on the 2 development cores shared with other work (load 6-9): 7-13 min per problem (42 min for 70B RAG),
about half in the pipeline's compiles; ``--quick`` 19 s with a warm compile cache, 2 min cold.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from types import SimpleNamespace

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from optimize import (
    KNOBS,
    constraint_slacks,
    constraints_hold,
    cost_per_hour,
    meets_confidence,
    recommend,
    serving_slo_metrics,
    simulate_check,
    verdict_engine,
)
from perfmodel import System, max_concurrent_requests
from servingmath.cli import enable_compile_cache
from servingmath.commands import optimize as optimize_cli

GPU, TP, PP, KV, WEIGHT, MNBT, SEQS, CHUNK, MOE = (
    KNOBS.index(k)
    for k in (
        "gpu",
        "tp",
        "pp",
        "kv_dtype",
        "weight_dtype",
        "max_num_batched_tokens",
        "max_num_seqs",
        "chunk_size",
        "moe_layout",
    )
)
"""Columns of a configuration array (``optimize.KNOBS``) that the referee reads."""

WITHIN = 0.05
"""The recommendation may cost at most this much more than the referee's cheapest."""

BOUND = 1.25
"""The referee scores points costing up to this multiple of the recommendation (a point it
accepts there lowers the bound to its own cost)."""

BLOCK = 5
"""Draws per row of the compiled referee function (a point's draws are scored block by block)."""


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Static shapes of the referee's compiled calls: ``rows`` (point, draw block) rows per call
    of ``_failures`` (the last call is padded) and ``group`` points whose engines are built at
    once, cheapest first.  Larger shapes mean fewer calls on a big grid; the smoke's dozen
    points need small ones (the padding is scored like real rows)."""

    rows: int
    group: int


FULL = Shapes(rows=256, group=2048)
SMOKE = Shapes(rows=16, group=64)

PROBLEMS = (
    # (label, servingmath optimize arguments); every one colocated (--pool-ratios none)
    (
        "405B long prompt, 3 GPUs",
        (
            "--model meta-llama/Llama-3.1-405B --gpus h100-sxm,h200-sxm,b200 --rate 2 "
            "--input-len 4096 --output-len 512 --ttft-p95 5 --tpot-p95 0.1 --weight-dtypes bf16"
        ),
    ),
    (
        "8B chat, strict, 2 GPUs",
        (
            "--model meta-llama/Llama-3.1-8B --gpus h100-sxm,l40s --rate 10 --input-len 1024 "
            "--output-len 256 --ttft-p95 0.5 --tpot-p95 0.03 --confidence 0.95"
        ),
    ),
    (
        "8B RAG 12k/256, loose, 4 GPUs",
        (
            "--model meta-llama/Llama-3.1-8B --gpus a100-sxm-80gb,h100-sxm,l40s,l4 --rate 2 "
            "--input-len 12000 --output-len 256 --ttft-p95 5 --tpot-p95 0.1 --kv-dtypes fp8 "
            "--weight-dtypes bf16"
        ),
    ),
    (
        "8B chat, loose, 1 GPU",
        (
            "--model meta-llama/Llama-3.1-8B --gpus a100-sxm-80gb --rate 20 --input-len 512 "
            "--output-len 256 --ttft-p95 2 --tpot-p95 0.1 --confidence 0.8"
        ),
    ),
    (
        "70B chat, 2 GPUs",
        (
            "--model meta-llama/Llama-3.1-70B --gpus h100-sxm,h200-sxm --rate 4 --input-len 1024 "
            "--output-len 256 --ttft-p95 2 --tpot-p95 0.05"
        ),
    ),
    (
        "70B RAG 16k/256, strict, 3 GPUs",
        (
            "--model meta-llama/Llama-3.1-70B --gpus h100-sxm,h200-sxm,b200 --rate 1 "
            "--input-len 16000 --output-len 256 --ttft-p95 3 --tpot-p95 0.05 --weight-dtypes fp8 "
            "--confidence 0.95"
        ),
    ),
    (
        "Mixtral-8x7B chat, 2 GPUs",
        (
            "--model mistralai/Mixtral-8x7B-v0.1 --gpus h100-sxm,a100-sxm-80gb --rate 8 "
            "--input-len 1024 --output-len 512 --ttft-p95 1.5 --tpot-p95 0.04"
        ),
    ),
    (
        "Qwen3-30B-A3B, loose, 1 GPU",
        (
            "--model Qwen/Qwen3-30B-A3B --gpus l40s --rate 6 --input-len 2048 --output-len 512 "
            "--ttft-p95 5 --tpot-p95 0.1"
        ),
    ),
    (
        "Qwen3-235B-A22B RAG 8k/256, 2 GPUs",
        (
            "--model Qwen/Qwen3-235B-A22B --gpus h200-sxm,b200 --rate 1 --input-len 8192 "
            "--output-len 256 --ttft-p95 4 --tpot-p95 0.06 --weight-dtypes fp8"
        ),
    ),
)

QUICK = (
    (
        "8B chat, coarse grid, 1 GPU",
        (
            "--model meta-llama/Llama-3.1-8B --gpus l40s --rate 4 --input-len 1024 --output-len 256 "
            "--ttft-p95 1 --tpot-p95 0.05 --kv-dtypes fp8 --weight-dtypes bf16 --chunk-sizes 2048 "
            "--max-replicas 8"
        ),
    ),
)


@dataclasses.dataclass(frozen=True)
class Referee:
    """The referee's cheapest accepted point (``config`` None: none within the bound)."""

    config: np.ndarray | None
    replicas: int
    cost_per_hour: float
    points: int
    draw_evaluations: int
    rec_probability: float


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One problem: the recommendation, the referee's optimum, the simulator, wall times."""

    label: str
    recommendation: str
    rec_cost: float
    rec_probability: float
    referee: Referee
    referee_label: str
    sim: dict
    slo: tuple[float, float]
    seconds: dict[str, float]

    @property
    def ratio(self) -> float:
        return self.rec_cost / self.referee.cost_per_hour

    @property
    def within(self) -> bool:
        return self.ratio <= 1.0 + WITHIN + 1e-9


# ------------------------------------------------------------------ the CLI's pipeline


def build_problem(argv: str, draws: int):
    """(problem, gpus, model name) exactly as ``servingmath optimize`` builds them."""
    parser = argparse.ArgumentParser()
    optimize_cli.add_arguments(parser)
    args = parser.parse_args(
        argv.split() + ["--pool-ratios", "none", "--draws", str(draws), "--seed", "0"]
    )
    model, gpus, hardware, efficiency = optimize_cli.resolve_common(args)
    workload = optimize_cli.resolve_workload(args)
    problem = optimize_cli.problem_from_args(args, model, gpus, workload, efficiency, hardware)
    assert not problem.grid.disaggregated and not problem.grid.speculative
    return problem, gpus, model.name


def config_row(problem, gpus, described: dict) -> np.ndarray:
    """The grid index row of a recommendation's described configuration."""
    g = problem.grid
    chunks = [c or b for c in g.chunk_sizes for b in (described["max_num_batched_tokens"],)]
    want = {
        GPU: gpus.index(described["gpu"]),
        TP: g.tp.index(described["tp"]),
        PP: g.pp.index(described["pp"]),
        KV: g.kv_dtypes.index(described["kv_dtype"]),
        WEIGHT: g.weight_dtypes.index(described["weight_dtype"]),
        MNBT: g.max_num_batched_tokens.index(described["max_num_batched_tokens"]),
        SEQS: g.max_num_seqs.index(described["max_num_seqs"]),
        CHUNK: chunks.index(described["chunk_size"]),
        MOE: g.moe_layouts.index(described.get("moe_layout", "tp")),
    }
    rows = g.all_configs(problem.model)
    hit = np.all([rows[:, k] == v for k, v in want.items()], axis=0)
    return rows[np.flatnonzero(hit)[0]]


def label_of(problem, gpus, config: np.ndarray, replicas: int) -> str:
    g = problem.grid
    c = [int(v) for v in config]
    chunk = g.chunk_sizes[c[CHUNK]] or g.max_num_batched_tokens[c[MNBT]]
    return (
        f"{replicas} x {gpus[c[GPU]]} TP{g.tp[c[TP]]} PP{g.pp[c[PP]]} "
        f"w {g.weight_dtypes[c[WEIGHT]]} kv {g.kv_dtypes[c[KV]]} "
        f"B {g.max_num_batched_tokens[c[MNBT]]} c {chunk} S {g.max_num_seqs[c[SEQS]]}"
        + ("" if g.moe_layouts[c[MOE]] == "tp" else f" {g.moe_layouts[c[MOE]]}")
    )


# ------------------------------------------------------------------ the referee


@eqx.filter_jit
def _engines(problem, configs, replicas):
    """Per point: (hardware, deployment, efficiency draws, prefill chunk) of its engines, as the
    verdict builds them, and the sequences whose KV fits at once (the memory constraint)."""
    hw, dep, eff, chunk = jax.vmap(lambda c, r: verdict_engine(problem, c, r))(configs, replicas)
    wl = problem.workload
    seats = jax.vmap(
        lambda h, d: max_concurrent_requests(
            problem.model, h, d, wl.prompt_tokens_mean + wl.output_tokens_mean
        )
    )(hw, dep)
    return hw, dep, eff, chunk, seats


@eqx.filter_jit
def _failures(model, workload, slo, hw, dep, eff, chunk):
    """Draws of each row (leaves of ``eff``: (rows, BLOCK)) in which the full load model misses a
    constraint: ``serving_slo_metrics`` (the verdict's closed form) under one flat vmap over
    rows x draws, judged by the verdict's own ``constraints_hold(constraint_slacks(...))``."""
    wl = eqx.tree_at(lambda w: w.concurrency, workload, 0.0)  # open loop, as the verdict
    rows, block = eff.bandwidth_fraction.shape

    def rep(x):
        return jnp.repeat(x, block, axis=0)

    m = jax.vmap(
        lambda h, d, e, c: serving_slo_metrics(System(model, h, d, e), wl, chunk_tokens=c),
    )(
        jax.tree_util.tree_map(rep, hw),
        jax.tree_util.tree_map(rep, dep),
        jax.tree_util.tree_map(lambda x: x.reshape((rows * block,) + x.shape[2:]), eff),
        rep(chunk),
    )
    bounds = SimpleNamespace(slo_ttft_p95_s=slo[0], slo_tpot_p95_s=slo[1])
    ok = constraints_hold(constraint_slacks(bounds, m))
    return jnp.sum(~ok.reshape(rows, block), axis=1)


def allowed_failures(draws: int, confidence: float) -> int:
    """Most failing draws (of ``draws``) with which a point still meets the confidence."""
    f = np.arange(draws + 1)
    ok = np.asarray(meets_confidence((draws - f) / draws, confidence))
    return int(f[ok].max()) if ok.any() else -1


class _Scorer:
    """Counts failing draws of (point, draw block) rows through ``_failures`` in calls of
    ``rows`` rows."""

    def __init__(self, problem, rows: int):
        self.problem = problem
        self.rows = rows
        self.slo = jnp.asarray([problem.slo_ttft_p95_s, problem.slo_tpot_p95_s])
        self.evaluations = 0

    def __call__(self, engines, points: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        hw, dep, eff, chunk = engines
        out = np.zeros(len(points), dtype=int)
        rows = self.rows
        for i in range(0, len(points), rows):
            p = points[i : i + rows]
            b = blocks[i : i + rows]
            n = len(p)
            p = np.concatenate([p, np.repeat(p[:1], rows - n)])
            b = np.concatenate([b, np.repeat(b[:1], rows - n)])
            cols = b[:, None] * BLOCK + np.arange(BLOCK)[None, :]
            fails = _failures(
                self.problem.model,
                self.problem.workload,
                self.slo,
                jax.tree_util.tree_map(lambda x, p=p: x[p], hw),
                jax.tree_util.tree_map(lambda x, p=p: x[p], dep),
                jax.tree_util.tree_map(lambda x, p=p, cols=cols: x[p[:, None], cols], eff),
                chunk[p],
            )
            out[i : i + n] = np.asarray(fails)[:n]
            self.evaluations += rows * BLOCK
        return out


def referee(
    problem, rec_row: np.ndarray, rec_replicas: int, rec_cost: float, shapes: Shapes = FULL
) -> Referee:
    """Cheapest (configuration, replicas) of the grid the full load model accepts, among points
    costing at most ``BOUND`` x the recommendation's."""
    draws = problem.num_draws
    assert draws % BLOCK == 0, f"--draws must be a multiple of {BLOCK}"
    blocks = draws // BLOCK
    allowed = allowed_failures(draws, float(problem.confidence))
    first = min(blocks, allowed // BLOCK + 1)  # blocks before a rejection is possible
    configs = problem.grid.all_configs(problem.model)
    price = np.asarray(jax.vmap(lambda c: cost_per_hour(problem, c, 1.0))(jnp.asarray(configs)))
    bound = BOUND * rec_cost
    top = np.minimum(np.floor(bound / price * (1 + 1e-12)), problem.grid.max_replicas).astype(int)
    idx = np.repeat(np.arange(len(configs)), np.maximum(top, 0))
    reps = np.concatenate([np.arange(1, t + 1) for t in top if t > 0] or [np.zeros(0, int)])
    cost = price[idx] * reps
    order = np.argsort(cost, kind="stable")
    idx, reps, cost = idx[order], reps[order], cost[order]
    score = _Scorer(problem, shapes.rows)
    group = shapes.group

    def engines(rows: np.ndarray, r: np.ndarray):
        """Engines of the points (config rows ``rows``, replicas ``r``), padded to ``group``."""
        n = len(rows)
        pad = group - n
        c = jnp.asarray(np.concatenate([rows, np.repeat(rows[:1], pad, 0)]))
        rr = jnp.asarray(np.concatenate([r, np.repeat(r[:1], pad)]).astype(float))
        hw, dep, eff, chunk, seats = _engines(problem, c, rr)
        return (hw, dep, eff, chunk), np.asarray(seats)[:n]

    best, best_at = np.inf, None
    for start in range(0, len(idx), group):
        if cost[start] > best:
            break
        sl = slice(start, start + group)
        eng, seats = engines(configs[idx[sl]], reps[sl])
        alive = np.flatnonzero((seats >= 1) & (cost[sl] <= best))
        fails = np.zeros(len(seats), dtype=int)
        # the first blocks of every live point at once: none can be rejected before them
        pts = np.repeat(alive, first)
        got = score(eng, pts, np.tile(np.arange(first), len(alive)))
        np.add.at(fails, pts, got)
        alive = alive[fails[alive] <= allowed]
        # the remaining blocks, cheapest points first; stop at the first accepted batch
        rest = blocks - first
        per = max(1, shapes.rows // max(rest, 1))
        for j in range(0, len(alive), per):
            pts = alive[j : j + per]
            if cost[sl][pts[0]] > best:
                break
            if rest:
                rows = np.repeat(pts, rest)
                got = score(eng, rows, np.tile(np.arange(first, blocks), len(pts)))
                np.add.at(fails, rows, got)
            ok = pts[fails[pts] <= allowed]
            if len(ok):
                k = ok[np.argmin(cost[sl][ok])]
                if cost[sl][k] < best:
                    best, best_at = float(cost[sl][k]), (idx[sl][k], int(reps[sl][k]))
        _say(
            f"  referee: {min(start + group, len(idx)):,} of {len(idx):,} points by cost, "
            f"{score.evaluations:,} draw evaluations, cheapest accepted ${best:.2f}/h"
        )
    # the recommendation itself, every draw (its P under the referee)
    eng, seats = engines(rec_row[None, :], np.asarray([rec_replicas]))
    got = score(eng, np.zeros(blocks, dtype=int), np.arange(blocks))
    rec_p = 0.0 if seats[0] < 1 else 1.0 - got.sum() / draws
    if best_at is None:
        return Referee(None, 0, np.inf, len(idx), score.evaluations, rec_p)
    return Referee(configs[best_at[0]], best_at[1], best, len(idx), score.evaluations, rec_p)


# ------------------------------------------------------------------ one problem


def run_one(label: str, argv: str, draws: int, requests: int, shapes: Shapes = FULL) -> Outcome:
    t0 = time.perf_counter()
    _say(f"{label}: the optimize pipeline")
    problem, gpus, name = build_problem(argv, draws)
    rec = recommend(problem, gpus, name)
    t1 = time.perf_counter()
    out = rec.to_json()
    slo = (float(problem.slo_ttft_p95_s), float(problem.slo_tpot_p95_s))
    assert out["feasible"], f"{label}: no recommendation"
    row = config_row(problem, gpus, out)
    _say(f"{label}: the referee ({t1 - t0:.0f} s)")
    ref = referee(problem, row, int(out["replicas"]), float(out["cost_per_hour"]), shapes)
    t2 = time.perf_counter()
    _say(f"{label}: the simulator ({t2 - t1:.0f} s)")
    sim = simulate_check(problem, row, int(out["replicas"]), requests)
    t3 = time.perf_counter()
    _say(f"{label}: done ({t3 - t2:.0f} s simulating, {t3 - t0:.0f} s in all)")
    return Outcome(
        label=label,
        recommendation=label_of(problem, gpus, row, int(out["replicas"])),
        rec_cost=float(out["cost_per_hour"]),
        rec_probability=float(out["slo_probability"]),
        referee=ref,
        referee_label=(
            label_of(problem, gpus, ref.config, ref.replicas) if ref.config is not None else "-"
        ),
        sim=sim,
        slo=slo,
        seconds={"pipeline": t1 - t0, "referee": t2 - t1, "simulator": t3 - t2},
    )


def _say(text: str) -> None:
    """Progress on stderr (the table goes to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.2f} s"


HEADER = (
    "| problem | recommendation | $/h | P (verdict / referee) | referee's cheapest | $/h "
    "| rec / referee | within 5 % | sim p95 TTFT / SLO | sim p95 TPOT / SLO | SLO met |\n"
    "| --- | --- | ---: | --- | --- | ---: | ---: | --- | --- | --- | --- |"
)


def row(o: Outcome) -> str:
    r = o.referee
    return (
        f"| {o.label} | {o.recommendation} | {o.rec_cost:.2f} "
        f"| {o.rec_probability:.3f} / {r.rec_probability:.3f} | {o.referee_label} "
        f"| {r.cost_per_hour:.2f} | {o.ratio:.3f} | {'yes' if o.within else '**no**'} "
        f"| {_s(o.sim['ttft_s']['p95'])} / {_s(o.slo[0])} "
        f"| {_s(o.sim['tpot_s']['p95'])} / {_s(o.slo[1])} "
        f"| {'yes' if o.sim['meets_slo'] else '**no**'} |"
    )


def print_summary(outcomes: list[Outcome], draws: int, requests: int) -> None:
    k = sum(o.within for o in outcomes)
    met = sum(bool(o.sim["meets_slo"]) for o in outcomes)
    n = len(outcomes)
    print(f"\nwithin 5 % of the referee: {k} of {n}; simulator meets the SLO: {met} of {n}")
    print(
        "\n| problem | points in bound | draw evaluations | pipeline s | referee s | simulator s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for o in outcomes:
        t = o.seconds
        print(
            f"| {o.label} | {o.referee.points:,} | {o.referee.draw_evaluations:,} "
            f"| {t['pipeline']:.0f} | {t['referee']:.0f} | {t['simulator']:.0f} |"
        )
    tot = {p: sum(o.seconds[p] for o in outcomes) for p in ("pipeline", "referee", "simulator")}
    print(
        f"| **total** | | | {tot['pipeline']:.0f} | {tot['referee']:.0f} | {tot['simulator']:.0f} |"
    )
    print(f"({draws} draws, {requests:,} simulated requests per problem)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--draws", type=int, default=200, help=f"posterior draws (multiple of {BLOCK})")
    ap.add_argument("--requests", type=int, default=2000, help="simulated requests per problem")
    ap.add_argument("--only", type=int, nargs="*", help="run these problems (0-based) only")
    ap.add_argument("--quick", action="store_true", help="one small problem, coarse grid (smoke)")
    args = ap.parse_args()
    enable_compile_cache()
    problems = QUICK if args.quick else PROBLEMS
    if args.only:
        problems = tuple(problems[i] for i in args.only)
    draws = 10 if args.quick else args.draws
    requests = 200 if args.quick else args.requests
    outcomes = []
    print(HEADER, flush=True)
    for label, argv in problems:  # each row as its problem finishes
        outcomes.append(run_one(label, argv, draws, requests, SMOKE if args.quick else FULL))
        print(row(outcomes[-1]), flush=True)
    print_summary(outcomes, draws, requests)


if __name__ == "__main__":
    main()
