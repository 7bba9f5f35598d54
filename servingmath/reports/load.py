"""Latency under load in words and JSON: the closed form's lines (``render_dynamics``), the p95
intervals and the engines' fitted offsets, and the simulator's measurements as JSON keys.
"""

from __future__ import annotations

import math

from perfmodel.dynamics import LOAD_ELASTICITY_STEP

from .render import human_seconds, latency_json, table

KNIFE_EDGE = 10.0
"""Elasticity above which the p95 tail is flagged as swinging with small load errors."""


def simulation_report(result, summary: dict) -> dict:
    """The simulator's measurements (``perfmodel.simulator.summarize``) as JSON-ready keys.

    ``busy_fraction`` is the share of wall time the engines run iterations (the simulator does
    not know the capacity that ``utilization`` divides by); ``stable`` is ``queue_stable``: the
    backlog grew by under 5 % of arrivals over the run's second half (null: too short to tell).
    """
    return {
        "ttft_s": latency_json(summary["ttft_s"]),
        "tpot_s": latency_json(summary["tpot_s"]),
        "itl_s": latency_json(summary["itl_s"]),
        "e2e_s": latency_json(summary["e2e_s"]),
        "busy_fraction": summary["busy_fraction"],
        "stable": summary["stable"],
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "decode_batch": summary["decode_batch"],
        "requests": summary["requests"],
        "preemptions": summary["preemptions"],
    }


def render_dynamics(report: dict) -> str:
    """Human lines for the keys of ``dynamics_report`` (empty string when absent)."""
    if "ttft_s" not in report:
        return ""

    def pct(p):
        return "  ".join(
            f"{k} {human_seconds(v) if v is not None else 'inf'}" for k, v in p.items()
        )

    rows = [
        ("TTFT", pct(report["ttft_s"])),
        ("TPOT", pct(report["tpot_s"])),
        ("ITL (over gaps)", pct(report["itl_s"])),
        ("E2E", pct(report["e2e_s"])),
        (
            "utilization",
            f"{report['utilization']:.2f}" + ("" if report["stable"] else "  OVERLOADED"),
        ),
        ("seat occupancy", f"{report['seat_occupancy']:.2f}"),
        ("queue-bound", "yes" if report["queue_bound"] else "no"),
        ("KV-bound", "yes" if report["kv_bound"] else "no"),
        ("output tokens/s", f"{report['output_tokens_per_s']:,.0f}"),
        ("mean decode batch", f"{report['decode_batch']:.1f}"),
    ]
    e = report.get("ttft_p95_load_elasticity")
    if e is not None:
        note = (
            f"  near slot saturation: a {LOAD_ELASTICITY_STEP:.0%} load error moves p95 TTFT by "
            f"{math.expm1(e * math.log1p(LOAD_ELASTICITY_STEP)):.0%}; plan with headroom"
            if e > KNIFE_EDGE
            else ""
        )
        rows.append(("p95 TTFT elasticity", f"{e:.1f} (d ln p95 / d ln rate){note}"))
    intervals = report.get("p95_intervals")
    if intervals:
        rows.append(("p95, 90% posterior", p95_interval_line(intervals)))
    rows.append(("engine offsets", engine_scales_line(report["engine_scales"])))
    return "\nunder load (closed form):\n" + table(rows)


def p95_interval_line(intervals: dict) -> str:
    """'TTFT 80 ms .. 1.2 s, TPOT ...': each p95's 90 % posterior interval."""

    def show(v):
        return human_seconds(v) if v is not None else "overloaded"

    names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "itl_s": "ITL", "e2e_s": "E2E"}
    return ", ".join(
        f"{label} {show(intervals[k]['p05'])} .. {show(intervals[k]['p95'])}"
        for k, label in names.items()
    )


def engine_scales_line(scales: dict) -> str:
    """What the fitted end-to-end offsets did to the closed form's TTFT and TPOT."""
    if scales["ttft"] == 1.0 and scales["tpot"] == 1.0:
        return "none: the physics alone (--prior, or a posterior without end-to-end runs)"
    whose = scales["engine"] or "pooled over vLLM, SGLang and TensorRT-LLM (--engine to pick)"
    return (
        f"TTFT x{scales['ttft']:.2f}, TPOT and ITL x{scales['tpot']:.2f}, as measured "
        f"serving runs differ from the physics ({whose}; posterior median)"
    )
