"""``fit``'s answer in words: what a fit or an update wrote, the rows it skipped, its sampler
diagnostics, and an update's before / after table (reference predictions, efficiencies,
end-to-end biases)."""

from __future__ import annotations

from .render import human_seconds


def render_fit(attrs, num_draws: int, seconds: float, out, skipped: dict, diagnostics) -> str:
    """A fit's summary: rows and draws written to ``out``, the rows skipped (reason -> count)
    and the NUTS diagnostics (``None`` for SVI)."""
    head = (
        f"{attrs['method']}: {attrs['fit_rows']} rows of {attrs['table_rows']} ({attrs['subsample']}), "
        f"{num_draws} draws in {seconds:.0f} s -> {out}"
    )
    lines = [head]
    lines += [f"  skipped {n} rows: {reason}" for reason, n in skipped.items()]
    if diagnostics is not None:
        lines.append(diagnostics.report())
    else:
        lines.append(
            "diagnostics: SVI draws are independent (no R-hat/ESS); check held-out coverage with "
            "servingmath validate"
        )
    return "\n".join(lines)


def render_update(prior_path, attrs, num_draws: int, seconds: float, out, skipped: dict) -> str:
    """An update's summary: rows of the GPU and draws written to ``out``, the end-to-end rows
    sampled, the rows skipped (reason -> count) and a divergence warning."""
    head = (
        f"update of {prior_path}: {attrs['update_rows']} rows of GPU {attrs['update_gpus']}, "
        f"{num_draws} draws in {seconds:.0f} s -> {out}"
    )
    lines = [head]
    if attrs["serving_rows_available"] > attrs["update_serving_rows"]:
        lines.append(
            f"  end-to-end rows: a seeded {attrs['update_serving_rows']} of "
            f"{attrs['serving_rows_available']} (each run is a closed-loop solve per NUTS step)"
        )
    lines += [f"  skipped {n} rows: {reason}" for reason, n in skipped.items()]
    if attrs["divergences"]:
        lines.append(
            f"WARNING: {attrs['divergences']} divergent transitions; raise --warmup or check the rows"
        )
    return "\n".join(lines)


def _interval(x, unit: str) -> str:
    """``median [lo, hi]`` of an ``Interval`` in ``unit`` (seconds as s/ms/us)."""
    if unit == "s":
        return f"{human_seconds(x.median)} [{human_seconds(x.lo)}, {human_seconds(x.hi)}]"

    def num(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"

    return f"{num(x.median)} [{num(x.lo)}, {num(x.hi)}]" + (f" {unit}" if unit else "")


def render_update_report(report) -> str:
    """The text of a ``fitting._update_report.UpdateReport``: reference points, then efficiencies."""
    lines = []
    if report.points:
        lines.append(
            f"how many runs are enough: 90 % predictive intervals of {report.gpu} "
            f"({report.model}, TP {report.tp}, {report.engine or report.source}, closed loop, "
            f"{report.input_len:.0f} in / {report.output_len:.0f} out tokens) on "
            f"{report.serving_rows} end-to-end rows"
        )
        rows = [("reference", "prior (spec sheet, population)", "updated", "width hi/lo")]
        rows += [
            (
                p.label,
                _interval(p.before, p.unit),
                _interval(p.after, p.unit),
                f"{p.before.width:.2f}x -> {p.after.width:.2f}x",
            )
            for p in report.points
        ]
        lines += _columns(rows)
        w = report.widest
        lines.append(
            f"  widest after the update: {w.label} ({w.after.width:.2f}x); "
            f"a run there would narrow it most"
        )
    else:
        lines.append(f"no end-to-end run of {report.gpu}: no reference predictions")
    lines.append(f"efficiencies of {report.gpu}: median [90 % interval]")
    rows = [("parameter", "prior", "updated")]
    rows += [
        (
            p.name,
            _interval(p.before, "s" if p.name.endswith("_s") else ""),
            _interval(p.after, "s" if p.name.endswith("_s") else ""),
        )
        for p in report.parameters
    ]
    lines += _columns(rows)
    if report.biases:
        lines.append(
            f"end-to-end biases of {report.gpu}: measured / step and load models with the "
            f"engine's offsets, median [90 % interval]"
        )
        rows = [("group", "prior", "updated")]
        rows += [(p.name, _interval(p.before, "x"), _interval(p.after, "x")) for p in report.biases]
        lines += _columns(rows)
    return "\n".join(lines)


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
