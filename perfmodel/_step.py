"""One engine iteration: prefill chunks and decode tokens through the roofline, plus communication.

Decode step ~ (weight bytes + KV bytes touched) / (BW * eta_b) + overhead (Pope et al. 2022);
prefill ~ FLOPs / (peak * eta_c); a mixed iteration (Sarathi-Serve, Agrawal et al. 2024) is one
forward pass over both, so both budgets meet in one roofline max.  MoE layers read only the
experts the batch routes to: E * (1 - (1 - k/E)^T) distinct experts for T tokens (uniform routing).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.typing import ArrayLike

from ._compute import (
    StepTime,
    attention_flops,
    compute_fraction,
    linear_flops,
    peak_flops_per_s,
)
from ._memory import kv_bytes_per_sequence, kv_shard_fraction
from ._parallel import pipeline_time_factor, pp_transfer_s, tp_comm_s
from ._smooth import smooth_max
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec

Array = jnp.ndarray


def expected_experts_touched(model: ModelSpec, tokens: ArrayLike) -> Array:
    """Distinct routed experts per MoE layer hit by ``tokens`` tokens: E * (1 - (1 - k/E)^T)."""
    e = model.num_experts
    moe = e > 0
    e_safe = jnp.where(moe, e, 1.0)
    miss = jnp.where(moe, 1.0 - model.experts_per_token / e_safe, 1.0)
    touched = e_safe * (1.0 - jnp.power(miss, jnp.maximum(tokens, 0.0)))
    return jnp.where(moe, touched, 0.0)


def weight_bytes_touched(model: ModelSpec, deployment: Deployment, tokens: ArrayLike) -> Array:
    """Weight bytes one forward pass over ``tokens`` reads (dense weights + experts it routes to)."""
    all_experts = model.num_moe_layers * model.num_experts * model.expert_params
    dense = model.total_params - all_experts
    experts = model.num_moe_layers * model.expert_params * expected_experts_touched(model, tokens)
    return (dense + experts) * deployment.weight_bytes_per_param


def forward_step(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    *,
    prefill_tokens: ArrayLike = 0.0,
    prefill_seqs: ArrayLike = 0.0,
    prefill_context: ArrayLike = 0.0,
    decode_seqs: ArrayLike = 0.0,
    decode_context: ArrayLike = 0.0,
    temperature: float = 0.0,
) -> StepTime:
    """Time of one iteration that prefills ``prefill_tokens`` new tokens spread over
    ``prefill_seqs`` sequences (each already holding ``prefill_context`` cached tokens) and
    decodes one token for each of ``decode_seqs`` sequences at ``decode_context`` cached tokens.

    The batch is split into ``deployment.microbatches`` microbatches m through ``pp`` stages:
    iteration = (m + p - 1) / p * T(batch / m), T the whole-chain time of one microbatch.
    """
    m = deployment.microbatches
    p_tok = jnp.asarray(prefill_tokens) / m
    p_seq = jnp.asarray(prefill_seqs) / m
    d_seq = jnp.asarray(decode_seqs) / m
    tokens = p_tok + d_seq
    per_prompt = jnp.where(p_seq > 0, p_tok / jnp.where(p_seq > 0, p_seq, 1.0), 0.0)

    flops = (
        linear_flops(model, tokens, p_seq + d_seq)
        + p_seq * attention_flops(model, per_prompt, prefill_context, temperature)
        + d_seq * attention_flops(model, 1.0, decode_context, temperature)
    )
    kv_read = d_seq * kv_bytes_per_sequence(
        model, deployment.kv_bytes_per_elem, decode_context + 1.0, temperature
    ) + p_seq * kv_bytes_per_sequence(
        model, deployment.kv_bytes_per_elem, prefill_context + per_prompt, temperature
    )
    tp_share = kv_shard_fraction(model, deployment.tp, 1.0)
    chain_bytes = weight_bytes_touched(model, deployment, tokens) / deployment.tp + kv_read * tp_share

    peak = peak_flops_per_s(hardware, deployment) * compute_fraction(efficiency, tokens)
    busy_tokens = tokens > 0  # an empty iteration computes nothing (0/0 guarded, grads finite)
    compute_s = jnp.where(busy_tokens, flops / deployment.tp / jnp.where(busy_tokens, peak, 1.0), 0.0)
    memory_s = chain_bytes / (hardware.hbm_bytes_per_s * efficiency.bandwidth_fraction)
    comm_s = tp_comm_s(model, hardware, deployment, efficiency, tokens, temperature) + pp_transfer_s(
        model, hardware, deployment, efficiency, tokens, temperature
    )
    factor = m * pipeline_time_factor(deployment.pp, m)
    busy = smooth_max(compute_s, memory_s, temperature) + comm_s
    overhead = jnp.broadcast_to(efficiency.step_overhead_s, jnp.shape(busy))
    return StepTime(
        compute_s=compute_s * factor,
        memory_s=memory_s * factor,
        comm_s=comm_s * factor,
        overhead_s=overhead,
        total_s=busy * factor + overhead,
    )


def prefill_step(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    input_len: ArrayLike,
    batch_size: ArrayLike = 1.0,
    temperature: float = 0.0,
) -> StepTime:
    """Prefill of ``batch_size`` prompts of ``input_len`` tokens from an empty cache."""
    return forward_step(
        model, hardware, deployment, efficiency,
        prefill_tokens=jnp.asarray(input_len) * batch_size,
        prefill_seqs=batch_size,
        temperature=temperature,
    )


def decode_step(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    batch_size: ArrayLike,
    context_len: ArrayLike,
    temperature: float = 0.0,
) -> StepTime:
    """One decode iteration: one new token for each of ``batch_size`` sequences at ``context_len``."""
    return forward_step(
        model, hardware, deployment, efficiency,
        decode_seqs=batch_size,
        decode_context=context_len,
        temperature=temperature,
    )
