"""The serving features (prefix reuse, speculation, disaggregation, host KV tier) of ``explain`` and
``simulate``, evaluated with the closed forms in ``perfmodel.features``.

``feature_report`` returns a JSON-ready dict (always the keys ``prefix_hit_rate``,
``effective_prefill_tokens``, ``spec_tokens_per_step``, ``spec_speedup``, ``kv_transfer_s``,
``verdicts``; a feature that was not asked for reports the plain engine: no reuse, one token per
step, no transfer); ``feature_load`` is the load the latency model serves with them on.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import equinox as eqx
import jax.numpy as jnp

from optimize import cached_jit
from perfmodel import System, features as ft
from perfmodel.dynamics import DecodeCost

from ..options.disagg import disagg_pools, pool_deployment, pool_efficiency
from ..options.features import validate_feature_arguments
from ..options.speculation import draft_model
from .load import load_metrics


def _lengths(args, workload) -> tuple[float, float, float | None]:
    if workload is not None:
        rate = (
            float(workload.arrival_rate_per_s) if getattr(args, "rate", None) is not None else None
        )
        return float(workload.prompt_tokens_mean), float(workload.output_tokens_mean), rate
    return float(args.input_len), float(args.output_len), getattr(args, "rate", None)


def _spec_params(args, model) -> tuple:
    """(draft model or None for MTP heads, acceptance alpha, where alpha came from) of
    --spec-draft / --spec-acceptance (the measured prior at --spec-k when not given)."""
    mtp = args.spec_draft.lower() == "mtp"
    draft = None if mtp else draft_model(args.spec_draft, model)
    if args.spec_acceptance is None:
        k = args.spec_k if 1 <= args.spec_k <= 8 else None
        alpha, _ = ft.acceptance_prior(ft.load_acceptance(), "mtp" if mtp else None, k)
        source = f"prior: mean over measured {'mtp' if mtp else 'draft'} acceptance lengths"
    else:
        alpha, source = args.spec_acceptance, "--spec-acceptance"
    return draft, alpha, source


def feature_load(args, system: System, load):
    """(the ``Workload`` the prefill path serves, the ``DecodeCost`` of each iteration) of ``load``
    under the feature flags, for the latency percentiles: a prefix cache serves the uncached
    prompts and every iteration reads the cached prefix's KV (``prefix_workload``); speculative
    decoding drafts --spec-k tokens per sequence and emits E per iteration.  Without either, the
    load as given and None (plain decoding: the program the plain load compiles)."""
    model = system.model
    if not ((args.prefix_reuse is not None and args.prefix_len) or args.spec_draft):
        return load, None
    served, cost = load, DecodeCost()
    if args.prefix_reuse is not None and args.prefix_len:
        reduced, cost = ft.prefix_workload(
            system,
            load,
            shared_fraction=float(args.prefix_reuse),
            prefix_tokens=float(args.prefix_len),
        )
        served = eqx.tree_at(
            lambda w: (w.prompt_tokens_mean, w.prompt_tokens_cv),
            load,
            (reduced.prompt_tokens_mean, reduced.prompt_tokens_cv),
        )
    if args.spec_draft:
        draft, alpha, _ = _spec_params(args, model)
        cost = DecodeCost.speculation(
            float(args.spec_k), float(alpha), draft, cached_prompt_tokens=cost.cached_prompt_tokens
        )
    return served, cost


def _spec(args, system: System, prompt, output, batch) -> dict:
    model = system.model
    mtp = args.spec_draft.lower() == "mtp"
    draft, alpha, source = _spec_params(args, model)
    s = ft.speculative_decode(
        system,
        batch_size=batch,
        context_tokens=prompt + output / 2.0,
        draft_tokens=float(args.spec_k),
        acceptance=alpha,
        draft_model=draft,
    )
    return {
        "draft": "mtp" if mtp else draft.name,
        "k": args.spec_k,
        "acceptance": float(alpha),
        "acceptance_source": source,
        "batch": float(batch),
        "tokens_per_step": float(s.tokens_per_step),
        "speedup": float(s.speedup),
        "tpot_s": float(s.tpot_s),
        "net_gain_s": float(s.net_gain_s),
        "breakeven_acceptance": float(s.breakeven_acceptance),
    }


@cached_jit
def _colocated_interference(system: System, prompt, output, rate):
    """``disaggregation``'s prefill interference of one colocated deployment (what the verdicts
    read), as one program whose trace is kept on disk (op by op: ~1.8 s of every warm run)."""
    pools = (system.hardware, system.deployment)
    return ft.disaggregation(
        system.model,
        system.efficiency,
        colocated=pools,
        prefill=pools,
        decode=pools,
        prompt_tokens=prompt,
        output_tokens=output,
        arrival_rate_per_s=rate,
    ).prefill_interference


_verdict_budgets = cached_jit(ft.verdict_budgets)
"""The verdicts' budgets as one program kept on disk (op by op: ~90 small compiles a run)."""


