"""Benchmarks stay runnable: their ``--quick`` modes run to the end and print their table (the
search, simulator, feature and speed benchmarks; the fitting ones are in
``test_benchmarks_smoke_fits.py``, a file of their own so the suite's two workers share them)."""

import json
import re

import pytest
from benchmark_runs import run_python, run_quick as _quick

from perfmodel.dynamics import CORRECTIONS


def test_search_agreement_quick_prints_its_table():
    out = _quick("bench_search_agreement.py")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| problem") and any("pooled" in r for r in rows)
    pooled = next(r for r in rows if "pooled" in r).split("|")
    ttft, tpot = (float(cell.split()[0]) for cell in pooled[3:5])
    assert 0.85 <= ttft <= 1.15 and 0.85 <= tpot <= 1.15


def test_simulator_vs_measured_quick_scores_both_predictors():
    """``benchmarks/bench_simulator_vs_measured.py`` in its smoke mode: 4 measured closed-loop
    runs through the closed form and the simulator (same step, same efficiencies), and the
    summary's pooled rows (TPOT, which both predict within a few tens of per cent, as a check).
    The answer for a lab held out scales the closed form's TTFT up: every lab measured TTFT
    above the physics, so a stage fitted on the other labs does too."""
    out = _quick("bench_simulator_vs_measured.py")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    runs = [r for r in lines if r.startswith(("| aiconfigurator", "| inferencemax"))]
    assert len([r for r in runs if r.count("|") == 12]) == 4  # one row per run
    pooled = {r.split("|")[3].strip(): r.split("|") for r in lines if r.startswith("| **pooled")}
    assert set(pooled) == {
        "closed form",
        "simulator",
        "answer, lab held out",
        "simulator / closed form",
    }
    for label in ("closed form", "simulator", "answer, lab held out"):
        assert 0.5 <= float(pooled[label][6]) <= 2.0  # median TPOT predicted / measured
    assert float(pooled["answer, lab held out"][4]) > float(pooled["closed form"][4])
    assert 0.7 <= float(pooled["simulator / closed form"][6].split()[0]) <= 1.3


def test_referee_quick_scores_the_recommendation_against_the_full_model():
    """``benchmarks/bench_referee.py`` in its smoke mode: one small problem through the CLI's
    optimize pipeline, the full-model referee over its grid and the simulator; the table prints
    and the referee accepts the recommendation the verdict accepted."""
    out = _quick("bench_referee.py")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("| problem | recommendation")
    rows = [r.split("|") for r in lines if r.startswith("| 8B chat")]
    assert len(rows) == 2  # the results row and the wall-time row
    result = rows[0]
    assert float(result[7]) > 0 and float(result[6]) > 0  # both costs, $/h
    assert float(result[7]) >= 1.0 - 1e-9  # the referee's cheapest is no dearer than the answer
    assert float(result[4].split("/")[1]) >= 0.9  # the referee's P of the recommendation
    assert "within 5 % of the referee: " in out.stdout


def test_fleet_quick_never_beats_or_contradicts_the_exact_milp():
    """``benchmarks/bench_fleet.py --quick``: the relaxed fleet mix against ``scipy``'s MILP on 3
    random instances; the MILP is exact, so the gradient plan is never cheaper (gap >= 0) and
    never feasible where the MILP finds none."""
    out = _quick("bench_fleet.py")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "instances: 3 " in out.stdout and "infeasible reported feasible: 0" in out.stdout
    gaps = re.search(r"median gap (-?[\d.]+)%, worst (-?[\d.]+)%", out.stdout)
    median, worst = float(gaps.group(1)), float(gaps.group(2))
    assert 0.0 <= median <= worst


def test_simulator_quick_serves_the_trace_both_ways():
    """``benchmarks/bench_simulator.py --quick``: 500 requests of the Azure trace, with and
    without chunked prefill; both serve every request of the same trace, so their output
    throughput agrees, and each percentile line is ordered."""
    out = _quick("bench_simulator.py")
    assert out.returncode == 0, out.stderr[-2000:]
    pat = (
        r"chunked=(True|False).*TTFT p50 ([\d.]+) s p95 ([\d.]+) s \| "
        r"TPOT p50 ([\d.]+) ms p95 ([\d.]+) ms \| (\d+) tok/s"
    )
    runs = {m[0]: [float(x) for x in m[1:]] for m in re.findall(pat, out.stdout)}
    assert set(runs) == {"True", "False"}
    for ttft50, ttft95, tpot50, tpot95, tokens in runs.values():
        assert 0 < ttft50 <= ttft95 and 0 < tpot50 <= tpot95 and tokens > 0
    assert runs["True"][4] == pytest.approx(runs["False"][4], rel=0.05)


def test_sheet_quick_vectorised_equals_the_loop():
    """``benchmarks/bench_sheet.py --quick``: the budget sheet vmapped over 7,680 configurations
    agrees with one call per configuration on the sampled ones."""
    out = _quick("bench_sheet.py")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "grid: 7,680 configurations" in out.stdout
    assert "vectorized == loop on sample: True" in out.stdout


