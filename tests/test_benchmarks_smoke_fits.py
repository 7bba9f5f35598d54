"""The fitting benchmarks stay runnable: their ``--quick`` modes (tiny fits, a few hundred rows)
run to the end and print their tables."""

import re

from benchmark_runs import run_quick as _quick


def test_refit_quick_runs_the_bundled_pipeline_and_prints_its_table():
    """The reproducibility check of the bundled posterior (``benchmarks/bench_refit.py``, a
    long fit) in its smoke mode: the bundled data and settings fit, and the table compares the
    same GPUs and cells as ``default.nc``."""
    out = _quick("bench_refit.py")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| parameter") and len(rows) == 1 + 9
    assert "same GPUs and cells as the bundled file: yes" in out.stdout


def test_new_gpu_e2e_quick_scores_the_spec_sheet_and_an_update():
    """``benchmarks/bench_new_gpu_e2e.py`` in its smoke mode: one GPU treated as new, its
    spec-sheet prediction (k = 0) and an update on 3 of its own runs scored on the same rows."""
    out = _quick("bench_new_gpu_e2e.py")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split("|") for line in out.stdout.splitlines() if line.startswith("| h100-sxm")]
    assert [int(r[2]) for r in rows] == [0, 3]
    assert all(int(r[3]) == 200 for r in rows)  # both score the same held-back rows
    for r in rows:
        ape, cov50, cov90 = (float(cell.split()[0]) for cell in r[4:7])
        assert 0 < ape < 100 and 0 <= cov50 <= cov90 <= 100
    assert "target after 10 runs" in out.stdout


def test_e2e_holdout_quick_predicts_every_lab_from_the_others():
    """``benchmarks/bench_e2e_holdout.py --quick --split source`` (the headline's held-out
    figures, on a few hundred rows): each of the three labs is held out of the end-to-end stage
    and scored, the pooled rows and the signed tables print, and every APE and coverage is a
    proportion (a run called overloaded counts as a miss, so an APE may be infinite)."""
    out = _quick("bench_e2e_holdout.py", "--split", "source")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [r.split("|") for r in out.stdout.splitlines() if r.startswith("| ")]
    per_lab = [r for r in rows if len(r) == 10 and r[2].strip() in ("serving", "saturated")]
    labs = {r[1].strip() for r in per_lab if r[1].strip()}  # pooled rows leave it empty
    assert labs == {"aiconfigurator-silicon", "inferencemax", "mlperf-inference-v4.1"}
    total = next(r for r in rows if r[1].strip() == "**all**")
    ape = float(total[5].strip(" *%"))
    cov50, cov90 = (float(c.strip(" %")) for c in total[6:8])
    assert 0 < ape < 100 and 0 <= cov50 <= cov90 <= 100
    assert "| held out | engine | TTFT n |" in out.stdout  # serving, signed by engine
    # serving TTFT signed by band of the predicted TTFT (seconds "lo-hi" in the third cell)
    bands = [r for r in rows if len(r) == 8 and re.fullmatch(r" [0-9.]+-([0-9.]+|inf) ", r[2])]
    assert bands and all(abs(float(r[4])) < 5 for r in bands)
    assert all(float(r[2].split("-")[0]) < float(r[2].split("-")[1]) for r in bands)
    # saturated throughput signed by GPU and model (a Hugging Face id in the third cell)
    saturated = [r for r in rows if len(r) == 8 and "/" in r[3]]
    assert saturated and {r[1].strip() for r in saturated} == {"mlperf-inference-v4.1"}
    assert all(abs(float(r[5])) < 5 for r in saturated)  # a log ratio, signed


def test_new_gpu_quick_scores_the_spec_sheet_and_the_update_on_the_same_rows():
    """``benchmarks/bench_new_gpu.py --quick``: the A40 treated as new (its own parameters
    removed from the bundled posterior), predicted from its spec sheet and after an update on
    10 of its rows; both score the same held-back rows, and the user's command prints."""
    out = _quick("bench_new_gpu.py")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("a40 ")]
    assert [r[2] for r in rows] == ["spec-sheet", "updated"]
    assert rows[0][3] == rows[1][3] and 0 < int(rows[0][3]) <= 50
    for r in rows:
        ape, cov50, cov90 = (float(r[i].rstrip("%")) for i in (4, 6, 7))
        assert 0 < ape < 100 and 0 <= cov50 <= cov90 <= 100
    assert "command: servingmath fit --data a40_10rows.csv --prior" in out.stdout


def test_calibration_quick_leaves_a_gpu_out_of_the_fit():
    """``benchmarks/bench_calibration.py --quick``: a tiny NUTS fit without any A40 row, then the
    A40's rows predicted from its spec sheet and the population (the fit asserts the GPU is not
    in its posterior); the total and the per-scenario lines print."""
    out = _quick("bench_calibration.py")
    assert out.returncode == 0, out.stderr[-2000:]
    pat = r"(leave out a40|  \w+)\s+n=\s*(\d+)\s+median APE\s+([\d.]+)%.*cov50\s+(\d+)%\s+cov90\s+(\d+)%"
    lines = {m[0].strip(): m[1:] for m in re.findall(pat, out.stdout)}
    n, ape, cov50, cov90 = lines.pop("leave out a40")
    assert 0 < int(n) <= 100 and 0 < float(ape) < 100 and 0 <= int(cov50) <= int(cov90) <= 100
    assert lines and sum(int(v[0]) for v in lines.values()) == int(n)
