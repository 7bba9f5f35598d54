"""Operator-level roofline: one GEMM, one elementwise kernel, one attention call, one collective.

A kernel takes max(FLOPs / (peak * eta_c), bytes / (BW * eta_b)) plus a fixed launch cost
(roofline: Williams, Waterman & Patterson 2009; per-operator use as in LLM-Viewer, Yuan et al. 2024,
and vidur's per-operator decomposition, Agrawal et al. 2024).  The step-level budgets in
``_compute``/``_step`` use the same ``Efficiency``; what only a single kernel reveals (launch cost,
elementwise and attention-kernel efficiency, narrow-GEMM tiling, the FP8 derate) lives in
``KernelEfficiency``.

Collective volume factors (Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009; nccl-tests
``PERFORMANCE.md``): all-reduce moves 2(p-1)/p * n per device, all-gather / reduce-scatter /
all-to-all (p-1)/p * n, each with its number of ring steps times the per-hop latency.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from ._compute import compute_fraction
from ._constants import FLOPS_PER_MAC
from ._parallel import point_to_point_s, ring_all_reduce_s
from ._smooth import smooth_max
from ._specs import Efficiency
from ._types import Array, ArrayLike, BatchArray, BatchLike

ATTENTION_MATMULS = 2.0
"""Q K^T logits and the P V reduction: two matmuls per attended (query, key) pair."""

OUTPUT_BYTES = 2.0
"""Width of a kernel's activation output (bf16/fp16)."""


KernelEfficiency = Efficiency
"""The kernel-level fields live in the one ``Efficiency`` pytree that every step reads; this name
is the same class, kept for call sites that pass the kernel view as a separate argument."""

KERNEL_FIELDS = (
    "launch_overhead_s",
    "elementwise_bandwidth_fraction",
    "attention_compute_fraction_max",
    "attention_half_tokens",
    "gemm_half_width",
    "low_precision_compute_ratio",
    "internode_bandwidth_fraction",
    "attention_overhead_s",
    "elementwise_onchip_bytes_per_s",
    "attention_cta_s",
    "collective_ll_bandwidth_ratio",
    "collective_simple_latency_s",
    "attention_tile_share",
    "elementwise_launch_overlap",
)
"""``Efficiency`` fields that single-kernel and collective timings identify (launch, elementwise,
attention-kernel, tiling, FP8 derate, NCCL protocol, inter-node fabric)."""


def gemm_time_s(
    m: BatchLike,
    n: BatchLike,
    k: BatchLike,
    input_bytes_per_elem: BatchLike,
    peak_flops_per_s: BatchLike,
    hbm_bytes_per_s: BatchLike,
    efficiency: Efficiency,
    kernel: KernelEfficiency,
    low_precision: BatchLike = 0.0,
    temperature: float = 0.0,
    weight_bytes_per_elem: BatchLike | None = None,
    groups: BatchLike = 1.0,
) -> BatchArray:
    """Time of ``y = x W^T`` with x (m, k), W (n, k): roofline of 2mnk FLOPs and the bytes moved.

    Bytes = m k * input width + n k * weight width (``weight_bytes_per_elem``, default the input
    width; weight-only INT4 streams 0.5-byte weights into 16-bit math) + m n * ``OUTPUT_BYTES``.
    ``groups`` > 1 is a grouped GEMM (MoE experts): that many independent (m, n, k) problems in
    one kernel, so the roofline terms scale by ``groups``, the launch is paid once and the
    compute fraction is that of the launch's m * groups rows (its tiles fill the SMs together:
    fused MoE kernels, Triton ``fused_moe``, DeepGEMM grouped GEMMs).  An empty
    GEMM (m = 0) costs nothing.  Compute fraction
    eta_c(m) * n/(n + w) * k/(k + w), times ``low_precision_compute_ratio`` where ``low_precision``
    is 1 (FP8/FP4 rates, which also pay a second launch for the activation-quantisation kernel).
    E.g. 4096^3 bf16 on H100 SXM at eta = 0.75: 2 * 4096^3 / (0.75 * 989e12)
    = 185 us (aiconfigurator measures 166 us).
    """
    m, n, k = jnp.asarray(m), jnp.asarray(n), jnp.asarray(k)
    busy = (m > 0) & (n > 0) & (k > 0)
    # double-where safe mask: the branch not taken stays finite, so its gradient is too
    m_safe, n, k = (jnp.where(busy, x, 1.0) for x in (m, n, k))
    w = kernel.gemm_half_width
    derate = 1.0 + jnp.asarray(low_precision) * (kernel.low_precision_compute_ratio - 1.0)
    # a grouped launch fills the SMs with the tiles of all its groups: occupancy by its total rows
    eta = compute_fraction(efficiency, m_safe * groups) * n / (n + w) * k / (k + w) * derate
    compute_s = groups * FLOPS_PER_MAC * m_safe * n * k / (peak_flops_per_s * eta)
    w_bytes = input_bytes_per_elem if weight_bytes_per_elem is None else weight_bytes_per_elem
    moved = groups * (
        m_safe * k * input_bytes_per_elem + n * k * w_bytes + m_safe * n * OUTPUT_BYTES
    )
    memory_s = moved / (hbm_bytes_per_s * efficiency.bandwidth_fraction)
    # FP8/FP4 GEMMs first quantise the activations in their own kernel (vLLM scaled_fp8_quant)
    launches = 1.0 + jnp.asarray(low_precision)
    t = smooth_max(compute_s, memory_s, temperature) + launches * kernel.launch_overhead_s
    return jnp.where(busy, t, 0.0)


