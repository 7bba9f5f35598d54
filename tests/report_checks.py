"""Checks shared by the ``--report`` / ``--emit`` tests (``test_reports.py``,
``test_optimize_plots.py``): the page rendered in headless Chromium, its key/value rows read
back, its self-containment, and a reader for the YAML subset ``servingmath.reports.yaml_text``
writes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
"""Headless browser (Debian's ``chromium``; ``.ci/run`` installs it when missing)."""

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)


def rendered_dom(page: Path, profile: Path) -> str:
    """The DOM of ``page`` after headless Chromium loaded it; fails the test on any console
    message (the page has no script, so any is an error) or a failed load.  Chromium is part of
    the test set-up (``.ci/run`` installs it), so its absence fails the test."""
    assert CHROMIUM is not None, (
        "chromium is not installed: apt-get install chromium (.ci/run does)"
    )
    proc = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    console = [
        line for line in proc.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line
    ]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not console, console
    assert "<h1>" in proc.stdout, proc.stdout[:2000]
    return proc.stdout


def assert_renders(page: Path, profile: Path) -> str:
    """``rendered_dom`` of ``page``, whose tables must read exactly as the file's (the browser
    shows what was written)."""
    dom = rendered_dom(page, profile)
    assert table_rows(dom) == table_rows(page.read_text(encoding="utf-8"))
    return dom


def assert_self_contained(page_text: str) -> None:
    """No script, frame or object; every ``src`` / ``href`` a ``data:`` URI (figures PNG); the
    style sheet inline, importing nothing."""
    parser = _Tags()
    parser.feed(page_text)
    assert not {"script", "iframe", "object", "embed", "base"} & {t for t, _ in parser.tags}
    for tag, attrs in parser.tags:
        for name in ("src", "href", "srcset", "action", "poster", "data"):
            value = attrs.get(name)
            assert value is None or value.startswith("data:"), (tag, name, value)
        if tag == "img":
            assert attrs["src"].startswith("data:image/png;base64,")
    assert "url(" not in parser.style and "@import" not in parser.style


class _Tags(HTMLParser):
    """Start tags with their attributes, and the text of ``<style>`` elements."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.style = ""
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.style += data


class _Rows(HTMLParser):
    """Rows of every table: [heading cell text, data cell texts...]; ``keyed``: indices of the
    rows a ``<th scope="row">`` names (key/value sheets)."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.keyed: set[int] = set()
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
            if tag == "th" and ("scope", "row") in attrs:
                self.keyed.add(len(self.rows) - 1)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def table_rows(dom: str) -> list[list[str]]:
    """Every table row of ``dom`` as its cells' text (entities decoded)."""
    parser = _Rows()
    parser.feed(dom)
    return parser.rows


def sheet(dom: str) -> dict[str, str]:
    """Key/value rows (row heading -> second cell) of every key/value table in ``dom``."""
    parser = _Rows()
    parser.feed(dom)
    return {parser.rows[i][0]: parser.rows[i][1] for i in sorted(parser.keyed)}


# ------------------------------------------------------------------ YAML subset reader


def parse_yaml(text: str) -> list:
    """Documents of block YAML as ``yaml_text.dump`` writes it: mappings, sequences (items at
    the key's indentation or deeper), JSON scalars (quoted strings, ints, true/false/null, {},
    []), ``#`` comment lines and ``---`` separators.  Anything else is a ``ValueError``."""
    documents: list[list[tuple[int, str]]] = [[]]
    for raw in text.splitlines():
        if raw.strip() == "---":
            documents.append([])
        elif raw.strip() and not raw.lstrip().startswith("#"):
            documents[-1].append((len(raw) - len(raw.lstrip(" ")), raw.strip()))
    out = []
    for lines in filter(None, documents):
        value, end = _block(lines, 0, lines[0][0])
        if end != len(lines):
            raise ValueError(f"unparsed line: {lines[end]}")
        out.append(value)
    return out


def _block(lines, i, indent):
    if lines[i][1].startswith("-"):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _sequence(lines, i, indent):
    out = []
    while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("-"):
        item = lines[i][1][1:].strip()
        if _is_key(item):
            lines = [*lines[:i], (indent + 2, item), *lines[i + 1 :]]
            value, i = _mapping(lines, i, indent + 2)
        else:
            value, i = _scalar(item), i + 1
        out.append(value)
    return out, i


def _mapping(lines, i, indent):
    out = {}
    while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("-"):
        if not _is_key(lines[i][1]):
            raise ValueError(f"not a key: {lines[i]}")
        key, _, rest = lines[i][1].partition(":")
        i += 1
        if rest.strip():
            out[key] = _scalar(rest.strip())
        elif i < len(lines) and (
            lines[i][0] > indent or (lines[i][0] == indent and lines[i][1].startswith("-"))
        ):
            out[key], i = _block(lines, i, lines[i][0])
        else:
            out[key] = None
    return out, i


def _is_key(text: str) -> bool:
    return re.match(r"^[A-Za-z_][A-Za-z0-9_./-]*:( |$)", text) is not None


def _scalar(text: str):
    if text == "{}":
        return {}
    if text == "[]":
        return []
    if text.startswith('"') or text in ("true", "false", "null") or re.fullmatch(r"-?\d+", text):
        return json.loads(text)
    raise ValueError(f"not a scalar of the subset: {text!r}")
