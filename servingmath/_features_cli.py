"""Options and report for the serving features (prefix reuse, speculation, disaggregation, host KV tier), shared by ``explain`` and ``simulate``.

``add_feature_arguments`` declares prefix reuse, speculative decoding, disaggregation and the host
KV tier; ``feature_report`` evaluates them with the closed forms in ``perfmodel.features`` and
returns a JSON-ready dict (always the keys ``prefix_hit_rate``, ``effective_prefill_tokens``,
``spec_tokens_per_step``, ``spec_speedup``, ``kv_transfer_s``, ``verdicts``; a feature that was
not asked for reports the plain engine: no reuse, one token per step, no transfer).
"""

from __future__ import annotations

import argparse
import math

import equinox as eqx
import jax.numpy as jnp

import perfmodel as pm
from optimize import cached_jit
from perfmodel import CatalogError, Deployment, Efficiency, HardwareSpec, ModelSpec, features as ft
from perfmodel.dynamics import DecodeCost

from ._disagg_cli import DisaggPools as DisaggPools, _disagg, _pools, disagg_pools as disagg_pools
from ._dynamics_cli import load_metrics
from ._types import finite_float, positive_float
from .errors import UsageError

MAX_SPEC_K = 16
"""Largest --spec-k accepted: engines verify a handful of draft tokens per step (vLLM's and
SGLang's examples use 1-8); at acceptance a < 1 the k-th token is accepted with probability a^k,
so past 16 drafts only add draft and verification cost."""

DEFAULT_HOST_KV_BYTES_PER_S = 63e9
"""PCIe 5.0 x16, one direction: 32 GT/s * 16 lanes * 128/130 encoding / 8 bits ~ 63 GB/s."""


def add_feature_arguments(parser: argparse.ArgumentParser) -> None:
    """Feature options (the paged-KV ``--block-size`` is a deployment option)."""
    g = parser.add_argument_group("serving features")
    g.add_argument(
        "--prefix-reuse",
        type=finite_float,
        metavar="FRACTION",
        help="share of requests that open with a shared prefix (0..1)",
    )
    g.add_argument("--prefix-len", type=int, metavar="N", help="shared prefix length (tokens)")
    g.add_argument(
        "--spec-draft", metavar="MODEL|mtp", help="speculative decoding: draft model or mtp"
    )
    g.add_argument(
        "--spec-k",
        type=int,
        default=4,
        metavar="K",
        help=f"draft tokens per step, 1..{MAX_SPEC_K} (default 4)",
    )
    g.add_argument(
        "--spec-acceptance",
        type=finite_float,
        metavar="A",
        help="per-token acceptance in [0, 1] (default: prior from measured acceptance lengths)",
    )
    g.add_argument(
        "--disagg", metavar="PREFILL_GPUS:DECODE_GPUS", help="split prefill and decode pools"
    )
    g.add_argument("--prefill-gpu", metavar="G", help="prefill pool hardware id (default --gpu)")
    g.add_argument("--decode-gpu", metavar="G", help="decode pool hardware id (default --gpu)")
    g.add_argument(
        "--transfer-bw",
        type=finite_float,
        metavar="BYTES_PER_S",
        help="KV hand-off bandwidth per GPU (default: the inter-node network)",
    )
    g.add_argument(
        "--host-kv-bytes", type=finite_float, metavar="BYTES", help="host-memory KV tier per GPU"
    )
    g.add_argument(
        "--host-kv-bw",
        type=positive_float,
        default=DEFAULT_HOST_KV_BYTES_PER_S,
        metavar="BYTES_PER_S",
        help="host <-> GPU bandwidth (default PCIe 5.0 x16, 63e9)",
    )


