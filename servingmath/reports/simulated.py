"""``simulate``'s measurements in words: latency percentiles, engine busy fraction and queue
stability, and the serving features the engine ran.
"""

from __future__ import annotations

import numpy as np

from .load import engine_scales_line
from .render import human_seconds, table

STABLE_WORDS = {True: "yes", False: "no (the queue grew over the run)", None: "too short to tell"}


def rejection_report(result, requests, max_model_len) -> dict:
    """Requests the engine refused (prompts over --max-model-len) and cut short (output capped
    by it), with a note in words when any were refused."""
    out = {
        "rejected": result.num_rejected,
        "length_capped": int(
            np.sum((result.output_tokens < requests.output_tokens) & ~result.rejected)
        ),
    }
    if out["rejected"]:
        out["note"] = (
            f"{out['rejected']} prompts longer than --max-model-len {max_model_len} were "
            "rejected as vLLM does (no latency recorded); raise --max-model-len to serve them"
        )
    return out


def render_simulation(r: dict) -> str:
    rows = []
    for key, label in (
        ("ttft_s", "TTFT"),
        ("tpot_s", "TPOT"),
        ("itl_s", "ITL (over gaps)"),
        ("e2e_s", "E2E"),
    ):
        p = r[key]
        rows.append(
            (
                label,
                "  ".join(
                    f"{k} {human_seconds(v) if v is not None else 'inf'}" for k, v in p.items()
                ),
            )
        )
    rows += [
        ("engine busy fraction", f"{r['busy_fraction']:.2f}"),
        ("stable", STABLE_WORDS[r["stable"]]),
        ("output tokens/s", f"{r['output_tokens_per_s']:,.0f}"),
        ("mean decode batch", f"{r['decode_batch']:.1f}"),
        ("requests (preemptions)", f"{r['requests']:,} ({r['preemptions']:,})"),
        ("rejected", f"{r['rejected']:,}"),
        ("engine offsets", engine_scales_line(r["engine_scales"])),
    ]
    head = f"efficiencies: {r['efficiency_source']}\n"
    note = f"\nnote: {r['note']}" if r.get("note") else ""
    return head + table(rows) + note


def render_simulated(sim: dict) -> str:
    lines = ["simulated features:"]
    if "prefix_hit_rate" in sim:
        lines.append(
            f"  prefix cache: hit rate {sim['prefix_hit_rate']:.2f}, effective prefill "
            f"{sim['effective_prefill_tokens']:,.0f} tokens "
            f"({100 * sim['prefix_reused_token_fraction']:.1f}% of prompt tokens reused)"
        )
    if "spec_tokens_per_step" in sim:
        tp = sim["tpot_s"]["p50"]
        lines.append(
            f"  speculative decoding: {sim['spec_tokens_per_step']:.2f} tokens/step, TPOT p50 "
            f"{human_seconds(tp) if tp is not None else 'n/a'}"
        )
    if "disaggregation" in sim:
        d = sim["disaggregation"]
        pct = lambda p: "  ".join(
            f"{k} {human_seconds(v) if v is not None else 'inf'}" for k, v in p.items()
        )
        extra = "".join(
            [
                f", prefix reuse {100 * d['prefix_reused_token_fraction']:.1f}%"
                if "prefix_reused_token_fraction" in d
                else "",
                f", {d['spec_tokens_per_step']:.2f} tokens/step"
                if "spec_tokens_per_step" in d
                else "",
            ]
        )
        lines += [
            (
                f"  disaggregation {d['prefill_gpus']}:{d['decode_gpus']}: KV hand-off "
                f"{d['kv_transfer_s'] * 1e3:.2f} ms{extra}"
            ),
            f"    TTFT {pct(d['ttft_s'])}",
            f"    TPOT {pct(d['tpot_s'])}",
            f"    E2E {pct(d['e2e_s'])}",
        ]
    return "\n".join(lines)
