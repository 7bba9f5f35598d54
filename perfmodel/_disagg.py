"""Prefill/decode disaggregation: two pools and a KV hand-off, against one colocated pool.

Colocated (Sarathi-Serve style, Agrawal et al. 2024): every iteration of a replica carries its
decode batch and the prefill chunks that arrived, so decode gaps stretch to
TPOT = tau_d(n) / (1 - lambda_r * Delta), Delta = T(chunks + decode batch) - T(decode batch) the
marginal time a prompt adds (small while a short prompt rides on a bandwidth-bound decode step,
its full compute time for a long one), and each chunk waits for the decode batch in its iteration.
Disaggregated (DistServe, Zhong et al. 2024; Splitwise, Patel et al. 2024): the prefill pool is an
M/D/1 queue,
TTFT = D + lambda D^2 / (2 (1 - lambda D)) (DistServe eq. 1), then the KV moves,
t_kv = prompt * KV bytes per token per device / link bw + latency, the decode pool emits the first
token within ``DECODE_POOL_ENTRY_STEPS`` of its iterations and then decodes without interference.
Decode batch by Little's law n = lambda_r (O - 1) TPOT (fixed point).

net_s = benefit_of_isolation_s - (kv_transfer_s + orchestration_s) = E2E_colocated - E2E_split.
An overloaded pool (utilisation >= 1 or more running requests than KV seats) reports ``inf``
latencies, so net_s is +inf / -inf when only one side is stable (nan when neither is).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

from ._memory import kv_bytes_per_token_per_gpu, max_concurrent_requests
from ._smooth import smooth_ceil
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec, System
from ._step import decode_step, prefill_step, step_total_s
from ._types import Array, ArrayLike

DEFAULT_TRANSFER_LATENCY_S = 1.0e-4
"""Fixed cost of one KV hand-off (RDMA connection lookup, descriptor exchange, completion):
an assumed order of magnitude, not a measurement; pass your own."""

DEFAULT_ORCHESTRATION_S = 1.0e-3
"""Per-request cost of routing through two schedulers (a proxy hop plus a second admission):
an assumed order of magnitude, not a measurement; pass your own."""

FIXED_POINT_ITERATIONS = 60
"""Damped iterations of the (decode batch, TPOT) fixed point."""

DECODE_POOL_ENTRY_STEPS = 1.5
"""Decode-pool iterations between a hand-off and the first token: the residual half of the
running iteration plus the one that carries the request's recomputed last prompt token."""

MAX_PREFILL_SHARE = 0.99
"""Cap on lambda * Delta in the colocated TPOT stretch (the pool is reported unstable above 1)."""


class Disaggregation(eqx.Module):
    """Per-request mean latencies (seconds) of the colocated and the split system."""

    colocated_ttft_s: Array
    colocated_tpot_s: Array
    colocated_e2e_s: Array
    split_ttft_s: Array
    split_tpot_s: Array
    split_e2e_s: Array
    kv_transfer_s: Array
    orchestration_s: Array
    benefit_of_isolation_s: Array
    net_s: Array
    prefill_interference: Array
    colocated_stable: Array
    split_stable: Array


def _mdl_wait(rate, service):
    """M/D/1 mean wait lambda D^2 / (2 (1 - lambda D)); inf at or above saturation."""
    rho = rate * service
    ok = rho < 1.0
    return jnp.where(ok, rate * service**2 / (2.0 * jnp.where(ok, 1.0 - rho, 1.0)), jnp.inf)


def _decode_fixed_point(step_of_batch, rate, decode_tokens, stretch):
    """n = rate * decode_tokens * TPOT(n), n the time-average decode batch (Little).  A request's
    own steps carry it plus the others it meets, n on average (M/G/inf: the others' count is
    Poisson(n) whether or not it is there), so its TPOT is the step at batch 1 + n."""

    def tpot(n):
        return step_of_batch(1.0 + n) / stretch

    def body(_, n):
        return 0.5 * (n + rate * decode_tokens * tpot(n))

    start = jnp.ones_like(jnp.asarray(rate, dtype=float))
    n = jax.lax.fori_loop(0, FIXED_POINT_ITERATIONS, body, start)
    return n, tpot(n)


