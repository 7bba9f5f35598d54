"""Progress of long commands: one updating stderr line on a terminal, nothing otherwise."""

import argparse
import io
import json

import pandas as pd

import fitting
from servingmath import progress
from servingmath.cli import main
from servingmath.progress import CLEAR_LINE, Phases, phases_for


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_phases_overwrite_one_line_and_erase_it():
    stream = io.StringIO()
    phases = Phases("optimize", enabled=True, stream=stream)
    phases("loading the posterior")
    phases("searching 12 configurations")
    phases.done()
    text = stream.getvalue()
    assert "\n" not in text  # one line, rewritten in place
    assert text.count(CLEAR_LINE) == 3 and text.endswith(CLEAR_LINE)
    assert "servingmath optimize: loading the posterior (" in text
    assert "servingmath optimize: searching 12 configurations (" in text


def test_disabled_phases_write_nothing():
    stream = io.StringIO()
    phases = Phases("fit", enabled=False, stream=stream)
    phases("sampling")
    phases.done()
    assert stream.getvalue() == "" and progress.callback(phases) is None


def test_on_only_for_a_terminal_and_never_under_json(monkeypatch):
    monkeypatch.setattr("sys.stderr", _Terminal())
    assert phases_for(argparse.Namespace(command="validate", json=False)).enabled
    assert not phases_for(argparse.Namespace(command="validate", json=True)).enabled
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not phases_for(argparse.Namespace(command="validate", json=False)).enabled


def test_validate_on_a_terminal_shows_its_phases_then_erases_them(tmp_path, monkeypatch, capsys):
    raw = pd.read_csv(fitting.bundled_measurements()[0].parent / "trtllm_docs.csv")
    rows = tmp_path / "rows.csv"
    raw.sample(12, random_state=0).to_csv(rows, index=False)
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["validate", "--data", str(rows), "--draws", "20"]) == 0
    err = terminal.getvalue()
    assert "servingmath validate: reading the posterior and the measurements" in err
    assert "servingmath validate: predicting 12 rows x 20 draws" in err
    assert err.endswith(CLEAR_LINE)  # erased before the report
    assert "on 12 rows" in capsys.readouterr().out

    terminal.truncate(0)
    terminal.seek(0)
    assert main(["validate", "--data", str(rows), "--draws", "20", "--json"]) == 0
    assert terminal.getvalue() == ""  # --json: no progress line
    json.loads(capsys.readouterr().out)
