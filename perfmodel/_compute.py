"""Compute budget: forward FLOPs and the roofline step time.

FLOPs per token ~ 2N (N = non-embedding parameters a token uses) plus attention; QK logits take
2 * n_layer * n_ctx * d_attn FLOPs per token (Kaplan et al. 2020, Table 1) and the value reduction
the same again.  Achievable FLOP/s = peak * eta_c(n), eta_c rising with batched tokens n.
Roofline: time = max(FLOPs / (peak * eta_c), bytes / (BW * eta_b)) (Williams et al. 2009;
LLM-Viewer, Yuan et al. 2024).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from ._constants import FLOPS_PER_MAC
from ._smooth import smooth_min
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec
from ._types import Array, BatchArray, BatchLike


class StepTime(eqx.Module):
    """Components of one forward pass (seconds); ``total_s`` is what the engine spends."""

    compute_s: Array
    memory_s: Array
    comm_s: Array
    overhead_s: Array
    total_s: Array


def peak_flops_per_s(hardware: HardwareSpec, deployment: Deployment) -> Array:
    """Dense peak at the deployment's GEMM dtype: ``compute_dtype_mix . dense_flops_per_s``."""
    return jnp.dot(deployment.compute_dtype_mix, hardware.dense_flops_per_s)


def compute_fraction(efficiency: Efficiency, batched_tokens: BatchLike) -> BatchArray:
    """eta_c(n) = eta_max * n / (n + n_half): small GEMMs leave tensor cores idle."""
    n = jnp.asarray(batched_tokens)
    return efficiency.compute_fraction_max * n / (n + efficiency.compute_half_tokens)


def linear_flops(model: ModelSpec, tokens: BatchLike, sampled_tokens: BatchLike) -> BatchArray:
    """GEMM FLOPs: 2 * (active params - embedding - LM head) per token, LM head per sampled token."""
    body = model.active_params - model.embedding_params - model.lm_head_params
    return FLOPS_PER_MAC * (body * tokens + model.lm_head_params * sampled_tokens)


def attention_flops(
    model: ModelSpec,
    new_tokens: BatchLike,
    context_tokens: BatchLike,
    temperature: float = 0.0,
) -> BatchArray:
    """Attention FLOPs of appending ``new_tokens`` to a sequence holding ``context_tokens``.

    New token i attends to c + i positions (causal), so full layers see n*c + n(n+1)/2 pairs;
    a windowed layer sees at most n * W (approximated as n * min(c + (n+1)/2, W)).  Each pair costs
    2 * heads * (d_qk + d_v) FLOPs (QK logits and value reduction).
    """
    n = jnp.asarray(new_tokens)
    c = jnp.asarray(context_tokens)
    pairs_full = n * c + n * (n + 1.0) / 2.0
    mean_span = c + (n + 1.0) / 2.0
    pairs_window = n * smooth_min(mean_span, jnp.maximum(model.window_tokens, 1.0), temperature)
    per_pair = FLOPS_PER_MAC * model.num_heads * (model.head_dim + model.v_head_dim)
    return per_pair * (
        model.num_full_attention_layers * pairs_full + model.num_window_layers * pairs_window
    )
