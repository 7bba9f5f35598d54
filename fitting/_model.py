"""The NumPyro calibration model: a plain function around ``predict_log`` (the physics).

Per GPU g and parameter p (every ``Efficiency`` and ``KernelEfficiency`` field), on its
unconstrained scale u = logit(theta) for fractions in (0, 1) and log(theta) for positive quantities:

    mu_p ~ Normal(prior_p, s_p)             spec-sheet-informed population mean
    tau_p ~ HalfNormal(t_p)                 spread between GPU types (partial pooling)
    u_gp = mu_p + tau_p * z_gp, z_gp ~ N(0, 1)   (non-centred; Gelman et al., BDA3 ch. 5)

A new GPU's parameters are draws from Normal(mu_p, tau_p) (its spec sheet supplies the peaks).
Rows of whole-model scenarios (and a few kernel groups, ``has_offset``) add the offset
delta_c ~ N(0, tau_src) (kernel groups: N(0, tau_kernel)) of their cell c = (source/engine, group k):
a Kennedy & O'Hagan (2001) discrepancy per lab/engine and operator class, so a different lab or
engine (an unseen cell) widens the interval by tau_src instead of biasing it.  One offset per cell
rather than a source effect plus a group effect avoids an additive ridge NUTS mixes badly on.
A GPU x kernel-group interaction eta_gk ~ N(0, tau_gpu) (non-centred; tau_gpu learned) lets each
GPU carry its own bias per operator class (a GDDR6 card's elementwise kernels reach more of peak
than HBM cards'), and a held-out GPU's kernel predictions inherit that spread instead of a falsely
tight interval.  Anchor groups (``ANCHOR_GROUPS``: bf16 GEMM, norm, residual add, prefill
attention, all-reduce) get none: there the bias is collinear with the GPU's own efficiencies.
Whole-model groups get none: there a GPU's bias is collinear with its sources'
offsets (most sources measured one GPU), which cost NUTS half its ESS on tau_source.
Noise is multiplicative Student-t per group k (scenario and operator class):

    log y_r ~ StudentT(nu, log f_r(theta_g) + delta_c + eta_gk, sigma_k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer.reparam import LocScaleReparam

from ._groups import COMM_GROUP
from ._names import PARAM_NAMES
from ._predict import Prepared, fitted_efficiency, predict_log


@dataclass(frozen=True)
class Prior:
    """Population prior of one parameter: ``link`` maps (0, 1) or (0, inf) to the real line.

    Attributes:
        link: ``"logit"`` for fractions of a peak, ``"log"`` for positive quantities.
        center: prior median in natural units (spec-sheet experience, cited per field).
        scale: prior sd of the population mean on the unconstrained scale.
        spread: half-normal scale of the between-GPU sd tau_p.
        per_gpu: False for a property of the kernel library rather than the chip (one value for
            every GPU: tau_p is 0, so no funnel in tau_p and no per-GPU z to sample).
    """

    link: str
    center: float
    scale: float
    spread: float = 0.5
    per_gpu: bool = True


PRIORS: dict[str, Prior] = {
    # Dense GEMMs reach 70-85 % of the bf16 datasheet peak (vidur, aiconfigurator sanity tables).
    "compute_fraction_max": Prior("logit", 0.75, 1.0),
    "compute_half_tokens": Prior("log", 64.0, 1.5),
    # Streaming kernels read HBM at 80-92 % of peak (aiconfigurator decode attention ~90 %).
    "bandwidth_fraction": Prior("logit", 0.85, 1.0),
    # Host cost per iteration (scheduling, sampling, launch): here a nuisance of the static-batch
    # and decode-step rows; the value predictions read is the one the cut stage profiles on the
    # end-to-end rows (``_serving_stage``), with this prior.
    "step_overhead_s": Prior("log", 1.0e-3, 2.0),
    # NCCL: ~5 us per call plus ~1-2 us per ring hop (nccl-tests small messages: ~5 us at 2 GPUs,
    # ~15 us at 8), 60-90 % of link bandwidth (vidur DGX bus bandwidth tables).
    "collective_latency_s": Prior("log", 1.5e-6, 1.5),
    "collective_bandwidth_fraction": Prior("logit", 0.7, 1.0),
    "collective_base_latency_s": Prior("log", 5.0e-6, 1.5),
    "launch_overhead_s": Prior("log", 5.0e-6, 1.5),
    "elementwise_bandwidth_fraction": Prior("logit", 0.7, 1.0),
    # FlashAttention-2/3 reach 50-75 % of peak (Dao 2023; Shah et al. 2024).
    "attention_compute_fraction_max": Prior("logit", 0.6, 1.0),
    "attention_half_tokens": Prior("log", 256.0, 1.5),
    "gemm_half_width": Prior("log", 64.0, 1.0),
    "low_precision_compute_ratio": Prior("logit", 0.6, 1.0),
    # Cloud clusters often have less than one 400 Gb/s NIC per GPU; wide prior.
    "internode_bandwidth_fraction": Prior("logit", 0.5, 1.5),
    # vLLM/FlashAttention calls carry metadata and combine kernels: tiny calls take 10-15 us.
    "attention_overhead_s": Prior("log", 6.0e-6, 1.5),
    # Row-wise elementwise kernels (norms: a block per token, fp32 reductions) cost ~10-50 ns per
    # token beyond their HBM stream whatever the memory (vidur A40 / A100 / H100): ~1-4 TB/s.
    "elementwise_onchip_bytes_per_s": Prior("log", 2.0e12, 1.5),
    # A paged decode CTA (one sequence x KV head) costs tens of ns of block-table reads, Q loads
    # and softmax bookkeeping beyond its KV stream: a few us per CTA spread over ~100 SMs.
    "attention_cta_s": Prior("log", 3.0e-8, 1.5),
    # NCCL's LL protocol moves 4 data bytes per 8-byte store (<= 1/2 of the bus bandwidth); its
    # Simple protocol pays ~2-3 us more per hop plus a larger base (NCCL tuning.cc latencies).
    "collective_ll_bandwidth_ratio": Prior("logit", 0.4, 1.0),
    "collective_simple_latency_s": Prior("log", 1.5e-5, 1.0),
    # One CTA computes on one SM (1/108 of an A100, 1/132 of an H100); a lone CTA runs faster
    # than the average one of a full grid, so its share of peak x eta_a can exceed that.
    # FlashAttention's tile scheduler is the same code on every GPU, so one share for all (per-GPU
    # fits gave 0.018-0.019 on A100, H100 and the rest alike).
    "attention_tile_share": Prior("log", 1.0 / 64.0, 1.0, per_gpu=False),
    # A streaming kernel's CTAs launch while earlier ones load: most of the launch hides (wide);
    # a property of the launch pipeline, not the chip (per-GPU fits: 0.84-0.85 on all six).
    "elementwise_launch_overlap": Prior("logit", 0.5, 1.5, per_gpu=False),
}
assert set(PRIORS) == set(PARAM_NAMES), "every Efficiency/KernelEfficiency field needs a prior"

STUDENT_DF = 5.0
"""Degrees of freedom of the log-scale noise: robust to the odd outlier row."""

NOISE_SCALE = 0.3
"""Half-normal scale of each group's log-noise sd (30 % multiplicative)."""

