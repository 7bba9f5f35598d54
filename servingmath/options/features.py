"""The serving-feature options of ``explain`` and ``simulate``: prefix reuse, speculative decoding,
disaggregated pools and the host KV tier.

``add_feature_arguments`` declares them; ``validate_feature_arguments`` refuses bad values before
anything loads (``UsageError``, one line).
"""

from __future__ import annotations

import argparse
import math

from perfmodel import features as ft

from ..errors import UsageError
from .disagg import parse_pools
from .validators import finite_float, positive_float

MAX_SPEC_K = 16
"""Largest --spec-k accepted: engines verify a handful of draft tokens per step (vLLM's and
SGLang's examples use 1-8); at acceptance a < 1 the k-th token is accepted with probability a^k,
so past 16 drafts only add draft and verification cost."""


def add_feature_arguments(parser: argparse.ArgumentParser) -> None:
    """Feature options (the paged-KV ``--block-size`` is a deployment option)."""
    g = parser.add_argument_group("serving features")
    g.add_argument(
        "--prefix-reuse",
        type=finite_float,
        metavar="FRACTION",
        help="share of requests that open with a shared prefix (0..1)",
    )
    g.add_argument("--prefix-len", type=int, metavar="N", help="shared prefix length (tokens)")
    g.add_argument(
        "--spec-draft", metavar="MODEL|mtp", help="speculative decoding: draft model or mtp"
    )
    g.add_argument(
        "--spec-k",
        type=int,
        default=4,
        metavar="K",
        help=f"draft tokens per step, 1..{MAX_SPEC_K} (default 4)",
    )
    g.add_argument(
        "--spec-acceptance",
        type=finite_float,
        metavar="A",
        help="per-token acceptance in [0, 1] (default: prior from measured acceptance lengths)",
    )
    g.add_argument(
        "--disagg", metavar="PREFILL_GPUS:DECODE_GPUS", help="split prefill and decode pools"
    )
    g.add_argument("--prefill-gpu", metavar="G", help="prefill pool hardware id (default --gpu)")
    g.add_argument("--decode-gpu", metavar="G", help="decode pool hardware id (default --gpu)")
    g.add_argument(
        "--transfer-bw",
        type=finite_float,
        metavar="BYTES_PER_S",
        help="KV hand-off bandwidth per GPU (default: the inter-node network)",
    )
    g.add_argument(
        "--host-kv-bytes", type=finite_float, metavar="BYTES", help="host-memory KV tier per GPU"
    )
    g.add_argument(
        "--host-kv-bw",
        type=positive_float,
        default=ft.PCIE5_X16_BYTES_PER_S,
        metavar="BYTES_PER_S",
        help="host <-> GPU bandwidth (default PCIe 5.0 x16, 63e9)",
    )


def _fraction(name: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise UsageError(f"{name} must be in [0, 1], got {value}; pass e.g. {name} 0.5")


def validate_feature_arguments(args: argparse.Namespace, prompt_tokens: float) -> None:
    """Every check that needs no budget, so bad input fails fast (``UsageError``, one line)."""
    if args.prefix_reuse is not None or args.prefix_len is not None:
        if args.prefix_reuse is None or args.prefix_len is None:
            raise UsageError(
                "--prefix-reuse and --prefix-len go together; pass both, e.g. 0.8 and 1024"
            )
        _fraction("--prefix-reuse", args.prefix_reuse)
        if args.prefix_len < 0:
            raise UsageError(
                f"--prefix-len must be >= 0 tokens, got {args.prefix_len}; pass e.g. --prefix-len 1024"
            )
        if args.prefix_len > prompt_tokens:
            raise UsageError(
                f"--prefix-len {args.prefix_len} is longer than the {prompt_tokens:.0f}-token prompt; "
                "pass a prefix no longer than the prompt"
            )
    if args.spec_draft:
        if not 1 <= args.spec_k <= MAX_SPEC_K:
            raise UsageError(
                f"--spec-k must be a positive integer <= {MAX_SPEC_K} draft tokens, got "
                f"{args.spec_k}; pass e.g. --spec-k 4"
            )
        if args.spec_acceptance is not None:
            _fraction("--spec-acceptance", args.spec_acceptance)
    if args.disagg:
        parse_pools(args.disagg)
        if args.transfer_bw is not None and not (
            math.isfinite(args.transfer_bw) and args.transfer_bw > 0
        ):
            raise UsageError(
                f"--transfer-bw must be a positive number of bytes/s, got {args.transfer_bw}"
            )
    if args.host_kv_bytes is not None and not (
        math.isfinite(args.host_kv_bytes) and args.host_kv_bytes >= 0 and args.host_kv_bw > 0
    ):
        raise UsageError(
            "--host-kv-bytes must be >= 0 and --host-kv-bw > 0; pass e.g. --host-kv-bytes 256e9"
        )