def _fraction(name: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise UsageError(f"{name} must be in [0, 1], got {value}; pass e.g. {name} 0.5")


def _lengths(args, workload) -> tuple[float, float, float | None]:
    if workload is not None:
        rate = (
            float(workload.arrival_rate_per_s) if getattr(args, "rate", None) is not None else None
        )
        return float(workload.prompt_tokens_mean), float(workload.output_tokens_mean), rate
    return float(args.input_len), float(args.output_len), getattr(args, "rate", None)


def validate_feature_arguments(args: argparse.Namespace, prompt_tokens: float) -> None:
    """Every check that needs no budget, so bad input fails fast (``UsageError``, one line)."""
    if args.prefix_reuse is not None or args.prefix_len is not None:
        if args.prefix_reuse is None or args.prefix_len is None:
            raise UsageError(
                "--prefix-reuse and --prefix-len go together; pass both, e.g. 0.8 and 1024"
            )
        _fraction("--prefix-reuse", args.prefix_reuse)
        if args.prefix_len < 0:
            raise UsageError(
                f"--prefix-len must be >= 0 tokens, got {args.prefix_len}; pass e.g. --prefix-len 1024"
            )
        if args.prefix_len > prompt_tokens:
            raise UsageError(
                f"--prefix-len {args.prefix_len} is longer than the {prompt_tokens:.0f}-token prompt; "
                "pass a prefix no longer than the prompt"
            )
    if args.spec_draft:
        if not 1 <= args.spec_k <= MAX_SPEC_K:
            raise UsageError(
                f"--spec-k must be a positive integer <= {MAX_SPEC_K} draft tokens, got "
                f"{args.spec_k}; pass e.g. --spec-k 4"
            )
        if args.spec_acceptance is not None:
            _fraction("--spec-acceptance", args.spec_acceptance)
    if args.disagg:
        _pools(args.disagg)
        if args.transfer_bw is not None and not (
            math.isfinite(args.transfer_bw) and args.transfer_bw > 0
        ):
            raise UsageError(
                f"--transfer-bw must be a positive number of bytes/s, got {args.transfer_bw}"
            )
    if args.host_kv_bytes is not None and not (
        math.isfinite(args.host_kv_bytes) and args.host_kv_bytes >= 0 and args.host_kv_bw > 0
    ):
        raise UsageError(
            "--host-kv-bytes must be >= 0 and --host-kv-bw > 0; pass e.g. --host-kv-bytes 256e9"
        )


def _spec_params(args, model) -> tuple:
    """(draft model or None for MTP heads, acceptance alpha, where alpha came from) of
    --spec-draft / --spec-acceptance (the measured prior at --spec-k when not given)."""
    mtp = args.spec_draft.lower() == "mtp"
    draft = None
    if not mtp:
        try:
            draft = pm.load_model(args.spec_draft)
        except CatalogError as exc:
            raise UsageError(str(exc)) from None
        if float(draft.total_params) >= float(model.total_params):
            raise UsageError(
                f"draft {draft.name} ({float(draft.total_params) / 1e9:.1f} B) is not smaller than "
                f"{model.name} ({float(model.total_params) / 1e9:.1f} B); pick a smaller draft or mtp"
            )
    if args.spec_acceptance is None:
        k = args.spec_k if 1 <= args.spec_k <= 8 else None
        alpha, _ = ft.acceptance_prior(ft.load_acceptance(), "mtp" if mtp else None, k)
        source = f"prior: mean over measured {'mtp' if mtp else 'draft'} acceptance lengths"
    else:
        alpha, source = args.spec_acceptance, "--spec-acceptance"
    return draft, alpha, source


def feature_load(args, model, hardware, deployment, efficiency, load):
    """(the ``Workload`` the prefill path serves, the ``DecodeCost`` of each iteration) of ``load``
    under the feature flags, for the latency percentiles: a prefix cache serves the uncached
    prompts and every iteration reads the cached prefix's KV (``prefix_workload``); speculative
    decoding drafts --spec-k tokens per sequence and emits E per iteration.  Without either, the
    load as given and None (plain decoding: the program the plain load compiles)."""
    if not ((args.prefix_reuse is not None and args.prefix_len) or args.spec_draft):
        return load, None
    served, cost = load, DecodeCost()
    if args.prefix_reuse is not None and args.prefix_len:
        reduced, cost = ft.prefix_workload(
            model,
            hardware,
            deployment,
            efficiency,
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
        cost = DecodeCost(
            cached_prompt_tokens=cost.cached_prompt_tokens,
            draft_tokens=float(args.spec_k),
            acceptance=float(alpha),
            draft_model=draft,
            speculative=True,
        )
    return served, cost


def _spec(args, model, hardware, deployment, efficiency, prompt, output, batch) -> dict:
    mtp = args.spec_draft.lower() == "mtp"
    draft, alpha, source = _spec_params(args, model)
    s = ft.speculative_decode(
        model,
        hardware,
        deployment,
        efficiency,
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
def _colocated_interference(model, hardware, deployment, efficiency, prompt, output, rate):
    """``disaggregation``'s prefill interference of one colocated deployment (what the verdicts
    read), as one program whose trace is kept on disk (op by op: ~1.8 s of every warm run)."""
    pools = (hardware, deployment)
    return ft.disaggregation(
        model,
        efficiency,
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
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
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
            model,
            hardware,
            deployment,
            efficiency,
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
        batch = _decode_batch(model, hardware, deployment, efficiency, prompt, output, rate)
        spec = _spec(args, model, hardware, deployment, efficiency, prompt, output, batch)
    out["spec_tokens_per_step"] = spec["tokens_per_step"] if spec else 1.0
    out["spec_speedup"] = spec["speedup"] if spec else 1.0
    if spec:
        out["speculative"] = spec

    out["kv_transfer_s"] = 0.0
    if args.disagg:
        out.update(_disagg(args, model, hardware, deployment, efficiency, prompt, output, rate))

    if args.host_kv_bytes is not None:
        tier_dep = eqx.tree_at(
            lambda d: (d.host_kv_bytes, d.host_kv_bytes_per_s),
            deployment,
            (args.host_kv_bytes, args.host_kv_bw),
        )
        h = ft.host_tier(model, hardware, tier_dep, efficiency, sequence_tokens=prompt + output)
        out["host_tier"] = {k: float(v) for k, v in h.__dict__.items()}

    judged = load if load is not None else workload
    out["verdicts"] = ft.verdicts(
        model,
        hardware,
        deployment,
        efficiency,
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
            model,
            hardware,
            deployment,
            efficiency,
            judged if served is None else served,
            decode_cost,
        ),
        prefill_interference=None
        if rate is None
        else _colocated_interference(
            model,
            hardware,
            deployment,
            efficiency,
            *(jnp.asarray(float(v)) for v in (prompt, output, rate)),
        ),
        budgets=_verdict_budgets(
            model,
            hardware,
            deployment,
            efficiency,
            *(jnp.asarray(float(v)) for v in (prompt, output)),
        ),
    )
    return out


def _decode_batch(model, hardware, deployment, efficiency, prompt, output, rate) -> float:
    """Sequences decoding together per replica: 1 without a rate, else Little's law on the
    colocated TPOT (the KV/sequence cap when overloaded)."""
    seats = min(
        float(pm.max_concurrent_requests(model, hardware, deployment, prompt + output)),
        float(deployment.max_num_seqs),
    )
    if rate is None:
        return 1.0
    r = ft.disaggregation(
        model,
        efficiency,
        colocated=(hardware, deployment),
        prefill=(hardware, deployment),
        decode=(hardware, deployment),
        prompt_tokens=prompt,
        output_tokens=output,
        arrival_rate_per_s=rate,
    )
    tpot = float(r.colocated_tpot_s)
    if not math.isfinite(tpot):
        return max(seats, 1.0)
    return min(
        max(rate / float(deployment.replicas) * max(output - 1.0, 0.0) * tpot, 1.0), max(seats, 1.0)
    )


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
