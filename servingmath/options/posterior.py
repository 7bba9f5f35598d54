"""``--posterior``: every command's efficiencies come from the fitted posterior.

Point values use the per-field posterior median for the deployment's GPU; intervals come from
vmapping the same budgets over posterior draws.  An unseen GPU draws from the population.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import perfmodel as pm

from ..errors import UsageError
from .run_fill import ENGINES
from .validators import nonnegative_int, positive_int

INTERVAL_QUANTILES = (0.05, 0.5, 0.95)
"""Reported as p05 / p50 / p95: a 90 % posterior interval and its median."""


ENGINE_HELP = (
    "serving engine whose measured end-to-end runs calibrate TTFT and TPOT (the fitted offsets "
    "of the load model's latencies) and whose scheduler the load model prices (sglang prefills "
    "first: a fixed-length --concurrency loop runs in lockstep); default: pooled over the "
    "engines and labs measured, which widens the interval"
)


def add_engine_argument(parser) -> None:
    """``--engine``: which engine's fitted end-to-end offsets scale TTFT and TPOT."""
    parser.add_argument("--engine", choices=ENGINES, default=None, help=ENGINE_HELP)


def add_efficiency_source_arguments(group, draws_help: str) -> None:
    """--posterior, --engine, --prior and --draws: where a command's efficiencies come from
    (``explain``'s calibration group, and ``simulate``'s beside its ``--draw``)."""
    group.add_argument("--posterior", help="fitted posterior netCDF (default: the bundled one)")
    add_engine_argument(group)
    group.add_argument(
        "--prior",
        action="store_true",
        help="use the spec-sheet default efficiencies instead of a posterior",
    )
    group.add_argument("--draws", type=positive_int, default=200, help=draws_help)


def add_posterior_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("calibration")
    add_efficiency_source_arguments(g, "posterior draws for intervals (default 200)")
    g.add_argument("--seed", type=nonnegative_int, default=0, help="seed for posterior draws")


def resolve_efficiency(
    args: argparse.Namespace, hardware: pm.HardwareSpec, weight_dtype: str, lockstep: bool = False
) -> tuple[pm.Efficiency, pm.Efficiency | None, str]:
    """(median efficiency, draws with a leading axis or None, a label saying where they came from);
    ``lockstep``: the TTFT scale of lockstep loops (``fitting.efficiency_draws``)."""
    if args.prior:
        return pm.Efficiency(), None, "spec-sheet defaults (--prior)"
    if args.draws < 2:
        raise UsageError(f"--draws must be at least 2, got {args.draws}")
    import fitting

    from ..cli import posterior_cache_dir

    try:
        posterior = fitting.load_posterior(args.posterior, cache_dir=posterior_cache_dir())
        draws = fitting.efficiency_draws(
            posterior,
            hardware.name,
            args.draws,
            seed=args.seed,
            weight_dtype=weight_dtype,
            engine=args.engine,
            lockstep=lockstep,
        )
    except (fitting.PosteriorError, OSError, ValueError) as exc:
        raise UsageError(
            f"cannot use posterior {args.posterior or '(bundled)'}: {exc}; "
            "pass --posterior FILE.nc, or --prior for spec-sheet defaults"
        ) from None
    median = jax.tree.map(lambda x: np.median(np.asarray(x), axis=0), draws)
    label = f"posterior {posterior.path} ({args.draws} draws, {hardware.name})"
    return median, draws, label


def quantiles(values: jnp.ndarray) -> dict[str, float]:
    """{"p05", "p50", "p95"} of posterior draws."""
    q = np.quantile(np.asarray(values), INTERVAL_QUANTILES)
    return {f"p{round(p * 100):02d}": float(v) for p, v in zip(INTERVAL_QUANTILES, q)}
