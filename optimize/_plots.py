"""Figures for ``--plot DIR``: the cost / SLO-probability trade-off, the posterior of p95 latency
of the recommendation, and the procurement fan chart.  matplotlib with the Agg backend (no
display needed); each ``*_figure`` function returns the open Figure (an HTML report renders it to
memory), and its writer (``plot_tradeoff``, ``fan_chart``, ...) saves it as one PNG and returns
the path.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from perfmodel import Array

from ._evaluate import constraint_slacks, constraints_hold, cost_per_hour, draw_metrics
from ._grid import KNOBS, one_hot_weights
from ._problem import Problem
from ._program_cache import cached_jit
from ._verify import ONE_OFF

NAMES = {
    "tradeoff": "cost_vs_slo_probability.png",
    "latency": "latency_posterior.png",
    "fan": "forecast_fan.png",
    "fleet": "fleet_mix.png",
}
"""File names written into the ``--plot`` directory."""

DPI = 120
"""Resolution of every written PNG (dots per inch)."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def config_index(problem: Problem, gpus: tuple[str, ...], d: dict) -> np.ndarray:
    """Index vector (``KNOBS`` order) of a described configuration (``describe_config``)."""
    g = problem.grid
    choices = {
        "gpu": list(gpus),
        "tp": list(g.tp),
        "pp": list(g.pp),
        "kv_dtype": list(g.kv_dtypes),
        "weight_dtype": list(g.weight_dtypes),
        "max_num_batched_tokens": list(g.max_num_batched_tokens),
        "max_num_seqs": list(g.max_num_seqs),
        "moe_layout": list(g.moe_layouts),
    }
    d = {"moe_layout": "tp", **d}
    chunk = d.get("chunk_size") or d["max_num_batched_tokens"]
    sizes = list(g.chunk_sizes)
    idx = {k: choices[k].index(d[k]) for k in choices}
    idx["chunk_size"] = sizes.index(chunk) if chunk in sizes else sizes.index(0)
    idx["spec_k"] = list(g.spec_k).index((d.get("speculative") or {}).get("k", 0))
    pools = d.get("disaggregation")
    idx["pool_split"], idx["prefill_gpu"] = 0, 0
    idx["prefill_tp"], idx["prefill_pp"] = idx["tp"], idx["pp"]
    if pools:
        p, q = pools["prefill"]["replicas"], pools["decode"]["replicas"]
        ratios = [r for r in g.pool_ratios if p * r[1] == q * r[0]]
        idx["pool_split"] = 1 + list(g.pool_ratios).index(ratios[0])
        idx["prefill_gpu"] = list(gpus).index(pools["prefill"]["gpu"])
        idx["prefill_tp"] = list(g.tp).index(pools["prefill"]["tp"])
        idx["prefill_pp"] = list(g.pp).index(pools["prefill"]["pp"])
    return np.asarray([idx[k] for k in KNOBS], dtype=np.int32)


@cached_jit(compiler_options=ONE_OFF)
def _draw_table(problem: Problem, configs: Array, replicas: Array):
    """(SLO probability, p95 TTFT, p95 TPOT and p95 ITL draws) of each (config, replicas) row:
    the plots' numbers in one program compiled once per shape (``slo_probability`` and
    ``draw_metrics`` of each row)."""

    def one(c, r):
        m = draw_metrics(problem, one_hot_weights(c, problem.grid), r)
        return (
            jnp.mean(constraints_hold(constraint_slacks(problem, m)).astype(float)),
            m.ttft_p95_s,
            m.tpot_p95_s,
            m.itl_p95_s,
        )

    return jax.vmap(one)(configs, replicas)


def draw_table(problem: Problem, configs, replicas) -> tuple[np.ndarray, ...]:
    """``_draw_table`` as numpy, rows padded to at least ``max_replicas`` (so the trade-off line
    and a latency histogram share one compiled shape) and the padding dropped."""
    configs = np.atleast_2d(np.asarray(configs, dtype=np.int32))
    replicas = np.asarray(replicas, dtype=float).reshape(-1)
    n, pad = len(configs), max(0, problem.grid.max_replicas - len(configs))
    configs = np.concatenate([configs, np.repeat(configs[:1], pad, axis=0)])
    replicas = np.concatenate([replicas, np.repeat(replicas[:1], pad)])
    out = _draw_table(problem, jnp.asarray(configs), jnp.asarray(replicas))
    return tuple(np.asarray(x)[:n] for x in out)


