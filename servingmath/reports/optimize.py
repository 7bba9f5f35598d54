"""``optimize``'s verdict in words: the recommendation table, the one-line infeasibility message,
a configuration's one-line description, and the report's two figures.
"""

from __future__ import annotations

import argparse

from .render import human_seconds, layout_text, pools_text, table


def infeasible_message(out: dict, args: argparse.Namespace, gpus) -> str:
    """One line: what cannot be met, the closest achievable bound and where, and the flag to relax."""
    near = out["closest_achievable"] or {}
    if near.get("scale") is None:
        return (
            f"no candidate in --gpus {','.join(gpus)}{_reached(near)} fits the model and keeps up "
            f"with the load at {args.max_replicas} replicas (binding: {out['binding_constraint']}); "
            "add larger GPUs or raise --max-replicas"
        )
    wanted = []
    if args.ttft_p95 is not None:
        wanted.append(f"p95 TTFT <= {args.ttft_p95:g} s")
    if args.tpot_p95 is not None:
        wanted.append(f"p95 TPOT <= {args.tpot_p95:g} s")
    if getattr(args, "itl_p95", None) is not None:
        wanted.append(f"p95 ITL <= {args.itl_p95:g} s")
    name = out["binding_constraint"]
    if name not in ("ttft_p95", "tpot_p95", "itl_p95"):
        name = "tpot_p95"
    key = f"{name}_s"
    flag = f"--slo-{name.replace('_', '-')}"
    best = near[key]
    where = (near.get("configs") or {}).get(key) or {}
    on = f" on {where['gpu']} TP{where['tp']} PP{where['pp']}" if where else ""
    if where.get("disaggregation"):
        on += f" ({where['disaggregation']['prefill']['gpu']} prefill pool)"
    text = (
        f"no configuration meets {' and '.join(wanted)} with confidence {args.confidence}; "
        f"the best {_achieved(near)} is {best:.3g} s{on}; relax {flag} to >= {best:.3g}"
    )
    if len(wanted) >= 2 and near["scale"] > 1:
        both = "both bounds" if len(wanted) == 2 else "every bound"
        text += f" (or scale {both} by x{near['scale']:.3g})"
    return text


def _achieved(near: dict) -> str:
    """The word for the closest bounds: achievable when every configuration of the grid was
    scored, else found by a coordinate search (how many it scored): bounds the rest of the grid
    could still lower."""
    if near.get("exhaustive", True):
        return "achievable"
    return (
        f"found ({near['configurations_scored']:,} of {near['configurations_in_grid']:,} "
        "configurations searched)"
    )


def _reached(near: dict) -> str:
    """Nothing when every configuration of the grid was scored, else which part the coordinate
    search reached: that none of those fits says nothing certain of the rest."""
    if near.get("exhaustive", True):
        return ""
    return (
        f" of the {near['configurations_scored']:,} (of {near['configurations_in_grid']:,}) "
        "the search reached"
    )


def _latency_text(d: dict | None) -> str:
    if not d:
        return "-"
    return " / ".join(
        human_seconds(d[k]) if d[k] is not None else "inf" for k in ("p50", "p95", "p99")
    )


