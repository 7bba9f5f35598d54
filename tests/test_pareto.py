"""``servingmath pareto`` and ``optimize._pareto``: the frontier is non-dominated, its numbers are
the one load model's (``perfmodel.serving_metrics``, closed loop) at that configuration, more
clients never speed a user up, the JSON is strict, and bad input is one line with exit 2.

One CLI run (Llama-3.1-8B on H100, 6 posterior draws, 4 concurrencies) and one library call with
the same draws share the compiled sweep; the whole module stays well under a minute on 2 cores.
"""

from __future__ import annotations

import contextlib
import io
import json

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import perfmodel as pm
from optimize import ParetoResult, non_dominated, pareto_frontier, pareto_problem
from optimize._draws import efficiency_draws_for
from optimize._grid import KNOBS, MOE, PP, SEQS, TP, layout_degrees
from perfmodel import System
from perfmodel.dynamics import Workload
from servingmath import cli

LLAMA = "meta-llama/Llama-3.1-8B"
GPU = "h100-sxm"
DRAWS = 6
CONCURRENCY = (1, 4, 16, 64)
INPUT, OUTPUT = 512.0, 128.0
ARGS = [
    "pareto",
    "--model",
    LLAMA,
    "--gpus",
    GPU,
    "--draws",
    str(DRAWS),
    "--concurrency",
    ",".join(map(str, CONCURRENCY)),
    "--input-len",
    str(INPUT),
    "--output-len",
    str(OUTPUT),
]
POINT_KEYS = {
    "gpu",
    "tp",
    "pp",
    "moe_layout",
    "ep",
    "attention_dp",
    "weight_dtype",
    "kv_dtype",
    "concurrency",
    "tokens_per_s_per_gpu",
    "tokens_per_s_per_gpu_interval",
    "tokens_per_s_per_user",
    "tokens_per_s_per_user_interval",
    "ttft_seconds",
    "ttft_seconds_interval",
    "cost_per_million_tokens",
    "cost_per_million_tokens_interval",
}


def _strict_json(text: str) -> dict:
    def refuse(constant):
        raise ValueError(f"non-finite {constant} in JSON")

    return json.loads(text, parse_constant=refuse)


def _workload() -> Workload:
    return Workload(prompt_tokens_mean=INPUT, output_tokens_mean=OUTPUT, output_tokens_cv=1.0)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """(exit code, stdout, plot folder) of one ``--json --plot`` run on the bundled posterior."""
    folder = tmp_path_factory.mktemp("pareto")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(
            [*ARGS, "--json", "--plot", str(folder), "--report", str(folder / "plan.html")]
        )
    return code, out.getvalue(), folder


@pytest.fixture(scope="module")
def library(cli_run):
    """(efficiency draws, result) of the library on the CLI run's draws (same seed)."""
    import fitting

    efficiency = efficiency_draws_for((GPU,), DRAWS, posterior=fitting.load_posterior(None), seed=0)
    model = pm.load_model(LLAMA)
    problem = pareto_problem(
        model, (GPU,), _workload(), concurrencies=CONCURRENCY, efficiency=efficiency
    )
    return efficiency, pareto_frontier(problem, (GPU,), model.name)


def _medians(result: ParetoResult) -> tuple[np.ndarray, np.ndarray]:
    s = result.sweep
    return np.median(s.tokens_per_s_per_user, axis=1), np.median(s.tokens_per_s_per_gpu, axis=1)


def test_json_is_strict_and_complete(cli_run):
    code, text, _ = cli_run
    assert code == 0
    out = _strict_json(text)
    assert out["frontier"], out
    for point in out["frontier"]:
        assert POINT_KEYS <= set(point), POINT_KEYS - set(point)
        assert point["gpu"] == GPU and point["concurrency"] in CONCURRENCY
        for key in ("tokens_per_s_per_gpu", "tokens_per_s_per_user", "cost_per_million_tokens"):
            lo, hi = point[f"{key}_interval"]
            assert 0 < lo <= point[key] <= hi, (key, point)
    users = [p["tokens_per_s_per_user"] for p in out["frontier"]]
    gpus = [p["tokens_per_s_per_gpu"] for p in out["frontier"]]
    assert users == sorted(users) and gpus == sorted(gpus, reverse=True)


