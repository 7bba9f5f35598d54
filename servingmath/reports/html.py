"""One self-contained HTML page from a title, a question, sections and figures.

Generic: a command describes its report as data (``render_html``'s arguments) and this module
turns it into a page that needs nothing else: the style sheet is inline, there is no script,
no font or other request, and every figure is a PNG rendered to memory and embedded as a
base64 ``data:`` URI.  Every piece of text is escaped with ``html.escape``, so a model name or a
file path can never become markup.

A section's content is one of:

* ``str``: prose; a blank line starts a new paragraph;
* ``Pre``: preformatted text (commands, a JSON object), shown verbatim;
* ``Table``: rows under a header row;
* a sequence of rows (each a sequence of cells) without a header: a key/value sheet whose first
  column names the row.

Cells are ``str()``-ed; ``None`` shows as an en dash.  Numbers are formatted by the caller
(``number`` gives the report's convention), so the page shows what the caller decided to show.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from typing import NamedTuple

FIGURE_DPI = 110
"""Resolution of embedded figures (dots per inch): sharp on screen, a few hundred kB a figure."""

SIGNIFICANT_DIGITS = 6
"""Significant digits of a float in a report (``number``): the --json value to 6 digits."""

MISSING = "\N{EN DASH}"
"""What a missing value (``None``, a non-finite float) shows as."""


class Pre(NamedTuple):
    """Preformatted text, shown verbatim in a ``<pre>`` block."""

    text: str


class Table(NamedTuple):
    """Rows of cells under a header row."""

    header: Sequence[object]
    rows: Sequence[Sequence[object]]


Content = str | Pre | Table | Sequence[Sequence[object]]
"""What a section (or the question) holds; see the module docstring."""


def number(x: object, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A value as a report shows it: ints as they are, floats to ``digits`` significant digits
    (``f"{x:.{digits}g}"``), ``None`` and non-finite floats as ``MISSING``, anything else
    ``str``-ed.  ``bool`` is text (yes / no), not a number."""
    if x is None:
        return MISSING
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}" if math.isfinite(x) else MISSING
    return str(x)


def figure_data_uri(figure, dpi: int = FIGURE_DPI) -> str:
    """``data:image/png;base64,...`` of a matplotlib Figure, rendered to memory (no file)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def render_html(
    title: str,
    question: Content,
    sections: Sequence[tuple[str, Content]],
    figures: Sequence[tuple[str, object]] = (),
) -> str:
    """The whole page as text.

    Args:
        title: page title and first heading.
        question: what was asked (model, hardware, load, SLOs, ...), shown first.
        sections: ``(heading, content)`` in page order (the answer first).
        figures: ``(caption, matplotlib Figure)``; each is rendered to a PNG in memory and
            embedded (the figures are not closed: the caller owns them).

    Returns:
        An HTML5 document with no external reference.
    """
    body = [f"<h1>{_text(title)}</h1>", _section("The question", question)]
    body += [_section(heading, content) for heading, content in sections]
    if figures:
        body.append("<section><h2>Figures</h2>")
        body += [
            f'<figure><img src="{figure_data_uri(fig)}" alt="{_text(caption)}">'
            f"<figcaption>{_text(caption)}</figcaption></figure>"
            for caption, fig in figures
        ]
        body.append("</section>")
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'  # no favicon request
        f"<title>{_text(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;"
    "color:#222;line-height:1.4}"
    "h1{font-size:1.5rem}h2{font-size:1.2rem;border-bottom:1px solid #ccc;margin-top:2rem}"
    "table{border-collapse:collapse;margin:.5rem 0}"
    "th,td{border:1px solid #ddd;padding:.25rem .6rem;text-align:left;vertical-align:top}"
    "thead th{background:#f3f3f3}tbody th{font-weight:600;background:#fafafa}"
    "pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;white-space:pre-wrap;"
    "word-break:break-all}"
    "figure{margin:1rem 0}img{max-width:100%}figcaption{color:#555;font-size:.9rem}"
)


def _text(value: object) -> str:
    return html.escape(number(value), quote=True)


def _section(heading: str, content: Content) -> str:
    return f"<section><h2>{_text(heading)}</h2>\n{_content(content)}\n</section>"


def _content(content: Content) -> str:
    if isinstance(content, Pre):
        return f"<pre>{_text(content.text)}</pre>"
    if isinstance(content, str):
        paragraphs = [p.strip() for p in content.split("\n\n") if p.strip()]
        return "\n".join(f"<p>{_text(p)}</p>" for p in paragraphs)
    if isinstance(content, Table):
        head = "".join(f'<th scope="col">{_text(c)}</th>' for c in content.header)
        rows = "".join(
            "<tr>" + "".join(f"<td>{_text(c)}</td>" for c in row) + "</tr>" for row in content.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    rows = "".join(
        f'<tr><th scope="row">{_text(row[0])}</th>'
        + "".join(f"<td>{_text(c)}</td>" for c in row[1:])
        + "</tr>"
        for row in content
    )
    return f"<table><tbody>{rows}</tbody></table>"
