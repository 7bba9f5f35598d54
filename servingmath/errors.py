"""The one exception the CLI turns into a one-line message and exit status 2."""

from __future__ import annotations

from perfmodel import CatalogError


class UsageError(ValueError):
    """Bad input from the user; the message names the problem and the fix."""


USER_ERRORS = (UsageError, CatalogError)
"""Library errors that are the user's input, re-raised by commands as ``UsageError``."""
