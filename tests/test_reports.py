"""``--report`` pages and ``optimize --emit`` files, without a search (the real optimize and
forecast runs with these flags are in ``test_optimize_plots``, on the runs it already makes):

* the generic renderer escapes every text, embeds figures as PNG data URIs and needs nothing
  else; headless Chromium loads it without a console message;
* a fleet run through the CLI (its solvers replaced by a fixed plan: nothing compiles) prints
  ``question`` / ``assumptions`` in its JSON and a page whose numbers are that JSON's;
* launch scripts are valid bash running exactly ``engine_args``' commands, and the manifest has
  one Deployment per pool with the pool's replicas and GPUs per engine, its container args the
  vLLM command's words, every flag one of the vLLM flag table;
* a --report or --emit path that cannot be written is refused before any work.
"""

from __future__ import annotations

import argparse
import json
import subprocess

import numpy as np
import pytest
from report_checks import assert_renders, assert_self_contained, parse_yaml, sheet, table_rows

import optimize
from optimize import FleetPlan, FleetProblem
from optimize._engine_args import engine_args, flag_table
from servingmath.cli import main
from servingmath.reports.html import MISSING, Pre, Table, number, render_html
from servingmath.reports.launch import launch_files, split_command
from servingmath.reports.yaml_text import dump

LLAMA = ["--model", "meta-llama/Llama-3.1-8B", "--prior", "--draws", "8"]


def test_number_keeps_six_significant_digits_and_marks_missing():
    assert number(41.2834567) == "41.2835" and number(3) == "3" and number(1e-7) == "1e-07"
    assert number(None) == MISSING and number(float("inf")) == MISSING
    assert number(True) == "yes" and number("fp8") == "fp8"


def test_render_html_escapes_text_and_embeds_figures(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [1, 0])
    evil = '<script>alert("x")</script> & <img src=http://example.com/a.png>'
    page = render_html(
        f"title {evil}",
        [("model", evil)],
        [
            ("prose " + evil, "first paragraph\n\nsecond " + evil),
            ("table", Table(("a", "b"), [(1, 2.5), (None, evil)])),
            ("pre", Pre("vllm serve m --x 'y' <z>")),
        ],
        [("caption " + evil, fig)],
    )
    plt.close(fig)
    assert_self_contained(page)
    assert evil not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("<p>") == 2 and "vllm serve m --x &#x27;y&#x27; &lt;z&gt;" in page
    path = tmp_path / "page.html"
    path.write_text(page, encoding="utf-8")
    dom = assert_renders(path, tmp_path / "profile")
    assert ["a", "b"] in table_rows(dom) and ["1", "2.5"] in table_rows(dom)
    assert sheet(dom)["model"] == evil  # shown as text, not markup
    assert dom.count("data:image/png;base64,") == 1 and "<script>alert" not in dom


# ------------------------------------------------------------------ fleet through the CLI


def _fixed_fleet(monkeypatch, feasible: bool = True):
    """Replace fleet's problem building and solvers by a fixed 2-class, 2-type instance (no
    plan at all when not ``feasible``)."""
    fp = FleetProblem(
        rates=np.array([6.0, 1.5]),
        capacity=np.array([[4.0, 2.5], [1.0, 0.0]]),
        replica_cost=np.array([[3.99, 1.861], [7.98, 1.861]]),
        replica_gpus=np.array([[1.0, 1.0], [2.0, 1.0]]),
        max_gpus=np.array([np.inf, 4.0]),
    )
    plan = FleetPlan(np.array([[0, 3], [2, 0]]), 2 * 7.98 + 3 * 1.861)
    if not feasible:
        plan = FleetPlan(np.zeros((2, 2), dtype=int), float("inf"))
    exact = FleetPlan(plan.replicas, plan.cost_per_hour * 0.99)
    monkeypatch.setattr(optimize, "make_problem", lambda *a, **k: None)
    no_configs = -np.ones((2, 2, len(optimize.KNOBS)), dtype=np.int32)  # no usable pair
    monkeypatch.setattr(optimize, "fleet_problem", lambda *a, **k: (fp, no_configs))
    monkeypatch.setattr(optimize, "fleet_gradient", lambda *a, **k: plan)
    monkeypatch.setattr(optimize, "fleet_milp", lambda *a: exact)


