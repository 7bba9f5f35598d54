"""Memory-capacity budget: KV bytes per token, weight bytes, KV capacity and concurrency.

KV (MHA/GQA/MQA): bytes/token = 2 * L * H_kv * D_head * bytes_per_elem (Ainslie et al. 2023).
KV (MLA): bytes/token = L * (d_c + d_rope) * bytes_per_elem (DeepSeek-V2 report 2024).
Sliding/chunked layers hold min(context, window) tokens (Mistral 7B 2023; Gemma 2 2024).
Paged KV allocates blocks of B tokens (Kwon et al., PagedAttention, SOSP 2023); static
reservation holds max_model_len per sequence.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._constants import ACTIVATION_BYTES, KV_FACTOR, GiB
from ._smooth import smooth_ceil, smooth_floor, smooth_min
from ._specs import Deployment, HardwareSpec, ModelSpec
from ._types import Array, ArrayLike, BatchArray, BatchLike

ACTIVATION_WIDTHS_PER_TOKEN = 8.0
"""Peak live activations of one forward pass, in hidden-size widths per batched token
(residual, normed input, QKV/attention output and the TP-sharded MLP intermediate)."""

NON_TORCH_BYTES = 1.0 * GiB
"""CUDA context, NCCL buffers and CUDA graphs that the engine cannot hand to the KV cache."""


def kv_elems_per_token_per_layer(model: ModelSpec) -> Array:
    """Cached elements per token in one attention layer: 2 * H_kv * D_head, or d_c + d_rope (MLA)."""
    return jnp.where(
        model.mla_kv_dim > 0, model.mla_kv_dim, KV_FACTOR * model.num_kv_heads * model.head_dim
    )


def attention_layers(model: ModelSpec) -> Array:
    """Layers that keep a per-token KV cache (full + windowed; linear-attention layers keep none)."""
    return model.num_full_attention_layers + model.num_window_layers


def kv_bytes_per_token(model: ModelSpec, kv_bytes_per_elem: BatchLike) -> BatchArray:
    """Whole-model KV bytes per cached token (upper bound: every attention layer holds it).

    Llama-2-7B in fp16: 2 * 32 * 32 * 128 * 2 = 524,288 bytes.
    """
    return attention_layers(model) * kv_elems_per_token_per_layer(model) * kv_bytes_per_elem


def kv_bytes_per_sequence(
    model: ModelSpec,
    kv_bytes_per_elem: BatchLike,
    context_tokens: BatchLike,
    temperature: float = 0.0,
) -> BatchArray:
    """Whole-model KV bytes of one sequence of ``context_tokens``; windowed layers cap at the window."""
    live_window = smooth_min(context_tokens, jnp.maximum(model.window_tokens, 1.0), temperature)
    live_tokens = (
        model.num_full_attention_layers * context_tokens + model.num_window_layers * live_window
    )
    return live_tokens * kv_elems_per_token_per_layer(model) * kv_bytes_per_elem


def kv_shard_fraction(model: ModelSpec, tp: BatchLike, pp: BatchLike) -> BatchArray:
    """Share of a token's KV that one device of a TP x PP group stores.

    KV heads split across TP ranks until each rank has one head, then replicate; the MLA latent
    is replicated on every TP rank (vLLM); layers split across PP stages.
    """
    heads_per_rank = jnp.maximum(model.num_kv_heads / tp, 1.0)
    tp_share = jnp.where(model.mla_kv_dim > 0, 1.0, heads_per_rank / model.num_kv_heads)
    return tp_share / pp


def kv_sequence_share(model: ModelSpec, deployment: Deployment) -> Array:
    """Share of one sequence's KV that a device of the attention group holding it stores:
    ``kv_shard_fraction`` over the attention's tp / a ranks (a = ``deployment.attention_dp``)."""
    return kv_shard_fraction(model, deployment.tp / deployment.attention_dp, deployment.pp)