def _tradeoff_rows(problem: Problem, config: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r_max = problem.grid.max_replicas
    return np.repeat(np.asarray(config)[None], r_max, axis=0), np.arange(1.0, r_max + 1.0)


def replica_tradeoff(problem: Problem, config: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """($/hour, SLO probability) of ``config`` at every replica count 1..max_replicas."""
    configs, reps = _tradeoff_rows(problem, config)
    prob = draw_table(problem, configs, reps)[0]
    return _costs(problem, config, reps), prob


def _costs(problem: Problem, config: np.ndarray, reps: np.ndarray) -> np.ndarray:
    c = jnp.asarray(config)
    return np.asarray([float(cost_per_hour(problem, c, 1.0))]) * reps


def latency_draws(
    problem: Problem, config: np.ndarray, replicas: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p95 TTFT, p95 TPOT and p95 ITL (seconds) of ``config`` in every posterior draw (search
    model)."""
    _, ttft, tpot, itl = draw_table(problem, config, [float(replicas)])
    return ttft[0], tpot[0], itl[0]


def plot_numbers(problem: Problem, gpus: tuple[str, ...], out: dict) -> dict:
    """Every number both ``optimize`` figures show, from one ``draw_table`` call: the trade-off
    line (cost, probability at 1..max_replicas), each listed configuration's probability at its
    replicas (recommendation first), and the recommendation's p95 TTFT / TPOT / ITL draws."""
    best = config_index(problem, gpus, out)
    line_c, line_r = _tradeoff_rows(problem, best)
    rows = [("recommended", out)] + [(f"alt {i + 1}", a) for i, a in enumerate(out["alternatives"])]
    listed_c = np.stack([config_index(problem, gpus, d) for _, d in rows])
    listed_r = np.asarray([float(d["replicas"]) for _, d in rows])
    prob, ttft, tpot, itl = draw_table(
        problem, np.concatenate([line_c, listed_c]), np.concatenate([line_r, listed_r])
    )
    n = len(line_r)
    return {
        "line": (_costs(problem, best, line_r), prob[:n]),
        "listed": [(label, d, p) for (label, d), p in zip(rows, prob[n:])],
        "latency": (ttft[n], tpot[n], itl[n]),
    }


def save_figure(fig, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (its folder created) and close it; returns the path."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)
    return Path(path)


def plot_tradeoff(
    problem: Problem, gpus: tuple[str, ...], out: dict, path: str | Path, numbers=None
) -> Path:
    """``tradeoff_figure`` written to ``path``."""
    return save_figure(tradeoff_figure(problem, gpus, out, numbers), path)


def tradeoff_figure(problem: Problem, gpus: tuple[str, ...], out: dict, numbers=None):
    """Cost against SLO probability: the recommendation and its runner-ups (points) and the
    recommended configuration at every replica count (line); the confidence as a dashed line.
    ``numbers``: ``plot_numbers``' (computed when None).  Returns the open matplotlib Figure."""
    numbers = plot_numbers(problem, gpus, out) if numbers is None else numbers
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    cost, prob = numbers["line"]
    keep = cost <= 2.0 * max(
        [out["cost_per_hour"]] + [a["cost_per_hour"] for a in out["alternatives"]]
    )
    keep[: out["replicas"] + 1] = True  # the line reaches one replica past the recommendation
    cost, prob = cost[keep], prob[keep]
    ax.plot(
        cost,
        prob,
        "-",
        color="0.6",
        lw=1,
        label=f"{out['gpu']} TP{out['tp']} PP{out['pp']} at 1..{len(cost)} replicas",
    )
    for i, (label, d, p) in enumerate(numbers["listed"]):
        ax.scatter(
            [d["cost_per_hour"]],
            [float(p)],
            s=80 if i == 0 else 40,
            zorder=3,
            marker="*" if i == 0 else "o",
            label=f"{label}: {d['replicas']} x {d['gpu']} TP{d['tp']} PP{d['pp']} "
            f"{d['weight_dtype']}/{d['kv_dtype']}",
        )
    ax.axhline(float(problem.confidence), ls="--", color="k", lw=1, label="required confidence")
    ax.set_xscale("log")
    ax.set_xlabel("$ per hour")
    ax.set_ylabel("P(SLO met) over the posterior (search model)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Cost against SLO probability")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_latency(
    problem: Problem, gpus: tuple[str, ...], out: dict, path: str | Path, numbers=None
) -> Path:
    """``latency_figure`` written to ``path``."""
    return save_figure(latency_figure(problem, gpus, out, numbers), path)


def latency_figure(problem: Problem, gpus: tuple[str, ...], out: dict, numbers=None):
    """Histograms over the posterior draws of p95 TTFT and p95 TPOT of the recommendation, and
    of p95 ITL when the question bounds it, with the SLO bounds (where given) as vertical lines.
    ``numbers``: ``plot_numbers``' (or None).  Returns the open matplotlib Figure."""
    plt = _pyplot()
    if numbers is None:
        draws = latency_draws(problem, config_index(problem, gpus, out), out["replicas"])
    else:
        draws = numbers["latency"]
    panels = [
        (draws[0], float(problem.slo_ttft_p95_s), "p95 TTFT"),
        (draws[1], float(problem.slo_tpot_p95_s), "p95 TPOT"),
    ]
    itl_bound = float(problem.slo_itl_p95_s)
    if math.isfinite(itl_bound):  # ITL is a constraint of this question only when bounded
        panels.append((draws[2], itl_bound, "p95 ITL"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6))
    for ax, (values, bound, name) in zip(axes, panels):
        finite = values[np.isfinite(values) & (values > 0)] * 1e3
        if len(finite):  # log-spaced bins: a draw near saturation can sit decades out
            lo, hi = finite.min(), max(finite.max(), finite.min() * 1.01)
            bins = np.geomspace(lo, hi, min(30, max(5, len(finite) // 5)) + 1)
            ax.hist(finite, bins=bins, color="tab:blue", alpha=0.8)
            ax.set_xscale("log")
        if math.isfinite(bound):
            ax.axvline(bound * 1e3, color="tab:red", ls="--", label=f"SLO {bound * 1e3:g} ms")
            ax.legend(fontsize=8)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("posterior draws")
    fig.suptitle(
        f"{out['replicas']} x {out['gpu']} TP{out['tp']} PP{out['pp']}: latency over the posterior"
    )
    fig.tight_layout()
    return fig


def write_optimize_plots(
    problem: Problem, gpus: tuple[str, ...], out: dict, directory: str | Path
) -> list[Path]:
    """Both ``optimize`` figures into ``directory`` (created); none when ``out`` is infeasible."""
    if not out.get("feasible", True):
        return []
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    numbers = plot_numbers(problem, gpus, out)
    return [
        plot_tradeoff(problem, gpus, out, directory / NAMES["tradeoff"], numbers),
        plot_latency(problem, gpus, out, directory / NAMES["latency"], numbers),
    ]


def fan_chart(result: dict, path: str | Path) -> Path:
    """``fan_figure`` written to ``path``."""
    return save_figure(fan_figure(result), path)


def fan_figure(result: dict):
    """GPUs per period and type from a forecast result: median line, 80 % and 95 % bands.
    Returns the open matplotlib Figure."""
    plt = _pyplot()
    periods = [p["period"] for p in result["periods"]]
    x = range(len(periods))
    fig, ax = plt.subplots(figsize=(7, 4))
    for g in result["periods"][0]["gpus"]:
        s = [p["gpus"][g] for p in result["periods"]]

        def col(f, s=s):
            return [float("nan") if v is None else v for v in map(f, s)]

        (line,) = ax.plot(x, col(lambda v: v["p50"]), marker="o", label=g)
        for key, alpha in (("p95", 0.15), ("p80", 0.3)):
            ax.fill_between(
                x,
                col(lambda v, key=key: v[key][0]),
                col(lambda v, key=key: v[key][1]),
                color=line.get_color(),
                alpha=alpha,
                linewidth=0,
            )
    ax.set_xticks(list(x), periods, rotation=45, ha="right")
    ax.set_ylabel("GPUs needed")
    ax.set_title("GPUs per period: median, 80% and 95% intervals")
    ax.legend()
    fig.tight_layout()
    return fig


def fleet_chart(result: dict, path: str | Path) -> Path:
    """``fleet_figure`` written to ``path``."""
    return save_figure(fleet_figure(result), path)


def fleet_figure(result: dict):
    """Replicas per GPU type stacked by request class, from a ``servingmath fleet --json`` result;
    each bar is labelled with its GPU count, the title gives the cost and the gap to the milp.
    Returns the open matplotlib Figure."""
    plt = _pyplot()
    gpus = list(result["plan"])
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = np.zeros(len(gpus))
    for c, cls in enumerate(result["classes"]):
        counts = np.asarray(
            [result["plan"][g]["replicas_by_class"].get(str(c), 0) for g in gpus], dtype=float
        )
        ax.bar(
            gpus,
            counts,
            bottom=bottom,
            label=f"class {c}: prompt {cls['prompt_tokens']:.0f}, output {cls['output_tokens']:.0f}, "
            f"{cls['requests_per_s']:.2f} req/s",
        )
        bottom += counts
    for x, (g, top) in enumerate(zip(gpus, bottom)):
        ax.annotate(
            f"{result['plan'][g]['gpus']} GPUs", (x, top), ha="center", va="bottom", fontsize=8
        )
    ax.set_ylabel("replicas")
    cost, exact = result.get("cost_per_hour"), result.get("milp_cost_per_hour")
    title = "infeasible" if cost is None else f"fleet ${cost:.2f}/hour"
    if cost is not None and exact is not None:
        title += f" (milp optimum ${exact:.2f}/hour)"
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
