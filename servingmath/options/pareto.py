"""``pareto``'s options: the search problem posed as a closed loop (no arrival rate: the clients
in flight set the load), the concurrencies to sweep, and the files it writes; ``sweep_from_args``
turns them into the workload and the sweep grid.
"""

from __future__ import annotations

import argparse

from .grid import add_moe_layout_argument, grid_from_args
from .outputs import add_report_argument
from .problem import add_problem_arguments, gpu_ids, resolve_workload
from .validators import output_dir

DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64,128,256"


def concurrency_list(text: str) -> tuple[int, ...]:
    """``1,4,16`` -> (1, 4, 16): whole numbers >= 1, comma-separated."""
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"must be whole numbers >= 1, comma-separated, got {text!r}; pass e.g. 1,4,16,64"
        )
    return tuple(sorted(set(values)))


def add_pareto_arguments(parser: argparse.ArgumentParser) -> None:
    """The search problem without a load (no --rate, no shared prefix), the concurrencies to
    sweep and the files it writes."""
    add_problem_arguments(parser, workload=False, prefix=False)
    parser.add_argument(
        "--concurrency",
        type=concurrency_list,
        default=concurrency_list(DEFAULT_CONCURRENCY),
        metavar="N,...",
        help=f"clients in flight to sweep; the batch limit max_num_seqs = N (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--plot",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write pareto_frontier.png here: the frontier and $ per million tokens, 90%% bars",
    )
    add_moe_layout_argument(parser)
    add_report_argument(parser)


def sweep_from_args(args: argparse.Namespace):
    """(workload, sweep grid) of the frontier, with one-line errors for bad lengths or dtypes."""
    from optimize import pareto_grid
    from perfmodel import CatalogError, load_model

    try:
        model = load_model(args.model)
    except CatalogError:
        model = None  # the command's own resolve refuses an unknown model in one line
    dtypes = grid_from_args(args, 1, 1, model)
    grid = pareto_grid(
        len(gpu_ids(args)),
        args.concurrency,
        kv_dtypes=dtypes.kv_dtypes,
        weight_dtypes=dtypes.weight_dtypes,
        moe_layouts=dtypes.moe_layouts,
    )
    return resolve_workload(args, rate=1.0), grid  # a closed loop: the rate is not used