def test_plot_written(cli_run):
    png = cli_run[2] / "pareto_frontier.png"
    assert png.stat().st_size > 10_000


def test_report_shows_the_json_frontier(cli_run, tmp_path):
    """The --report page is built from the --json object: its frontier table reads the same
    numbers (to the page's 6 significant digits), it states the question, it is
    self-contained, and headless Chromium loads it without a console message."""
    from report_checks import assert_renders, assert_self_contained, sheet, table_rows

    from servingmath.reports.html import number

    out = _strict_json(cli_run[1])
    page = cli_run[2] / "plan.html"
    text = page.read_text(encoding="utf-8")
    assert_self_contained(text)
    rows = [r for r in table_rows(text) if len(r) == 9][1 : 1 + len(out["frontier"])]
    assert [r[0] for r in rows] == [number(p["tokens_per_s_per_user"]) for p in out["frontier"]]
    assert [r[2] for r in rows] == [number(p["tokens_per_s_per_gpu"]) for p in out["frontier"]]
    assert [r[4] for r in rows] == [number(p["cost_per_million_tokens"]) for p in out["frontier"]]
    q = sheet(text)
    assert q["model"] == LLAMA and q["candidate GPUs"] == GPU
    assert q["clients in flight (swept)"] == ", ".join(map(str, CONCURRENCY))
    shown = assert_renders(page, tmp_path / "profile")
    assert sheet(shown)["model"] == LLAMA


def test_cli_and_library_agree(cli_run, library):
    out = _strict_json(cli_run[1])
    assert out["frontier"] == [p.to_json() for p in library[1].frontier]


def test_frontier_is_non_dominated_and_complete(library):
    result = library[1]
    x, y = _medians(result)
    x, y = x[result.eligible], y[result.eligible]
    for p in result.frontier:
        beaten = (x >= p.tokens_per_s_per_user) & (y >= p.tokens_per_s_per_gpu)
        strictly = (x > p.tokens_per_s_per_user) | (y > p.tokens_per_s_per_gpu)
        assert not np.any(beaten & strictly), p
    fx = np.asarray([p.tokens_per_s_per_user for p in result.frontier])
    fy = np.asarray([p.tokens_per_s_per_gpu for p in result.frontier])
    covered = (fx[None, :] >= x[:, None]) & (fy[None, :] >= y[:, None])
    assert covered.any(axis=1).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=30))
def test_non_dominated_property(points):
    x, y = np.asarray(points, dtype=float).T
    keep = non_dominated(x, y)
    for i in np.flatnonzero(keep):
        assert not np.any((x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i])))
    for i in np.flatnonzero(~keep):  # every dropped point is matched or beaten by a kept one
        assert np.any(keep & (x >= x[i]) & (y >= y[i]))
    assert len({(a, b) for a, b in zip(x[keep], y[keep])}) == keep.sum()  # no duplicates kept


def _per_draw(model, hardware, deployment, efficiency, load, num_draws):
    """``perfmodel.serving_metrics`` of the closed loop ``load`` in each of the first
    ``num_draws`` draws of GPU 0's ``efficiency`` (leaves (gpus, draws))."""
    return [
        pm.serving_metrics(
            System(
                model,
                hardware,
                deployment,
                jax.tree_util.tree_map(lambda x, d=d: x[0, d], efficiency),
            ),
            load,
            closed_loop=True,
        )
        for d in range(num_draws)
    ]


