"""Files a command writes: ``--report`` (an HTML page), launch scripts, figures.

Paths are checked while the line is parsed (``validators.output_file`` / ``output_dir``) and
again by ``check_output_paths`` for callers that build a Namespace without the parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError
from .validators import output_dir, output_file


def add_report_argument(parser: argparse.ArgumentParser) -> None:
    """``--report FILE.html`` (validated while parsing: its folder exists and is writable)."""
    parser.add_argument(
        "--report",
        type=output_file,
        default=None,
        metavar="FILE.html",
        help="write a self-contained HTML report (question, answer, intervals, assumptions, "
        "figures), built from the --json output",
    )


def check_output_paths(
    args: argparse.Namespace, *, files: tuple[str, ...] = (), folders: tuple[str, ...] = ()
) -> None:
    """``UsageError`` naming the flag when an output file (``output_file``) or folder
    (``output_dir``) given in ``args`` cannot be written."""
    for names, check in ((files, output_file), (folders, output_dir)):
        for name in names:
            value = getattr(args, name, None)
            if value is None:
                continue
            try:
                check(value)
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"--{name}: {exc}") from None


def write_report(path: str, page: str) -> None:
    """Write an HTML page (UTF-8)."""
    write_text(Path(path), page)


def write_text(path: Path, text: str, *, executable: bool = False) -> None:
    """Write ``text`` at ``path`` (UTF-8; its folder created), mode 0755 when ``executable``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if executable:
        path.chmod(EXECUTABLE_MODE)


EXECUTABLE_MODE = 0o755
"""rwxr-xr-x: a launch script its owner and others can run."""


def close_figures(figures) -> None:
    """Close matplotlib figures (releases pyplot's reference to each); with none, pyplot (~1 s
    to import) is not loaded."""
    figures = list(figures)
    if not figures:
        return
    import matplotlib.pyplot as plt

    for fig in figures:
        plt.close(fig)
