"""Run a benchmark script's ``--quick`` mode as the smoke tests do."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_quick(script: str, *args: str) -> subprocess.CompletedProcess:
    """``python benchmarks/<script> --quick [args]`` from the repository root."""
    return run_python(str(ROOT / "benchmarks" / script), "--quick", *args)


def run_python(*argv: str) -> subprocess.CompletedProcess:
    """``python argv...`` from the repository root, its output captured (10-minute limit)."""
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )
