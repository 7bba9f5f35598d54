"""argparse ``type=`` validators: bad numbers and paths are refused while the line is parsed.

Each returns the converted value or raises ``argparse.ArgumentTypeError`` with a message that
follows the flag's name ("must be a positive number, got 'nan'"); the parser prints it as one
line and exits 2 before any work starts.  Non-finite numbers (nan, inf) never pass.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

import perfmodel as pm
from perfmodel.dynamics import trace_path


def _checked(kind: type, ok: Callable[[float], bool], wanted: str, hint: str):
    """A validator converting with ``kind`` and accepting finite values where ``ok`` holds."""

    def validate(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid {kind.__name__} value: {text!r}; {hint}"
            ) from None
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}; {hint}")
        return value

    return validate


finite_float = _checked(float, lambda v: True, "a finite number", "pass e.g. 1")
positive_float = _checked(float, lambda v: v > 0, "a positive number", "pass e.g. 1")
nonnegative_float = _checked(float, lambda v: v >= 0, "a number >= 0", "pass e.g. 0")
fraction = _checked(float, lambda v: 0 <= v <= 1, "in [0, 1]", "pass e.g. 0.5")
utilization = _checked(float, lambda v: 0 < v <= 1, "in (0, 1]", "pass e.g. 0.9")
probability = _checked(float, lambda v: 0 < v < 1, "strictly between 0 and 1", "pass e.g. 0.9")
positive_int = _checked(int, lambda v: v > 0, "a positive number", "pass a whole number >= 1")
nonnegative_int = _checked(int, lambda v: v >= 0, "a number >= 0", "pass a whole number >= 0")
scheduler_polls = _checked(
    int,
    lambda v: 1 <= v <= 1000,
    "a whole number of iterations in [1, 1000]",
    "pass e.g. 10 (SGLang's --scheduler-recv-interval; 1 = every iteration)",
)


def assignments(value_type: Callable[[str], float]):
    """``NAME=NUMBER,...`` -> {name: value}, each value checked with ``value_type``."""

    def parse(text: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for item in filter(None, (t.strip() for t in text.split(","))):
            key, sep, value = (s.strip() for s in item.partition("="))
            if not (sep and key):
                raise argparse.ArgumentTypeError(
                    f"{item!r} is not NAME=NUMBER; write e.g. h100-sxm=64"
                )
            try:
                out[key] = value_type(value)
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"{key}={value}: {exc}") from None
        return out

    return parse


def workload_source(text: str) -> str:
    """A trace preset name or an existing trace file (the text itself is returned)."""
    try:
        trace_path(text)
    except pm.CatalogError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _writable_parent(path: Path) -> None:
    parent = path.parent
    if not parent.is_dir():
        what = "is a file, not a folder" if parent.exists() else "does not exist"
        raise argparse.ArgumentTypeError(
            f"folder {str(parent)!r} of {str(path)!r} {what}; create it or pick another path"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"folder {str(parent)!r} is not writable; pick another path for {str(path)!r}"
        )


def output_file(text: str) -> str:
    """A file to write: its folder exists and is writable, and it is not itself a folder."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r} is a folder; pass a file name inside it, e.g. {str(path / 'out')!r}"
        )
    _writable_parent(path)
    return text


def output_dir(text: str) -> str:
    """A folder to write files into (created if missing): not a file, its parent writable."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder; pass a folder path")
    if not path.is_dir():
        _writable_parent(path)
    elif not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"folder {text!r} is not writable; pick another folder")
    return text
