"""``pareto``'s frontier in words: one table per frontier, posterior medians with 90 % intervals."""

from __future__ import annotations

from .render import human_seconds

FRONTIER_CAPTION = (
    "Left: output tokens/s per GPU against tokens/s per user, each GPU's frontier with "
    "90 % interval bars (grey: every eligible point). Right: $ per million output tokens "
    "along the same frontiers."
)
"""The report's caption of the frontier figure."""

COLUMNS = (
    "tok/s/user",
    "tok/s/GPU",
    "$/M out tok",
    "TTFT",
    "GPU",
    "TPxPP layout",
    "weights/KV",
    "N",
)


def _cell(value: float, interval, fmt: str) -> str:
    return f"{value:{fmt}} [{interval[0]:{fmt}}, {interval[1]:{fmt}}]"


def _table(points) -> list[str]:
    rows = [
        (
            _cell(p.tokens_per_s_per_user, p.tokens_per_s_per_user_interval, ".1f"),
            _cell(p.tokens_per_s_per_gpu, p.tokens_per_s_per_gpu_interval, ".0f"),
            _cell(p.cost_per_million_tokens, p.cost_per_million_tokens_interval, ".3g"),
            human_seconds(p.ttft_seconds),
            p.gpu,
            f"{p.tp}x{p.pp}" + ("" if p.moe_layout == "tp" else f" {p.moe_layout}"),
            f"{p.weight_dtype}/{p.kv_dtype}",
            str(p.concurrency),
        )
        for p in points
    ]
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(COLUMNS)]
    return [
        "  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [COLUMNS, *rows]
    ]


def render(result) -> str:
    """The frontier as a table (fastest per user last, 90 % intervals in brackets), then each
    GPU's own frontier when there are several."""
    head = f"{result.model}: output tokens/s per GPU vs tokens/s per user, closed loop"
    lines = [head + " (posterior median [90 % interval])", *_table(result.frontier)]
    if len(result.gpus) > 1:
        for gpu, points in result.frontier_by_gpu.items():
            lines += ["", f"{gpu} alone", *(_table(points) if points else ["  (no point)"])]
    return "\n".join(lines)
