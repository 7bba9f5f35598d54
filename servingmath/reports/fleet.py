"""``fleet``'s answer: the plan as JSON-ready keys and in words, and the one-line infeasibility message."""

from __future__ import annotations

import argparse
import math

from .optimize import describe_short
from .render import table

MIX_CAPTION = "Replicas per GPU type, stacked by request class, with each type's GPU count."
"""The report's caption of the fleet mix chart."""


def fleet_report(problem, gpus, classes, fp, configs, plan, exact) -> dict:
    """The fleet plan as JSON-ready keys: each class's rate, capacity per replica of each type and
    the configuration it runs on each usable type (``configs``, ``fleet_problem``'s), GPUs and
    replicas per type, the cost and the exact MILP cost and the gap between them."""
    feasible = math.isfinite(plan.cost_per_hour)
    out = {
        "feasible": feasible,
        "classes": [
            {
                "prompt_tokens": c.prompt_tokens,
                "output_tokens": c.output_tokens,
                "requests_per_s": float(r),
                "capacity_per_replica": {g: float(k) for g, k in zip(gpus, cap)},
            }
            for c, r, cap in zip(classes, fp.rates, fp.capacity)
        ],
        "plan": {
            g: {
                "gpus": int((fp.replica_gpus[:, j] * plan.replicas[:, j]).sum()),
                "replicas_by_class": {
                    str(c): int(plan.replicas[c, j])
                    for c in range(len(classes))
                    if plan.replicas[c, j]
                },
            }
            for j, g in enumerate(gpus)
        },
        "cost_per_hour": plan.cost_per_hour if feasible else None,
        "milp_cost_per_hour": exact.cost_per_hour if math.isfinite(exact.cost_per_hour) else None,
    }
    for c, entry in enumerate(out["classes"]):  # what each class runs on each usable type
        entry["configuration"] = {
            g: describe_short(problem, gpus, configs[c, j])
            for j, g in enumerate(gpus)
            if configs[c, j, 0] >= 0
        }
    out["gap"] = (
        (plan.cost_per_hour / exact.cost_per_hour - 1.0)
        if feasible and math.isfinite(exact.cost_per_hour)
        else None
    )
    return out


def infeasible_message(fp, classes, gpus, args: argparse.Namespace) -> str:
    """One line: the class no GPU type can serve under the SLO, else the availability limit."""
    for c, cls in enumerate(classes):
        if not (fp.capacity[c] > 0).any():
            return (
                f"class {c} (prompt {cls.prompt_tokens:.0f}, output "
                f"{cls.output_tokens:.0f} tokens) meets the SLO on no type in --gpus {','.join(gpus)} within --max-replicas "
                f"{args.max_replicas}; relax --ttft-p95/--tpot-p95, add GPU types or raise "
                "--max-replicas"
            )
    return (
        "the classes cannot all be served within the --max-gpus limits "
        f"({','.join(f'{g}={v:g}' for g, v in args.max_gpus.items())}); raise --max-gpus or "
        "relax the SLO"
    )


def render(result: dict) -> str:
    """The fleet plan in words: GPUs per type with replicas by class, the cost against the exact
    MILP optimum, the classes, and what each class runs on each usable type."""
    rows = [
        (
            g,
            f"{v['gpus']} GPUs ({', '.join(f'class {k}: {n} replicas' for k, n in v['replicas_by_class'].items())})",
        )
        for g, v in result["plan"].items()
        if v["gpus"]
    ]
    rows.append(
        (
            "cost",
            (
                f"${result['cost_per_hour']:.2f}/hour (exact milp optimum "
                f"${result['milp_cost_per_hour']:.2f}/hour, gap {result['gap']:.2%})"
            ),
        )
    )
    lines = ["fleet\n" + table(rows)]
    lines.append(
        "classes\n"
        + table(
            [
                (
                    f"class {i}",
                    (
                        f"prompt {c['prompt_tokens']:.0f}, output {c['output_tokens']:.0f}, "
                        f"{c['requests_per_s']:.2f} req/s"
                    ),
                )
                for i, c in enumerate(result["classes"])
            ]
        )
    )
    for i, c in enumerate(result["classes"]):
        for g, text in c["configuration"].items():
            lines.append(f"  class {i} on {g}: {text}")
    return "\n".join(lines)
