"""Speculative-decoding budget: tokens per target step, draft and verification cost, net gain.

With draft length k and i.i.d. per-token acceptance alpha, one target verification step yields
E = (1 - alpha^(k+1)) / (1 - alpha) tokens (Leviathan et al., ICML 2023, eq. 1; Chen et al. 2023).
A step costs the draft's k forward passes plus one target pass over k + 1 tokens per sequence;
speedup = E * t_target / (t_draft + t_verify).  Verification is nearly free only while decode is
bandwidth-bound: once the batch makes the step compute-bound, k + 1 tokens cost ~ k + 1 times one.
Multi-token prediction (MTP) heads (DeepSeek-V3 report 2024) draft with ~one extra layer each.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import NamedTuple

import equinox as eqx
import jax.numpy as jnp

from ._catalog import CatalogError, data_dir
from ._reuse import monotone_root
from ._specs import ModelSpec, System
from ._step import decode_step, step_total_s
from ._types import Array, ArrayLike, BatchArray, BatchLike

SERIES_SWITCH = 1e-4
"""|1 - alpha| below which E(alpha) uses its second-order Taylor series at alpha = 1 (the closed
form divides 0 by 0 there)."""

MTP_LAYERS_PER_DRAFT_TOKEN = 1.0
"""Target-layer equivalents of one MTP head pass (DeepSeek-V3: one transformer block per head;
the embedding and LM head are shared with the target)."""


def expected_tokens_per_step(acceptance: BatchLike, draft_tokens: BatchLike) -> BatchArray:
    """E = (1 - a^(k+1)) / (1 - a) = sum_{i=0..k} a^i; equals k + 1 at a = 1, smooth there.

    Args:
        acceptance: per-token acceptance probability alpha in [0, 1].
        draft_tokens: draft length k (real-valued when relaxed).
    """
    a = jnp.asarray(acceptance, dtype=float)
    k = jnp.asarray(draft_tokens, dtype=float)
    eps = 1.0 - a
    near = jnp.abs(eps) < SERIES_SWITCH
    safe_eps = jnp.where(near, 1.0, eps)
    closed = -jnp.expm1((k + 1.0) * jnp.log1p(-safe_eps)) / safe_eps
    series = (k + 1.0) - (k + 1.0) * k / 2.0 * eps + (k + 1.0) * k * (k - 1.0) / 6.0 * eps**2
    return jnp.where(near, series, closed)


def acceptance_from_length(acceptance_length: BatchLike, draft_tokens: BatchLike) -> BatchArray:
    """Per-token alpha whose E(alpha, k) equals a measured acceptance length AL in [1, k + 1]
    (AL = 1 + accepted draft tokens / verification steps, bonus token included)."""
    al = jnp.asarray(acceptance_length, dtype=float)
    return monotone_root(lambda a: expected_tokens_per_step(a, draft_tokens) - al, 0.0, 1.0)


class SpeculativeBudget(eqx.Module):
    """One verification step of speculative decoding at one batch (SI units, per step)."""

    tokens_per_step: Array
    accepted_extra_tokens: Array
    target_step_s: Array
    draft_s: Array
    verify_s: Array
    step_s: Array
    tpot_s: Array
    tokens_per_s: Array
    speedup: Array
    net_gain_s: Array
    breakeven_acceptance: Array


def speculative_decode(
    system: System,
    *,
    batch_size: ArrayLike,
    context_tokens: ArrayLike,
    draft_tokens: ArrayLike,
    acceptance: ArrayLike,
    draft_model: ModelSpec | None = None,
    temperature: float = 0.0,
) -> SpeculativeBudget:
    """Net TPOT, throughput and gain of speculative decoding against plain decode.

    Args:
        batch_size: sequences decoding together (per replica).
        context_tokens: cached tokens per sequence.
        draft_tokens: k.
        acceptance: per-token alpha.
        draft_model: a separate draft model run on the same deployment (k of its own decode
            steps); ``None`` for MTP heads (k passes of ``MTP_LAYERS_PER_DRAFT_TOKEN`` target
            layers each, fused into the target's iteration: no extra step overhead).

    The verification pass is ``forward_step`` with k + 1 new tokens per sequence at its context;
    it charges the LM head for one sampled position per sequence, so the k extra LM-head GEMMs are
    left out (LM head / body parameters: 0.5 B / 7.5 B for Llama-3.1-8B, 6 %).

    Returns:
        ``net_gain_s = accepted_extra_tokens * target_step_s - (draft_s + verify_s - target_step_s)``
        (the seed's rule; > 0 exactly when speedup > 1), and ``breakeven_acceptance``, the alpha
        at which speedup = 1 (``inf`` when even alpha = 1 does not pay).
    """
    model, deployment = system.model, system.deployment
    k = jnp.asarray(draft_tokens, dtype=float)
    target = decode_step(system, batch_size, context_tokens, temperature)
    if draft_model is None:
        per_layer = (target.total_s - target.overhead_s) / model.num_layers
        draft_s = k * MTP_LAYERS_PER_DRAFT_TOKEN * per_layer
    else:
        draft = decode_step(
            dataclasses.replace(system, model=draft_model), batch_size, context_tokens, temperature
        )
        draft_s = k * draft.total_s
    verify_s = step_total_s(
        system,
        prefill_tokens=jnp.asarray(batch_size) * (k + 1.0),
        prefill_seqs=batch_size,
        prefill_context=context_tokens,
        temperature=temperature,
    )
    step_s = draft_s + verify_s
    e = expected_tokens_per_step(acceptance, k)

    def gain(a):
        return expected_tokens_per_step(a, k) * target.total_s - step_s

    never = gain(1.0) <= 0
    breakeven = jnp.where(never, jnp.inf, monotone_root(gain, 0.0, 1.0))
    tpot = step_s / e
    return SpeculativeBudget(
        tokens_per_step=e,
        accepted_extra_tokens=e - 1.0,
        target_step_s=target.total_s,
        draft_s=draft_s,
        verify_s=verify_s,
        step_s=step_s,
        tpot_s=tpot,
        tokens_per_s=deployment.replicas * jnp.asarray(batch_size) / tpot,
        speedup=target.total_s / tpot,
        net_gain_s=(e - 1.0) * target.total_s - (draft_s + verify_s - target.total_s),
        breakeven_acceptance=breakeven,
    )


class AcceptanceRecord(NamedTuple):
    """One measured point of ``data/traces/speculative/acceptance.csv`` with its implied alpha."""

    model: str
    draft_method: str
    draft_variant: str
    thinking_mode: str
    draft_tokens: int
    acceptance_length: float
    acceptance: float


def load_acceptance(path: str | Path | None = None) -> list[AcceptanceRecord]:
    """Measured acceptance lengths (SemiAnalysis InferenceX, vLLM on B300, SPEED-Bench coding),
    each inverted to the per-token alpha of the i.i.d. model: E(alpha, k) = AL.

    Raises:
        CatalogError: unreadable file or a row without a numeric draft length / AL.
    """
    path = (
        Path(path) if path is not None else data_dir() / "traces" / "speculative" / "acceptance.csv"
    )
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
        ks = [int(r["num_speculative_tokens"]) for r in rows]
        als = [float(r["acceptance_length"]) for r in rows]
    except OSError as exc:
        raise CatalogError(f"cannot read {path}: {exc.strerror}; check the path") from None
    except (KeyError, ValueError) as exc:
        raise CatalogError(
            f"{path}: needs numeric num_speculative_tokens and acceptance_length ({exc})"
        ) from None
    alphas = acceptance_from_length(jnp.asarray(als), jnp.asarray(ks, dtype=float))
    return [
        AcceptanceRecord(
            r["model"], r["draft_method"], r["draft_variant"], r["thinking_mode"], k, al, float(a)
        )
        for r, k, al, a in zip(rows, ks, als, alphas)
    ]


def acceptance_prior(
    records: list[AcceptanceRecord],
    draft_method: str | None = None,
    draft_tokens: int | None = None,
) -> tuple[float, float]:
    """Mean and standard deviation of alpha over records of one draft method / draft length."""
    picked = [
        r.acceptance
        for r in records
        if (draft_method is None or r.draft_method == draft_method)
        and (draft_tokens is None or r.draft_tokens == draft_tokens)
    ]
    if not picked:
        raise CatalogError(
            f"no acceptance records for method {draft_method!r}, k = {draft_tokens}; "
            f"methods: {sorted({r.draft_method for r in records})}"
        )
    values = jnp.asarray(picked)
    return float(values.mean()), float(values.std())
