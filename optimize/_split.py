"""Search-model metrics of a disaggregated deployment: a prefill pool and a decode pool.

The same budgets as ``perfmodel.features.disaggregation`` (DistServe, Zhong et al. 2024;
Splitwise, Patel et al. 2024), in the search model's fast form:

* prefill pool (R_p engines on the prefill GPU): each serves lambda / R_p whole prompts, an
  M/D/1 queue with service D = one prefill pass over I tokens; its wait's tail is the Kingman
  exponential with c_s^2 = 0 (``queue_waits``);
* KV hand-off: t_kv = I * KV bytes per token per device / link bandwidth + latency
  (``perfmodel.features.kv_transfer_s``; default link: the prefill GPU's inter-node network);
* decode pool (R_d engines on the decode GPU): decode-only iterations, no prefill interference;
  capacity mu = n_max E / (O t(n_max)), batch by Little's law, p95 batch n + z_0.95 sqrt(n);
* TTFT = D + wait + t_kv + orchestration + ``DECODE_POOL_ENTRY_STEPS`` decode iterations.

Utilisation is the busier pool's; a sequence must fit in both pools.
"""

from __future__ import annotations

from statistics import NormalDist

import jax.numpy as jnp

from perfmodel import (
    System,
    max_concurrent_requests,
    prefill_step,
    smooth_min,
)
from perfmodel.dynamics import Workload
from perfmodel.features import (
    DECODE_POOL_ENTRY_STEPS,
    DEFAULT_ORCHESTRATION_S,
    DEFAULT_TRANSFER_LATENCY_S,
    kv_transfer_s,
)

from ._metrics import (
    TAIL_PROBABILITY,
    SloMetrics,
    SpecStep,
    iteration_s,
    little_batch,
    queue_waits,
)

P95_Z = NormalDist().inv_cdf(1.0 - TAIL_PROBABILITY)
"""z_(1 - TAIL_PROBABILITY): the standard normal quantile of the SLO's tail (1.645 at 5 %)."""


def split_slo_metrics(
    prefill: System,
    decode: System,
    workload: Workload,
    temperature: float = 0.0,
    *,
    spec: SpecStep | None = None,
    transfer_bytes_per_s=None,
    transfer_latency_s=DEFAULT_TRANSFER_LATENCY_S,
    orchestration_s=DEFAULT_ORCHESTRATION_S,
) -> SloMetrics:
    """p95 TTFT/TPOT, utilisation and KV fit of a prefill + decode split, each pool a ``System``
    of the one model (replicas of its ``Deployment`` = engines in that pool).
    ``transfer_bytes_per_s`` <= 0 or None: the prefill GPU's inter-node bandwidth."""
    model = prefill.model  # both pools serve it
    hw_p, dep_p, eff_p = prefill.hardware, prefill.deployment, prefill.efficiency
    hw_d, dep_d, eff_d = decode.hardware, decode.deployment, decode.efficiency
    i_len, o_len = workload.prompt_tokens_mean, workload.output_tokens_mean
    context = i_len + o_len / 2.0
    e = 1.0 if spec is None else spec.tokens_per_step

    lam_p = workload.arrival_rate_per_s / dep_p.replicas
    d_pre = prefill_step(prefill, i_len, temperature=temperature).total_s
    rho_p = lam_p * d_pre
    stable_p = rho_p < 1.0
    waits_p = queue_waits(rho_p, 1.0 / d_pre, workload.interarrival_cv, 0.0, stable_p)
    bw = (
        hw_p.internode_bytes_per_s
        if transfer_bytes_per_s is None
        else jnp.where(transfer_bytes_per_s > 0, transfer_bytes_per_s, hw_p.internode_bytes_per_s)
    )
    t_kv = kv_transfer_s(model, dep_p, i_len, bw, transfer_latency_s)

    lam_d = workload.arrival_rate_per_s / dep_d.replicas
    seats_d = max_concurrent_requests(decode.model, hw_d, dep_d, i_len + o_len, temperature)
    n_max = jnp.maximum(smooth_min(seats_d, dep_d.max_num_seqs, temperature), 1.0)
    k = 1.0 if spec is None else jnp.maximum(spec.draft_tokens, 1.0)

    def iteration(n):
        return iteration_s(
            decode,
            spec,
            n_decode=n,
            prefill_tokens=0.0,
            tokens_per_prefill_seq=k,
            context=context,
            temperature=temperature,
        )

    # both ends of the decode batch through one (vectorised) step evaluation
    t_full, t_one = iteration(jnp.stack(jnp.broadcast_arrays(n_max, 1.0)))
    mu_d = n_max * e / (o_len * t_full)
    rho_d = lam_d / mu_d
    stable = stable_p & (rho_d < 1.0)
    n_op, slope, intercept = little_batch(lam_d, o_len / e, t_one, t_full, n_max, rho_d < 1.0)
    n_hi = jnp.minimum(n_op + P95_Z * jnp.sqrt(n_op), n_max)
    t_mean, t_hi = intercept + slope * n_op, intercept + slope * n_hi
    # as the engines deliver them (``perfmodel.features.split_serving``, the verdict model's):
    # the prefill pool's first token times its engine's TTFT scale, the decode pool's gaps
    # times its TPOT scale
    tpot = jnp.where(stable, jnp.stack([t_mean, t_hi, t_hi]) / e * eff_d.tpot_scale, jnp.inf)
    fixed = d_pre + t_kv + orchestration_s + DECODE_POOL_ENTRY_STEPS * t_mean
    ttft = jnp.where(stable, (fixed + waits_p) * eff_p.ttft_scale, jnp.inf)
    seats_p = max_concurrent_requests(model, hw_p, dep_p, i_len, temperature)
    return SloMetrics(
        ttft_p95_s=ttft[1],
        tpot_p95_s=tpot[1],
        utilization=jnp.maximum(rho_p, rho_d),
        concurrent_requests=jnp.minimum(seats_d, seats_p),
        ttft_quantiles_s=ttft,
        tpot_quantiles_s=tpot,
    )