def kv_transfer_s(
    model: ModelSpec,
    prefill_deployment: Deployment,
    prompt_tokens: ArrayLike,
    transfer_bytes_per_s: ArrayLike,
    transfer_latency_s: ArrayLike = DEFAULT_TRANSFER_LATENCY_S,
) -> Array:
    """prompt * KV bytes per token per device / per-device bw + latency (shards move in parallel)."""
    per_device = jnp.asarray(prompt_tokens) * kv_bytes_per_token_per_gpu(model, prefill_deployment)
    return per_device / transfer_bytes_per_s + transfer_latency_s


def disaggregation(
    model: ModelSpec,
    efficiency: Efficiency,
    *,
    colocated: tuple[HardwareSpec, Deployment],
    prefill: tuple[HardwareSpec, Deployment],
    decode: tuple[HardwareSpec, Deployment],
    prompt_tokens: ArrayLike,
    output_tokens: ArrayLike,
    arrival_rate_per_s: ArrayLike,
    transfer_bytes_per_s: ArrayLike | None = None,
    transfer_latency_s: ArrayLike = DEFAULT_TRANSFER_LATENCY_S,
    orchestration_s: ArrayLike = DEFAULT_ORCHESTRATION_S,
    temperature: float = 0.0,
    prefill_efficiency: Efficiency | None = None,
    decode_efficiency: Efficiency | None = None,
) -> Disaggregation:
    """Mean TTFT, TPOT and E2E of a colocated pool and of a prefill + decode split.

    Args:
        colocated, prefill, decode: (hardware, deployment) of each pool; ``replicas`` is the
            number of engine instances in that pool (GPUs = replicas * tp * pp).
        prompt_tokens, output_tokens: per request (the first output token comes from prefill).
        arrival_rate_per_s: requests/s offered to the whole system.
        transfer_bytes_per_s: per-device KV link bandwidth; default the prefill GPU's inter-node
            network (pools on different nodes).
        prefill_efficiency, decode_efficiency: each pool's GPU efficiency when the pools use
            other GPU types than the colocated system; default ``efficiency``.
    """
    eff_p = efficiency if prefill_efficiency is None else prefill_efficiency
    eff_d = efficiency if decode_efficiency is None else decode_efficiency
    p = jnp.asarray(prompt_tokens, dtype=float)
    o_dec = jnp.maximum(jnp.asarray(output_tokens, dtype=float) - 1.0, 0.0)
    ctx = p + o_dec / 2.0

    hw_c, dep_c = colocated
    rate_c = jnp.asarray(arrival_rate_per_s) / dep_c.replicas
    chunks = smooth_ceil(p / dep_c.max_num_batched_tokens, temperature)

    def tau_c(n):
        return decode_step(System(model, hw_c, dep_c, efficiency), n, ctx, temperature).total_s

    def chunk_c(n):
        """One iteration carrying a prompt chunk and the decode batch."""
        return step_total_s(
            System(model, hw_c, dep_c, efficiency),
            prefill_tokens=p / chunks,
            prefill_seqs=1.0,
            prefill_context=(p - p / chunks) / 2.0,
            decode_seqs=n,
            decode_context=ctx,
            temperature=temperature,
        )

    def share_c(n):
        """lambda_r * Delta: busy time the arriving prefills add to decode iterations, per second."""
        b = jnp.maximum(n, 1.0)
        return rate_c * chunks * (chunk_c(b) - tau_c(b))

    def body(_, n):
        stretch = 1.0 - jnp.minimum(share_c(n), MAX_PREFILL_SHARE)
        return 0.5 * (n + rate_c * o_dec * tau_c(1.0 + n) / stretch)  # batch seen: 1 + n

    n_c = jax.lax.fori_loop(0, FIXED_POINT_ITERATIONS, body, jnp.ones_like(rate_c))
    share = share_c(n_c)
    stretch = 1.0 - jnp.minimum(share, MAX_PREFILL_SHARE)
    tpot_c = tau_c(1.0 + n_c) / stretch
    own_c = chunks * chunk_c(n_c)
    ttft_c = own_c + _mdl_wait(rate_c, own_c)
    seats_c = max_concurrent_requests(model, hw_c, dep_c, p + o_dec + 1.0, temperature)
    stable_c = (share < 1.0) & (rate_c * own_c < 1.0) & (n_c <= seats_c)

    hw_p, dep_p = prefill
    rate_p = jnp.asarray(arrival_rate_per_s) / dep_p.replicas
    pre_p = prefill_step(System(model, hw_p, dep_p, eff_p), p, temperature=temperature).total_s
    bw = hw_p.internode_bytes_per_s if transfer_bytes_per_s is None else transfer_bytes_per_s
    t_kv = kv_transfer_s(model, dep_p, p, bw, transfer_latency_s)

    hw_d, dep_d = decode
    rate_d = jnp.asarray(arrival_rate_per_s) / dep_d.replicas

    def step_d(n):
        return decode_step(System(model, hw_d, dep_d, eff_d), n, ctx, temperature).total_s

    n_d, tpot_d = _decode_fixed_point(step_d, rate_d, o_dec, 1.0)
    seats_d = max_concurrent_requests(model, hw_d, dep_d, p + o_dec + 1.0, temperature)
    ttft_s = (
        pre_p + _mdl_wait(rate_p, pre_p) + t_kv + orchestration_s + DECODE_POOL_ENTRY_STEPS * tpot_d
    )
    stable_s = (rate_p * pre_p < 1.0) & (n_d <= seats_d)

    ttft_c, tpot_c = jnp.where(stable_c, ttft_c, jnp.inf), jnp.where(stable_c, tpot_c, jnp.inf)
    ttft_s, tpot_d = jnp.where(stable_s, ttft_s, jnp.inf), jnp.where(stable_s, tpot_d, jnp.inf)
    e2e_c = ttft_c + o_dec * tpot_c
    e2e_s = ttft_s + o_dec * tpot_d
    benefit = e2e_c - (
        e2e_s - t_kv - orchestration_s
    )  # the decode-pool entry step counts as split time
    return Disaggregation(
        colocated_ttft_s=ttft_c,
        colocated_tpot_s=tpot_c,
        colocated_e2e_s=e2e_c,
        split_ttft_s=ttft_s,
        split_tpot_s=tpot_d,
        split_e2e_s=e2e_s,
        kv_transfer_s=t_kv,
        orchestration_s=jnp.asarray(orchestration_s, dtype=float),
        benefit_of_isolation_s=benefit,
        net_s=benefit - t_kv - orchestration_s,
        prefill_interference=1.0 / stretch,
        colocated_stable=stable_c,
        split_stable=stable_s,
    )