def kv_device_share(model: ModelSpec, deployment: Deployment) -> Array:
    """Share of the group's KV one device stores, sequences spread evenly over the attention
    groups: ``kv_sequence_share / a``.

    Attention split by TP (a = 1): ``kv_shard_fraction`` over the tp ranks.  Attention
    data-parallel over a groups: a device holds only its group's 1 / a of the sequences, so an
    MLA latent or a GQA head that TP would replicate on every rank is stored once per group.
    """
    return kv_sequence_share(model, deployment) / deployment.attention_dp


def weight_bytes(model: ModelSpec, weight_bytes_per_param: BatchLike) -> BatchArray:
    """All weights (MoE: every expert) at the storage width."""
    return model.total_params * weight_bytes_per_param


def weight_bytes_per_gpu(model: ModelSpec, deployment: Deployment) -> Array:
    """Weights held by one device of the TP x PP group: total / (tp * pp), plus the attention
    weights that attention data parallelism copies into each of its a groups:
    (total + L * attention * (a - 1)) / (tp * pp).  Expert parallelism moves whole experts
    between ranks but leaves each rank's share unchanged."""
    copies = model.num_layers * model.attention_params * (deployment.attention_dp - 1.0)
    total = weight_bytes(model, deployment.weight_bytes_per_param)
    return (total + copies * deployment.weight_bytes_per_param) / (deployment.tp * deployment.pp)


def workspace_bytes_per_gpu(model: ModelSpec, deployment: Deployment) -> Array:
    """Activation peak of a ``max_num_batched_tokens`` forward pass plus non-torch memory."""
    activations = (
        deployment.max_num_batched_tokens
        * ACTIVATION_WIDTHS_PER_TOKEN
        * model.hidden_size
        * ACTIVATION_BYTES
        / deployment.tp
    )
    return activations + NON_TORCH_BYTES


def kv_free_bytes_per_gpu(
    model: ModelSpec, hardware: HardwareSpec, deployment: Deployment
) -> Array:
    """HBM left for KV on one device: HBM * utilisation - weights - workspace (may be negative),
    plus the optional host-memory tier."""
    return (
        hardware.hbm_bytes * deployment.gpu_memory_utilization
        - weight_bytes_per_gpu(model, deployment)
        - workspace_bytes_per_gpu(model, deployment)
        + deployment.host_kv_bytes
    )


def kv_bytes_per_token_per_gpu(model: ModelSpec, deployment: Deployment) -> Array:
    """KV bytes one device stores per cached token of the group."""
    return kv_bytes_per_token(model, deployment.kv_bytes_per_elem) * kv_device_share(
        model, deployment
    )


def kv_capacity_tokens(model: ModelSpec, hardware: HardwareSpec, deployment: Deployment) -> Array:
    """Tokens the whole TP x PP group can cache: max(free, 0) / (KV bytes per token per device)."""
    free = jnp.maximum(kv_free_bytes_per_gpu(model, hardware, deployment), 0.0)
    return free / kv_bytes_per_token_per_gpu(model, deployment)


def allocated_tokens_per_sequence(
    deployment: Deployment, sequence_tokens: ArrayLike, temperature: float = 0.0
) -> Array:
    """Tokens of KV a sequence occupies: ceil(n / B) * B when paged, max_model_len when static."""
    if deployment.kv_allocation == "static":
        return jnp.broadcast_to(deployment.max_model_len, jnp.shape(sequence_tokens))
    blocks = smooth_ceil(jnp.asarray(sequence_tokens) / deployment.block_size_tokens, temperature)
    return blocks * deployment.block_size_tokens


def max_concurrent_requests(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    sequence_tokens: ArrayLike,
    temperature: float = 0.0,
) -> Array:
    """Sequences of ``sequence_tokens`` (prompt + output) whose KV fits at once: floor(free / per-seq)."""
    tokens = allocated_tokens_per_sequence(deployment, sequence_tokens, temperature)
    per_seq = kv_bytes_per_sequence(
        model, deployment.kv_bytes_per_elem, tokens, temperature
    ) * kv_device_share(model, deployment)
    free = jnp.maximum(kv_free_bytes_per_gpu(model, hardware, deployment), 0.0)
    return smooth_floor(free / per_seq, temperature)
