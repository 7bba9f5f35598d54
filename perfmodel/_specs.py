"""The pytrees every budget is a function of (ARCHITECTURE.md, "the five kinds of values").

Continuous quantities are traced array leaves (``eqx.field(converter=jnp.asarray)``) so that
``jit``, ``vmap``, ``grad`` and NumPyro see them; only names are static.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from ._constants import COMPUTE_DTYPES, DTYPE_BYTES, WEIGHT_DTYPE_COMPUTE


def _arr():
    return eqx.field(converter=jnp.asarray)


class ModelSpec(eqx.Module):
    """Architecture of a decoder-only transformer, as read from a Hugging Face ``config.json``.

    Attributes:
        name: Hugging Face id (static label).
        num_layers: transformer blocks L.
        hidden_size: model width d.
        num_heads: query heads.
        num_kv_heads: key/value heads H_kv (= num_heads for MHA, 1 for MQA).
        head_dim: query/key head width D_head (MLA: nope + rope dims).
        v_head_dim: value head width (= head_dim except MLA).
        mla_kv_dim: cached latent width per layer for MLA (kv_lora_rank + qk_rope_head_dim),
            0 for models that cache full K and V.
        num_full_attention_layers: layers whose KV grows with the whole context.
        num_window_layers: sliding-window or chunked-attention layers (live tokens <= window).
        window_tokens: their window (or chunk) in tokens.
        vocab_size: vocabulary V.
        total_params: all parameters (MoE: all experts).
        active_params: parameters used per token (MoE: top-k routed + shared experts).
        embedding_params: input-embedding parameters (a lookup, no FLOPs).
        lm_head_params: output-projection parameters (one GEMM per sampled token).
        num_experts: routed experts per MoE layer (0 for dense models).
        experts_per_token: routed experts each token uses (top-k).
        num_moe_layers: layers with routed experts.
        expert_params: parameters of one routed expert in one layer.
    """

    name: str = eqx.field(static=True)
    num_layers: jnp.ndarray = _arr()
    hidden_size: jnp.ndarray = _arr()
    num_heads: jnp.ndarray = _arr()
    num_kv_heads: jnp.ndarray = _arr()
    head_dim: jnp.ndarray = _arr()
    v_head_dim: jnp.ndarray = _arr()
    mla_kv_dim: jnp.ndarray = _arr()
    num_full_attention_layers: jnp.ndarray = _arr()
    num_window_layers: jnp.ndarray = _arr()
    window_tokens: jnp.ndarray = _arr()
    vocab_size: jnp.ndarray = _arr()
    total_params: jnp.ndarray = _arr()
    active_params: jnp.ndarray = _arr()
    embedding_params: jnp.ndarray = _arr()
    lm_head_params: jnp.ndarray = _arr()
    num_experts: jnp.ndarray = _arr()
    experts_per_token: jnp.ndarray = _arr()
    num_moe_layers: jnp.ndarray = _arr()
    expert_params: jnp.ndarray = _arr()


class HardwareSpec(eqx.Module):
    """Peak datasheet figures of one accelerator (``data/hardware.csv``), per device, SI units.

    Attributes:
        name: hardware id (static label).
        hbm_bytes: device memory in bytes (vendor nominal "GB" read as GiB).
        hbm_bytes_per_s: peak memory bandwidth, decimal bytes/s.
        dense_flops_per_s: dense tensor-core peak, shape (4,), for
            ``COMPUTE_DTYPES = (bf16, fp8, int8, fp4)``; a rate the chip lacks falls back to the
            next wider one (fp4 -> fp8 -> bf16), as weight-only kernels do.
        link_bytes_per_s: intra-node bandwidth per device, one direction.
        gpus_per_node: devices sharing the fast intra-node fabric.
        internode_bytes_per_s: network bandwidth per device between nodes, one direction.
        price_per_gpu_hour: on-demand $ per device-hour (NaN when not in the price list).
    """

    name: str = eqx.field(static=True)
    hbm_bytes: jnp.ndarray = _arr()
    hbm_bytes_per_s: jnp.ndarray = _arr()
    dense_flops_per_s: jnp.ndarray = _arr()
    link_bytes_per_s: jnp.ndarray = _arr()
    gpus_per_node: jnp.ndarray = _arr()
    internode_bytes_per_s: jnp.ndarray = _arr()
    price_per_gpu_hour: jnp.ndarray = _arr()


class Efficiency(eqx.Module):
    """Achievable fractions of peak and fixed costs: the uncertain parameters ``fitting/`` infers.

    Defaults are the order of magnitude seen in ``../shared/data/measurements`` (e.g. vidur's
    H100 GEMMs at 4096 tokens reach 75 % of dense bf16 peak; aiconfigurator's decode attention
    reads KV at ~90 % of HBM bandwidth; DGX-H100 8-GPU all-reduce bus bandwidth ~ 365 of 450 GB/s).

    Attributes:
        compute_fraction_max: asymptotic fraction of peak FLOP/s for large GEMMs, eta_max.
        compute_half_tokens: batched tokens at which the compute fraction is eta_max / 2:
            eta_c(n) = eta_max * n / (n + n_half) (small batches leave tensor cores idle).
        bandwidth_fraction: achievable fraction of peak HBM bandwidth, eta_b.
        step_overhead_s: fixed per-iteration cost (scheduling, sampling, kernel launches).
        collective_latency_s: per-hop latency alpha of a ring collective.
        collective_bandwidth_fraction: achievable fraction of link bandwidth in collectives.
        collective_base_latency_s: fixed cost of one collective call, alpha_0, paid once whatever
            the ring length (launch, protocol handshake): t = alpha_0 + hops * alpha + bytes / bw.
            nccl-tests small-message times grow far less than linearly in the hop count (~5 us at
            2 GPUs, ~15 us at 8 on NVSwitch), which one per-hop alpha cannot fit.  Default 0 (pure
            per-hop latency).
    """

    compute_fraction_max: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.75)
    compute_half_tokens: jnp.ndarray = eqx.field(converter=jnp.asarray, default=64.0)
    bandwidth_fraction: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.85)
    step_overhead_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0e-3)
    collective_latency_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=5.0e-6)
    collective_bandwidth_fraction: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.8)
    collective_base_latency_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)


def compute_dtype_weights(weight_dtype: str) -> jnp.ndarray:
    """One-hot over ``COMPUTE_DTYPES`` for the GEMM rate a weight dtype runs at."""
    return jnp.asarray(
        [1.0 if d == WEIGHT_DTYPE_COMPUTE[weight_dtype] else 0.0 for d in COMPUTE_DTYPES]
    )


class Deployment(eqx.Module):
    """The knobs of one deployment; real-valued so ``optimize/`` can relax them.

    Attributes:
        tp: tensor-parallel degree.
        pp: pipeline-parallel degree.
        replicas: independent copies of the TP x PP group.
        weight_bytes_per_param: storage width of weights (2 for bf16, 1 for fp8, 0.5 for int4/fp4).
        kv_bytes_per_elem: storage width of the KV cache.
        compute_dtype_mix: weights over ``COMPUTE_DTYPES`` picking the GEMM peak rate (one-hot at
            a discrete configuration, softmax weights when relaxed).
        gpu_memory_utilization: share of HBM the engine may use (vLLM's default 0.9).
        block_size_tokens: paged-KV block size B (vLLM default 16).
        max_model_len: longest sequence the engine admits (static reservation reserves this).
        max_num_batched_tokens: token budget of one iteration (vLLM/Sarathi).
        max_num_seqs: cap on sequences in one iteration.
        microbatches: PP microbatches in flight, m.
        host_kv_bytes: optional host-memory KV tier per device (0 = none).
        host_kv_bytes_per_s: host <-> device transfer bandwidth for that tier.
        kv_allocation: ``"paged"`` (blocks of B tokens) or ``"static"`` (max_model_len per sequence).
    """

    tp: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    pp: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    replicas: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    weight_bytes_per_param: jnp.ndarray = eqx.field(converter=jnp.asarray, default=2.0)
    kv_bytes_per_elem: jnp.ndarray = eqx.field(converter=jnp.asarray, default=2.0)
    compute_dtype_mix: jnp.ndarray = eqx.field(
        converter=jnp.asarray, default=(1.0, 0.0, 0.0, 0.0)
    )
    gpu_memory_utilization: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.9)
    block_size_tokens: jnp.ndarray = eqx.field(converter=jnp.asarray, default=16.0)
    max_model_len: jnp.ndarray = eqx.field(converter=jnp.asarray, default=8192.0)
    max_num_batched_tokens: jnp.ndarray = eqx.field(converter=jnp.asarray, default=8192.0)
    max_num_seqs: jnp.ndarray = eqx.field(converter=jnp.asarray, default=256.0)
    microbatches: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    host_kv_bytes: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    host_kv_bytes_per_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    kv_allocation: str = eqx.field(static=True, default="paged")

    @classmethod
    def create(
        cls,
        *,
        tp: int = 1,
        pp: int = 1,
        replicas: int = 1,
        weight_dtype: str = "bf16",
        kv_dtype: str = "bf16",
        microbatches: int | None = None,
        **knobs: float | str,
    ) -> Deployment:
        """A discrete deployment from dtype names; ``microbatches`` defaults to ``pp``."""
        for label, dtype in (("weight dtype", weight_dtype), ("KV dtype", kv_dtype)):
            if dtype not in DTYPE_BYTES:
                raise ValueError(
                    f"unknown {label} {dtype!r}; use one of {', '.join(DTYPE_BYTES)}"
                )
        return cls(
            tp=float(tp),
            pp=float(pp),
            replicas=float(replicas),
            weight_bytes_per_param=DTYPE_BYTES[weight_dtype],
            kv_bytes_per_elem=DTYPE_BYTES[kv_dtype],
            compute_dtype_mix=compute_dtype_weights(weight_dtype),
            microbatches=float(pp if microbatches is None else microbatches),
            **knobs,
        )
