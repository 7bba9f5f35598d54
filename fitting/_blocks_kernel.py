"""Kernel rows: single GEMM, elementwise, attention and collective measurements, each predicted
by its ``perfmodel._ops`` kernel (``_features`` derives the numbers from a row)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from perfmodel import (
    Efficiency,
    attention_time_s,
    collective_time_s,
    elementwise_time_s,
    gemm_time_s,
)

from ._blocks_base import RowBlock, RowScales


class GemmRows(RowBlock):
    """``y = x W^T`` with x (M, K), W (N, K): vidur projection ops and aiconfigurator ``gemm``
    kernels -> ``gemm_time_s``, the roofline of 2 M N K FLOPs and the bytes moved."""

    m_tokens: np.ndarray
    """M: rows of x, the tokens of the call."""
    n_out_features: np.ndarray
    """N: output features (rows of W) on this GPU."""
    k_in_features: np.ndarray
    """K: input features (the reduction dimension)."""
    input_bytes_per_elem: np.ndarray
    """Bytes per activation element (1 for FP8-or-narrower GEMMs, 2 for bf16/fp16)."""
    peak_flops_per_s: np.ndarray
    """Dense peak FLOP/s of the GPU at the GEMM's dtype."""
    hbm_bytes_per_s: np.ndarray
    """Peak HBM bandwidth of the GPU, bytes/s."""
    low_precision: np.ndarray
    """1.0 where the GEMM runs at the FP8 (or narrower) tensor-core rate, else 0.0."""

    def predict(self, eff: Efficiency, ker: Efficiency, scales: RowScales) -> jnp.ndarray:
        return gemm_time_s(
            self.m_tokens,
            self.n_out_features,
            self.k_in_features,
            self.input_bytes_per_elem,
            self.peak_flops_per_s,
            self.hbm_bytes_per_s,
            eff,
            ker,
            self.low_precision,
        )


class ElementwiseRows(RowBlock):
    """Norms, residual add, activation, rope, embedding -> ``elementwise_time_s``:
    bytes / (BW eta_elem) + onchip x bytes / R_onchip plus the launch."""

    bytes_moved: np.ndarray
    """Bytes the kernel reads and writes."""
    hbm_bytes_per_s: np.ndarray
    """Peak HBM bandwidth of the GPU, bytes/s."""
    onchip_work: np.ndarray
    """1.0 for kernels with per-row work (they also pay the on-chip ceiling), 0.0 for a pure
    stream (residual add)."""

    def predict(self, eff: Efficiency, ker: Efficiency, scales: RowScales) -> jnp.ndarray:
        return elementwise_time_s(self.bytes_moved, self.hbm_bytes_per_s, ker, self.onchip_work)


class AttentionRows(RowBlock):
    """aiconfigurator ``attn_prefill`` / ``attn_decode`` kernels -> ``attention_time_s``: the
    roofline of their FLOPs at eta_a(s) = eta_a,max s / (s + s_half) and the bytes moved."""

    flops: np.ndarray
    """Attention FLOPs of the call."""
    bytes_moved: np.ndarray
    """Bytes of Q, K, V, output (and the KV cache read by decode)."""
    tokens_per_sequence: np.ndarray
    """s of eta_a(s): prompt tokens (prefill) or keys read (decode)."""
    work_units: np.ndarray
    """Grid units of the kernel: (sequence, KV head) pairs."""
    tile_flops: np.ndarray
    """FLOPs of the kernel's largest query tile (prefill), 0 for split-KV decode."""
    peak_flops_per_s: np.ndarray
    """Dense bf16 peak FLOP/s of the GPU."""
    hbm_bytes_per_s: np.ndarray
    """Peak HBM bandwidth of the GPU, bytes/s."""

    def predict(self, eff: Efficiency, ker: Efficiency, scales: RowScales) -> jnp.ndarray:
        return attention_time_s(
            self.flops,
            self.bytes_moved,
            self.tokens_per_sequence,
            self.peak_flops_per_s,
            self.hbm_bytes_per_s,
            eff,
            ker,
            0.0,
            self.work_units,
            self.tile_flops,
        )


class CollectiveRows(RowBlock):
    """All-reduce, one-pass gather/scatter/all-to-all and send/recv -> ``collective_time_s``;
    cross-node rows run at the inter-node link times ``internode_bandwidth_fraction``."""

    kind: np.ndarray
    """``perfmodel.COLLECTIVE_KINDS`` code: 0 all-reduce, 1 one-pass, 2 send/recv."""
    message_bytes: np.ndarray
    """Bytes of the message."""
    num_devices: np.ndarray
    """GPUs in the group."""
    link_bytes_per_s: np.ndarray
    """Catalog link bandwidth, bytes/s: NVLink within a node, the NIC rate across nodes."""
    cross_node: np.ndarray
    """1.0 where the group spans nodes, else 0.0."""

    def predict(self, eff: Efficiency, ker: Efficiency, scales: RowScales) -> jnp.ndarray:
        # the catalog's inter-node figure is a nominal NIC rate; the fabric a lab had differs
        link = self.link_bytes_per_s * (
            1.0 + self.cross_node * (ker.internode_bandwidth_fraction - 1.0)
        )
        scaled = eff.with_collective_latency_scale(jnp.exp(scales.collective_latency_log[self.pos]))
        return collective_time_s(self.kind, self.message_bytes, self.num_devices, link, scaled, ker)
