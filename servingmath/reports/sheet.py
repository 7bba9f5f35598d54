"""``explain``'s budget sheet in words, each interval-bearing value with its 90 % posterior band."""

from __future__ import annotations

from .render import human_bytes, human_seconds, layout_text, table


def _with_interval(report: dict, key: str, fmt) -> str:
    value = fmt(report[key])
    band = report.get("intervals", {}).get(key)
    return f"{value}   (90%: {fmt(band['p05'])} .. {fmt(band['p95'])})" if band else value


def render_sheet(report: dict) -> str:
    rate = lambda x: f"{x:,.0f}"
    rows = [
        ("KV bytes per token (all layers)", human_bytes(report["kv_bytes_per_token"])),
        ("weights per GPU", human_bytes(report["weight_bytes_per_gpu"])),
        ("KV capacity (group)", f"{report['kv_capacity_tokens']:,.0f} tokens"),
        ("max concurrent requests", f"{report['max_concurrent_requests']:,}"),
        ("decode batch at max", f"{report['max_decode_batch']:,}"),
        ("prefill, one prompt", _with_interval(report, "prefill_s", human_seconds)),
        ("decode step, batch 1", _with_interval(report, "decode_step_s_batch1", human_seconds)),
        (
            "decode step, max batch",
            _with_interval(report, "decode_step_s_max_batch", human_seconds),
        ),
        ("decode tokens/s at max", _with_interval(report, "decode_tokens_per_s_max", rate)),
        ("binding budget", report["binding_budget"]),
    ]
    named = report["model"]
    if "checkpoint" in report:
        named = f"{report['checkpoint']} (architecture of {named})"
    head = (
        f"{named} on {report['tp'] * report['pp']}x {report['gpu']} "
        f"(TP {report['tp']}, PP {report['pp']}{layout_text(report)}), prompt {report['input_len']}, "
        f"output {report['output_len']}\nefficiencies: {report['efficiency_source']}"
    )
    el = [(f"  d log tokens/s / d log {k}", f"{v:+.3f}") for k, v in report["elasticities"].items()]
    return "\n".join([head, table(rows), "elasticities of decode throughput:", table(el)])
