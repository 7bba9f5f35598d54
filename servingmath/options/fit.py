"""``fit``'s options: the measurements to read, the posterior file to write, the sampler (NUTS
or SVI) and its settings, and --prior, which updates a fitted posterior with a few rows of a GPU
instead of refitting everything.
"""

from __future__ import annotations

import argparse

from .run_fill import add_data_argument, add_run_fill_arguments
from .validators import nonnegative_int, output_dir, output_file, positive_int


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """The measurements, where the posterior goes, the sampler's settings, --prior (update a
    fitted posterior instead of refitting), the run facts files leave out and --plot."""
    add_data_argument(parser)
    parser.add_argument(
        "--out", required=True, type=output_file, help="where to write the posterior netCDF"
    )
    parser.add_argument(
        "--draws", type=positive_int, default=500, help="posterior draws per chain (default 500)"
    )
    parser.add_argument(
        "--warmup",
        type=nonnegative_int,
        default=500,
        help="NUTS warm-up steps per chain (default 500)",
    )
    parser.add_argument("--chains", type=positive_int, default=2, help="NUTS chains (default 2)")
    parser.add_argument(
        "--per-stratum",
        type=nonnegative_int,
        default=10,
        help="seeded stratified subsample: rows per source/scenario/op/gpu/metric cell "
        "(default 10; 0 = all rows)",
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument(
        "--svi", action="store_true", help="SVI (low-rank Gaussian guide) instead of NUTS"
    )
    parser.add_argument(
        "--svi-steps", type=positive_int, default=3000, help="SVI optimisation steps (default 3000)"
    )
    parser.add_argument(
        "--prior",
        nargs="?",
        const="",
        default=None,
        metavar="P",
        help="update posterior P (default: the bundled one) with a few measurements of "
        "a GPU instead of refitting everything",
    )
    parser.add_argument(
        "--hardware-csv",
        default=None,
        help="spec rows (columns of data/hardware.csv) of GPUs the catalog lacks",
    )
    parser.add_argument(
        "--from-population",
        action="store_true",
        help="with --prior: start the measured GPUs from the population, even if P fitted them",
    )
    add_run_fill_arguments(
        parser,
        engine_help="engine of the runs whose files do not name it (end-to-end rows need one)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="model of tool-output rows (replaces the served name the tool recorded)",
    )
    parser.add_argument(
        "--max-tree-depth",
        type=positive_int,
        default=None,
        metavar="D",
        help="with --prior: NUTS tree depth cap (default 8: at most 255 gradients a draw)",
    )
    parser.add_argument(
        "--plot",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write PNGs (posterior histograms; predicted vs measured on the fitted rows)",
    )
