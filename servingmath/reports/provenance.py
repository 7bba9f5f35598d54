"""What an answer was asked and assumed, as plain JSON values: the ``question`` and
``assumptions`` keys of the ``--json`` output of ``optimize``, ``fleet`` and ``forecast`` (and
of their ``--report`` pages, which are built from that output).

The prices are those the search used (each GPU's cheapest row of the prices CSV, as
``perfmodel.load_hardware`` picks it), with the row's provenance columns (cloud, instance type,
region, source, date) where the CSV has them; a CSV without them is its own source.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

WORKLOAD_FIELDS = (
    "arrival_rate_per_s",
    "interarrival_cv",
    "prompt_tokens_mean",
    "prompt_tokens_cv",
    "output_tokens_mean",
    "output_tokens_cv",
)
"""The ``perfmodel.Workload`` fields a report states (the load and the length distributions)."""

PRICE_COLUMNS = ("cloud", "instance_type", "region", "source", "date")
"""Provenance columns of ``data/prices.csv`` copied next to each price."""

PRICE_MATCH_RTOL = 1e-6
"""Relative tolerance matching a used price to its CSV row (a float32 price differs ~1e-8)."""


def question(args: argparse.Namespace, model_name: str, gpus, workload, **extra) -> dict:
    """The question asked: model, candidate GPUs, load, SLO bounds and confidence.

    Args:
        args: the parsed command line (``ttft_p95``, ``tpot_p95``, ``confidence``, ``workload``).
        model_name: the served model's name.
        gpus: candidate hardware ids.
        workload: the resolved ``perfmodel.Workload`` (its fields in ``WORKLOAD_FIELDS``).
        extra: command-specific entries (a demand file, availability limits, ...).
    """
    return {
        "command": args.command,
        "model": model_name,
        "gpus": list(gpus),
        "workload": {f: float(getattr(workload, f)) for f in WORKLOAD_FIELDS},
        "workload_trace": getattr(args, "workload", None),
        "slo_ttft_p95_s": args.ttft_p95,
        "slo_tpot_p95_s": args.tpot_p95,
        **({"slo_itl_p95_s": args.itl_p95} if getattr(args, "itl_p95", None) is not None else {}),
        **(
            {"max_model_len": args.max_model_len}
            if getattr(args, "max_model_len", None) is not None
            else {}
        ),
        "confidence": args.confidence,
        **(
            {"prefix_reuse": args.prefix_reuse, "prefix_len": args.prefix_len}
            if getattr(args, "prefix_reuse", None) is not None
            else {}
        ),
        **extra,
    }


def assumptions(args: argparse.Namespace, gpus, hardware) -> dict:
    """The calibration and prices behind the answer.

    Args:
        args: the parsed command line (``prior``, ``posterior``, ``draws``, ``seed``, ``prices``).
        gpus: hardware ids, in the order of ``hardware``.
        hardware: the loaded ``HardwareSpec`` of each (its ``price_per_gpu_hour`` is the price
            the search used).
    """
    from perfmodel import data_dir

    if args.prior:
        posterior = "spec-sheet prior draws (--prior)"
    elif args.posterior:
        posterior = str(args.posterior)
    else:
        from fitting import default_posterior_path

        posterior = f"bundled {default_posterior_path()}"
    prices_csv = Path(args.prices) if args.prices else data_dir() / "prices.csv"
    used = {g: float(h.price_per_gpu_hour) for g, h in zip(gpus, hardware)}
    return {
        "posterior": posterior,
        "engine_offsets": (
            "none (physics alone)"
            if args.prior
            else f"fitted end-to-end TTFT/TPOT offsets of {getattr(args, 'engine', None) or 'the engines pooled'}"
        ),
        "posterior_draws": args.draws,
        "seed": args.seed,
        "prices_csv": str(prices_csv),
        "prices": price_sources(prices_csv, used),
    }


def price_sources(path: str | Path, used: dict[str, float]) -> dict[str, dict]:
    """``{gpu: {"price_per_gpu_hour", *PRICE_COLUMNS}}``: each used price with the columns of the
    first row of ``path`` that lists that GPU at that price (``source`` = the file when the CSV
    has no source column or no such row)."""
    rows = _rows(path)
    out = {}
    for gpu, price in used.items():
        entry: dict = {"price_per_gpu_hour": price if math.isfinite(price) else None}
        match = next((r for r in rows if r.get("gpu") == gpu and _same(r, price)), None)
        for column in PRICE_COLUMNS:
            entry[column] = (match or {}).get(column) or None
        entry["source"] = entry["source"] or str(path)
        out[gpu] = entry
    return out


def _rows(path: str | Path) -> list[dict]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError):  # read (and checked) before, by load_hardware
        return []


def _same(row: dict, price: float) -> bool:
    try:
        return math.isclose(
            float(row.get("price_per_gpu_hour") or "nan"), price, rel_tol=PRICE_MATCH_RTOL
        )
    except ValueError:
        return False