def elementwise_time_s(
    bytes_moved: BatchLike,
    hbm_bytes_per_s: BatchLike,
    kernel: KernelEfficiency,
    onchip: BatchLike = 1.0,
) -> BatchArray:
    """Bandwidth-bound kernel (norm, residual add, activation, rope, embedding gather):
    s = bytes / (BW * eta_elem) + onchip * bytes / R_onchip (two ceilings in series: the HBM
    stream and the SMs' own issue rate, ``elementwise_onchip_bytes_per_s``, inf by default;
    ``onchip`` = 0 for a pure stream with no per-row work, such as a residual add), plus the launch
    L less the share o = ``elementwise_launch_overlap`` of it hidden under the stream:
    s + L - o * min(s, L) (o = 0: in series, the default)."""
    bw = hbm_bytes_per_s * kernel.elementwise_bandwidth_fraction
    moved = jnp.asarray(bytes_moved)
    per_row = jnp.asarray(onchip) * moved / kernel.elementwise_onchip_bytes_per_s
    stream = moved / bw + per_row
    hidden = kernel.elementwise_launch_overlap * jnp.minimum(stream, kernel.launch_overhead_s)
    return stream + kernel.launch_overhead_s - hidden


def attention_time_s(
    flops: BatchLike,
    bytes_moved: BatchLike,
    tokens_per_sequence: BatchLike,
    peak_flops_per_s: BatchLike,
    hbm_bytes_per_s: BatchLike,
    efficiency: Efficiency,
    kernel: KernelEfficiency,
    temperature: float = 0.0,
    work_units: BatchLike = 0.0,
    tile_flops: BatchLike = 0.0,
) -> BatchArray:
    """One fused attention call: roofline of its FLOPs at eta_a(s) = eta_a,max s / (s + s_half),
    s = ``tokens_per_sequence``, and the bytes it moves (Q, K, V, output; the KV cache for decode)
    at eta_b, plus launch and ``attention_overhead_s`` (FlashAttention tiling: Dao 2023; Shah et al.
    2024), plus ``work_units`` x ``attention_cta_s`` in series (the kernel's grid: batch x KV
    heads; default 0), plus the longest CTA's ``tile_flops`` (one query tile against every key it
    attends, ``attention_tile_flops``) at ``attention_tile_share`` of the peak times eta_a(s)
    (Graham's list-scheduling bound; default 0)."""
    q = jnp.asarray(tokens_per_sequence)
    eta = kernel.attention_compute_fraction_max * q / (q + kernel.attention_half_tokens)
    compute_s = (jnp.asarray(flops) + jnp.asarray(tile_flops) / kernel.attention_tile_share) / (
        peak_flops_per_s * eta
    )
    memory_s = jnp.asarray(bytes_moved) / (hbm_bytes_per_s * efficiency.bandwidth_fraction)
    fixed_s = kernel.launch_overhead_s + kernel.attention_overhead_s
    grid_s = jnp.asarray(work_units) * kernel.attention_cta_s
    return smooth_max(compute_s, memory_s, temperature) + fixed_s + grid_s


def prefill_attention_flops(
    batch: BatchLike,
    new_tokens: BatchLike,
    num_heads: BatchLike,
    head_dim: BatchLike,
    window_tokens: BatchLike = 0.0,
) -> BatchArray:
    """Causal self-attention FLOPs of ``batch`` prompts of ``new_tokens`` from an empty cache:
    pairs = s(s+1)/2 (full) or ~ s * min((s+1)/2, W) (window W > 0); each pair costs
    2 matmuls * 2 FLOPs * heads * head_dim (Kaplan et al. 2020, Table 1)."""
    s = jnp.asarray(new_tokens)
    w = jnp.asarray(window_tokens)
    pairs = jnp.where(
        w > 0, s * jnp.minimum((s + 1.0) / 2.0, jnp.where(w > 0, w, 1.0)), s * (s + 1.0) / 2.0
    )
    return batch * pairs * ATTENTION_MATMULS * FLOPS_PER_MAC * num_heads * head_dim


