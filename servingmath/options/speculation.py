"""Speculative decoding as a knob of the search (``optimize``, ``fleet``, ``forecast``):
--spec-draft / --spec-acceptance, the draft lengths offered (``SPEC_K``), and
``speculation_from_args``, which turns them into ``optimize.make_problem``'s speculation
arguments with a one-line ``UsageError`` for a bad draft.
"""

from __future__ import annotations

import argparse

import perfmodel as pm
from perfmodel import CatalogError

from ..errors import UsageError
from .deployment import require_mtp
from .validators import fraction

SPEC_K = (0, 1, 2, 3, 4, 5, 6, 7, 8)
"""Speculative draft lengths offered with --spec-draft (0 = off)."""


def add_speculation_arguments(parser: argparse.ArgumentParser) -> None:
    """--spec-draft / --spec-acceptance: speculative decoding as a knob of the search (optimize,
    fleet, forecast); ``speculation_from_args`` reads them."""
    parser.add_argument(
        "--spec-draft",
        metavar="MODEL|mtp",
        help="offer speculative decoding with this draft (k = 0..8 becomes a knob)",
    )
    parser.add_argument(
        "--spec-acceptance",
        type=fraction,
        metavar="A",
        help="per-token draft acceptance in [0, 1] (default: prior from measured lengths)",
    )


def check_speculation_arguments(args: argparse.Namespace) -> None:
    """Before the posterior loads: --spec-draft mtp only for a model with MTP layers (a caller
    that bypasses the parser may leave the option out)."""
    draft = getattr(args, "spec_draft", None)
    if draft and draft.lower() == "mtp":
        require_mtp(args.model)


def speculation_from_args(args: argparse.Namespace, model) -> dict:
    """``make_problem``'s speculation arguments from --spec-draft / --spec-acceptance."""
    return {"spec_draft": _spec_draft(args, model), "spec_acceptance": args.spec_acceptance}


def _spec_draft(args: argparse.Namespace, model):
    """None, "mtp" or the draft ``ModelSpec`` of --spec-draft; one-line errors for bad input."""
    if not args.spec_draft:
        if args.spec_acceptance is not None:
            raise UsageError("--spec-acceptance needs --spec-draft MODEL|mtp")
        return None
    if args.spec_draft.lower() == "mtp":
        return "mtp"
    return draft_model(args.spec_draft, model)


def draft_model(name: str, model):
    """The draft ``ModelSpec`` --spec-draft names, smaller than ``model``; a one-line
    ``UsageError`` for an unknown draft or one at least as large."""
    try:
        draft = pm.load_model(name)
    except CatalogError as exc:
        raise UsageError(str(exc)) from None
    if float(draft.total_params) >= float(model.total_params):
        raise UsageError(
            f"--spec-draft {draft.name} ({float(draft.total_params) / 1e9:.1f} B) is not smaller "
            f"than {model.name} ({float(model.total_params) / 1e9:.1f} B); pick a smaller draft "
            "or mtp"
        )
    return draft
