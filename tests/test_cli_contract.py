"""The command-line contract as a property over generated flag values.

For every command, a valid base call plus one to three of its options set to values drawn from
valid, edge and invalid ranges (numbers, zero, negatives, ``nan``, ``inf``, huge and tiny
exponents, empty and non-numeric strings, bogus choices):

* the call exits 0 or 2 and never raises;
* exit 2 prints exactly one line on stderr, naming the command, with no traceback;
* a NaN never gets past the parser into a command's work: no typed (numeric) option has a NaN
  meaning.

The work itself is replaced by a recorder (``run``), so this checks the validation layer alone:
each refusal is cheap and happens before anything compiles.  Named bad inputs and their messages
are in ``test_cli_robustness``; real runs in each command's own tests.
"""

from __future__ import annotations

import argparse
import math
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from servingmath import cli
from servingmath.options.validators import output_dir, output_file, workload_source

LLAMA = ["--model", "meta-llama/Llama-3.1-8B"]
BASES: dict[str, list[str]] = {
    "explain": ["explain", *LLAMA, "--gpu", "h100-sxm", "--prior"],
    "simulate": ["simulate", *LLAMA, "--gpu", "h100-sxm", "--prior", "--requests", "10"],
    "optimize": ["optimize", *LLAMA, "--gpus", "h100-sxm", "--prior", "--draws", "8"],
    "fleet": ["fleet", *LLAMA, "--gpus", "h100-sxm", "--prior", "--draws", "8", "--rate", "5"],
    "forecast": ["forecast", *LLAMA, "--gpus", "h100-sxm", "--prior", "--draws", "8"],
    "pareto": ["pareto", *LLAMA, "--gpus", "h100-sxm", "--prior", "--draws", "8"],
    "validate": ["validate", "--data", "tests/data/ingest/tidy_example.csv"],
    "fit": [
        "fit",
        "--data",
        "tests/data/ingest/tidy_example.csv",
        "--out",
        "/tmp/servingmath-contract.nc",
    ],
}
"""A call of each command that is valid as it stands (the options drawn are added to it)."""

SKIPPED_OPTIONS = {"-h", "--help", "--out", "--csv", "--plot", "--plot-dir", "--save"}
"""Options not drawn: help exits before any check, and output paths are written by the work."""

VALUES = st.sampled_from(
    [
        "1",
        "2",
        "8",
        "0.5",
        "0",
        "-1",
        "-0.0",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "1e308",
        "1e-308",
        "",
        "abc",
        "1,2",
        "h100-sxm",
        "h100-sxm=nan",
        "h100-sxm=4",
        "bf16",
        "mtp",
        "4096",
    ]
)
"""What a user might type after a flag: valid, edge and invalid."""

PATH_TYPES = (output_file, output_dir, workload_source)
"""Option types whose value is a file or folder name: ``nan`` is a legal name there, not a NaN."""


def _options(command: str) -> list[argparse.Action]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = sub.choices[command]._actions
    return [a for a in actions if a.option_strings and not set(a.option_strings) & SKIPPED_OPTIONS]


def _argument(action: argparse.Action, data) -> list[str]:
    flag = action.option_strings[-1]
    if action.nargs == 0:  # store_true / store_false / store_const
        return [flag]
    if action.choices is not None and data.draw(st.booleans()):
        return [flag, str(data.draw(st.sampled_from([*action.choices, "no-such-choice"])))]
    return [flag, data.draw(VALUES)]


def _is_nan(text: str) -> bool:
    try:
        return math.isnan(float(text))
    except ValueError:
        return False


@pytest.mark.parametrize("command", sorted(BASES))
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_call_exits_0_or_2_with_one_line(capsys, command, data):
    options = _options(command)
    chosen = data.draw(
        st.lists(st.sampled_from(options), min_size=1, max_size=3, unique_by=id), label="flags"
    )
    extra = [word for action in chosen for word in _argument(action, data)]
    argv = [*BASES[command], *extra]
    reached = []

    def run(args):
        reached.append(args)
        return 0

    capsys.readouterr()
    with mock.patch(f"servingmath.commands.{command}.run", run):
        code = cli.main(argv)
    _, err = capsys.readouterr()
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, (argv, err)
        assert lines[0].startswith("servingmath"), (argv, err)
    else:
        assert reached, (argv, err)
        typed = {a.option_strings[-1] for a in chosen if a.type not in (None, str, *PATH_TYPES)}
        values = [extra[i + 1] for i, w in enumerate(extra[:-1]) if w in typed]
        assert not any(_is_nan(v) for v in values), f"NaN accepted: {argv}"


def test_every_command_assumes_the_same_default_request():
    """Without --input-len / --output-len, explain and simulate (fixed lengths), optimize (mean
    lengths) and ``Workload()`` describe one request: 1,024 prompt and 256 output tokens."""
    from perfmodel.dynamics import Workload
    from servingmath.options.load import resolve_workload as dynamics_workload
    from servingmath.options.problem import resolve_workload as optimize_workload

    parser = cli.build_parser()
    lengths = set()
    for base in (BASES["explain"], BASES["simulate"]):
        w, _ = dynamics_workload(parser.parse_args([*base, "--rate", "2"]))
        lengths.add((float(w.prompt_tokens_mean), float(w.output_tokens_mean)))
    w = optimize_workload(parser.parse_args([*BASES["optimize"], "--rate", "2"]), 2.0)
    lengths.add((float(w.prompt_tokens_mean), float(w.output_tokens_mean)))
    default = Workload()
    lengths.add((float(default.prompt_tokens_mean), float(default.output_tokens_mean)))
    assert lengths == {(1024.0, 256.0)}
