"""Every notebook's code cells run top to bottom with tiny settings (no Jupyter needed)."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, monkeypatch):
    monkeypatch.setenv("SERVINGMATH_NOTEBOOK_QUICK", "1")
    cells = json.loads(path.read_text())["cells"]
    code = [("".join(c["source"])) for c in cells if c["cell_type"] == "code"]
    assert code, f"{path.name} has no code cells"
    namespace: dict = {}
    for i, source in enumerate(code):
        exec(compile(source, f"{path.name}[cell {i}]", "exec"), namespace)
    assert namespace["QUICK"] is True  # every notebook honours the tiny-settings switch
    if path.name == "quickstart.ipynb":
        assert namespace["sheet"].kv_bytes_per_token == 327680 / 2
        assert 0 < float(namespace["closed"].ttft_s.p95) < float("inf")
    if path.name == "plan_fleet.ipynb":
        assert namespace["fleet_gap"] < 0.02  # gradient fleet plan vs the exact MILP
        assert len(namespace["periods"]) == 2
        assert namespace["fan"].read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_saved_with_its_outputs(path):
    """Read on GitHub, a notebook shows what it computes: every code cell was run in order by
    ``notebooks/save_outputs.py`` and the notebook carries its printed results."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert [c.get("execution_count") for c in cells] == list(range(1, len(cells) + 1))
    printed = [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "stream"]
    assert printed, f"{path.name}: no saved output; run python notebooks/save_outputs.py"
    assert not any("Traceback" in "".join(o["text"]) for o in printed)