def test_fleet_report_numbers_are_the_json_numbers(tmp_path, capsys, monkeypatch):
    _fixed_fleet(monkeypatch)
    page = tmp_path / "fleet.html"
    argv = ["fleet", *LLAMA, "--gpus", "h100-sxm,l40s", "--rate", "7.5", "--ttft-p95", "1"]
    argv += ["--max-gpus", "l40s=4", "--json", "--report", str(page)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert f"report: {page}" in captured.err
    q, a = out["question"], out["assumptions"]
    assert q["model"] == "meta-llama/Llama-3.1-8B" and q["gpus"] == ["h100-sxm", "l40s"]
    assert q["workload"]["arrival_rate_per_s"] == 7.5 and q["slo_ttft_p95_s"] == 1.0
    assert q["max_gpus"] == {"l40s": 4.0} and a["posterior"].endswith("(--prior)")
    price = a["prices"]["h100-sxm"]
    assert price["price_per_gpu_hour"] > 0 and "skypilot" in price["source"]  # data/prices.csv
    dom = page.read_text(encoding="utf-8")
    assert_self_contained(dom)
    kv = sheet(dom)
    assert float(kv["cost ($/hour)"]) == pytest.approx(out["cost_per_hour"], rel=1e-5)
    assert float(kv["exact MILP optimum ($/hour)"]) == pytest.approx(
        out["milp_cost_per_hour"], rel=1e-5
    )
    plan_rows = {r[0]: r for r in table_rows(dom) if r[0] in ("h100-sxm", "l40s") and len(r) == 3}
    assert int(plan_rows["h100-sxm"][1]) == out["plan"]["h100-sxm"]["gpus"] == 4
    assert int(plan_rows["l40s"][1]) == out["plan"]["l40s"]["gpus"] == 3
    assert float(kv["arrival rate (requests/s)"]) == 7.5
    (price_row,) = [r for r in table_rows(dom) if r[0] == "h100-sxm" and len(r) == 7]
    assert float(price_row[1]) == pytest.approx(price["price_per_gpu_hour"], rel=1e-5)
    assert price_row[5] == price["source"]
    assert dom.count("data:image/png;base64,") == 1
    shown = assert_renders(page, tmp_path / "profile")  # loads, no console message
    assert (
        "The answer: fleet plan" in shown and sheet(shown)["cost ($/hour)"] == kv["cost ($/hour)"]
    )


def test_fleet_page_lists_each_classs_configuration(tmp_path, capsys, monkeypatch):
    """The configurations fleet's JSON names per class and GPU type are a table of the page (the
    stand-in fleet has none, so the one class gets two here); without any the section is left
    out."""
    from servingmath.reports.pages import fleet_page

    _fixed_fleet(monkeypatch)
    argv = ["fleet", *LLAMA, "--gpus", "h100-sxm,l40s", "--rate", "7.5", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(c["configuration"] == {} for c in out["classes"])
    assert "configuration per GPU type" not in fleet_page(out)
    out["classes"][0]["configuration"] = {
        "h100-sxm": "TP 2 PP 1",
        "l40s": "TP 1 PP 1, speculative mtp k 3",
    }
    page = fleet_page(out)
    rows = table_rows(page)
    assert "configuration per GPU type" in page
    assert ["0", "h100-sxm", "TP 2 PP 1"] in rows
    assert ["0", "l40s", "TP 1 PP 1, speculative mtp k 3"] in rows


def test_infeasible_fleet_still_writes_its_page_and_one_error_line(tmp_path, capsys, monkeypatch):
    _fixed_fleet(monkeypatch, feasible=False)
    page = tmp_path / "fleet.html"
    argv = ["fleet", *LLAMA, "--gpus", "h100-sxm,l40s", "--rate", "7.5", "--report", str(page)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("servingmath fleet: error: ")
    kv = sheet(page.read_text(encoding="utf-8"))
    assert kv["feasible"] == "no" and kv["cost ($/hour)"] == MISSING


# ------------------------------------------------------------------ --emit files


def _answer(split: bool) -> dict:
    """An optimize --json object's fields the launch files read, engine_args real."""
    cfg = {
        "gpu": "h100-sxm",
        "tp": 2,
        "pp": 1,
        "replicas": 3,
        "num_gpus": 6,
        "kv_dtype": "fp8",
        "weight_dtype": "bf16",
        "max_num_batched_tokens": 8192,
        "chunk_size": 2048,
        "max_num_seqs": 256,
        "speculative": None,
        "disaggregation": None,
    }
    if split:  # 2:1 split, prefill on l40s
        cfg["disaggregation"] = {
            "prefill": {"gpu": "l40s", "num_gpus": 4, "tp": 2, "pp": 1, "replicas": 2},
            "decode": {"gpu": "h100-sxm", "num_gpus": 2, "tp": 2, "pp": 1, "replicas": 1},
            "kv_transfer_s": 0.01,
        }
    return {
        "feasible": True,
        **cfg,
        "cost_per_hour": 23.94,
        "engine_args": engine_args("meta-llama/Llama-3.1-8B", cfg),
    }


def _vllm_flags_known(args: list[str]) -> None:
    flags = flag_table("vllm")["flags"]
    used = [w for w in args if w.startswith("--")]
    assert used and all(f in flags for f in used), [f for f in used if f not in flags]


@pytest.mark.parametrize("split", [False, True], ids=["colocated", "split"])
def test_emit_files_follow_the_answer(tmp_path, split):
    out = _answer(split)
    files = launch_files(out)
    assert sorted(files) == ["deployment.yaml", "sglang.sh", "trtllm.sh", "vllm.sh"]
    for engine in ("vllm", "sglang", "trtllm"):
        script = tmp_path / f"{engine}.sh"
        script.write_text(files[f"{engine}.sh"])
        check = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert check.returncode == 0, check.stderr
        keys = [f"{engine}_prefill", f"{engine}_decode"] if split else [engine]
        lines = [line.strip() for line in files[f"{engine}.sh"].splitlines()]
        for key in keys:  # the command verbatim, nothing added
            assert out["engine_args"][key] in lines
    docs = parse_yaml(files["deployment.yaml"])
    pools = (
        [("prefill", out["disaggregation"]["prefill"]), ("decode", out["disaggregation"]["decode"])]
        if split
        else [("engine", out)]
    )
    assert len(docs) == len(pools)
    for doc, (role, pool) in zip(docs, pools):
        assert doc["apiVersion"] == "apps/v1" and doc["kind"] == "Deployment"
        assert doc["spec"]["replicas"] == pool["replicas"]
        assert doc["metadata"]["name"] == f"llama-3-1-8b-{role}"
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert labels["servingmath/gpu"] == pool["gpu"]
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        limits = container["resources"]["limits"]
        assert (
            limits
            == {"nvidia.com/gpu": pool["num_gpus"] // pool["replicas"]}
            == {"nvidia.com/gpu": 2}
        )
        key = f"vllm_{role}" if split else "vllm"
        env, argv = split_command(out["engine_args"][key])
        assert container["command"] + container["args"] == argv
        assert {e["name"]: e["value"] for e in container.get("env", [])} == env
        _vllm_flags_known(container["args"])
        assert container["image"] == f"vllm/vllm-openai:v{flag_table('vllm')['version']}"


def test_yaml_reader_reads_the_subset_and_refuses_the_rest():
    text = (
        "# comment\n"
        'kind: "Deployment"\n'
        "spec:\n"
        "  replicas: 3\n"
        "  empty: {}\n"
        "  containers:\n"
        '  - name: "a \\"b\\": #c"\n'
        "    args:\n"
        '    - "--x"\n'
        '    - "1"\n'
        "    limits:\n"
        "      nvidia.com/gpu: 2\n"
        '  - name: "d"\n'
        "---\n"
        "- true\n"
        "- null\n"
    )
    assert parse_yaml(text) == [
        {
            "kind": "Deployment",
            "spec": {
                "replicas": 3,
                "empty": {},
                "containers": [
                    {"name": 'a "b": #c', "args": ["--x", "1"], "limits": {"nvidia.com/gpu": 2}},
                    {"name": "d"},
                ],
            },
        },
        [True, None],
    ]
    with pytest.raises(ValueError):
        parse_yaml("key: bare words\n")
    value = {"a": [{"b": "x: y # z", "c": [1, 2]}, "s"], "d": {"e": None, "f": []}}
    assert parse_yaml(dump(value)) == [value]


def test_emit_refuses_an_infeasible_answer():
    with pytest.raises(ValueError, match="infeasible"):
        launch_files({"feasible": False, "engine_args": None})


# ------------------------------------------------------------------ bad paths, before any work


@pytest.fixture
def no_work(monkeypatch):
    def reached(args):
        pytest.fail(f"servingmath {args.command} started working on bad input")

    for name in ("optimize", "fleet", "forecast"):
        monkeypatch.setattr(f"servingmath.commands.{name}.run", reached)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (
            ["optimize", "--gpus", "h100-sxm", "--rate", "5", "--report", "{missing}/r.html"],
            "does not exist",
        ),
        (["optimize", "--gpus", "h100-sxm", "--rate", "5", "--report", "{tmp}"], "is a folder"),
        (["optimize", "--gpus", "h100-sxm", "--rate", "5", "--emit", "{file}"], "is a file"),
        (
            ["optimize", "--gpus", "h100-sxm", "--rate", "5", "--emit", "{missing}/x/y"],
            "does not exist",
        ),
        (["fleet", "--gpus", "h100-sxm", "--rate", "5", "--report", "{tmp}"], "is a folder"),
        (
            ["forecast", "--gpus", "h100-sxm", "--demand", "d.csv", "--report", "{file}/r.html"],
            "is a file",
        ),
    ],
)
def test_unwritable_report_and_emit_paths_are_one_line(tmp_path, capsys, no_work, argv, fragment):
    (tmp_path / "file").write_text("x")
    paths = {"missing": tmp_path / "missing", "tmp": tmp_path, "file": tmp_path / "file"}
    argv = [w.format(**paths) for w in argv]
    assert main([*argv[:1], *LLAMA, *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and fragment in err and "Traceback" not in err


def test_check_arguments_refuses_what_the_parser_would(tmp_path):
    """``check_arguments`` re-checks --report / --emit for a Namespace built without the parser."""
    from servingmath.commands import forecast, optimize as optimize_cmd
    from servingmath.errors import UsageError

    with pytest.raises(UsageError, match="--report: .* is a folder"):
        forecast.check_arguments(argparse.Namespace(report=str(tmp_path)))
    (tmp_path / "f").write_text("x")
    ns = argparse.Namespace(spec_draft=None, report=None, emit=str(tmp_path / "f"))
    with pytest.raises(UsageError, match="--emit: .* is a file"):
        optimize_cmd.check_arguments(ns)


@pytest.mark.parametrize("exhaustive", [True, False])
def test_an_infeasible_answer_says_whether_its_bounds_are_the_grids_or_a_searchs(exhaustive):
    """The closest-achievable bounds are exact minima when the whole grid was scored, and only
    what the coordinate search reached otherwise: the message, the text report and the page's
    row say which (``configurations_scored`` of ``configurations_in_grid``)."""
    from servingmath.reports.optimize import infeasible_message, render
    from servingmath.reports.pages import _coverage_text

    scored, grid = (2304, 2304) if exhaustive else (1536, 1169280)
    near = {
        "scale": 2.5,
        "ttft_p95_s": 0.25,
        "tpot_p95_s": 0.02,
        "itl_p95_s": 0.02,
        "configs": {"ttft_p95_s": {"gpu": "h100-sxm", "tp": 4, "pp": 1}},
        "exhaustive": exhaustive,
        "configurations_scored": scored,
        "configurations_in_grid": grid,
    }
    out = {"feasible": False, "binding_constraint": "ttft_p95", "closest_achievable": near}
    args = argparse.Namespace(
        ttft_p95=0.1, tpot_p95=0.05, itl_p95=None, confidence=0.9, max_replicas=64
    )
    line = infeasible_message(out, args, ("h100-sxm",))
    text = render(out, args)
    if exhaustive:
        assert "the best achievable is 0.25 s on h100-sxm TP4 PP1" in line
        assert "closest achievable: TTFT p95" in text
    else:
        found = "found (1,536 of 1,169,280 configurations searched)"
        assert f"the best {found} is 0.25 s on h100-sxm TP4 PP1" in line
        assert f"closest {found}: TTFT p95" in text
    assert "relax --slo-ttft-p95 to >= 0.25" in line and len(line.splitlines()) == 1
    # nothing fits or keeps up: on a partial search that is said of what the search reached
    nothing = {**out, "closest_achievable": {**near, "scale": None}}
    reached = "" if exhaustive else " of the 1,536 (of 1,169,280) the search reached"
    line = infeasible_message(nothing, args, ("h100-sxm",))
    assert f"no candidate in --gpus h100-sxm{reached} fits the model and keeps up" in line
    assert f"infeasible: no candidate{reached} fits the model" in render(nothing, args)
    coverage = _coverage_text(near)
    assert coverage.startswith(f"{scored:,} of {grid:,}")
    assert ("exact minima" in coverage) == exhaustive
