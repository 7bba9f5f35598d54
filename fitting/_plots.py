"""Pictures of a calibration (matplotlib, Agg backend, PNG files).

* ``predicted_vs_measured.png``: posterior predictive median against the measured value, log-log,
  with the central 90 % interval as an error bar, coloured by scenario; the diagonal is perfect.
* ``posteriors.png``: one panel per parameter (every ``Efficiency`` / ``KernelEfficiency`` field),
  a histogram of its draws per GPU, natural units (log axis for positive quantities).
* ``residuals_by_scenario.png``: log(measured / predicted median) per scenario as box plots, with
  the mean predictive 90 % half-width shaded, so bias and interval width read side by side.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ._model import PARAM_NAMES, PRIORS
from ._posterior import Posterior
from ._predict import prepare
from ._predictive import predictive_log_draws
from ._validate import cap_rows, predictive_quantiles

MAX_GPUS_SHOWN = 8
"""Histograms drawn per parameter panel (the first GPUs of the posterior, then the rest omitted)."""

MAX_SERVING_ROWS = 32
"""Serving rows predicted for the plots (each costs a closed-loop solve per draw)."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_posteriors(
    posterior: Posterior, path: str | Path, *, gpus: tuple[str, ...] | None = None
) -> Path:
    """Per-parameter posterior histograms (one colour per GPU) to ``path``."""
    plt = _pyplot()
    gpus = tuple(gpus or posterior.gpus)[:MAX_GPUS_SHOWN]
    names = [n for n in PARAM_NAMES if n in posterior.idata.posterior]  # older files lack a few
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows))
    for ax, name in zip(axes.flat, names):
        draws = posterior.flat(name)
        log = PRIORS[name].link == "log"
        for g in gpus:
            v = draws[:, posterior.gpus.index(g)]
            v = np.log10(v) if log else v
            ax.hist(v[np.isfinite(v)], bins=30, alpha=0.5, density=True, label=g)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("log10 value" if log else "fraction", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"posterior per GPU ({posterior.num_draws} draws)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def predictive_summary(
    posterior: Posterior,
    table: pd.DataFrame,
    *,
    num_draws: int = 200,
    seed: int = 0,
    max_rows: int | None = 2000,
) -> pd.DataFrame:
    """Per covered row: scenario, gpu, measured, predictive median and 5/95 % quantiles."""
    table, _ = cap_rows(table, max_rows, MAX_SERVING_ROWS, seed)
    prep = prepare(
        table, gpus=posterior.gpus, cells=posterior.cells, noise_keys=posterior.noise_keys
    )
    if not len(prep.log_value):
        return pd.DataFrame(columns=["scenario", "gpu", "measured", "median", "lo90", "hi90"])
    q = predictive_quantiles(
        predictive_log_draws(posterior, prep, num_draws, seed=seed), (0.05, 0.5, 0.95)
    )
    out = pd.DataFrame(
        {
            "scenario": prep.table["scenario"].astype(str).to_numpy(),
            "gpu": prep.table["gpu"].astype(str).to_numpy(),
            "measured": np.exp(prep.log_value),
            "median": np.exp(q[1]),
            "lo90": np.exp(q[0]),
            "hi90": np.exp(q[2]),
        }
    )
    return out[np.isfinite(out["median"]) & np.isfinite(out["hi90"])]


def plot_predicted_vs_measured(summary: pd.DataFrame, path: str | Path) -> Path:
    """Log-log scatter of predictive median vs measured, 90 % intervals as bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for scen, s in summary.groupby("scenario"):
        yerr = np.vstack([s["median"] - s["lo90"], s["hi90"] - s["median"]])
        ax.errorbar(
            s["measured"],
            s["median"],
            yerr=yerr,
            fmt="o",
            ms=3,
            alpha=0.6,
            elinewidth=0.6,
            label=f"{scen} ({len(s)})",
        )
    if len(summary):
        lo = float(min(summary["measured"].min(), summary["lo90"].min()))
        hi = float(max(summary["measured"].max(), summary["hi90"].max()))
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.legend(fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (SI units)")
    ax.set_ylabel("predicted median, 90% interval")
    ax.set_title("posterior predictive vs measured")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def plot_residuals(summary: pd.DataFrame, path: str | Path) -> Path:
    """Box plots of log(measured / predicted median) per scenario, 90 % half-width shaded."""
    plt = _pyplot()
    groups = sorted(summary["scenario"].unique()) if len(summary) else []
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(groups) + 2), 4))
    data = [
        np.log(
            summary.loc[summary["scenario"] == g, "measured"]
            / summary.loc[summary["scenario"] == g, "median"]
        )
        for g in groups
    ]
    if groups:
        ax.boxplot(data, showfliers=True)
        ax.set_xticks(range(1, len(groups) + 1), groups, rotation=20, fontsize=8)
        for i, g in enumerate(groups, start=1):
            s = summary[summary["scenario"] == g]
            half = float(np.mean(np.log(s["hi90"] / s["lo90"]))) / 2
            ax.fill_between([i - 0.4, i + 0.4], -half, half, color="tab:blue", alpha=0.15)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_ylabel("log(measured / predicted)")
    ax.set_title("residuals by scenario (shaded: mean 90% half-width)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def write_plots(
    posterior: Posterior,
    out_dir: str | Path,
    *,
    table: pd.DataFrame | None = None,
    num_draws: int = 200,
    seed: int = 0,
    max_rows: int | None = 2000,
    hardware_csv: str | Path | None = None,
) -> list[Path]:
    """Write ``posteriors.png`` and, given measurements, ``predicted_vs_measured.png`` and
    ``residuals_by_scenario.png`` into ``out_dir`` (created); returns the paths written."""
    from ._update import user_hardware

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gpus = None
    if table is not None and len(table):
        shown = [g for g in dict.fromkeys(table["gpu"].astype(str)) if g in posterior.gpus]
        gpus = tuple(shown + [g for g in posterior.gpus if g not in shown])
    paths = [plot_posteriors(posterior, out / "posteriors.png", gpus=gpus)]
    if table is not None and len(table):
        with user_hardware(hardware_csv):
            summary = predictive_summary(
                posterior, table, num_draws=num_draws, seed=seed, max_rows=max_rows
            )
        paths.append(plot_predicted_vs_measured(summary, out / "predicted_vs_measured.png"))
        paths.append(plot_residuals(summary, out / "residuals_by_scenario.png"))
    return paths
