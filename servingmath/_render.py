"""Plain-text rendering helpers for human output."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """Binary units: 1.5 GiB, 512.0 KiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} B" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_seconds(s: float) -> str:
    """Seconds, milliseconds or microseconds, three significant figures."""
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def table(rows: list[tuple[str, str]]) -> str:
    """Two left-aligned columns."""
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
