"""The tree is ``ruff format`` and ``ruff check`` clean (settings in ``pyproject.toml``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [("format", "--check"), ("check",)], ids=["format", "check"])
def test_ruff_is_clean(args):
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
