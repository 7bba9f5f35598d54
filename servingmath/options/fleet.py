"""``fleet``'s options: the search problem and its knobs (``problem``, ``grid``,
``speculation``), the request-size classes the fleet serves (a --classes CSV, classes binned from
a --workload trace, or the workload's mean request), availability per GPU type and the files it
writes.
"""

from __future__ import annotations

import argparse
import csv
import math

from perfmodel import CatalogError

from ..errors import UsageError
from .grid import add_chunk_argument, add_moe_layout_argument, add_pool_ratio_argument
from .outputs import add_report_argument
from .problem import add_problem_arguments
from .speculation import add_speculation_arguments
from .validators import assignments, nonnegative_float, output_dir, positive_int


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The search problem and its knobs, then fleet's own: the request classes (--classes, or
    --num-classes binned from --workload), availability per type, the replica bound and the
    files it writes."""
    add_problem_arguments(parser)
    add_speculation_arguments(parser)
    add_chunk_argument(parser, default=None)
    add_moe_layout_argument(parser)
    add_pool_ratio_argument(parser, default="none")
    parser.add_argument("--classes", help="histogram CSV prompt_tokens,output_tokens,share")
    parser.add_argument(
        "--num-classes",
        type=positive_int,
        default=3,
        help="classes binned from --workload by prompt length (default 3)",
    )
    parser.add_argument(
        "--max-gpus",
        type=assignments(nonnegative_float),
        default="",
        help="availability per type, e.g. h100-sxm=64,l40s=16",
    )
    parser.add_argument(
        "--max-replicas", type=positive_int, default=64, help="largest replica count per class"
    )
    parser.add_argument(
        "--plot",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write PNGs into this directory (fleet_mix.png)",
    )
    add_report_argument(parser)


def read_classes(path: str):
    """The request classes of a --classes CSV (prompt_tokens,output_tokens,share; shares
    normalised to sum to 1), with one-line errors naming the file, line and field."""
    from optimize import RequestClass

    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(
            f"{path}: not a UTF-8 text file; --classes takes a CSV "
            "prompt_tokens,output_tokens,share"
        ) from None
    out = []
    for line, row in enumerate(rows, start=2):
        vals = []
        for field in ("prompt_tokens", "output_tokens", "share"):
            raw = (row.get(field) or "").strip()
            try:
                v = float(raw)
            except ValueError:
                raise UsageError(
                    f"{path}:{line}: field {field!r} = {raw!r} is not a number; "
                    "columns are prompt_tokens,output_tokens,share"
                ) from None
            if not (math.isfinite(v) and v > 0):
                raise UsageError(f"{path}:{line}: field {field!r} = {raw!r} must be positive")
            vals.append(v)
        out.append(RequestClass(*vals))
    if not out:
        raise UsageError(f"{path}: no classes; add prompt_tokens,output_tokens,share rows")
    total = sum(c.share for c in out)
    return [c._replace(share=c.share / total) for c in out]


def classes_from_args(args: argparse.Namespace, workload):
    """The request classes: --classes, else --num-classes binned from the --workload trace by
    prompt length, else one class of the workload's mean request."""
    from optimize import RequestClass, classes_from_trace
    from perfmodel.dynamics import load_trace

    if args.classes:
        return read_classes(args.classes)
    if args.workload:
        try:
            trace = load_trace(args.workload)
        except CatalogError as exc:
            raise UsageError(str(exc)) from None
        return classes_from_trace(
            trace.prompt_tokens, trace.output_tokens, max(1, args.num_classes)
        )
    return [
        RequestClass(float(workload.prompt_tokens_mean), float(workload.output_tokens_mean), 1.0)
    ]
