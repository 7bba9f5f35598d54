"""Prefix caching and speculative decoding under load: TTFT/TPOT percentiles from ``serving_metrics``
on an equivalent plain workload, corrected for what the plain engine does not see.

Prefix caching (``prefix_serving_metrics``): a request whose shared prefix is cached prefills only
P - R tokens, so the prefill path sees the two-point law {P - R w.p. w, P w.p. 1 - w},
w = shared_fraction x hit_rate (``prefix_reuse``), moment-matched to the workload's lognormal
(mean P - wR, variance of the mixture plus the workload's own).  Shared prefix blocks are
referenced, not copied, so KV seats follow the effective prompt too.  The decode batch still
attends to the whole prompt, so TPOT is scaled by r = tau_d(n, P + O/2) / tau_d(n, P - wR + O/2)
at the closed form's decode batch n (``PREFIX_CONTEXT_STEPS``).  TTFT is left
as the effective workload gives it (prefill compute dominates it).

Speculative decoding (``speculative_serving_metrics``): a sequence emits E tokens per verification
step (Leviathan et al. 2023), so its decode phase is (O - 1) / E steps; the plain workload with
1 + (O - 1) / E output tokens has the same number of decode iterations.  Each of those costs
draft + verify instead of tau_d, so TPOT = (per-step gap) x r / E, r = step_spec(r n) / tau_d(n)
(the longer step keeps r times more sequences decoding, Little's law; substitutions); the prefill
chunk's own iteration and the residual of the running one carry the extra verification time, so
TTFT grows by ``SPEC_TTFT_STEPS`` x (step_spec - tau_d).  Accepted tokens per step are random:
the steps needed for m tokens have CV sqrt(Var T / (m E)) (renewal CLT), added in quadrature to
the plain TPOT spread.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jax.typing import ArrayLike

from ._reuse import prefix_reuse
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec
from ._speculative import expected_tokens_per_step, speculative_decode
from ._step import decode_step

Array = jnp.ndarray

Z95 = 1.6448536269514722
"""Standard normal 0.95 quantile."""
Z99 = 2.3263478740408408
"""Standard normal 0.99 quantile."""

PREFIX_CONTEXT_STEPS = 4
"""``serving_metrics`` substitutions of the prefix form's step ratio r = tau_d(n, P + O/2) /
tau_d(n, P_eff + O'/2), n the plain batch at O' = 1 + (O - 1) r.  Scaling only TPOT by r at the
unstretched batch (one substitution, no re-solve) left the utilisation blind to the full-context
KV reads: Llama-3.1-8B, 90 % shared, "utilisation 0.7" was saturated in the simulator (decode
batch 115 closed vs 160-198 simulated, TTFT growing through the run)."""

CONTEXT_FIXED_POINT_STEPS = 3
"""``serving_metrics`` substitutions of the speculative step ratio r = step_spec(n) / tau_d(n),
n the plain batch at 1 + r (O - 1) / E decode steps.  Stretching only TPOT at the unstretched
batch left the utilisation blind to the longer step (8B TPOT p95 -16 % .. -25 % at load)."""

SPEC_TTFT_STEPS = (1.5, 2.0, 2.0, 2.0)
"""Extra verification iterations inside TTFT (mean, p50, p95, p99): the prefill's own iteration
carries the decode batch's verification (1) plus the residual of the running one (1/2 on average,
close to a whole one in the tail)."""


class LoadedFeature(eqx.Module):
    """(mean, p50, p95, p99) of TTFT and TPOT, utilisation, stability, decode batch (one replica)."""

    ttft_s: Array
    tpot_s: Array
    utilization: Array
    stable: Array
    decode_batch: Array
    tokens_per_step: Array


def _stack(p):
    return jnp.stack([p.mean, p.p50, p.p95, p.p99])


def prefix_serving_metrics(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    workload,
    *,
    shared_fraction: ArrayLike,
    prefix_tokens: ArrayLike,
    chunked_prefill: bool = True,
) -> LoadedFeature:
    """Percentiles with a prefix cache (see module docstring); ``workload`` is a ``Workload``."""
    from ._serving import serving_metrics  # the dynamics layer, imported where used

    p = workload.prompt_tokens_mean
    reuse = prefix_reuse(
        model,
        hardware,
        deployment,
        efficiency,
        prompt_tokens=p,
        output_tokens=workload.output_tokens_mean,
        shared_fraction=shared_fraction,
        prefix_tokens=prefix_tokens,
        arrival_rate_per_s=workload.arrival_rate_per_s,
    )
    w, r = reuse.reused_fraction, reuse.reusable_tokens
    mean = p - w * r
    var = jnp.square(workload.prompt_tokens_cv * p) + w * (1.0 - w) * jnp.square(r)
    o_dec = jnp.maximum(workload.output_tokens_mean - 1.0, 0.0)
    full_ctx = p + workload.output_tokens_mean / 2.0

    def plain(ratio):
        # each real decode step costs `ratio` plain ones: (O - 1) x ratio plain decode steps
        out = 1.0 + o_dec * ratio
        eff = eqx.tree_at(
            lambda x: (x.prompt_tokens_mean, x.prompt_tokens_cv, x.output_tokens_mean),
            workload,
            (jnp.asarray(mean, dtype=float), jnp.sqrt(var) / mean, jnp.asarray(out, dtype=float)),
        )
        m = serving_metrics(
            model, hardware, deployment, efficiency, eff, chunked_prefill=chunked_prefill
        )
        n = jnp.maximum(m.decode_batch, 1.0)
        new = (
            decode_step(model, hardware, deployment, efficiency, n, full_ctx).total_s
            / decode_step(model, hardware, deployment, efficiency, n, mean + out / 2.0).total_s
        )
        return m, new

    ratio = jnp.asarray(1.0)
    for _ in range(PREFIX_CONTEXT_STEPS):
        _, ratio = plain(ratio)
    m, _ = plain(ratio)
    return LoadedFeature(
        ttft_s=_stack(m.ttft_s),
        tpot_s=_stack(m.tpot_s) * ratio,
        utilization=m.utilization,
        stable=m.stable,
        decode_batch=m.decode_batch,
        tokens_per_step=jnp.asarray(1.0),
    )


def speculative_serving_metrics(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    efficiency: Efficiency,
    workload,
    *,
    draft_tokens: ArrayLike,
    acceptance: ArrayLike,
    draft_model: ModelSpec | None = None,
    chunked_prefill: bool = True,
) -> LoadedFeature:
    """Percentiles with speculative decoding (see module docstring)."""
    from ._serving import serving_metrics

    k = jnp.asarray(draft_tokens, dtype=float)
    a = jnp.asarray(acceptance, dtype=float)
    e = expected_tokens_per_step(a, k)
    o_dec = jnp.maximum(workload.output_tokens_mean - 1.0, 0.0)
    ctx = workload.prompt_tokens_mean + workload.output_tokens_mean / 2.0

    def spec_at(batch):
        return speculative_decode(
            model,
            hardware,
            deployment,
            efficiency,
            batch_size=batch,
            context_tokens=ctx,
            draft_tokens=k,
            acceptance=a,
            draft_model=draft_model,
        )

    def run(stretch):
        # (O - 1) / E spec steps, each costing `stretch` plain decode steps
        out = 1.0 + o_dec / e * stretch
        steps = eqx.tree_at(lambda x: x.output_tokens_mean, workload, jnp.asarray(out))
        m = serving_metrics(
            model, hardware, deployment, efficiency, steps, chunked_prefill=chunked_prefill
        )
        n = jnp.maximum(m.decode_batch, 1.0)
        s = spec_at(n)
        tau = decode_step(
            model, hardware, deployment, efficiency, n, workload.prompt_tokens_mean + out / 2.0
        ).total_s
        return m, s, s.step_s / tau

    # the longer spec step keeps more sequences decoding (Little's law); the plain engine sees
    # them, and its utilisation the longer decode phase, through the stretched step count
    stretch = jnp.asarray(1.0)
    for _ in range(CONTEXT_FIXED_POINT_STEPS):
        _, _, stretch = run(stretch)
    m, s, _ = run(stretch)
    plain = _stack(m.tpot_s) * stretch / e
    # tokens per step T = 1 + min(G, k), G geometric: E[T^2] = sum_j (2j + 1) a^j over j <= k
    j = jnp.arange(0.0, 17.0)
    second = jnp.sum(jnp.where(j <= k, (2.0 * j + 1.0) * a**j, 0.0))
    var_t = jnp.maximum(second - jnp.square(e), 0.0)
    cv_acc = jnp.sqrt(var_t / (jnp.maximum(o_dec, 1.0) * e))
    z = jnp.asarray([0.0, 0.0, Z95, Z99])
    cv_int = (plain / plain[0] - 1.0) / jnp.where(z > 0, z, 1.0)
    tpot = plain[0] * (1.0 + z * jnp.sqrt(jnp.square(cv_int) + jnp.square(cv_acc)))
    tpot = tpot.at[1].set(plain[1])
    extra = jnp.asarray(SPEC_TTFT_STEPS) * (s.step_s - s.target_step_s)
    return LoadedFeature(
        ttft_s=_stack(m.ttft_s) + extra,
        tpot_s=tpot,
        utilization=m.utilization,
        stable=m.stable,
        decode_batch=m.decode_batch,
        tokens_per_step=e,
    )
