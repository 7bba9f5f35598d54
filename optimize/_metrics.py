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

from perfmodel import (
    Deployment,
    Efficiency,
    HardwareSpec,
    ModelSpec,
    decode_step,
    forward_step,
    max_concurrent_requests,
)
from perfmodel._smooth import smooth_ceil, smooth_min
from perfmodel._speculative import MTP_LAYERS_PER_DRAFT_TOKEN

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


class SpecStep(eqx.Module):
    """Speculative decoding in an iteration: k draft tokens per sequence, E accepted per step.

    Attributes:
        draft_tokens: k (0 = off; real-valued when relaxed).
        tokens_per_step: E = (1 - alpha^(k+1)) / (1 - alpha) (``perfmodel.features``).
        draft_model: the draft model (the target itself for MTP heads).
        draft_is_mtp: True: each draft token costs ``MTP_LAYERS_PER_DRAFT_TOKEN`` target layers.
    """

    draft_tokens: Array
    tokens_per_step: Array
    draft_model: ModelSpec
    draft_is_mtp: Array


def iteration_s(
    model,
    hardware,
    deployment,
    efficiency,
    spec,
    *,
    n_decode,
    prefill_tokens,
    tokens_per_prefill_seq,
    context,
    temperature=0.0,
):
    """One engine iteration: ``n_decode`` sequences decode (each verifying k draft tokens under
    ``spec``) beside ``prefill_tokens`` prompt tokens in pieces of ``tokens_per_prefill_seq``.

    The k verification tokens per sequence are charged as extra new tokens of the same pieces
    (their GEMM FLOPs exact; the context KV is read once, by the sequence's decode slot); the
    draft adds k draft forward passes over the decoding sequences (``perfmodel._speculative``).
    """
    k = 0.0 if spec is None else spec.draft_tokens
    new = prefill_tokens + n_decode * k
    per_seq = jnp.maximum(tokens_per_prefill_seq, 1.0)
    t = forward_step(
        model,
        hardware,
        deployment,
        efficiency,
        prefill_tokens=new,
        prefill_seqs=new / per_seq,
        decode_seqs=n_decode,
        decode_context=context,
        temperature=temperature,
    ).total_s
    if spec is None:
        return t
    draft = decode_step(
        spec.draft_model, hardware, deployment, efficiency, n_decode, context, temperature
    )
    mtp = (
        MTP_LAYERS_PER_DRAFT_TOKEN
        * (draft.total_s - draft.overhead_s)
        / spec.draft_model.num_layers
    )
    return t + k * jnp.where(spec.draft_is_mtp, mtp, draft.total_s)


def p95_prefills(in_flight: Array) -> Array:
    """Prefills sharing an iteration at the 95th percentile: the tagged one plus a Poisson count
    of mean ``in_flight`` at its normal-approximation 95 % point (L + 1.645 sqrt(L))."""
    return 1.0 + in_flight + 1.645 * jnp.sqrt(jnp.maximum(in_flight, 0.0))


def queue_waits(
    rho: Array, mu: Array, interarrival_cv: Array, service_cv2: Array, stable: Array
) -> Array:
    """M/G/1 (Kingman) wait quantiles (p50, p95, p99): P(W > t) = rho exp(-t / W_cond)."""
    rho_s = jnp.where(stable, rho, 0.5)
    wait_cond = (interarrival_cv**2 + service_cv2) / 2.0 / mu / (1.0 - rho_s)
    tails = jnp.asarray([0.5, TAIL_PROBABILITY, 0.01])
    return wait_cond * jnp.maximum(jnp.log(jnp.maximum(rho_s, 1e-30) / tails), 0.0)


def little_batch(
    lam: Array, tokens: Array, t_one: Array, t_full: Array, n_max: Array, stable: Array
):
    """Operating batch n = lam * tokens * t(n), t affine through (1, t_one) and (n_max, t_full);
    returns (n, slope, intercept)."""
    slope = (t_full - t_one) / jnp.maximum(n_max - 1.0, 1e-9)
    intercept = t_one - slope
    denom = jnp.where(stable, 1.0 - lam * tokens * slope, 1.0)
    return jnp.clip(lam * tokens * intercept / denom, 0.0, n_max), slope, intercept