def test_frontier_numbers_are_the_load_model_at_that_configuration(library):
    efficiency, result = library
    hardware = pm.load_hardware(GPU)
    price = float(hardware.price_per_gpu_hour)
    for p in result.frontier:
        deployment = pm.Deployment.create(
            tp=p.tp,
            pp=p.pp,
            expert_parallel=float(p.ep),
            attention_dp=float(p.attention_dp),
            weight_dtype=p.weight_dtype,
            kv_dtype=p.kv_dtype,
            max_num_seqs=float(p.concurrency),
            max_num_batched_tokens=float(p.max_num_batched_tokens),
        )
        load = Workload(
            concurrency=float(p.concurrency),
            prompt_tokens_mean=INPUT,
            output_tokens_mean=OUTPUT,
            output_tokens_cv=1.0,
        )
        per_gpu, per_user, ttft = [], [], []
        for m in _per_draw(pm.load_model(LLAMA), hardware, deployment, efficiency, load, DRAWS):
            per_gpu.append(float(m.output_tokens_per_s) / (p.tp * p.pp))
            per_user.append(1.0 / float(m.tpot_s.mean))
            ttft.append(float(m.ttft_s.mean))
        cost = [price * 1e6 / (3600.0 * t) for t in per_gpu]
        for value, draws in (
            (p.tokens_per_s_per_gpu, per_gpu),
            (p.tokens_per_s_per_user, per_user),
            (p.ttft_seconds, ttft),
            (p.cost_per_million_tokens, cost),
        ):
            assert value == pytest.approx(float(np.median(draws)), rel=1e-6), p
        lo, hi = np.quantile(per_gpu, (0.05, 0.95))
        assert p.tokens_per_s_per_gpu_interval == pytest.approx((lo, hi), rel=1e-6)


LOCKSTEP_ARGS = ["--engine", "sglang", "--output-cv", "0", "--concurrency", "16"]
"""SGLang at fixed lengths: its closed loop runs in lockstep (``perfmodel.PREFILL_FIRST_ENGINES``)."""


