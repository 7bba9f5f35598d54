"""Options that fill what benchmark tools leave out of their result files (``fit``, ``validate``)."""

from __future__ import annotations

import argparse

from ._types import positive_int

ENGINES = ("vllm", "sglang", "trtllm")
"""Engines whose serving behaviour the calibration knows."""


def add_run_fill_arguments(parser: argparse.ArgumentParser, *, engine_help: str) -> None:
    """``--engine``, ``--gpu`` and ``--tp`` for rows that do not record them."""
    parser.add_argument("--engine", choices=ENGINES, default=None, help=engine_help)
    parser.add_argument(
        "--gpu",
        default=None,
        help="hardware id of rows that do not record one (vLLM/SGLang/GenAI-Perf files never do)",
    )
    parser.add_argument(
        "--tp",
        type=positive_int,
        default=None,
        help="tensor-parallel degree of rows that do not record one",
    )
