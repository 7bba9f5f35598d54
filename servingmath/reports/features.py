"""The serving features' headline numbers and verdicts in words (``evaluation.features``'s report)."""

from __future__ import annotations


def render_features(report: dict) -> str:
    """Human lines for ``feature_report``: the headline numbers, then each verdict."""
    lines = [
        (
            f"prefix cache: hit rate {report['prefix_hit_rate']:.2f}, effective prefill "
            f"{report['effective_prefill_tokens']:,.0f} tokens ({report['prefix_prefill_speedup']:.2f}x faster)"
        ),
        (
            f"speculative decoding: {report['spec_tokens_per_step']:.2f} tokens/step, "
            f"speedup {report['spec_speedup']:.2f}x"
        ),
    ]
    if "disaggregation" in report:
        d = report["disaggregation"]
        net = d.get("net_s")
        lines.append(
            f"disaggregation {d['prefill_gpus']}:{d['decode_gpus']}: KV hand-off "
            f"{report['kv_transfer_s'] * 1e3:.2f} ms"
            + (f", net E2E gain {net * 1e3:+.1f} ms per request" if net is not None else "")
        )
    if "host_tier" in report:
        h = report["host_tier"]
        lines.append(
            f"host KV tier: {h['host_sequences_used']:.0f} more sequences, "
            f"throughput {100 * h['gain_fraction']:+.0f}%"
        )
    lines += [f"{k}: {v}" for k, v in report["verdicts"].items()]
    return "\n".join(lines)