def slo_metrics(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    workload: Workload,
    temperature: float = 0.0,
    *,
    chunk_tokens: Array | None = None,
    spec: SpecStep | None = None,
) -> SloMetrics:
    """The search model: step budgets + M/G/1 queue, all replicas sharing the arrivals evenly.

    B = ``max_num_batched_tokens`` (iteration token budget), c = ``chunk_tokens`` (prefill chunk
    per request per iteration, default B), E tokens per decode step (1, or ``spec``'s).
    Capacity mu = min(n_max E / O, B / I) / t(n_max) requests/s per replica: n_max the
    KV/``max_num_seqs`` batch, t(n_max) a mixed iteration (Sarathi-Serve) carrying n_max decodes
    plus the prefill tokens that keep up with them (at most B).  The operating batch solves
    Little's law n = lambda (O / E) t(n) with t affine between n = 1 and n_max.  Prefills in
    flight L = lambda ceil(I / c) t_c share an iteration: the p95 iteration carries
    min(B, min(I, c) * (1 + L + 1.645 sqrt L)) prompt tokens; TPOT p95 is that iteration / E and
    TTFT p95 = ceil(I / c) such iterations plus the Pollaczek-Khinchine / Kingman wait's tail at
    ``TAIL_PROBABILITY``.
    """
    lam = workload.arrival_rate_per_s / deployment.replicas
    i_len, o_len = workload.prompt_tokens_mean, workload.output_tokens_mean
    context = i_len + o_len / 2.0
    budget = deployment.max_num_batched_tokens
    chunk = budget if chunk_tokens is None else chunk_tokens
    e = 1.0 if spec is None else spec.tokens_per_step
    concurrent = max_concurrent_requests(model, hardware, deployment, i_len + o_len, temperature)
    n_max = jnp.maximum(smooth_min(concurrent, deployment.max_num_seqs, temperature), 1.0)

    def iteration(n_decode, prefill_tokens, per_seq):
        return iteration_s(
            model,
            hardware,
            deployment,
            efficiency,
            spec,
            n_decode=n_decode,
            prefill_tokens=prefill_tokens,
            tokens_per_prefill_seq=per_seq,
            context=context,
            temperature=temperature,
        )

    # the full and the one-sequence iteration through one (vectorised) step evaluation
    t_full, t_one = iteration(
        jnp.stack(jnp.broadcast_arrays(n_max, 1.0)),
        jnp.stack(
            jnp.broadcast_arrays(
                smooth_min(n_max * e * i_len / o_len, budget, temperature), e * i_len / o_len
            )
        ),
        i_len,
    )
    mu = smooth_min(n_max * e / o_len, budget / i_len, temperature) / t_full
    rho = lam / mu
    stable = rho < 1.0
    n_op, slope, intercept = little_batch(lam, o_len / e, t_one, t_full, n_max, stable)

    c_eff = smooth_min(i_len, chunk, temperature)
    chunks = smooth_ceil(i_len / chunk, temperature)
    in_flight = lam * chunks * iteration(n_op, c_eff, c_eff)
    p95_tokens = smooth_min(c_eff * p95_prefills(in_flight), budget, temperature)
    t_chunk = iteration(n_op, p95_tokens, c_eff)
    waits = queue_waits(rho, mu, workload.interarrival_cv, workload.output_tokens_cv**2, stable)
    ttft = jnp.where(stable, chunks * t_chunk + waits, jnp.inf)
    t_mean = intercept + slope * n_op
    tpot = jnp.where(stable, jnp.stack([t_mean, t_chunk, t_chunk]) / e, jnp.inf)
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
        model,
        hardware,
        deployment,
        workload.prompt_tokens_mean + workload.output_tokens_mean,
        temperature,
    )
    return SloMetrics(
        ttft_p95_s=m.ttft_s.p95,
        tpot_p95_s=m.tpot_s.p95,
        utilization=m.utilization,
        concurrent_requests=concurrent,
        ttft_quantiles_s=jnp.stack([m.ttft_s.p50, m.ttft_s.p95, m.ttft_s.p99]),
        tpot_quantiles_s=jnp.stack([m.tpot_s.p50, m.tpot_s.p95, m.tpot_s.p99]),
    )
