"""``simulate``'s calibration options: the one efficiency the simulator's step times use (the
posterior median, one draw ``--draw I``, or the spec-sheet defaults under ``--prior``).
"""

from __future__ import annotations

import argparse

import jax

import perfmodel as pm

from ..errors import UsageError
from .posterior import add_efficiency_source_arguments, resolve_efficiency
from .validators import nonnegative_int


def add_calibration_arguments(parser: argparse.ArgumentParser) -> None:
    """--posterior, --prior, --draws, --draw (``--seed`` is simulate's own)."""
    g = parser.add_argument_group(
        "calibration",
        "the simulator's step times use ONE efficiency: the per-field median of --draws posterior "
        "draws for the deployment's GPU (as explain and optimize), or draw --draw I of them",
    )
    add_efficiency_source_arguments(g, "posterior draws the median is taken over (default 200)")
    g.add_argument(
        "--draw",
        type=nonnegative_int,
        metavar="I",
        help="simulate at posterior draw I (0 <= I < --draws, drawn with --seed) instead of the median",
    )


def simulation_efficiency(args, hardware, lockstep: bool = False) -> tuple[pm.Efficiency, str]:
    """The efficiency the simulator runs at, and where it came from (``lockstep``: the load is
    a lockstep loop, whose TTFT takes the lockstep runs' scale)."""
    if args.draw is not None and args.prior:
        raise UsageError("--draw picks a posterior draw; drop --prior or --draw")
    median, draws, source = resolve_efficiency(args, hardware, args.weight_dtype, lockstep=lockstep)
    if args.draw is None:
        return median, source + (", median" if draws is not None else "")
    if not 0 <= args.draw < args.draws:
        raise UsageError(
            f"--draw must be in [0, {args.draws - 1}] (one of --draws {args.draws}), got {args.draw}"
        )
    return jax.tree.map(lambda x: x[args.draw], draws), f"{source}, draw {args.draw}"
