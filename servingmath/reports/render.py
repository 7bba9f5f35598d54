"""Rendering helpers: plain text for people, JSON-ready values for ``--json``."""

from __future__ import annotations

import math

LATENCY_KEYS = ("mean", "p50", "p95", "p99")
"""What every latency summary reports, in seconds: ``perfmodel``'s ``Percentiles`` fields and
the simulator summary's keys."""


def finite_or_none(x: float) -> float | None:
    """``x`` as a float, or None (JSON ``null``) when it is infinite (overloaded) or NaN."""
    return float(x) if math.isfinite(float(x)) else None


def latency_json(p) -> dict:
    """A latency summary (a ``Percentiles`` or a simulator summary's dict) as JSON-ready
    ``LATENCY_KEYS`` -> seconds or None."""
    return {k: finite_or_none(p[k] if isinstance(p, dict) else getattr(p, k)) for k in LATENCY_KEYS}


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


def layout_text(d: dict) -> str:
    """ ", EP 8, attention DP 8" for a MoE layout other than experts split by TP (the ``ep`` and
    ``attention_dp`` of ``explain``'s and ``optimize``'s JSON); "" for TP alone."""
    return "".join(
        f", {label} {d[key]}"
        for key, label in (("ep", "EP"), ("attention_dp", "attention DP"))
        if (d.get(key) or 1) > 1
    )


def pools_text(out: dict) -> str:
    """A pool split's engines: "prefill pool 4 x h100-sxm (TP 8, PP 1) + decode pool 2 x
    h100-sxm (TP 2, PP 1) = 36 GPUs" (``optimize``'s JSON, ``disaggregation`` set)."""
    p, q = out["disaggregation"]["prefill"], out["disaggregation"]["decode"]
    return (
        f"prefill pool {p['replicas']} x {p['gpu']} (TP {p['tp']}, PP {p['pp']}) + decode pool "
        f"{q['replicas']} x {q['gpu']} (TP {q['tp']}, PP {q['pp']}) = {out['num_gpus']} GPUs"
    )


def table(rows: list[tuple[str, str]]) -> str:
    """Two left-aligned columns."""
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
