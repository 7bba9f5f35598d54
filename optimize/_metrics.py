"""The serving metrics a chance constraint reads: p95 TTFT, p95 TPOT, utilisation, memory fit.

Two fidelities with one output type:

* ``slo_metrics`` (the search model): the static step budgets (``perfmodel.forward_step``) plus an
  M/G/1 wait -- about 0.1 us per evaluation, so the gradient search and the exhaustive referee
  can afford every configuration x replica count x posterior draw.
* ``serving_slo_metrics`` (the verdict model): ``perfmodel.dynamics.serving_metrics`` (lognormal
  length nodes, fixed-point decode batch, Kingman/Allen-Cunneen waits) -- about 1000x dearer; it
  re-checks and reports the configurations the search returns.

Both are pure functions of the spec pytrees, exact at ``temperature == 0`` and smooth above it.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from perfmodel import Deployment, Efficiency, HardwareSpec, ModelSpec, forward_step
from perfmodel import max_concurrent_requests
from perfmodel._smooth import smooth_ceil, smooth_min

Array = jnp.ndarray

from perfmodel.dynamics import Workload, serving_metrics

TAIL_PROBABILITY = 0.05
"""p95: the waiting-time tail P(W > t) = rho * exp(-t / W_cond) is solved at this probability."""


class SloMetrics(eqx.Module):
    """What the chance constraints read, per replica group (seconds, fractions).

    Attributes:
        ttft_p95_s: 95th-percentile time to first token.
        tpot_p95_s: 95th-percentile time per output token.
        utilization: offered load / capacity of one replica (stable below 1).
        concurrent_requests: sequences of prompt + output tokens whose KV fits (fits at >= 1).
        ttft_quantiles_s: TTFT (p50, p95, p99).
        tpot_quantiles_s: TPOT (p50, p95, p99).
    """

    ttft_p95_s: Array
    tpot_p95_s: Array
    utilization: Array
    concurrent_requests: Array
    ttft_quantiles_s: Array
    tpot_quantiles_s: Array


def slo_metrics(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    workload: Workload,
    temperature: float = 0.0,
) -> SloMetrics:
    """The search model: step budgets + M/G/1 queue, all replicas sharing the arrivals evenly.

    Capacity mu = n_max / (O * t(n_max)) requests/s per replica, n_max the KV/``max_num_seqs``
    batch and t(n) a mixed iteration (Sarathi-Serve) carrying n decodes plus the prefill tokens
    that keep up with them.  The operating batch solves Little's law n = lambda * O * t(n) with
    t affine between n = 1 and n_max.  TPOT p95 is an iteration carrying one prefill chunk
    (``max_num_batched_tokens``); TTFT p95 = ceil(I / chunk) such iterations plus the
    Pollaczek-Khinchine / Kingman wait's tail at ``TAIL_PROBABILITY``.
    """
    lam = workload.arrival_rate_per_s / deployment.replicas
    i_len, o_len = workload.prompt_tokens_mean, workload.output_tokens_mean
    context = i_len + o_len / 2.0
    concurrent = max_concurrent_requests(model, hardware, deployment, i_len + o_len, temperature)
    n_max = jnp.maximum(smooth_min(concurrent, deployment.max_num_seqs, temperature), 1.0)

    def iteration(n_decode, prefill_tokens, prefill_seqs):
        return forward_step(
            model, hardware, deployment, efficiency,
            prefill_tokens=prefill_tokens, prefill_seqs=prefill_seqs,
            decode_seqs=n_decode, decode_context=context, temperature=temperature,
        ).total_s

    t_full = iteration(n_max, n_max * i_len / o_len, n_max / o_len)
    t_one = iteration(1.0, i_len / o_len, 1.0 / o_len)
    mu = n_max / (o_len * t_full)
    rho = lam / mu
    slope = (t_full - t_one) / jnp.maximum(n_max - 1.0, 1e-9)
    intercept = t_one - slope
    stable = rho < 1.0
    denom = jnp.where(stable, 1.0 - lam * o_len * slope, 1.0)
    n_op = jnp.clip(lam * o_len * intercept / denom, 0.0, n_max)

    chunk = smooth_min(i_len, deployment.max_num_batched_tokens, temperature)
    t_chunk = iteration(n_op, chunk, 1.0)
    chunks = smooth_ceil(i_len / deployment.max_num_batched_tokens, temperature)
    service_cv2 = workload.output_tokens_cv**2
    rho_s = jnp.where(stable, rho, 0.5)
    wait_cond = (workload.interarrival_cv**2 + service_cv2) / 2.0 / mu / (1.0 - rho_s)
    tails = jnp.asarray([0.5, TAIL_PROBABILITY, 0.01])
    waits = wait_cond * jnp.maximum(jnp.log(jnp.maximum(rho_s, 1e-30) / tails), 0.0)
    ttft = jnp.where(stable, chunks * t_chunk + waits, jnp.inf)
    t_mean = intercept + slope * n_op
    tpot = jnp.where(stable, jnp.stack([t_mean, t_chunk, t_chunk]), jnp.inf)
    return SloMetrics(
        ttft_p95_s=ttft[1],
        tpot_p95_s=tpot[1],
        utilization=rho,
        concurrent_requests=concurrent,
        ttft_quantiles_s=ttft,
        tpot_quantiles_s=tpot,
    )


def serving_slo_metrics(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    workload: Workload,
    temperature: float = 0.0,
) -> SloMetrics:
    """The verdict model: ``perfmodel.dynamics.serving_metrics`` (chunked prefill at the token
    budget) as ``SloMetrics``."""
    m = serving_metrics(model, hardware, deployment, efficiency, workload, temperature=temperature)
    concurrent = max_concurrent_requests(
        model, hardware, deployment,
        workload.prompt_tokens_mean + workload.output_tokens_mean, temperature,
    )
    return SloMetrics(
        ttft_p95_s=m.ttft_s.p95,
        tpot_p95_s=m.tpot_s.p95,
        utilization=m.utilization,
        concurrent_requests=concurrent,
        ttft_quantiles_s=jnp.stack([m.ttft_s.p50, m.ttft_s.p95, m.ttft_s.p99]),
        tpot_quantiles_s=jnp.stack([m.tpot_s.p50, m.tpot_s.p95, m.tpot_s.p99]),
    )