def feature_report(
    args: argparse.Namespace,
    system: System,
    workload=None,
    trace_reuse: dict | None = None,
    load=None,
    served=None,
    decode_cost=None,
    metrics=None,
) -> dict:
    """Closed-form feature numbers and verdicts for the parsed options (``UsageError`` on bad input).

    The verdicts judge ``load`` (a ``Workload``; default ``workload``), the load the latency
    report prices, so their KV-bound and queue-bound words are that report's ``kv_bound`` and
    ``queue_bound``.

    ``trace_reuse`` (a hashed trace's measured ``shared_fraction`` and mean reused
    ``prefix_tokens``) stands in for --prefix-reuse/--prefix-len when those are not given.
    ``served`` / ``decode_cost`` (``feature_load`` of ``load``): the load model's view of it
    with the features on, which the verdicts' latency metrics read; ``metrics``: its
    ``load_metrics`` when the caller has them already (the latency report's own numbers).
    """
    deployment = system.deployment
    prompt, output, rate = _lengths(args, workload)
    validate_feature_arguments(args, prompt)
    share, prefix = 0.0, 0.0
    if args.prefix_reuse is not None:
        share, prefix = float(args.prefix_reuse), float(args.prefix_len)
    elif trace_reuse is not None:
        share, prefix = trace_reuse["shared_fraction"], min(trace_reuse["prefix_tokens"], prompt)
    out: dict = {}
    out["prefix_hit_rate"], out["effective_prefill_tokens"], out["prefix_prefill_speedup"] = (
        0.0,
        prompt,
        1.0,
    )
    if share > 0:
        reuse = ft.prefix_reuse(
            system,
            prompt_tokens=prompt,
            output_tokens=output,
            shared_fraction=share,
            prefix_tokens=prefix,
            arrival_rate_per_s=ft.REUSE_REFERENCE_RATE_PER_S if rate is None else rate,
        )
        out["prefix_hit_rate"] = float(reuse.hit_rate)
        out["effective_prefill_tokens"] = float(reuse.effective_prefill_tokens)
        out["prefix_prefill_speedup"] = float(reuse.prefill_speedup)

    spec = None
    if args.spec_draft:  # the decode batch (a fixed point under load) matters only here
        batch = ft.colocated_decode_batch(system, prompt, output, rate)
        spec = _spec(args, system, prompt, output, batch)
    out["spec_tokens_per_step"] = spec["tokens_per_step"] if spec else 1.0
    out["spec_speedup"] = spec["speedup"] if spec else 1.0
    if spec:
        out["speculative"] = spec

    out["kv_transfer_s"] = 0.0
    if args.disagg:
        out.update(_disagg(args, system, prompt, output, rate))

    if args.host_kv_bytes is not None:
        tier_dep = eqx.tree_at(
            lambda d: (d.host_kv_bytes, d.host_kv_bytes_per_s),
            deployment,
            (args.host_kv_bytes, args.host_kv_bw),
        )
        h = ft.host_tier(
            dataclasses.replace(system, deployment=tier_dep), sequence_tokens=prompt + output
        )
        out["host_tier"] = {k: float(v) for k, v in h.__dict__.items()}

    judged = load if load is not None else workload
    out["verdicts"] = ft.verdicts(
        system,
        prompt_tokens=prompt,
        output_tokens=output,
        arrival_rate_per_s=rate,
        shared_fraction=share,
        prefix_tokens=prefix,
        workload=judged,
        chunked_prefill=getattr(args, "chunked_prefill", True),
        chunk_tokens=getattr(args, "chunk_tokens", None),
        metrics=metrics
        if metrics is not None or judged is None
        else load_metrics(
            args,
            system,
            judged if served is None else served,
            decode_cost,
        ),
        prefill_interference=None
        if rate is None
        else _colocated_interference(
            system, *(jnp.asarray(float(v)) for v in (prompt, output, rate))
        ),
        budgets=_verdict_budgets(system, *(jnp.asarray(float(v)) for v in (prompt, output))),
    )
    return out


def _disagg(args, system: System, prompt, output, rate) -> dict:
    model, hardware, deployment, efficiency = (
        system.model,
        system.hardware,
        system.deployment,
        system.efficiency,
    )
    p_gpus, d_gpus, hw_p, hw_d, pre, dec, bw = disagg_pools(args, hardware, deployment)
    block = {
        "prefill_gpus": p_gpus,
        "decode_gpus": d_gpus,
        "prefill_gpu": hw_p.name,
        "decode_gpu": hw_d.name,
    }
    t_kv = float(ft.kv_transfer_s(model, pre, prompt, bw))
    if rate is not None:
        co = pool_deployment(deployment, p_gpus + d_gpus, "--disagg colocated comparison")
        r = ft.disaggregation(
            model,
            efficiency,
            colocated=(hardware, co),
            prefill=(hw_p, pre),
            decode=(hw_d, dec),
            prompt_tokens=prompt,
            output_tokens=output,
            arrival_rate_per_s=rate,
            transfer_bytes_per_s=bw,
            prefill_efficiency=pool_efficiency(args, hardware, efficiency, hw_p),
            decode_efficiency=pool_efficiency(args, hardware, efficiency, hw_d),
        )
        block.update(
            {k: (float(v) if math.isfinite(float(v)) else None) for k, v in r.__dict__.items()}
        )
    else:
        block["note"] = "pass --rate to compare TTFT/TPOT/E2E against the colocated system"
    return {"kv_transfer_s": t_kv, "disaggregation": block}
