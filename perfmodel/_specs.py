"""The pytrees every budget is a function of (ARCHITECTURE.md, "the five kinds of values").

Continuous quantities are traced array leaves (``eqx.field(converter=jnp.asarray)``) so that
``jit``, ``vmap``, ``grad`` and NumPyro see them; only names are static.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp

from ._constants import COMPUTE_DTYPES, DTYPE_BYTES, WEIGHT_DTYPE_COMPUTE
from ._types import ArrayLike

UNBOUNDED = 1.0e30
"""Default of a ceiling that is off (a rate or share so large its term vanishes): finite, so
weighted mixes over GPU types (0 x value) and gradients stay finite where inf would give NaN."""


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
        attention_params: weights of one layer's attention projections (Q, K, V and output;
            MLA: its low-rank down/up projections), biases and QK-norms included.
        output_projection_params: the output projection's share of ``attention_params``
            (row-parallel under TP; the rest is column-parallel).
        dense_mlp_params: weights of one dense (non-MoE) layer's MLP.
        shared_expert_params: weights every token of a MoE layer uses (shared experts, router).
        mlp_matrices: matrices per MLP or expert (3 gated: gate, up, down; 2 ungated).
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
    attention_params: jnp.ndarray = _arr()
    output_projection_params: jnp.ndarray = _arr()
    dense_mlp_params: jnp.ndarray = _arr()
    shared_expert_params: jnp.ndarray = _arr()
    mlp_matrices: jnp.ndarray = _arr()

    @property
    def has_routed_experts(self) -> jnp.ndarray:
        """Whether the model routes tokens to experts (``num_experts`` > 0): expert parallelism
        and the MoE layouts that split the experts need them.  A boolean array, usable under
        ``jit``; ``bool(...)`` outside it."""
        return self.num_experts > 0


class HardwareSpec(eqx.Module):
    """Peak datasheet figures of one accelerator (``data/hardware.csv``), per device, SI units.

    Attributes:
        name: hardware id (static label).
        hbm_bytes: device memory in bytes (vendor nominal "GB" read as GiB).
        hbm_bytes_per_s: peak memory bandwidth, decimal bytes/s.
        dense_flops_per_s: dense tensor-core peak, shape (4,), for
            ``COMPUTE_DTYPES = (bf16, fp8, int8, fp4)``; a rate the chip lacks falls back to the
            rate its weight-only kernels run at: 4-bit weights dequantised to 16-bit math (fp4
            -> bf16: Marlin / vLLM's MXFP4 path on Hopper), fp8 -> bf16, int8 -> fp8.
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


Named = TypeVar("Named", "ModelSpec", "HardwareSpec")


def unnamed(spec: Named, name: str = "") -> Named:
    """The same spec under a neutral name.  The name is the spec's one static field, so a
    compiled function of it is traced and compiled once per name; no budget reads the name, and
    under this one every model (or GPU) of the same structure shares the compiled program."""
    return dataclasses.replace(spec, name=name)


def without_names(tree):
    """``tree`` with every ``ModelSpec`` and ``HardwareSpec`` in it ``unnamed`` (a target, a
    draft model nested in a decode cost, ...)."""
    named = (ModelSpec, HardwareSpec)
    return jax.tree.map(
        lambda x: unnamed(x) if isinstance(x, named) else x,
        tree,
        is_leaf=lambda x: isinstance(x, named),
    )


def strongly_typed(tree):
    """``tree`` with every weakly typed floating array made strongly typed (same dtype, same
    values) when all its floating arrays share one dtype.  A spec built from Python numbers
    (``jnp.asarray(0.5)``) holds weakly typed leaves, one built from a file's arrays strongly
    typed ones; ``jit`` keys its programs by weak type too, so without this the same budgets of
    the same shapes compile twice.  With one floating dtype in the tree the weak type decides no
    promotion between its leaves; a tree mixing dtypes is returned as it is (a weak float64
    scalar times a float32 array stays float32)."""
    leaves = jax.tree.leaves(tree)
    floats = {x.dtype for x in leaves if _is_float_array(x)}
    if len(floats) != 1:
        return tree

    def strong(x):
        if _is_float_array(x) and getattr(x, "weak_type", False):
            return jax.lax.convert_element_type(x, x.dtype)
        return x

    return jax.tree.map(strong, tree)


def _is_float_array(x) -> bool:
    return hasattr(x, "dtype") and hasattr(x, "shape") and jnp.issubdtype(x.dtype, jnp.floating)


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

    Kernel-level fields (what single-kernel timings identify; the per-operator step reads them):
        launch_overhead_s: fixed cost of one kernel (launch, prologue, tail), seconds.
        elementwise_bandwidth_fraction: fraction of peak HBM bandwidth a norm/add/activation/rope
            kernel streams at.
        attention_compute_fraction_max: asymptotic fraction of peak FLOP/s of a fused
            (flash) attention kernel.
        attention_half_tokens: tokens per sequence (prefill: new tokens; decode: cached context)
            at which a fused attention kernel's compute fraction is half the asymptote (short
            sequences leave most of each 128-row tile idle and the causal diagonal dominates).
        gemm_half_width: GEMM N or K at which tiling leaves half the tensor cores idle:
            eta(m, n, k) = eta_c(m) * n / (n + w) * k / (k + w).
        low_precision_compute_ratio: achieved FP8 (or narrower) GEMM fraction of its own peak,
            relative to the bf16 fraction (power and clock limits bite harder at 2x the rate).
        internode_bandwidth_fraction: share of ``HardwareSpec.internode_bytes_per_s`` (a nominal
            one-NIC-per-GPU rate) a cross-node collective's fabric actually delivers.
        attention_overhead_s: fixed cost of a fused attention call beyond ``launch_overhead_s``
            (scheduler metadata, split-KV combine kernels: aiconfigurator's tiniest attention calls
            take 10-15 us where a GEMM launch takes 3-5 us).  Default 0.
        elementwise_onchip_bytes_per_s: the second ceiling of an elementwise kernel: the rate its
            SMs issue the loads, reductions and stores of its rows, which does not grow with HBM
            bandwidth (vidur's Llama-2-7B RMSNorm costs ~16 ns per token beyond its HBM stream on
            A40, A100 and H100 alike, 0.7 to 3.4 TB/s).  Default ``UNBOUNDED`` (HBM-bound only).
        attention_cta_s: time per work unit (one sequence x one KV head: the CTAs of a fused
            attention kernel, which read the block table, load Q, keep the softmax state and
            write or combine the output) beyond the roofline, summed over the grid (CTAs run in
            waves over the SMs, so the cost grows with batch x KV heads whatever the length):
            aiconfigurator's vLLM FlashAttention at 1-16 tokens costs 12 us + ~25-30 ns (H100) /
            ~37-46 ns (A100) per (sequence, KV head), decode up to batch 2048 and prefill up to
            batch 256 alike.  Default 0.
        collective_ll_bandwidth_ratio: share of the collective bandwidth that NCCL's low-latency
            (LL) protocol reaches (8-byte stores carrying 4 bytes of data and a 4-byte flag: at
            most half; nccl-tests on A100/H100 NVSwitch: ~0.35-0.42).  Default 1 (one regime).
        collective_simple_latency_s: extra fixed cost of NCCL's bandwidth (Simple) protocol over
            the LL latency (NCCL's tuning model gives Simple ~2-3 us more per hop and a larger
            base; nccl-tests: ~13-26 us).  A collective takes the faster protocol (NCCL picks the
            one its tuning model predicts fastest per call).  Default 0 (one regime).
        attention_tile_share: share of the GPU's peak FLOP/s x eta_a one attention CTA (one
            query tile) computes at (one SM's share is 1/108 on A100, 1/132 on H100; the bundled
            fit gives ~0.019 on both, ~2x that: a lone tail CTA has its SM to itself).  A kernel cannot finish
            before its longest CTA, so greedy scheduling of the grid takes at most the spread-out
            work plus the longest CTA (Graham 1969: makespan <= W / m + p_max): a causal prefill
            of few sequences x heads (few CTAs, the last query tile spanning every key) runs far
            below its FLOP roofline (aiconfigurator FA2/FA3, 1-4 heads x 1-4 sequences of 1-4k
            tokens: 0.1-0.3 of peak where 64 heads reach 0.5).  Default ``UNBOUNDED`` (no tail).
        elementwise_launch_overlap: share of ``launch_overhead_s`` an elementwise kernel hides
            under its own stream (CTAs launch and ramp while earlier ones already load):
            t = s + L - o * min(s, L).  vidur's kernels stay near their floor until the stream
            exceeds it and then grow with the bytes (H100 RMSNorm 4 us from 1 to 256 tokens,
            7 us at 512); least squares per GPU give o = 0.82-0.89 on A40, A100 and H100.
            Default 0 (in series).
        time_scale: multiplier on an iteration's kernel and communication time: an engine's or
            lab's discrepancy from the sum of its kernels (Kennedy & O'Hagan 2001), e^delta of
            the fitted (source, engine) offset; 1 = the kernels' own sum.
        ttft_scale: measured over modelled time to first token of a serving engine under load,
            e^delta of the end-to-end stage's fitted engine offset (``fitting._serving_stage``):
            what the step and load models leave out between a client and the first token
            (HTTP and tokenisation, the scheduler's admission, detokenisation and streaming).
            Closed-loop runs of three engines in two labs put it at ~2-6x (vLLM ~2.2x); 1 =
            the physics alone.  ``engine_scaled`` applies it to the load model's output.
        tpot_scale: the same for the time per output token (and each inter-token gap); ~0.8-1.1
            in the same runs.  1 = the physics alone.
    """

    compute_fraction_max: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.75)
    compute_half_tokens: jnp.ndarray = eqx.field(converter=jnp.asarray, default=64.0)
    bandwidth_fraction: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.85)
    step_overhead_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0e-3)
    collective_latency_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=5.0e-6)
    collective_bandwidth_fraction: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.8)
    collective_base_latency_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    launch_overhead_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=4.0e-6)
    elementwise_bandwidth_fraction: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.7)
    attention_compute_fraction_max: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.6)
    attention_half_tokens: jnp.ndarray = eqx.field(converter=jnp.asarray, default=512.0)
    gemm_half_width: jnp.ndarray = eqx.field(converter=jnp.asarray, default=64.0)
    low_precision_compute_ratio: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.6)
    internode_bandwidth_fraction: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.5)
    attention_overhead_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    elementwise_onchip_bytes_per_s: jnp.ndarray = eqx.field(
        converter=jnp.asarray, default=UNBOUNDED
    )
    attention_cta_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    collective_ll_bandwidth_ratio: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    collective_simple_latency_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    attention_tile_share: jnp.ndarray = eqx.field(converter=jnp.asarray, default=UNBOUNDED)
    elementwise_launch_overlap: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    time_scale: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    ttft_scale: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    tpot_scale: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)

    def with_collective_latency_scale(self, scale: ArrayLike) -> Efficiency:
        """The same efficiencies with the collective latencies alpha and alpha_0 times ``scale``
        (a source's or an engine's all-reduce kernel against the nccl-tests anchor)."""
        return dataclasses.replace(
            self,
            collective_latency_s=self.collective_latency_s * scale,
            collective_base_latency_s=self.collective_base_latency_s * scale,
        )


def compute_dtype_weights(weight_dtype: str) -> jnp.ndarray:
    """One-hot over ``COMPUTE_DTYPES`` for the GEMM rate a weight dtype runs at."""
    return jnp.asarray(
        [1.0 if d == WEIGHT_DTYPE_COMPUTE[weight_dtype] else 0.0 for d in COMPUTE_DTYPES]
    )


PREFILL_FIRST_ENGINES = ("sglang",)
"""Engines whose scheduler prefills waiting prompts in iterations of their own before the next
decode (``Deployment.prefill_first``; SGLang: ``--enable-mixed-chunk`` is off by default); vLLM
and TensorRT-LLM mix prompt chunks into decode iterations."""


def engine_prefill_first(engine: str | None, mixed_chunk: bool = False) -> float:
    """``Deployment.prefill_first`` of an engine named as a CLI or a measurement names it: 1 on
    a ``PREFILL_FIRST_ENGINES`` engine unless it mixes prefill chunks into decodes
    (SGLang's ``--enable-mixed-chunk``), else 0."""
    name = "" if engine is None else str(engine).strip().lower()
    return 1.0 if name in PREFILL_FIRST_ENGINES and not mixed_chunk else 0.0


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
        scheduler_polls: decode iterations between the scheduler's polls for new requests
            (SGLang's ``--scheduler-recv-interval``; 1 = every iteration, vLLM's and
            TensorRT-LLM's behaviour): an arrival waits ``poll_wait_s`` for the next poll.
        expert_parallel: EP degree e of the MoE layers: the ``tp`` ranks of a stage hold
            E / e whole routed experts each, each expert split over the remaining tp / e ranks
            (SGLang ``--ep-size``, TensorRT-LLM ``--ep_size``; vLLM's
            ``--enable-expert-parallel`` is e = tp). 1 = experts split by TP only.
        attention_dp: attention data-parallel degree a: attention runs as a groups of tp / a
            ranks, each on its own 1 / a of the sequences with its own copy of the attention
            weights and only its sequences' KV (SGLang ``--enable-dp-attention --dp-size``,
            TensorRT-LLM ``enable_attention_dp``); the MoE/MLP layers still span all tp ranks.
            1 = attention split by TP.
        prefill_first: 1 when waiting prompts are prefilled in iterations of their own, ahead
            of the next decode iteration (SGLang's default: prefill and decode batches are not
            mixed unless ``--enable-mixed-chunk``); 0 when prompt chunks ride in the decode
            iterations (vLLM, TensorRT-LLM).  A closed loop of fixed-length requests on such an
            engine runs in lockstep (``perfmodel._closed_loop``).
    """

    tp: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    pp: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    replicas: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    weight_bytes_per_param: jnp.ndarray = eqx.field(converter=jnp.asarray, default=2.0)
    kv_bytes_per_elem: jnp.ndarray = eqx.field(converter=jnp.asarray, default=2.0)
    compute_dtype_mix: jnp.ndarray = eqx.field(converter=jnp.asarray, default=(1.0, 0.0, 0.0, 0.0))
    gpu_memory_utilization: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.9)
    block_size_tokens: jnp.ndarray = eqx.field(converter=jnp.asarray, default=16.0)
    max_model_len: jnp.ndarray = eqx.field(converter=jnp.asarray, default=8192.0)
    max_num_batched_tokens: jnp.ndarray = eqx.field(converter=jnp.asarray, default=8192.0)
    max_num_seqs: jnp.ndarray = eqx.field(converter=jnp.asarray, default=256.0)
    microbatches: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    host_kv_bytes: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    host_kv_bytes_per_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    kv_allocation: str = eqx.field(static=True, default="paged")
    scheduler_polls: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    expert_parallel: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    attention_dp: jnp.ndarray = eqx.field(converter=jnp.asarray, default=1.0)
    prefill_first: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)

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
        """A discrete deployment from dtype names; ``microbatches`` defaults to ``pp``.
        ``expert_parallel`` and ``attention_dp`` (in ``knobs``) must divide ``tp``."""
        for label, dtype in (("weight dtype", weight_dtype), ("KV dtype", kv_dtype)):
            if dtype not in DTYPE_BYTES:
                raise ValueError(f"unknown {label} {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
        for label in ("expert_parallel", "attention_dp"):
            degree = knobs.get(label, 1.0)
            if not (float(degree) >= 1.0 and float(tp) % float(degree) == 0.0):
                raise ValueError(f"{label} {degree} must be >= 1 and divide tp {tp}")
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


class System(eqx.Module):
    """What every budget is a function of: a model served on a GPU type under a deployment, its
    kernels and engine priced by an ``Efficiency``.

    One pytree instead of four positional arguments.  ``vmap`` maps it part by part: a
    posterior's draws with ``in_axes=(System(None, None, None, 0),)`` over a ``System`` whose
    efficiency leaves carry the draws axis.  Its static fields are the spec names and the
    deployment's ``kv_allocation``; ``without_names`` drops the names, so systems of different GPUs
    or models (one allocation mode) stack leaf by leaf with ``jax.tree.map`` and one compiled
    program serves every spec of the same shapes.  Change one
    part with ``dataclasses.replace(system, deployment=...)``.
    """

    model: ModelSpec
    hardware: HardwareSpec
    deployment: Deployment
    efficiency: Efficiency