SOURCE_SCALE = 0.3
"""Half-normal scale of tau_src, the spread of whole-model (source, scenario) offsets on log time:
the engine/lab effect a new engine or lab inherits."""

GPU_GROUP_SCALE = 0.2
"""Half-normal scale of tau_gpu, the spread of GPU x kernel-group biases on log time."""

KERNEL_OFFSET_SCALE = 1.0
"""Half-normal scale of tau_kernel, the spread of single-kernel discrepancy offsets (``has_offset``
kernel groups), kept apart so kernel misfits do not widen whole-model intervals."""


def kernel_cells(cells) -> np.ndarray:
    """Mask of cells that are single-kernel, collective or step-latency (``comm:``) groups: their
    offsets spread with ``tau_kernel``."""
    return np.asarray(
        [c.split("|")[1].startswith(("op:", "collective:", "comm:")) for c in cells], dtype=bool
    )


ANCHOR_GROUPS = (
    "op:gemm",
    "op:norm",
    "op:residual_add",
    "op:attn_prefill",
    "collective:all_reduce",
)
"""Kernel groups that anchor a per-GPU efficiency (bf16 GEMMs: the compute roofline; residual
adds: the elementwise HBM fraction; norms: the elementwise on-chip rate; prefill attention: the
attention roofline; all-reduce: the collective latency and bandwidth).  A GPU x group bias on them is collinear with that GPU's own parameters
(NUTS cannot tell a faster norm kernel from a higher bandwidth fraction), so they get none: the
per-GPU parameter carries the GPU's level, the other groups' biases are relative to it."""


def kernel_groups(keys) -> np.ndarray:
    """Mask of noise groups with a GPU x group bias (``tau_gpu_kernel``): single kernels and
    collectives, except the ``ANCHOR_GROUPS``."""
    return np.asarray(
        [k.startswith(("op:", "collective:")) and k not in ANCHOR_GROUPS for k in keys], dtype=bool
    )


