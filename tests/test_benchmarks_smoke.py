"""Benchmarks stay runnable: their ``--quick`` modes run to the end and print their table."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quick(script: str) -> subprocess.CompletedProcess:
    """``python benchmarks/<script> --quick`` from the repository root."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )


def test_search_agreement_quick_prints_its_table():
    out = _quick("bench_search_agreement.py")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| problem") and any("pooled" in r for r in rows)
    pooled = next(r for r in rows if "pooled" in r).split("|")
    ttft, tpot = (float(cell.split()[0]) for cell in pooled[3:5])
    assert 0.85 <= ttft <= 1.15 and 0.85 <= tpot <= 1.15


def test_refit_quick_runs_the_bundled_pipeline_and_prints_its_table():
    """The reproducibility check of the bundled posterior (``benchmarks/bench_refit.py``, a
    long fit) in its smoke mode: the bundled data and settings fit, and the table compares the
    same GPUs and cells as ``default.nc``."""
    out = _quick("bench_refit.py")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| parameter") and len(rows) == 1 + 9
    assert "same GPUs and cells as the bundled file: yes" in out.stdout