def _table_rows(stdout: str, title: str) -> list[list[str]]:
    """The body rows of the markdown table printed under the heading that contains ``title``."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("###") and title in line)
    body = []
    for line in lines[start + 3 :]:  # heading, header row, rule
        if not line.startswith("|"):
            break
        body.append([cell.strip() for cell in line.strip("|").split("|")])
    return body


def test_features_quick_prints_finite_tables_and_the_cache_pays():
    """``benchmarks/bench_features.py --quick``: every feature's table prints without a NaN
    (a prompt longer than the engine's context is a rejected request, not a NaN latency); on
    the Mooncake trace a larger prefix cache reuses more prompt tokens and so lowers the mean
    TTFT (reused tokens skip their prefill)."""
    out = _quick("bench_features.py")
    assert out.returncode == 0, out.stderr[-2000:]
    assert not re.search(r"\bnan\b", out.stdout, flags=re.IGNORECASE)
    engine = _table_rows(out.stdout, "Mooncake trace through the engine")
    reused = [float(r[2]) for r in engine]
    ttft_mean = [float(r[3]) for r in engine]
    assert len(engine) == 3 and reused[0] == 0.0
    assert reused == sorted(reused) and reused[-1] > reused[0]
    assert ttft_mean == sorted(ttft_mean, reverse=True) and ttft_mean[-1] < ttft_mean[0]
    for title in (
        "Prefix cache",
        "Speculative decoding, Llama-3.1-8B",
        "Disaggregation",
        "Host KV",
    ):
        assert _table_rows(out.stdout, title)


def test_cli_speed_quick_times_the_import_floor_and_the_budget_sheet():
    """``benchmarks/bench_cli_speed.py --quick``: the import floor (``gpus``) and the budget
    sheet, each cold then warm as new processes; both exit 0 and the warm-over-floor ratio is
    the sheet's warm time over the floor's (no timing asserted: the machine is shared)."""
    out = _quick("bench_cli_speed.py")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = {r[0]: r for r in (line.strip("|").split("|") for line in out.stdout.splitlines())}
    rows = {k.strip(): [c.strip() for c in v] for k, v in rows.items()}
    floor, sheet = rows["gpus (import floor)"], rows["explain (budget sheet)"]
    assert float(floor[3]) == 1.0  # the floor over itself
    for row in (floor, sheet):
        cold, warm, rss = float(row[1]), float(row[2]), float(row[4])
        assert cold > 0 and warm > 0 and 0 < rss < 4.0
    assert float(sheet[3]) == pytest.approx(float(sheet[2]) / float(floor[2]), rel=0.1)


def test_optimize_quick_search_reaches_the_referees_optimum():
    """``benchmarks/bench_optimize.py --quick``: the gradient search against the exhaustive
    referee on 2 random instances of a small grid (same model, same draws); an answer the
    re-check finds infeasible would be counted, and the referee enumerates the whole grid."""
    out = _quick("bench_optimize.py")
    assert out.returncode == 0, out.stderr[-2000:]
    counts = re.search(r"instances: (\d+) \(draws (\d+), grid (\d+) configuration", out.stdout)
    assert counts and (int(counts[1]), int(counts[2])) == (2, 16) and int(counts[3]) > 0
    within = re.search(r"within 1% of the exhaustive optimum: (\d+)/(\d+)", out.stdout)
    assert within and within[1] == within[2] == "2"
    assert "infeasible reported feasible: 0;" in out.stdout


def test_queueing_grid_quick_feeds_the_corrections_fit_and_the_seat_diagnostic(tmp_path):
    """``benchmarks/bench_queueing_vs_sim.py --quick --save`` (4 grid points through the closed
    form and the simulator), then what reads its file: ``python -m fitting.queueing_corrections
    --quick`` (the TTFT terms of ``CORRECTIONS`` refitted for 10 simplex steps from the shipped
    values, so the corrected score is printed beside the uncorrected one) and
    ``benchmarks/diagnose_seats.py --quick`` (the running count and iteration mix of one point)."""
    points = tmp_path / "points.json"
    out = _quick("bench_queueing_vs_sim.py", "--save", str(points))
    assert out.returncode == 0, out.stderr[-2000:]
    saved = json.loads(points.read_text())
    assert len(saved) == 4 and {p["chunked"] for p in saved} == {True, False}
    for p in saved:
        assert 0 < p["sim"]["ttft_s"]["p50"] <= p["sim"]["ttft_s"]["p95"]
        assert 0 < p["cf"]["ttft_s"]["p50"] <= p["cf"]["ttft_s"]["p95"]
    assert "| all points | 4 |" in out.stdout

    fit = run_python("-m", "fitting.queueing_corrections", "--quick", str(points))
    assert fit.returncode == 0, fit.stderr[-2000:]
    shipped = re.search(r"CORRECTIONS = \(([^)]*)\)", fit.stdout)
    assert shipped and len(shipped[1].split(",")) == len(CORRECTIONS)
    assert "uncorrected: p95 TTFT within 15%" in fit.stdout
    assert "corrected: p95 TTFT within 15%" in fit.stdout

    seats = _quick("diagnose_seats.py", str(points))
    assert seats.returncode == 0, seats.stderr[-2000:]
    assert seats.stdout.count("running N: sim") == 1 and "1000 requests" in seats.stdout
