"""Errors the CLI turns into a one-line message and exit status 2 (never a traceback)."""

from __future__ import annotations

import sys

from perfmodel import CatalogError


class UsageError(ValueError):
    """Bad input from the user; the message names the problem and the fix."""


def user_error_types() -> tuple[type[BaseException], ...]:
    """Library exceptions that mean "the user's input is wrong": usage, catalog, measurement files.

    ``fitting`` is only consulted if a command already imported it (keeps ``explain`` start-up lean).
    """
    types: list[type[BaseException]] = [UsageError, CatalogError]
    ingest = sys.modules.get("fitting._ingest")
    if ingest is not None and hasattr(ingest, "MeasurementFormatError"):
        types.append(ingest.MeasurementFormatError)
    return tuple(types)


USER_ERRORS = (UsageError, CatalogError)
"""Catalog and usage errors, for commands that convert library errors to ``UsageError``."""