def test_an_sglang_sweep_at_fixed_lengths_runs_the_lockstep_loop():
    """``pareto --engine sglang`` at fixed lengths prices every point with SGLang's scheduler
    (``Deployment.prefill_first``: the lockstep closed loop) and the lockstep runs' TTFT scale,
    as ``explain`` does for one such run; the desynchronised loop gives another TTFT there."""
    import fitting

    dtypes = ["--kv-dtypes", "bf16", "--weight-dtypes", "bf16"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        # the later --concurrency wins over ARGS's sweep
        code = cli.main([*ARGS, *LOCKSTEP_ARGS, *dtypes, "--json"])
    assert code == 0
    points = _strict_json(out.getvalue())["frontier"]
    assert points
    efficiency = efficiency_draws_for(
        (GPU,),
        DRAWS,
        posterior=fitting.load_posterior(None),
        seed=0,
        engine="sglang",
        lockstep=True,
    )
    hardware, model = pm.load_hardware(GPU), pm.load_model(LLAMA)
    load = Workload(concurrency=16.0, prompt_tokens_mean=INPUT, output_tokens_mean=OUTPUT)
    for p in points:
        ttft = {}
        for first in (1.0, 0.0):
            deployment = pm.Deployment.create(
                tp=p["tp"],
                pp=p["pp"],
                max_num_seqs=16.0,
                max_num_batched_tokens=8192.0,
                prefill_first=first,
            )
            metrics = _per_draw(model, hardware, deployment, efficiency, load, DRAWS)
            ttft[first] = float(np.median([float(m.ttft_s.mean) for m in metrics]))
        assert p["ttft_seconds"] == pytest.approx(ttft[1.0], rel=1e-6), p
        assert abs(ttft[1.0] / ttft[0.0] - 1.0) > 0.01  # the scheduler matters at this load


MOE_MODEL = "Qwen/Qwen3-30B-A3B"
MOE_DRAWS = 4


@pytest.fixture(scope="module")
def moe_sweep():
    """(efficiency draws, problem, result) of a MoE model's sweep over the three layouts, fp8,
    64 clients."""
    import fitting

    efficiency = efficiency_draws_for(
        (GPU,), MOE_DRAWS, posterior=fitting.load_posterior(None), seed=0
    )
    problem = pareto_problem(
        pm.load_model(MOE_MODEL),
        (GPU,),
        _workload(),
        concurrencies=(64,),
        kv_dtypes=("fp8",),
        weight_dtypes=("fp8",),
        moe_layouts=("tp", "ep", "ep+dp"),
        efficiency=efficiency,
    )
    return efficiency, problem, pareto_frontier(problem, (GPU,), MOE_MODEL)


def test_a_moe_models_sweep_prices_each_layout_with_the_one_step_model(moe_sweep):
    """Qwen3-30B-A3B (128 experts, top 8) on H100 at 64 clients: the sweep holds every layout at
    each TP above 1 (TP 1 has only the plain one), each TP 2 point's throughput in every draw is
    ``serving_metrics`` at that layout's expert-parallel and attention-DP degrees, and the three
    layouts price differently (whole experts per rank change the expert GEMMs' shapes; attention
    groups change the KV and attention work per rank)."""
    efficiency, problem, result = moe_sweep
    grid, sweep = problem.grid, result.sweep
    configs = np.asarray(sweep.configs)
    pairs = {(grid.tp[c[TP]], grid.moe_layouts[c[MOE]]) for c in configs}
    for tp in {t for t, _ in pairs}:
        want = {"tp"} if tp == 1 else {"tp", "ep", "ep+dp"}
        assert {name for t, name in pairs if t == tp} == want
    model, hardware = pm.load_model(MOE_MODEL), pm.load_hardware(GPU)
    load = Workload(
        concurrency=64.0, prompt_tokens_mean=INPUT, output_tokens_mean=OUTPUT, output_tokens_cv=1.0
    )
    medians = {}
    for i, c in enumerate(configs):
        if grid.tp[c[TP]] != 2 or grid.pp[c[PP]] != 1:
            continue
        layout = grid.moe_layouts[c[MOE]]
        ep, attention_dp = layout_degrees(layout, 2)
        deployment = pm.Deployment.create(
            tp=2,
            expert_parallel=float(ep),
            attention_dp=float(attention_dp),
            weight_dtype="fp8",
            kv_dtype="fp8",
            max_num_seqs=64.0,
            max_num_batched_tokens=float(grid.max_num_batched_tokens[0]),
        )
        draws = [
            float(m.output_tokens_per_s)
            for m in _per_draw(model, hardware, deployment, efficiency, load, MOE_DRAWS)
        ]
        np.testing.assert_allclose(np.asarray(sweep.output_tokens_per_s[i]), draws, rtol=1e-6)
        medians[layout] = float(np.median(draws))
    assert set(medians) == {"tp", "ep", "ep+dp"}
    values = sorted(medians.values())
    assert values[1] > 1.001 * values[0] and values[2] > 1.001 * values[1]


def test_more_clients_never_speed_a_user_up(library):
    result = library[1]
    s = result.sweep
    others = [k for k in range(len(KNOBS)) if k != SEQS]
    configs = np.asarray(s.configs)
    per_user = np.asarray(s.tokens_per_s_per_user)
    checked = 0
    for key in {tuple(c) for c in configs[:, others]}:
        rows = np.flatnonzero((configs[:, others] == key).all(axis=1) & s.fits)
        rows = rows[np.argsort(configs[rows, SEQS])]
        if len(rows) > 1:
            assert np.all(np.diff(per_user[rows], axis=0) <= 1e-9 * per_user[rows[:-1]])
            checked += 1
    assert checked > 0


def test_slo_keeps_only_points_meeting_it(library):
    efficiency, full = library
    bound = float(np.median([p.tpot_seconds for p in full.frontier]))
    problem = pareto_problem(
        pm.load_model(LLAMA),
        (GPU,),
        _workload(),
        concurrencies=CONCURRENCY,
        efficiency=efficiency,
        slo_tpot_p95_s=bound,
        confidence=0.5,
    )
    result = pareto_frontier(problem, (GPU,), LLAMA)
    assert result.frontier and 0 < result.eligible.sum() < full.eligible.sum()
    share = np.mean(result.sweep.tpot_p95_s[result.eligible] <= bound, axis=1)
    assert np.all(share >= 0.5)
    assert all(p.slo_probability >= 0.5 for p in result.frontier)
    assert result.to_json()["slo_tpot_p95_s"] == bound


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model", LLAMA, "--gpus", "no-such-gpu"], "no-such-gpu"),
        (
            ["--model", "meta-llama/Llama-3.1-405B", "--gpus", "l4", "--weight-dtypes", "bf16"],
            "does not fit",
        ),
        (["--model", LLAMA, "--gpus", GPU, "--concurrency", "0"], "--concurrency"),
        (["--model", LLAMA, "--gpus", GPU, "--concurrency", "1,x"], "--concurrency"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code = cli.main(["pareto", *argv, "--prior", "--draws", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("servingmath") and needle in err[0], err