ATTENTION_QUERY_TILE = 128.0
"""Query rows per FlashAttention-2/3 CTA at head dims 64-256 (Dao 2023; Shah et al. 2024)."""


def attention_tile_flops(keys: BatchLike, new_tokens: BatchLike, head_dim: BatchLike) -> BatchArray:
    """FLOPs of a fused attention kernel's longest CTA: min(``ATTENTION_QUERY_TILE``, new tokens)
    query rows of one head against ``keys`` keys (the last tile of a causal prefill sees every key),
    2 matmuls * 2 FLOPs * head_dim per pair.  E.g. 4096 keys, head dim 128: 128 * 4096 * 512
    = 268 MFLOP."""
    rows = jnp.minimum(ATTENTION_QUERY_TILE, jnp.asarray(new_tokens))
    return rows * jnp.asarray(keys) * ATTENTION_MATMULS * FLOPS_PER_MAC * head_dim


def one_pass_collective_s(
    message_bytes: ArrayLike,
    num_devices: ArrayLike,
    link_bytes_per_s: ArrayLike,
    efficiency: Efficiency,
) -> Array:
    """All-gather, reduce-scatter or all-to-all (ring / pairwise): (p-1)/p * n / (bw * eta)
    + (p-1) * alpha + alpha_0; zero for one device (``message_bytes`` is the whole buffer,
    nccl-tests size)."""
    p = jnp.asarray(num_devices)
    volume = (p - 1.0) / p * message_bytes
    bw = link_bytes_per_s * efficiency.collective_bandwidth_fraction
    latency = (p - 1.0) * efficiency.collective_latency_s + efficiency.collective_base_latency_s
    return jnp.where(p > 1.0, volume / bw + latency, 0.0)


def _one_protocol_s(kind, message_bytes, num_devices, link_bytes_per_s, efficiency) -> Array:
    ar = ring_all_reduce_s(message_bytes, num_devices, link_bytes_per_s, efficiency)
    op = one_pass_collective_s(message_bytes, num_devices, link_bytes_per_s, efficiency)
    p2p = point_to_point_s(message_bytes, link_bytes_per_s, efficiency)
    return jnp.where(kind == 0, ar, jnp.where(kind == 1, op, p2p))


def collective_time_s(
    kind: BatchLike,
    message_bytes: BatchLike,
    num_devices: BatchLike,
    link_bytes_per_s: BatchLike,
    efficiency: Efficiency,
    kernel: KernelEfficiency | None = None,
) -> BatchArray:
    """Collective by kind code: 0 all-reduce (ring), 1 one-pass (gather/scatter/all-to-all),
    2 send/recv (point to point).  Codes keep the dispatch a ``where``, not Python control flow.

    With ``kernel``, the faster of NCCL's two protocol regimes (NCCL ``tuning.cc``: per call, the
    protocol with the least base + hops x hop latency + bytes / protocol bandwidth):
    LL, t = alpha terms + wire / r_LL, and Simple, t = alpha terms + wire + alpha_S, where wire is
    the volume term at ``collective_bandwidth_fraction`` (the large-message bus bandwidth),
    r_LL = ``collective_ll_bandwidth_ratio`` and alpha_S = ``collective_simple_latency_s``.
    E.g. 2-GPU all-reduce of 2 MiB at 300 GB/s, r_LL = 0.4, alpha terms 6 us, alpha_S = 13 us:
    LL 6 + 17.5 = 23.5 us, Simple 6 + 7 + 13 = 26 us -> 23.5 us.  None: one regime (as before).
    """
    kind = jnp.asarray(kind)
    t = _one_protocol_s(kind, message_bytes, num_devices, link_bytes_per_s, efficiency)
    if kernel is None:
        return t
    zero = jnp.zeros_like(jnp.asarray(efficiency.collective_latency_s))
    no_latency = eqx.tree_at(
        lambda e: (e.collective_latency_s, e.collective_base_latency_s),
        efficiency,
        (zero, jnp.zeros_like(jnp.asarray(efficiency.collective_base_latency_s))),
    )
    wire = _one_protocol_s(kind, message_bytes, num_devices, link_bytes_per_s, no_latency)
    ll = t + wire * (1.0 / kernel.collective_ll_bandwidth_ratio - 1.0)
    simple = t + kernel.collective_simple_latency_s
    return jnp.where(t > 0.0, jnp.minimum(ll, simple), t)


COLLECTIVE_KINDS = {
    "all_reduce": 0,
    "all_gather": 1,
    "reduce_scatter": 1,
    "alltoall": 1,
    "send_recv": 2,
}
"""Kind code of each collective ``op`` name in the measurement schema."""
