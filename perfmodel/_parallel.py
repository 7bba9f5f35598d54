"""Communication budget: TP all-reduces, PP stage transfers and bubbles.

Ring all-reduce: t = 2(p-1)/p * n / bw + 2(p-1) * alpha (Patarasuk & Yuan 2009; Thakur et al. 2005).
Megatron TP: two all-reduces of the activations per layer (Shoeybi et al. 2019); with attention
data parallelism the attention's runs within its tp / a ranks and the MLP's all-gather before and
reduce-scatter after carry one all-reduce's traffic over all tp ranks (SGLang DP attention).
GPipe bubble: (p-1) / (m + p - 1) for m microbatches over p stages (Huang et al. 2019).
"""

from __future__ import annotations

import jax.numpy as jnp

from ._constants import ACTIVATION_BYTES
from ._smooth import smooth_step
from ._specs import Efficiency, HardwareSpec, System
from ._types import Array, ArrayLike, BatchArray, BatchLike


def _safe_div(num: ArrayLike, den: ArrayLike) -> Array:
    """num / den, 0 where den is not a positive finite number (double-where keeps grads finite)."""
    ok = jnp.isfinite(den) & (jnp.asarray(den) > 0)
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def ring_all_reduce_s(
    message_bytes: BatchLike,
    num_devices: BatchLike,
    link_bytes_per_s: BatchLike,
    efficiency: Efficiency,
) -> BatchArray:
    """Ring all-reduce time: 2(p-1)/p * n / (bw * eta) + 2(p-1) * alpha + alpha_0; zero for one
    device (alpha_0 = ``collective_base_latency_s``, the per-call cost)."""
    p = jnp.asarray(num_devices)
    hops = 2.0 * (p - 1.0)
    volume = hops / p * message_bytes
    bw = link_bytes_per_s * efficiency.collective_bandwidth_fraction
    latency = hops * efficiency.collective_latency_s + efficiency.collective_base_latency_s
    return jnp.where(p > 1.0, _safe_div(volume, bw) + latency, 0.0)


def point_to_point_s(
    message_bytes: BatchLike, link_bytes_per_s: BatchLike, efficiency: Efficiency
) -> BatchArray:
    """One send/recv: n / (bw * eta) + alpha + alpha_0."""
    bw = link_bytes_per_s * efficiency.collective_bandwidth_fraction
    latency = efficiency.collective_latency_s + efficiency.collective_base_latency_s
    return _safe_div(message_bytes, bw) + latency


def group_link_bytes_per_s(
    hardware: HardwareSpec, group_size: ArrayLike, temperature: float = 0.0
) -> Array:
    """Bandwidth a group's collective runs at: the node fabric while the group fits in a node,
    the inter-node network once it spans nodes."""
    spans = smooth_step(jnp.asarray(group_size) - hardware.gpus_per_node, temperature)
    intra = jnp.where(jnp.isfinite(hardware.link_bytes_per_s), hardware.link_bytes_per_s, 0.0)
    return (1.0 - spans) * intra + spans * hardware.internode_bytes_per_s


def tp_comm_s(
    system: System,
    tokens: BatchLike,
    temperature: float = 0.0,
) -> BatchArray:
    """TP collectives of one forward pass over ``tokens``, all layers (summed over stages).

    Per layer: the attention output's all-reduce among the attention's tp / a ranks, over the
    tokens / a of its group (a = ``deployment.attention_dp``; none when a = tp), and the MLP's
    over all tp ranks and all tokens (a > 1: the all-gather before the MLP and the reduce-scatter
    after it, one all-reduce's traffic).  At a = 1: two all-reduces per layer (Megatron-LM).
    Expert parallelism combines the experts' outputs with the same MLP collective.
    """
    model, hardware, deployment, efficiency = (
        system.model,
        system.hardware,
        system.deployment,
        system.efficiency,
    )
    width = model.hidden_size * ACTIVATION_BYTES
    tokens = jnp.asarray(tokens)
    attention_tp = deployment.tp / deployment.attention_dp
    attention = ring_all_reduce_s(
        tokens / deployment.attention_dp * width,
        attention_tp,
        group_link_bytes_per_s(hardware, attention_tp, temperature),
        efficiency,
    )
    mlp = ring_all_reduce_s(
        tokens * width,
        deployment.tp,
        group_link_bytes_per_s(hardware, deployment.tp, temperature),
        efficiency,
    )
    return model.num_layers * (attention + mlp)


def pp_transfer_s(
    system: System,
    tokens: BatchLike,
    temperature: float = 0.0,
) -> BatchArray:
    """Activation hand-offs between the pp stages of one forward pass: (pp - 1) sends."""
    deployment = system.deployment
    message = jnp.asarray(tokens) * system.model.hidden_size * ACTIVATION_BYTES
    link = group_link_bytes_per_s(system.hardware, deployment.tp * deployment.pp, temperature)
    return (deployment.pp - 1.0) * point_to_point_s(message, link, system.efficiency)


def pp_bubble_fraction(pp: BatchLike, microbatches: BatchLike) -> BatchArray:
    """Idle share of a GPipe schedule: (p - 1) / (m + p - 1)."""
    return (pp - 1.0) / (microbatches + pp - 1.0)


def pipeline_time_factor(pp: BatchLike, microbatches: BatchLike) -> BatchArray:
    """Iteration time of m microbatches through p stages, relative to one pass of the whole batch
    through all stages at the same per-microbatch work: (m + p - 1) / (m * p).  Equals 1 at p = 1."""
    return (microbatches + pp - 1.0) / (microbatches * pp)
