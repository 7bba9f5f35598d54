"""The ``pareto --plot`` figure: two panels sharing the tokens/s-per-user axis.

Left, output tokens/s per GPU against tokens/s per user: every eligible point's posterior median
(grey) and each GPU's frontier with 90 % interval bars on both axes.  Right, $ per million output
tokens along the same frontiers, with their intervals.  matplotlib with the Agg backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._pareto_points import ParetoPoint, ParetoResult

FILE_NAME = "pareto_frontier.png"
"""The figure's name inside the ``--plot`` directory."""


def _bars(points: tuple[ParetoPoint, ...], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(medians, 2 x n error-bar lengths below and above) of ``key`` over ``points``."""
    mid = np.asarray([getattr(p, key) for p in points])
    lo, hi = np.asarray([getattr(p, f"{key}_interval") for p in points]).T
    return mid, np.stack([np.maximum(mid - lo, 0.0), np.maximum(hi - mid, 0.0)])


def pareto_figure(result: ParetoResult):
    """The two panels as an open matplotlib Figure (the caller saves or embeds, then closes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    s, rows = result.sweep, result.eligible
    left.scatter(
        np.median(s.tokens_per_s_per_user[rows], axis=1),
        np.median(s.tokens_per_s_per_gpu[rows], axis=1),
        s=8,
        color="0.8",
        label="all points (median)",
    )
    for gpu, points in result.frontier_by_gpu.items():
        if not points:
            continue
        x, xerr = _bars(points, "tokens_per_s_per_user")
        y, yerr = _bars(points, "tokens_per_s_per_gpu")
        c, cerr = _bars(points, "cost_per_million_tokens")
        line = left.errorbar(x, y, xerr=xerr, yerr=yerr, marker="o", ms=4, capsize=2, label=gpu)
        right.errorbar(x, c, yerr=cerr, marker="o", ms=4, capsize=2, color=line[0].get_color())
        right.plot([], [], color=line[0].get_color(), label=gpu)
    left.set(
        xlabel="tokens/s per user (1 / TPOT)",
        ylabel="output tokens/s per GPU",
        title=f"{result.model}: frontier, 90 % intervals",
    )
    right.set(
        xlabel="tokens/s per user (1 / TPOT)",
        ylabel="$ per million output tokens",
        yscale="log",
        title="cost along the frontier",
    )
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_pareto_plot(result: ParetoResult, out_dir: str | Path) -> Path:
    """Draw the two panels into ``out_dir/pareto_frontier.png`` and return its path."""
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig = pareto_figure(result)
    path = out / FILE_NAME
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
