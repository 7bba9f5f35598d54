"""Run every notebook top to bottom at its full settings and save its outputs into the file.

    python notebooks/save_outputs.py                      # all notebooks in this folder
    python notebooks/save_outputs.py notebooks/quickstart.ipynb

No Jupyter kernel is needed: each code cell runs in one shared namespace, as ``tests/
test_notebooks.py`` runs them; what a cell prints becomes its ``stream`` output, a final
expression its ``execute_result`` (as Jupyter shows it), and each matplotlib figure it leaves
open an ``image/png`` display (then closed).  Run from the repository root after changing a
notebook or the model, so the outputs on GitHub match the code.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import io
import json
import sys
import time
import types
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
_SHOWN: list[dict] = []
"""Displays the running cell asked for (``IPython.display.display`` stand-in)."""


class _Image:
    """``IPython.display.Image(filename=...)``: a PNG file to show."""

    def __init__(self, filename: str | None = None, data: bytes | None = None) -> None:
        self.png = Path(filename).read_bytes() if filename is not None else data


def _display(*objects) -> None:
    for obj in objects:
        if isinstance(obj, _Image):
            data = {"image/png": base64.b64encode(obj.png).decode("ascii")}
        else:
            data = {"text/plain": repr(obj).splitlines(True)}
        _SHOWN.append({"output_type": "display_data", "data": data, "metadata": {}})


def _install_display() -> None:
    """A minimal ``IPython.display`` (``Image``, ``display``) when IPython is not installed, so a
    notebook's "inside Jupyter, show them" cells save their figures too."""
    try:
        import IPython.display  # noqa: F401
    except ImportError:
        ipython = types.ModuleType("IPython")
        display = types.ModuleType("IPython.display")
        display.Image, display.display = _Image, _display
        ipython.display = display
        ipython.get_ipython = lambda: None  # no shell: matplotlib installs no REPL hook
        ipython.version_info = (9, 0)  # what matplotlib checks before touching a shell
        sys.modules["IPython"], sys.modules["IPython.display"] = ipython, display


def _split_last_expression(source: str) -> tuple[str, str | None]:
    """(statements, final expression or None): a cell's last expression is shown, as Jupyter does."""
    tree = ast.parse(source)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
        return ast.unparse(tree), ast.unparse(last)
    return source, None


def _figures() -> list[dict]:
    out = []
    for number in plt.get_fignums():
        buffer = io.BytesIO()
        plt.figure(number).savefig(buffer, format="png", dpi=80, bbox_inches="tight")
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        out.append({"output_type": "display_data", "data": {"image/png": data}, "metadata": {}})
    plt.close("all")
    return out


def run_notebook(path: Path) -> float:
    """Execute ``path``'s code cells, write their outputs into it; returns the seconds taken."""
    notebook = json.loads(path.read_text())
    namespace: dict = {"__name__": "__main__"}
    t0 = time.perf_counter()
    count = 0
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        count += 1
        body, last = _split_last_expression("".join(cell["source"]))
        stdout, stderr = io.StringIO(), io.StringIO()
        _SHOWN.clear()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            exec(compile(body, f"{path.name}[cell {count}]", "exec"), namespace)  # noqa: S102 (running a notebook is the job)
            value = eval(last, namespace) if last is not None else None
        outputs = [
            {"output_type": "stream", "name": name, "text": text.getvalue().splitlines(True)}
            for name, text in (("stdout", stdout), ("stderr", stderr))
            if text.getvalue()
        ]
        if value is not None:
            outputs.append(
                {
                    "output_type": "execute_result",
                    "execution_count": count,
                    "data": {"text/plain": repr(value).splitlines(True)},
                    "metadata": {},
                }
            )
        outputs += list(_SHOWN) + _figures()
        cell["outputs"] = outputs
        cell["execution_count"] = count
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    _install_display()
    paths = [Path(a) for a in argv] or sorted(HERE.glob("*.ipynb"))
    for path in paths:
        seconds = run_notebook(path)
        print(f"{path}: outputs saved ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
