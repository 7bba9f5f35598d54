"""``forecast``'s options: the demand per period (a CSV), the search problem posed at its peak
(``problem``, ``grid``, ``speculation``; the lengths from a --workload trace or preset), and the
files it writes (fan chart, CSV, HTML report).
"""

from __future__ import annotations

import argparse

from .grid import add_chunk_argument, add_moe_layout_argument, add_pool_ratio_argument
from .outputs import add_report_argument
from .problem import add_problem_arguments
from .speculation import add_speculation_arguments
from .validators import output_dir, output_file, positive_int, workload_source


def add_forecast_arguments(parser: argparse.ArgumentParser) -> None:
    """The demand CSV, the search problem (its load from --demand, its lengths from --workload)
    and its knobs, the replica bound and the files it writes (fan chart, CSV, report)."""
    parser.add_argument(
        "--demand",
        required=True,
        help="CSV period,requests_per_s[,requests_per_s_sd] (e.g. data/examples/demand.csv)",
    )
    add_problem_arguments(parser, workload=False)
    add_speculation_arguments(parser)
    add_chunk_argument(parser, default=None)
    add_moe_layout_argument(parser)
    add_pool_ratio_argument(parser, default="none")
    parser.add_argument(
        "--workload", type=workload_source, help="trace file or preset for the length distribution"
    )
    parser.add_argument("--png", type=output_file, help="write the fan chart PNG to this file")
    parser.add_argument(
        "--plot",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write PNGs into this directory (forecast_fan.png)",
    )
    parser.add_argument(
        "--csv", dest="csv_out", type=output_file, help="write the table as CSV here"
    )
    parser.add_argument(
        "--max-replicas",
        type=positive_int,
        default=1024,
        help="largest replica count per type and period (default 1024)",
    )
    add_report_argument(parser)
