"""The ``--report`` pages of ``optimize``, ``fleet``, ``forecast`` and ``pareto``, built from the very dict
the command prints with ``--json`` (its ``question`` and ``assumptions`` included): nothing is
recomputed here, every number on the page is a value of that dict (floats to
``html.SIGNIFICANT_DIGITS`` significant digits), and the dict itself closes the page.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .html import Content, Pre, Table, number, render_html
from .render import layout_text

Figures = Sequence[tuple[str, object]]
"""``(caption, matplotlib Figure)`` pairs."""


def _coverage_text(near: dict) -> str:
    """How many configurations the closest-achievable bounds come from: the whole grid (exact
    minima) or a coordinate search (bounds the rest of the grid could lower)."""
    if "configurations_scored" not in near:
        return "-"
    scored = f"{near['configurations_scored']:,} of {near['configurations_in_grid']:,}"
    if near["exhaustive"]:
        return f"{scored} (the whole grid: exact minima)"
    return f"{scored} (a coordinate search: the rest of the grid could do better)"


def optimize_page(out: dict, figures: Figures = ()) -> str:
    """Report of ``servingmath optimize --json``'s object: the configuration, its latency
    percentiles and SLO probability, the binding constraint with its shadow prices and cost
    elasticities, the runner-ups, the engine commands, the assumptions and the figures."""
    q = out["question"]
    if not out["feasible"]:
        near = out.get("closest_achievable") or {}
        answer: list[tuple[str, Content]] = [
            (
                "The answer: infeasible",
                (
                    f"No candidate configuration meets the SLO with confidence {number(q['confidence'])} "
                    f"(binding: {number(out['binding_constraint'])})."
                ),
            ),
            (
                "Closest achievable",
                [
                    ("p95 TTFT alone (s)", number(near.get("ttft_p95_s"))),
                    ("p95 TPOT alone (s)", number(near.get("tpot_p95_s"))),
                    *(
                        [("p95 ITL alone (s)", number(near.get("itl_p95_s")))]
                        if q.get("slo_itl_p95_s")
                        else []
                    ),
                    ("both bounds scaled by", number(near.get("scale"))),
                    ("configurations scored", _coverage_text(near)),
                ],
            ),
        ]
        return render_html(_title(q), question_rows(q), answer + _tail(out), figures)
    sections: list[tuple[str, Content]] = [
        ("The answer: recommended configuration", _configuration_rows(out)),
        (
            "Intervals: latency percentiles (posterior median) and SLO probability",
            Table(
                ("metric", "p50 (s)", "p95 (s)", "p99 (s)"),
                [
                    (name, *(number((out[key] or {}).get(p)) for p in ("p50", "p95", "p99")))
                    for name, key in (
                        ("TTFT", "ttft_s"),
                        ("TPOT", "tpot_s"),
                        *([("ITL", "itl_s")] if q.get("slo_itl_p95_s") else []),
                    )
                ],
            ),
        ),
        (
            "Why: binding constraint and shadow prices",
            [
                ("binding constraint", number(out["binding_constraint"])),
                ("binding budget", number(out["binding_budget"])),
                ("numbers from", number(out.get("metrics_model"))),
                *[
                    (f"shadow price of {k} ($/hour per second)", number(v))
                    for k, v in out["shadow_prices"].items()
                ],
                *[
                    (f"d log cost / d log {k}", number(v))
                    for k, v in out["cost_elasticities"].items()
                ],
            ],
        ),
        ("Runner-up configurations", _runner_ups(out["alternatives"])),
    ]
    if out.get("simulator"):
        sections.append(("Simulator check", Pre(json.dumps(out["simulator"], indent=2))))
    e = out["engine_args"] or {}
    commands = "\n\n".join(e[k] for k in ("vllm", "sglang", "trtllm") if e.get(k))
    sections.append(
        ("Engine commands", Pre(commands + (f"\n\nnotes: {e['notes']}" if e.get("notes") else "")))
    )
    return render_html(_title(q), question_rows(q), sections + _tail(out), figures)


def fleet_page(result: dict, figures: Figures = ()) -> str:
    """Report of ``servingmath fleet --json``'s object: GPUs and replicas per type and class,
    the cost against the exact MILP optimum, the classes, the assumptions and the chart."""
    q = result["question"]
    plan = Table(
        ("GPU type", "GPUs", "replicas by class"),
        [
            (
                g,
                number(v["gpus"]),
                ", ".join(f"class {c}: {n}" for c, n in v["replicas_by_class"].items()) or "none",
            )
            for g, v in result["plan"].items()
        ],
    )
    cost = [
        ("feasible", number(result["feasible"])),
        ("cost ($/hour)", number(result["cost_per_hour"])),
        ("exact MILP optimum ($/hour)", number(result["milp_cost_per_hour"])),
        ("gap to the MILP optimum (fraction)", number(result["gap"])),
    ]
    classes = Table(
        ("class", "prompt tokens", "output tokens", "requests/s", "capacity per replica (req/s)"),
        [
            (
                str(i),
                number(c["prompt_tokens"]),
                number(c["output_tokens"]),
                number(c["requests_per_s"]),
                "; ".join(f"{g} {number(k)}" for g, k in c["capacity_per_replica"].items()),
            )
            for i, c in enumerate(result["classes"])
        ],
    )
    sections: list[tuple[str, Content]] = [
        ("The answer: fleet plan", plan),
        ("Cost", cost),
        ("Request classes", classes),
    ]
    configured = [
        (str(i), g, text)
        for i, c in enumerate(result["classes"])
        for g, text in c.get("configuration", {}).items()
    ]
    if configured:
        sections.append(
            (
                "Each class's configuration per GPU type",
                Table(("class", "GPU", "configuration"), configured),
            )
        )
    return render_html(_title(q), question_rows(q), sections + _tail(result), figures)


def forecast_page(result: dict, figures: Figures = ()) -> str:
    """Report of ``servingmath forecast --json``'s object: GPUs per type and period (median and
    80 % / 95 % intervals), $/hour of the recommended type, the configurations, the assumptions
    and the fan chart."""
    q = result["question"]
    rows = []
    for p in result["periods"]:
        for g, s in p["gpus"].items():
            rows.append(
                (
                    p["period"],
                    number(p["requests_per_s"]),
                    g,
                    number(s["p50"]),
                    _interval(s["p80"]),
                    _interval(s["p95"]),
                    "yes" if g == p["recommended_gpu"] else "",
                    number(p["cost_per_hour"]["p50"]) if g == p["recommended_gpu"] else "",
                )
            )
    sections: list[tuple[str, Content]] = [
        (
            "The answer: GPUs per period",
            Table(
                (
                    "period",
                    "requests/s",
                    "GPU type",
                    "GPUs (median)",
                    "80 % interval",
                    "95 % interval",
                    "recommended",
                    "$/hour (median)",
                ),
                rows,
            ),
        ),
        (
            "Cost intervals of the recommended type ($/hour)",
            Table(
                ("period", "GPU type", "median", "95 % interval"),
                [
                    (
                        p["period"],
                        p["recommended_gpu"],
                        number(p["cost_per_hour"]["p50"]),
                        _interval(p["cost_per_hour"]["p95"]),
                    )
                    for p in result["periods"]
                ],
            ),
        ),
        (
            "Configuration per GPU type (sized at the peak demand)",
            list(result["configurations"].items()),
        ),
    ]
    return render_html(_title(q), question_rows(q), sections + _tail(result), figures)


def pareto_page(out: dict, figures: Figures = ()) -> str:
    """Report of ``servingmath pareto --json``'s object: the frontier over every GPU with its
    90 % intervals, each GPU's own frontier, the sweep's size, the assumptions and the figure."""
    q = out["question"]
    sections: list[tuple[str, Content]] = [
        ("The answer: throughput-interactivity frontier", _frontier_table(out["frontier"])),
    ]
    if len(out["frontier_by_gpu"]) > 1:
        sections += [
            (f"{g} alone", _frontier_table(points)) for g, points in out["frontier_by_gpu"].items()
        ]
    sections.append(
        (
            "The sweep",
            [
                ("load model", out["load_model"]),
                ("tokens/s per user", out["tokens_per_s_per_user"]),
                (
                    "intervals (posterior quantiles)",
                    ", ".join(map(number, out["interval_quantiles"])),
                ),
                ("points evaluated", number(out["points_evaluated"])),
                ("points that fit in memory", number(out["points_fitting"])),
                ("points meeting the SLOs", number(out["points_eligible"])),
            ],
        )
    )
    return render_html(_title(q), question_rows(q), sections + _tail(out), figures)


def _frontier_table(points: list[dict]) -> Content:
    if not points:
        return "No point."
    return Table(
        (
            "tokens/s per user",
            "90 % interval",
            "output tokens/s per GPU",
            "90 % interval",
            "$ per million output tokens",
            "90 % interval",
            "TTFT (s)",
            "configuration",
            "clients in flight",
        ),
        [
            (
                number(p["tokens_per_s_per_user"]),
                _interval(p["tokens_per_s_per_user_interval"]),
                number(p["tokens_per_s_per_gpu"]),
                _interval(p["tokens_per_s_per_gpu_interval"]),
                number(p["cost_per_million_tokens"]),
                _interval(p["cost_per_million_tokens_interval"]),
                number(p["ttft_seconds"]),
                (
                    f"{p['gpu']} TP{number(p['tp'])} PP{number(p['pp'])} "
                    f"{p['weight_dtype']} / {p['kv_dtype']}"
                ),
                number(p["concurrency"]),
            )
            for p in points
        ],
    )


def question_rows(q: dict) -> list[tuple[str, str]]:
    """The ``question`` object as a key/value sheet."""
    w = q["workload"]
    rows = [
        ("model", q["model"]),
        ("candidate GPUs", ", ".join(q["gpus"])),
        ("arrival rate (requests/s)", number(w["arrival_rate_per_s"])),
        ("mean prompt tokens", number(w["prompt_tokens_mean"])),
        ("mean output tokens", number(w["output_tokens_mean"])),
        ("output length CV", number(w["output_tokens_cv"])),
        ("p95 TTFT bound (s)", number(q["slo_ttft_p95_s"]) if q["slo_ttft_p95_s"] else "none"),
        ("p95 TPOT bound (s)", number(q["slo_tpot_p95_s"]) if q["slo_tpot_p95_s"] else "none"),
        *([("p95 ITL bound (s)", number(q["slo_itl_p95_s"]))] if q.get("slo_itl_p95_s") else []),
        *(
            [("max_model_len (tokens)", number(q["max_model_len"]))]
            if q.get("max_model_len")
            else []
        ),
        ("confidence (probability over the posterior)", number(q["confidence"])),
    ]
    if q.get("workload_trace"):
        rows.insert(2, ("workload trace", q["workload_trace"]))
    if q.get("concurrency"):
        rows.insert(2, ("clients in flight (swept)", ", ".join(map(number, q["concurrency"]))))
    for key, label in (
        ("demand_csv", "demand CSV (the rate above is its peak)"),
        ("classes_csv", "request classes CSV"),
    ):
        if q.get(key):
            rows.append((label, q[key]))
    if q.get("max_gpus"):
        rows.append(
            ("availability (GPUs)", ", ".join(f"{g} {number(v)}" for g, v in q["max_gpus"].items()))
        )
    return rows


def _tail(out: dict) -> list[tuple[str, Content]]:
    """The assumptions, the price table and the raw ``--json`` object."""
    a = out["assumptions"]
    w = out["question"]["workload"]
    return [
        (
            "Assumptions",
            [
                ("calibration", a["posterior"]),
                ("posterior draws", number(a["posterior_draws"])),
                ("seed", number(a["seed"])),
                ("interarrival CV", number(w["interarrival_cv"])),
                ("prompt length CV", number(w["prompt_tokens_cv"])),
                ("prices from", a["prices_csv"]),
            ],
        ),
        (
            "Prices",
            Table(
                ("GPU", "$/GPU-hour", "cloud", "instance type", "region", "source", "date"),
                [
                    (
                        g,
                        number(p["price_per_gpu_hour"]),
                        *(
                            number(p[k])
                            for k in ("cloud", "instance_type", "region", "source", "date")
                        ),
                    )
                    for g, p in a["prices"].items()
                ],
            ),
        ),
        ("The --json output this page is built from", Pre(json.dumps(out, indent=2))),
    ]


def _title(q: dict) -> str:
    return f"servingmath {q['command']}: {q['model']}"


def _interval(pair) -> str:
    lo, hi = pair
    return f"{number(lo)} to {number(hi)}"


def _configuration_rows(out: dict) -> list[tuple[str, str]]:
    rows = [
        (
            "configuration",
            (
                f"{number(out['replicas'])} x {out['gpu']} (TP {number(out['tp'])}, "
                f"PP {number(out['pp'])}{layout_text(out)}) = {number(out['num_gpus'])} GPUs"
            ),
        ),
        ("GPUs", number(out["num_gpus"])),
        ("replicas", number(out["replicas"])),
        ("weight dtype", out["weight_dtype"]),
        ("KV-cache dtype", out["kv_dtype"]),
        ("max_num_batched_tokens", number(out["max_num_batched_tokens"])),
        ("prefill chunk (tokens)", number(out["chunk_size"])),
        ("max_num_seqs", number(out["max_num_seqs"])),
        *(
            [("max_model_len (tokens)", number(out["max_model_len"]))]
            if out.get("max_model_len")
            else []
        ),
        ("cost ($/hour)", number(out["cost_per_hour"])),
        ("cost ($ per million output tokens)", number(out["cost_per_million_output_tokens"])),
        ("SLO probability", number(out["slo_probability"])),
    ]
    d = out.get("disaggregation")
    if d:
        for role in ("prefill", "decode"):
            p = d[role]
            rows.insert(
                1,
                (
                    f"{role} pool",
                    (
                        f"{number(p['replicas'])} x {p['gpu']} (TP {number(p['tp'])}, "
                        f"PP {number(p['pp'])}) = {number(p['num_gpus'])} GPUs"
                    ),
                ),
            )
        rows.append(("KV hand-off per mean prompt (s)", number(d.get("kv_transfer_s"))))
    s = out.get("speculative")
    if s:
        rows.append(
            (
                "speculative decoding",
                (
                    f"{s.get('draft_model') or s['draft']} k={number(s['k'])}, acceptance "
                    f"{number(s['acceptance'])}, {number(s['tokens_per_step'])} tokens/step"
                ),
            )
        )
    return rows


def _runner_ups(alternatives: list[dict]) -> Content:
    if not alternatives:
        return "No other configuration passed the re-check."
    return Table(
        ("configuration", "GPUs", "dtypes (weights / KV)", "$/hour", "$ per million output tokens"),
        [
            (
                f"{number(a['replicas'])} x {a['gpu']} TP{number(a['tp'])} PP{number(a['pp'])}"
                + (
                    f" (split, prefill on {a['disaggregation']['prefill']['gpu']})"
                    if a.get("disaggregation")
                    else ""
                ),
                number(a["num_gpus"]),
                f"{a['weight_dtype']} / {a['kv_dtype']}",
                number(a["cost_per_hour"]),
                number(a["cost_per_million_output_tokens"]),
            )
            for a in alternatives
        ],
    )
