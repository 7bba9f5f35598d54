"""One engine iteration: prefill chunks and decode tokens through the roofline, plus communication.

Decode step ~ (weight bytes + KV bytes touched) / (BW * eta_b) + overhead (Pope et al. 2022);
prefill ~ FLOPs / (peak * eta_c); a mixed iteration (Sarathi-Serve, Agrawal et al. 2024) is one
forward pass over both, so both budgets meet in one roofline max.  MoE layers read only the
experts the batch routes to: E * (1 - (1 - k/E)^T) distinct experts for T tokens (uniform routing).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from ._compute import (
    StepTime,
    attention_flops,
    compute_fraction,
    linear_flops,
    peak_flops_per_s,
)
from ._constants import ACTIVATION_BYTES, LOW_PRECISION_ACTIVATION_BYTES
from ._floors import COUNT_FLOOR
from ._memory import kv_bytes_per_sequence, kv_shard_fraction
from ._ops import attention_tile_flops, attention_time_s, elementwise_time_s, gemm_time_s
from ._parallel import pipeline_time_factor, pp_transfer_s, tp_comm_s
from ._specs import Deployment, Efficiency, ModelSpec, System
from ._types import Array, ArrayLike, BatchArray, BatchLike


def expected_experts_touched(model: ModelSpec, tokens: BatchLike) -> BatchArray:
    """Distinct routed experts per MoE layer hit by ``tokens`` tokens: E * (1 - (1 - k/E)^T)."""
    e = model.num_experts
    moe = e > 0
    e_safe = jnp.where(moe, e, 1.0)
    miss = jnp.where(moe, 1.0 - model.experts_per_token / e_safe, 1.0)
    touched = e_safe * (1.0 - jnp.power(miss, jnp.maximum(tokens, 0.0)))
    return jnp.where(moe, touched, 0.0)


def weight_bytes_touched(model: ModelSpec, deployment: Deployment, tokens: BatchLike) -> BatchArray:
    """Weight bytes one forward pass over ``tokens`` reads (dense weights + experts it routes to)."""
    all_experts = model.num_moe_layers * model.num_experts * model.expert_params
    dense = model.total_params - all_experts
    experts = model.num_moe_layers * model.expert_params * expected_experts_touched(model, tokens)
    return (dense + experts) * deployment.weight_bytes_per_param


def _gated(active: Array, t: Array) -> Array:
    """A kernel that has no work this iteration is not launched: 0 where not ``active``."""
    return jnp.where(active, t, 0.0)


def _stacked(kernels: list[tuple]) -> list[Array]:
    """Columns of a list of kernel tuples, every entry broadcast to one shape and stacked on a new
    leading axis (one vectorised roofline over the kernels)."""
    flat = jnp.broadcast_arrays(*(x for kernel in kernels for x in kernel))
    width = len(kernels[0])
    return [jnp.stack(flat[j::width]) for j in range(width)]


class _Microbatch(eqx.Module):
    """One microbatch's share of an iteration's work (``deployment.microbatches`` of them)."""

    p_tok: Array
    p_seq: Array
    d_seq: Array
    tokens: Array
    per_prompt: Array  # prompt tokens per prefilling sequence (0 without any)

    @staticmethod
    def of(deployment: Deployment, prefill_tokens, prefill_seqs, decode_seqs) -> _Microbatch:
        m = deployment.microbatches
        p_tok = jnp.asarray(prefill_tokens) / m
        p_seq = jnp.asarray(prefill_seqs) / m
        d_seq = jnp.asarray(decode_seqs) / m
        per_prompt = jnp.where(p_seq > 0, p_tok / jnp.where(p_seq > 0, p_seq, 1.0), 0.0)
        return _Microbatch(p_tok, p_seq, d_seq, p_tok + d_seq, per_prompt)


def _layer_kernels_s(
    system: System,
    work: _Microbatch,
    prefill_context: ArrayLike,
    decode_context: ArrayLike,
    temperature: float,
) -> Array:
    """Sum over all layers of one TP rank's kernels for one microbatch (seconds).

    Per layer (vidur's decomposition, ``vidur/entities/execution_time.py``; aiconfigurator's
    operator database): the column-parallel QKV and row-parallel output projections, the MLP (or
    the routed experts as one grouped GEMM plus the shared experts), fused prefill and decode
    attention, two RMSNorms each fused with the residual add before it (vLLM's and SGLang's
    ``fused_add_rms_norm``), rope and the activation; then the LM head over the
    sampled rows and the embedding gather.  Each kernel is its own roofline plus launch
    (``_ops``), all reading the same ``Efficiency``.

    Attention data parallelism (a = ``deployment.attention_dp``) gives a rank 1 / a of the
    tokens and sequences for the attention side (projections, attention, norms, rope), with the
    heads split over tp / a ranks.  Expert parallelism
    (e = ``deployment.expert_parallel``) gives a rank E / e whole experts, each split over tp / e
    ranks: the same expert FLOPs and bytes as TP, in fewer and wider GEMMs (routing taken as
    uniform and balanced).
    """
    model, hardware, deployment, efficiency = (
        system.model,
        system.hardware,
        system.deployment,
        system.efficiency,
    )
    peak = peak_flops_per_s(hardware, deployment)
    bw = hardware.hbm_bytes_per_s
    tokens = work.tokens
    sampled = work.p_seq + work.d_seq
    gemms_s = _gemms_s(model, deployment, efficiency, tokens, sampled, peak, bw, temperature)
    attn_s = _attention_s(
        model, deployment, efficiency, peak, bw, temperature, work, prefill_context, decode_context
    )
    elementwise_s = _elementwise_s(model, deployment, efficiency, tokens, bw)
    body = gemms_s + model.num_layers * attn_s + elementwise_s
    return _gated(tokens > 0, body)


def _gemms_s(
    model: ModelSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    tokens: Array,
    sampled: Array,
    peak: Array,
    bw: Array,
    temperature: float,
) -> Array:
    """Every GEMM of one rank's microbatch, all layers (seconds), as one vectorised roofline
    (axis 0), each GEMM with its count: attention projections (output row-parallel, n = d;
    Q/K/V column-parallel), the MLP's (mats - 1) up/gate matrices column-parallel and one down
    matrix row-parallel -- for the dense layers, the routed experts (one grouped GEMM over the
    experts touched) and the shared experts -- and the LM head over the ``sampled`` rows."""
    tp = deployment.tp
    a = deployment.attention_dp
    attention_tp = tp / a
    moe_tp = tp / deployment.expert_parallel
    d = model.hidden_size
    low = 1.0 - deployment.compute_dtype_mix[0]  # share of GEMMs at an FP8/FP4/INT8 rate
    act = ACTIVATION_BYTES + low * (LOW_PRECISION_ACTIVATION_BYTES - ACTIVATION_BYTES)
    w_b = deployment.weight_bytes_per_param
    o_params = model.output_projection_params / attention_tp
    qkv_params = (model.attention_params - model.output_projection_params) / attention_tp
    # the groups' work taken as balanced: TensorRT-LLM's attention-DP balancer holds prompts
    # until every group has one (a wait this model does not price)
    own_tokens = tokens / a
    mats = jnp.maximum(model.mlp_matrices, 2.0)
    up_share = (mats - 1.0) / mats
    touched = expected_experts_touched(model, tokens)
    moe = model.has_routed_experts
    m_expert = jnp.where(
        moe, tokens * model.experts_per_token / jnp.maximum(touched, COUNT_FLOOR), 0.0
    )
    dense_layers = model.num_layers - model.num_moe_layers

    def mlp(m, params, groups, count, split=tp):
        p_up, p_down = params * up_share / split, params / mats / split
        return [(m, p_up, p_up / d, groups, count), (m, p_down, d, groups, count)]

    experts_here = jnp.maximum(touched / deployment.expert_parallel, 1.0)
    gemms = [
        (own_tokens, qkv_params, qkv_params / d, 1.0, model.num_layers),
        (own_tokens, o_params, d, 1.0, model.num_layers),
        *mlp(tokens, model.dense_mlp_params, 1.0, dense_layers),
        *mlp(m_expert, model.expert_params, experts_here, model.num_moe_layers, moe_tp),
        *mlp(tokens, model.shared_expert_params, 1.0, model.num_moe_layers),
        (sampled, model.lm_head_params / tp, model.vocab_size / tp, 1.0, 1.0),
    ]
    m_, params_, n_, groups_, count_ = _stacked(gemms)
    k_ = params_ / jnp.maximum(n_, 1.0)
    gemm_s = gemm_time_s(
        m_, n_, k_, act, peak, bw, efficiency, efficiency, low, temperature, w_b, groups_
    )
    return jnp.sum(count_ * gemm_s, axis=0)


def _attention_s(
    model: ModelSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    peak: Array,
    bw: Array,
    temperature: float,
    work: _Microbatch,
    prefill_context: ArrayLike,
    decode_context: ArrayLike,
) -> Array:
    """Fused attention of one layer on one rank (seconds), one call per phase (FlashAttention
    varlen over the prefill pieces: ``p_tok`` tokens in ``p_seq`` sequences of ``per_prompt``
    tokens after ``prefill_context`` earlier ones; paged decode over ``d_seq`` sequences at
    ``decode_context``); a phase with no sequences launches nothing."""
    p_tok, p_seq, d_seq, per_prompt = work.p_tok, work.p_seq, work.d_seq, work.per_prompt
    a = deployment.attention_dp
    attention_tp = deployment.tp / a
    own_p_tok, own_p_seq, own_d_seq = p_tok / a, p_seq / a, d_seq / a
    heads = jnp.maximum(model.num_heads / attention_tp, 1.0)
    kv_heads = jnp.maximum(model.num_kv_heads / attention_tp, 1.0)
    layers = jnp.maximum(model.num_layers, 1.0)
    kv_share = kv_shard_fraction(model, attention_tp, 1.0)
    kv_elem = deployment.kv_bytes_per_elem
    qk_v = model.head_dim + model.v_head_dim
    attn_flops = attention_flops(model, per_prompt, prefill_context, temperature)
    pre_flops = own_p_seq * attn_flops / attention_tp
    pre_bytes = (
        own_p_tok * heads * qk_v * 2.0 * ACTIVATION_BYTES * layers
        + own_p_seq
        * kv_share
        * (kv_bytes_per_sequence(model, kv_elem, prefill_context + per_prompt, temperature))
    )
    pre_keys = jnp.asarray(prefill_context) + per_prompt
    pre_tile = attention_tile_flops(pre_keys, per_prompt, qk_v / 2.0)
    prefill_attn_s = attention_time_s(
        pre_flops / layers,
        pre_bytes / layers,
        jnp.maximum(per_prompt, 1.0),
        peak,
        bw,
        efficiency,
        efficiency,
        temperature,
        own_p_seq * kv_heads,
        pre_tile,
    )
    dec_ctx = jnp.asarray(decode_context) + 1.0
    dec_flops = own_d_seq * attention_flops(model, 1.0, decode_context, temperature) / attention_tp
    dec_bytes = own_d_seq * kv_share * kv_bytes_per_sequence(model, kv_elem, dec_ctx, temperature)
    decode_attn_s = attention_time_s(
        dec_flops / layers,
        dec_bytes / layers,
        dec_ctx,
        peak,
        bw,
        efficiency,
        efficiency,
        temperature,
        own_d_seq * kv_heads,
        0.0,
    )
    return _gated(p_seq > 0, prefill_attn_s) + _gated(d_seq > 0, decode_attn_s)


def _elementwise_s(
    model: ModelSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    tokens: Array,
    bw: Array,
) -> Array:
    """One rank's elementwise kernels, all layers (seconds), one vectorised stream each: per layer
    2 fused residual-add + RMSNorm (each reads x and the residual and writes both, 4 widths per
    row, the norm's per-row work on half of them), rope and the MLP activation; once per
    iteration the embedding gather."""
    tp = deployment.tp
    a = deployment.attention_dp
    attention_tp = tp / a
    d = model.hidden_size
    own_tokens = tokens / a
    heads = jnp.maximum(model.num_heads / attention_tp, 1.0)
    kv_heads = jnp.maximum(model.num_kv_heads / attention_tp, 1.0)
    mlp_width = (
        jnp.where(
            model.has_routed_experts,
            (model.expert_params * model.experts_per_token + model.shared_expert_params) / d,
            model.dense_mlp_params / d,
        )
        / tp
    )
    # the activation reads the (mats - 1) up/gate outputs and writes one: mats widths per row
    elementwise = [  # (bytes moved, on-chip work share, kernels per iteration)
        (own_tokens * 4.0 * d * ACTIVATION_BYTES, 0.5, 2.0 * model.num_layers),
        (
            own_tokens * 2.0 * (heads + kv_heads) * model.head_dim * ACTIVATION_BYTES,
            1.0,
            model.num_layers,
        ),
        (tokens * mlp_width * ACTIVATION_BYTES, 1.0, model.num_layers),
        (own_tokens * 2.0 * d * ACTIVATION_BYTES, 1.0, 1.0),
    ]
    bytes_, onchip_, ew_count_ = _stacked(elementwise)
    return jnp.sum(ew_count_ * elementwise_time_s(bytes_, bw, efficiency, onchip_), axis=0)


def forward_step(
    system: System,
    *,
    prefill_tokens: ArrayLike = 0.0,
    prefill_seqs: ArrayLike = 0.0,
    prefill_context: ArrayLike = 0.0,
    decode_seqs: ArrayLike = 0.0,
    decode_context: ArrayLike = 0.0,
    temperature: float = 0.0,
) -> StepTime:
    """Time of one engine iteration: the one step model every prediction uses.

    The iteration prefills ``prefill_tokens`` new tokens spread over ``prefill_seqs`` sequences
    (each already holding ``prefill_context`` cached tokens) and decodes one token for each of
    ``decode_seqs`` sequences at ``decode_context`` cached tokens.  Its time is the sum of the
    per-operator kernel times of one TP rank (``_layer_kernels_s``: GEMMs, prefill and decode
    attention, elementwise kernels, each a roofline plus launch), the TP all-reduces and PP sends,
    times ``efficiency.time_scale`` (an engine's discrepancy from its kernels' sum), plus the
    per-iteration engine overhead (scheduling, sampling, detokenisation).

    The batch is split into ``deployment.microbatches`` microbatches m through ``pp`` stages:
    iteration = (m + p - 1) / p * T(batch / m), T the whole-chain time of one microbatch.
    ``compute_s`` and ``memory_s`` report the whole-model FLOP and byte rooflines (what binds);
    ``total_s`` is the kernels' sum.
    """
    model, hardware, deployment, efficiency = (
        system.model,
        system.hardware,
        system.deployment,
        system.efficiency,
    )
    work = _Microbatch.of(deployment, prefill_tokens, prefill_seqs, decode_seqs)
    busy, comm_s, factor = _timed(system, work, prefill_context, decode_context, temperature)
    p_seq, d_seq, tokens, per_prompt = work.p_seq, work.d_seq, work.tokens, work.per_prompt
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
    a = deployment.attention_dp
    kv_share = kv_shard_fraction(model, deployment.tp / a, 1.0) / a
    attention_copies = (
        model.num_layers * model.attention_params * (a - 1.0) * deployment.weight_bytes_per_param
    )
    weights = weight_bytes_touched(model, deployment, tokens) + attention_copies
    chain_bytes = weights / deployment.tp + kv_read * kv_share

    peak = peak_flops_per_s(hardware, deployment) * compute_fraction(efficiency, tokens)
    busy_tokens = tokens > 0  # an empty iteration computes nothing (0/0 guarded, grads finite)
    compute_s = jnp.where(
        busy_tokens, flops / deployment.tp / jnp.where(busy_tokens, peak, 1.0), 0.0
    )
    memory_s = jnp.where(
        busy_tokens, chain_bytes / (hardware.hbm_bytes_per_s * efficiency.bandwidth_fraction), 0.0
    )
    overhead = jnp.broadcast_to(efficiency.step_overhead_s, jnp.shape(busy))
    return StepTime(
        compute_s=compute_s * factor,
        memory_s=memory_s * factor,
        comm_s=comm_s * factor,
        overhead_s=overhead,
        total_s=busy * factor + overhead,
    )


def step_total_s(
    system: System,
    *,
    prefill_tokens: ArrayLike = 0.0,
    prefill_seqs: ArrayLike = 0.0,
    prefill_context: ArrayLike = 0.0,
    decode_seqs: ArrayLike = 0.0,
    decode_context: ArrayLike = 0.0,
    temperature: float = 0.0,
) -> Array:
    """``forward_step(...).total_s`` alone: the iteration's wall time, without the whole-model
    FLOP and byte rooflines ``forward_step`` reports beside it (what binds), which a load model
    never reads (a fifth of the step's operations, traced and differentiated at every call)."""
    work = _Microbatch.of(system.deployment, prefill_tokens, prefill_seqs, decode_seqs)
    busy, _, factor = _timed(system, work, prefill_context, decode_context, temperature)
    return busy * factor + system.efficiency.step_overhead_s


def _timed(
    system: System,
    work: _Microbatch,
    prefill_context: ArrayLike,
    decode_context: ArrayLike,
    temperature: float,
) -> tuple[Array, Array, Array]:
    """One microbatch ``work`` of an iteration, its prefill pieces after ``prefill_context``
    cached tokens and its decodes at ``decode_context``: (kernels + communication of the
    microbatch, x ``time_scale``; the communication alone; the pipeline factor m (m + p - 1) / p
    that turns one microbatch into the iteration)."""
    deployment, efficiency = system.deployment, system.efficiency
    tokens = work.tokens
    comm_s = tp_comm_s(system, tokens, temperature) + pp_transfer_s(system, tokens, temperature)
    comm_s = jnp.where(tokens > 0, comm_s, 0.0)
    kernels_s = _layer_kernels_s(system, work, prefill_context, decode_context, temperature)
    m = deployment.microbatches
    factor = m * pipeline_time_factor(deployment.pp, m)
    # layers split over pp stages: the chain of stages runs every layer once
    return (kernels_s + comm_s) * efficiency.time_scale, comm_s, factor


def prefill_step(
    system: System,
    input_len: ArrayLike,
    batch_size: ArrayLike = 1.0,
    temperature: float = 0.0,
) -> StepTime:
    """Prefill of ``batch_size`` prompts of ``input_len`` tokens from an empty cache."""
    return forward_step(
        system,
        prefill_tokens=jnp.asarray(input_len) * batch_size,
        prefill_seqs=batch_size,
        temperature=temperature,
    )


def decode_step(
    system: System,
    batch_size: ArrayLike,
    context_len: ArrayLike,
    temperature: float = 0.0,
) -> StepTime:
    """One decode iteration: one new token for each of ``batch_size`` sequences at ``context_len``."""
    return forward_step(
        system, decode_seqs=batch_size, decode_context=context_len, temperature=temperature
    )