def colocated_disaggregation(
    system: System,
    prompt_tokens: ArrayLike,
    output_tokens: ArrayLike,
    arrival_rate_per_s: ArrayLike,
) -> Disaggregation:
    """``disaggregation`` with both pools the colocated deployment itself: its own figures under
    the load (the colocated TPOT, the stretch prefill work puts on its decode iterations)."""
    hardware, deployment = system.hardware, system.deployment
    return disaggregation(
        system.model,
        system.efficiency,
        colocated=(hardware, deployment),
        prefill=(hardware, deployment),
        decode=(hardware, deployment),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        arrival_rate_per_s=arrival_rate_per_s,
    )


def colocated_decode_batch(
    system: System,
    prompt_tokens: float,
    output_tokens: float,
    arrival_rate_per_s: float | None,
) -> float:
    """Sequences decoding together per replica of a colocated deployment under load (a float).

    Little's law: the replica's arrival rate lambda / replicas times the time each request spends
    decoding, (output - 1) x TPOT (the first output token comes from prefill), with the TPOT of
    the colocated pool in ``disaggregation`` (prefill interference included).  The batch is at
    least 1 and at most the seats, max(min(KV-cache sequences of prompt + output tokens,
    max_num_seqs), 1) (``VerdictBudgets.decode_batch``); the seats when that TPOT is infinite
    (overloaded), and 1 without a rate (one request at a time).
    """
    model, hardware, deployment = system.model, system.hardware, system.deployment
    seats = min(
        float(max_concurrent_requests(model, hardware, deployment, prompt_tokens + output_tokens)),
        float(deployment.max_num_seqs),
    )
    if arrival_rate_per_s is None:
        return 1.0
    rate = arrival_rate_per_s
    r = colocated_disaggregation(system, prompt_tokens, output_tokens, rate)
    tpot = float(r.colocated_tpot_s)
    if not math.isfinite(tpot):
        return max(seats, 1.0)
    return min(
        max(rate / float(deployment.replicas) * max(output_tokens - 1.0, 0.0) * tpot, 1.0),
        max(seats, 1.0),
    )
