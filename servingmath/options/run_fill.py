"""Options that fill what benchmark tools leave out of their result files (``fit``, ``validate``)."""

from __future__ import annotations

import argparse

from .validators import positive_int, scheduler_polls

ENGINES = ("vllm", "sglang", "trtllm")
"""Engines whose serving behaviour the calibration knows."""


def add_data_argument(parser: argparse.ArgumentParser) -> None:
    """``--data``: the measurement files or folders a command reads (``fit``, ``validate``)."""
    parser.add_argument(
        "--data",
        nargs="+",
        required=True,
        metavar="FILE",
        help="measurement files or folders (SCHEMA.md CSVs, vLLM/SGLang/GenAI-Perf JSON)",
    )


def add_run_fill_arguments(parser: argparse.ArgumentParser, *, engine_help: str) -> None:
    """``--engine``, ``--gpu``, ``--tp``, ``--stream-interval`` and ``--scheduler-recv-interval``
    for rows that do not record them."""
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
    parser.add_argument(
        "--stream-interval",
        type=positive_int,
        default=None,
        metavar="TOKENS",
        help="tokens the engine streamed per chunk (vLLM/SGLang --stream-interval, TensorRT-LLM "
        "stream_interval) for runs whose files do not say (default 1): their ITL is the gap "
        "between chunks",
    )
    parser.add_argument(
        "--scheduler-recv-interval",
        type=scheduler_polls,
        default=None,
        metavar="ITERATIONS",
        help="forward iterations between the engine's polls for new requests (SGLang "
        "--scheduler-recv-interval) for runs whose files do not say (default 1): an arrival "
        "waits (k - 1) / 2 iterations on average, which TTFT and E2E include",
    )
