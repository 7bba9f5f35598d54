"""Expert parallelism (EP) for MoE decode: all-to-all dispatch and combine against a TP split.

Under EP over ``ep`` devices each device holds E / ep routed experts and its own share of the
batch (attention data-parallel, as DeepSeek-V3 serves decode); every MoE layer sends each token's
hidden state to its top-k experts and back: two all-to-alls, each moving
tokens * k * d * bytes * (ep - 1) / ep per device over the link, plus (ep - 1) latency hops
(Lepikhin et al., GShard 2020; Rajbhandari et al., DeepSpeed-MoE 2022; DeepSeek-V3 report 2024).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from ._compute import attention_flops, compute_fraction, linear_flops, peak_flops_per_s
from ._constants import ACTIVATION_BYTES
from ._memory import kv_bytes_per_sequence
from ._parallel import group_link_bytes_per_s
from ._smooth import smooth_max
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec
from ._step import expected_experts_touched
from ._types import Array, ArrayLike

ALL_TO_ALLS_PER_MOE_LAYER = 2.0
"""Dispatch (tokens to their experts) and combine (expert outputs back)."""


def all_to_all_s(
    tokens: ArrayLike,
    hidden_size: ArrayLike,
    bytes_per_elem: ArrayLike,
    ep: ArrayLike,
    link_bytes_per_s: ArrayLike,
    efficiency: Efficiency,
) -> Array:
    """One all-to-all of ``tokens`` hidden vectors held by one device:
    tokens * d * bytes * (ep - 1) / ep / (bw * eta) + (ep - 1) * alpha; zero for ep = 1."""
    p = jnp.asarray(ep, dtype=float)
    volume = jnp.asarray(tokens) * hidden_size * bytes_per_elem * (p - 1.0) / p
    bw = link_bytes_per_s * efficiency.collective_bandwidth_fraction
    return jnp.where(p > 1.0, volume / bw + (p - 1.0) * efficiency.collective_latency_s, 0.0)


class ExpertParallelStep(eqx.Module):
    """One EP decode iteration (seconds); ``comm_s`` is the all-to-all total over MoE layers."""

    compute_s: Array
    memory_s: Array
    comm_s: Array
    total_s: Array


def ep_decode_step(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    batch_size: ArrayLike,
    context_len: ArrayLike,
    ep: ArrayLike,
    temperature: float = 0.0,
) -> ExpertParallelStep:
    """Decode step of ``batch_size`` sequences spread over ``ep`` devices (batch / ep each).

    Per device: dense weights (attention, shared experts, embeddings) in full, the experts its
    tokens route to among its E / ep, its sequences' KV; roofline max of FLOPs and bytes, plus
    2 all-to-alls per MoE layer of batch / ep tokens * top-k.  ``deployment.tp`` is ignored.
    """
    p = jnp.asarray(ep, dtype=float)
    local = jnp.asarray(batch_size) / p
    all_experts = model.num_moe_layers * model.num_experts * model.expert_params
    dense_bytes = (model.total_params - all_experts) * deployment.weight_bytes_per_param
    experts_here = expected_experts_touched(model, batch_size) / p
    expert_bytes = (
        model.num_moe_layers
        * model.expert_params
        * experts_here
        * deployment.weight_bytes_per_param
    )
    kv = local * kv_bytes_per_sequence(
        model, deployment.kv_bytes_per_elem, context_len + 1.0, temperature
    )
    memory_s = (dense_bytes + expert_bytes + kv) / (
        hardware.hbm_bytes_per_s * efficiency.bandwidth_fraction
    )

    # uniform routing: a device's experts receive batch * k / ep token-expert pairs, the same
    # expert FLOPs its own batch / ep tokens would need, so per-device FLOPs = those of batch / ep.
    flops = linear_flops(model, local, local) + local * attention_flops(
        model, 1.0, context_len, temperature
    )
    peak = peak_flops_per_s(hardware, deployment) * compute_fraction(efficiency, local)
    compute_s = flops / peak

    link = group_link_bytes_per_s(hardware, p, temperature)
    comm_s = (
        ALL_TO_ALLS_PER_MOE_LAYER
        * model.num_moe_layers
        * all_to_all_s(
            local * model.experts_per_token,
            model.hidden_size,
            ACTIVATION_BYTES,
            p,
            link,
            efficiency,
        )
    )
    total = smooth_max(compute_s, memory_s, temperature) + comm_s + efficiency.step_overhead_s
    return ExpertParallelStep(compute_s=compute_s, memory_s=memory_s, comm_s=comm_s, total_s=total)
