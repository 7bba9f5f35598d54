"""Convergence diagnostics of a fit: rank-normalised R-hat, bulk ESS, divergences.

Thresholds from Vehtari, Gelman, Simpson, Carpenter & Buerkner (2021): R-hat <= 1.01 and bulk
ESS >= 400 over all chains; NUTS divergences must be zero (Betancourt 2017).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

RHAT_MAX = 1.01
ESS_BULK_MIN = 400.0


@dataclass(frozen=True)
class Diagnostics:
    """Worst values over every scalar of the posterior, and whether they pass."""

    max_rhat: float
    min_ess_bulk: float
    divergences: int
    worst_rhat_var: str
    worst_ess_var: str
    num_chains: int

    @property
    def ok(self) -> bool:
        return (
            self.max_rhat <= RHAT_MAX
            and self.min_ess_bulk >= ESS_BULK_MIN
            and self.divergences == 0
        )

    def report(self) -> str:
        """Lines to print; a loud WARNING when a threshold is missed."""
        line = (
            f"diagnostics: max R-hat {self.max_rhat:.3f} ({self.worst_rhat_var}), "
            f"min bulk ESS {self.min_ess_bulk:.0f} ({self.worst_ess_var}), "
            f"divergences {self.divergences}, chains {self.num_chains}"
        )
        if self.ok:
            return line + " -- OK"
        why = []
        if self.max_rhat > RHAT_MAX:
            why.append(f"R-hat {self.max_rhat:.3f} > {RHAT_MAX}")
        if self.min_ess_bulk < ESS_BULK_MIN:
            why.append(f"bulk ESS {self.min_ess_bulk:.0f} < {ESS_BULK_MIN:.0f}")
        if self.divergences:
            why.append(f"{self.divergences} divergent transitions")
        return (
            line + "\n" + "!" * 72 + f"\nWARNING: the fit did not converge: {'; '.join(why)}."
            "\nWARNING: run longer chains (--draws/--warmup) before trusting its intervals.\n"
            + "!"
            * 72
        )


def _worst(stat, reduce) -> dict[str, float]:
    """Per variable, ``reduce`` over its defined (finite) entries; all-undefined variables drop."""
    out = {}
    for name in stat.data_vars:
        values = np.asarray(stat[name].values, dtype=float)
        finite = values[np.isfinite(values)]
        if finite.size:
            out[name] = float(reduce(finite))
    return out or {"-": float("nan")}


def diagnose(idata) -> Diagnostics:
    """Diagnostics of an ``InferenceData`` (R-hat needs >= 2 chains; one chain reports NaN)."""
    import arviz as az

    post = idata.posterior
    chains = int(post.sizes["chain"])
    # Structural zeros (e.g. no GPU x group bias on anchor groups) are constant in every chain:
    # their R-hat/ESS are undefined (0/0), so they are left out rather than warned about.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rhat = az.rhat(post) if chains > 1 else None
        ess = az.ess(post, method="bulk")
    worst_r, worst_r_var = (float("nan"), "-")
    if rhat is not None:
        vals = _worst(rhat, np.max)
        worst_r_var = max(vals, key=vals.get)
        worst_r = vals[worst_r_var]
    evals = _worst(ess, np.min)
    worst_e_var = min(evals, key=evals.get)
    div = 0
    if "sample_stats" in idata.groups() and "diverging" in idata.sample_stats:
        div = int(np.asarray(idata.sample_stats["diverging"].values).sum())
    return Diagnostics(
        worst_r if chains > 1 else float("inf"),
        evals[worst_e_var],
        div,
        worst_r_var,
        worst_e_var,
        chains,
    )