def population_bias(key: str, *, new_gpu: bool) -> bool:
    """Whether a GPU x group pair no fit saw draws eta ~ N(0, tau_gpu_kernel) rather than 0.

    Kernel groups always do (each GPU's kernels sit off the roofline by their own amount).  A GPU
    no fit saw also does on its whole-model and end-to-end groups (prefill, decode step, static
    batch, serving, saturated): their (source, engine) offsets were learned on the GPUs each
    source measured, so how the same engine fares on another GPU is a bias of the kernel groups'
    size that the spec sheet cannot give.  A fitted GPU's whole-model groups and the anchor groups
    get 0 (their rows pinned the offsets and the peaks)."""
    whole_model = not key.startswith(("op:", "collective:"))
    return bool(kernel_groups([key])[0]) or (whole_model and new_gpu)


def to_natural(name: str, u: jnp.ndarray) -> jnp.ndarray:
    """Unconstrained value -> natural units through the parameter's link."""
    return jnp.exp(u) if PRIORS[name].link == "log" else 1.0 / (1.0 + jnp.exp(-u))


def to_unconstrained(name: str, theta) -> np.ndarray:
    """Natural units -> unconstrained scale through the parameter's link (inverse of
    ``to_natural``; a fraction is clipped into (0, 1) first)."""
    theta = np.asarray(theta, dtype=float)
    if PRIORS[name].link == "log":
        return np.log(theta)
    t = np.clip(theta, 1e-9, 1 - 1e-9)
    return np.log(t / (1.0 - t))


def prior_center_unconstrained(name: str) -> float:
    """The prior median on the unconstrained scale."""
    p = PRIORS[name]
    return math.log(p.center) if p.link == "log" else math.log(p.center / (1.0 - p.center))


def calibration_model(prep: Prepared, observed: jnp.ndarray | None = None) -> None:
    """NumPyro model of the log measurements in ``prep`` (``observed`` = their logs, or None to
    sample from the prior predictive)."""
    n_gpu, n_cell, n_key = len(prep.gpus), len(prep.cells), len(prep.noise_keys)
    params = {}
    for name in PARAM_NAMES:
        pr = PRIORS[name]
        mu = numpyro.sample(f"mu_{name}", dist.Normal(prior_center_unconstrained(name), pr.scale))
        if not pr.per_gpu:  # one value for every GPU (tau_p = 0 kept so the file's layout holds)
            numpyro.deterministic(f"tau_{name}", jnp.zeros_like(mu))
            u = jnp.broadcast_to(mu, (n_gpu,))
            params[name] = numpyro.deterministic(name, to_natural(name, u))
            continue
        tau = numpyro.sample(f"tau_{name}", dist.HalfNormal(pr.spread))
        with numpyro.plate("gpu", n_gpu):
            z = numpyro.sample(f"z_{name}", dist.Normal(0.0, 1.0))
        params[name] = numpyro.deterministic(name, to_natural(name, mu + tau * z))
    tau_src = numpyro.sample("tau_source", dist.HalfNormal(SOURCE_SCALE))
    tau_ker = numpyro.sample("tau_kernel", dist.HalfNormal(KERNEL_OFFSET_SCALE))
    scale = jnp.where(kernel_cells(prep.cells), tau_ker, tau_src)
    # Centred where a cell's own rows pin its offset (Betancourt & Girolami 2015: centring suits
    # strongly identified groups); non-centred for ``comm:latency`` cells, which only the
    # communication share of multi-GPU steps informs (a funnel with tau_kernel when centred).
    weak = np.asarray([c.endswith("|" + COMM_GROUP) for c in prep.cells], dtype=float)
    if n_cell:
        with (
            numpyro.plate("cell", n_cell),
            handlers.reparam(
                config={"cell_offset": LocScaleReparam(centered=jnp.asarray(1.0 - weak))}
            ),
        ):
            offset = numpyro.sample("cell_offset", dist.Normal(0.0, scale))
    else:  # only anchor-group kernel rows: no discrepancy offsets (a plate cannot be empty)
        offset = numpyro.deterministic("cell_offset", jnp.zeros(0))
    with numpyro.plate("noise_key", n_key):
        sigma = numpyro.sample("sigma", dist.HalfNormal(NOISE_SCALE))
    tau_gk = numpyro.sample("tau_gpu_kernel", dist.HalfNormal(GPU_GROUP_SCALE))
    spread = jnp.where(kernel_groups(prep.noise_keys), tau_gk, 0.0)
    with numpyro.plate("gg_key", n_key, dim=-1), numpyro.plate("gg_gpu", n_gpu, dim=-2):
        z_gg = numpyro.sample("z_gpu_group", dist.Normal(0.0, 1.0))
    eta = numpyro.deterministic("gpu_group", z_gg * spread)
    loc = predict_log(prep, fitted_efficiency(params), offset) + eta[prep.gpu_idx, prep.noise_idx]
    with numpyro.plate("row", len(prep.log_value)):
        numpyro.sample(
            "log_value", dist.StudentT(STUDENT_DF, loc, sigma[prep.noise_idx]), obs=observed
        )
