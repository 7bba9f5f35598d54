"""Demand CSVs for the forecast tests (``tests/test_forecast.py``, ``test_optimize_plots.py``,
``test_cli_optimize.py``): one writer instead of a ``write_text`` in each."""

from pathlib import Path


def write_demand(directory: Path, rows, name: str = "demand.csv") -> Path:
    """Write ``rows`` under ``directory``: a CSV text as is, or (period, requests/s[, sd]) tuples
    below the ``period,requests_per_s[,requests_per_s_sd]`` header.  Returns the path."""
    if not isinstance(rows, str):
        rows = list(rows)
        header = "period,requests_per_s" + (",requests_per_s_sd" if len(rows[0]) > 2 else "")
        rows = "\n".join([header] + [",".join(str(v) for v in r) for r in rows]) + "\n"
    path = Path(directory) / name
    path.write_text(rows)
    return path