def render(out: dict, args: argparse.Namespace) -> str:
    """Human report of a ``Recommendation.to_json()`` object."""
    if not out["feasible"]:
        near = out["closest_achievable"] or {}
        if near.get("scale") is None:
            return (
                f"infeasible: no candidate{_reached(near)} fits the model and keeps up with the "
                f"load at {args.max_replicas} replicas (binding: {out['binding_constraint']}); "
                "add larger GPUs or raise --max-replicas"
            )
        return (
            "infeasible: no candidate meets the SLO with confidence "
            f"{args.confidence} (binding: {out['binding_constraint']}); closest "
            f"{_achieved(near)}: "
            f"TTFT p95 {human_seconds(near['ttft_p95_s'])} alone, TPOT p95 "
            f"{human_seconds(near['tpot_p95_s'])} alone, "
            + (
                f"ITL p95 {human_seconds(near['itl_p95_s'])} alone, "
                if getattr(args, "itl_p95", None) is not None
                else ""
            )
            + f"or both bounds x{near['scale']:.3g}"
        )
    rows = [
        (
            "configuration",
            (
                f"{out['replicas']} x {out['gpu']} (TP {out['tp']}, PP {out['pp']}{layout_text(out)}) "
                f"= {out['num_gpus']} GPUs"
            ),
        ),
        ("dtypes", f"weights {out['weight_dtype']}, KV {out['kv_dtype']}"),
        ("max_model_len", f"{out['max_model_len']:,} tokens (one sequence's KV fits)"),
        (
            "token budget",
            (
                f"max_num_batched_tokens {out['max_num_batched_tokens']}, prefill chunk "
                f"{out['chunk_size']}, max_num_seqs {out['max_num_seqs']}"
            ),
        ),
        (
            "cost",
            f"${out['cost_per_hour']:.2f}/hour, ${out['cost_per_million_output_tokens']:.3f} per million output tokens",
        ),
        ("SLO probability", f"{out['slo_probability']:.3f} (required {args.confidence})"),
        ("TTFT p50/p95/p99", _latency_text(out["ttft_s"])),
        ("TPOT p50/p95/p99", _latency_text(out["tpot_s"])),
        *(
            [("ITL p50/p95/p99", _latency_text(out.get("itl_s")))]
            if getattr(args, "itl_p95", None) is not None
            else []
        ),
        ("binding", f"{out['binding_constraint']} (budget: {out['binding_budget']})"),
    ]
    if out.get("metrics_model"):
        rows.append(("numbers from", out["metrics_model"]))
    if out.get("speculative"):
        s = out["speculative"]
        rows.insert(
            3,
            (
                "speculative",
                (
                    f"{s.get('draft_model', s['draft'])} k={s['k']}, acceptance "
                    f"{s['acceptance']:.2f} -> {s['tokens_per_step']:.2f} tokens/step"
                ),
            ),
        )
    if out.get("disaggregation"):
        d = out["disaggregation"]
        rows[0] = ("configuration", pools_text(out))
        rows.insert(1, ("KV hand-off", f"{human_seconds(d['kv_transfer_s'])} per mean prompt"))
    for k, v in out["shadow_prices"].items():
        if v:
            rows.append((f"shadow price {k}", f"{v:+.3g} $/hour per second"))
    el = ", ".join(f"{k} {v:+.2f}" for k, v in out["cost_elasticities"].items() if abs(v) > 1e-3)
    rows.append(("d log cost / d log", el or "-"))
    text = "recommendation\n" + table(rows)
    if out["alternatives"]:
        text += "\nrunner-up configurations\n" + table(
            [
                (
                    f"{a['replicas']} x {a['gpu']} TP{a['tp']} PP{a['pp']}{layout_text(a)}"
                    + (
                        f" (split, prefill on {a['disaggregation']['prefill']['gpu']}"
                        f" TP{a['disaggregation']['prefill']['tp']}"
                        f" PP{a['disaggregation']['prefill']['pp']})"
                        if a.get("disaggregation")
                        else ""
                    ),
                    f"${a['cost_per_hour']:.2f}/hour ({a['weight_dtype']} weights, {a['kv_dtype']} KV)",
                )
                for a in out["alternatives"]
            ]
        )
    if out.get("simulator"):
        sim = out["simulator"]
        text += (
            f"\nsimulator ({sim.get('kind', 'colocated')}, {sim['requests']} requests, median "
            f"efficiency): TTFT {_latency_text(sim['ttft_s'])}, "
            f"TPOT {_latency_text(sim['tpot_s'])}"
            + (
                f", ITL {_latency_text(sim['itl_s'])}"
                if out.get("question", {}).get("slo_itl_p95_s")
                else ""
            )
            + f"; SLO {'met' if sim['meets_slo'] else 'NOT met'}"
        )
    e = out["engine_args"]
    text += f"\nengine flags\n  {e['vllm']}\n  {e['sglang']}\n  {e['trtllm']}"
    if e["notes"]:
        text += f"\n  note: {e['notes']}"
    return text


def describe_short(problem, gpus, config) -> str:
    """One line: TP/PP (and the prefill:decode engines of one replica unit of a pool split, with
    the prefill pool's TP and PP where they differ),
    dtypes, token budget (and a prefill chunk below it) and speculation of a configuration."""
    from optimize import describe_config

    d = describe_config(problem, gpus, config, 1)
    spec = d["speculative"]
    chunk = d["chunk_size"]
    pools = d.get("disaggregation")
    split = (
        f", {pools['prefill']['replicas']}:{pools['decode']['replicas']} prefill:decode engines"
        + (
            f" (prefill TP {pools['prefill']['tp']} PP {pools['prefill']['pp']})"
            if (pools["prefill"]["tp"], pools["prefill"]["pp"]) != (d["tp"], d["pp"])
            else ""
        )
        if pools
        else ""
    )
    return (
        f"TP {d['tp']} PP {d['pp']}{layout_text(d)}{split}, weights {d['weight_dtype']}, "
        f"KV {d['kv_dtype']}, "
        f"max_num_batched_tokens {d['max_num_batched_tokens']}, max_num_seqs {d['max_num_seqs']}"
        + (f", prefill chunk {chunk}" if chunk < d["max_num_batched_tokens"] else "")
        + (f", speculative {spec['draft']} k {spec['k']}" if spec else "")
    )


def optimize_figures(problem, gpus, out: dict) -> list[tuple[str, str, object]]:
    """(file name, caption, open Figure) of both optimize figures, from one ``plot_numbers``."""
    from optimize.plots import NAMES, latency_figure, plot_numbers, tradeoff_figure

    numbers = plot_numbers(problem, gpus, out)
    return [
        (
            NAMES["tradeoff"],
            (
                "Cost against the probability over the posterior that the SLO holds (search model): "
                "the recommendation (star), its runner-ups, and its configuration at every replica "
                "count."
            ),
            tradeoff_figure(problem, gpus, out, numbers),
        ),
        (
            NAMES["latency"],
            (
                "p95 TTFT and p95 TPOT (and p95 ITL where the question bounds it) of the "
                "recommendation in each posterior draw, with the SLO bounds."
            ),
            latency_figure(problem, gpus, out, numbers),
        ),
    ]
