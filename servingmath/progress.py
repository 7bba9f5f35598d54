"""Progress of long work on a terminal: one updating stderr line naming the phase under way.

A command's phases (loading the posterior, compiling and running the search, re-checking the
candidates over posterior draws, simulating) take seconds to minutes; on a terminal the user
sees which one is running, and the line is erased before the answer prints.  Off when stderr is
not a terminal (pipes, files, CI) and under ``--json`` (machine-read output stays clean).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

CLEAR_LINE = "\r\033[K"
"""Carriage return + ANSI erase-to-end-of-line: the next phase overwrites the last."""


class Phases:
    """``phases("searching the grid")`` shows a phase; ``phases.done()`` erases the line.

    Disabled (every call a no-op) when ``enabled`` is False.
    """

    def __init__(self, command: str, *, enabled: bool, stream=None) -> None:
        self.command = command
        self.enabled = enabled
        self.stream = sys.stderr if stream is None else stream
        self.start_s = time.perf_counter()
        self.shown = False

    def __call__(self, phase: str) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start_s
        line = f"{CLEAR_LINE}servingmath {self.command}: {phase} ({elapsed:.0f} s)"
        print(line, end="", file=self.stream, flush=True)
        self.shown = True

    def done(self) -> None:
        if self.enabled and self.shown:
            print(CLEAR_LINE, end="", file=self.stream, flush=True)
            self.shown = False


def phases_for(args: argparse.Namespace) -> Phases:
    """The progress line of ``args.command``: on for a terminal's stderr, off under ``--json``."""
    stream = sys.stderr
    on_terminal = bool(getattr(stream, "isatty", lambda: False)())
    return Phases(args.command, enabled=on_terminal and not getattr(args, "json", False))


def run_with_phases(
    args: argparse.Namespace, body: Callable[[argparse.Namespace, Phases], int]
) -> int:
    """``body(args, phases)`` with the command's progress line, erased however it ends."""
    phases = phases_for(args)
    try:
        return body(args, phases)
    finally:
        phases.done()


def callback(phases: Phases) -> Callable[[str], None] | None:
    """``phases`` as the optional ``progress`` argument of a library call (None when off)."""
    return phases if phases.enabled else None


def simulation_progress(phases: Phases, total: int):
    """A ``progress(finished, total)`` callback updating the command's progress line
    (on a terminal only, never under ``--json``) for runs of 2,000+ requests."""
    if not phases.enabled or total < 2000:
        return None

    def show(done: int, n: int) -> None:
        phases(f"simulated {done:,}/{n:,} requests")

    return show
