"""The serving metrics a chance constraint reads: p95 TTFT, TPOT and ITL, utilisation, memory fit.

Two evaluations of one load model, with one output type:

* ``serving_slo_metrics`` (the verdict model): ``perfmodel.dynamics.serving_metrics`` itself
  (lognormal length nodes, fixed-point steady state, prefill-server and running-slot waits) --
  about 0.7 ms per evaluation on a CPU core; it re-checks and reports what the search returns.
* ``slo_metrics`` (the search model): the first-order form of the same laws on the same
  ``forward_step`` iterations, with no fixed point and no quadrature -- the saturated
  batch-service capacity (``perfmodel.dynamics.saturated_batch``), the operating batch by
  Little's law, TTFT as residual + Kingman prefill-server wait (Takacs-shifted tail) + own
  prefill (``ttft_quantiles``), TPOT as a request's mean gap spread by the prefill landing in its
  gaps (``tpot_quantiles``), ITL as one gap's two-point law (``itl_quantiles``) -- about 10 us,
  so the gradient search and the exhaustive referee can afford every configuration x replica
  count x posterior draw.  Its agreement with the verdict model is measured
  (``benchmarks/bench_search_agreement.py``: median p95 TTFT / TPOT / utilisation ratios
  0.98 / 1.00 / 1.00 over four problems; p95 ITL 1.06 and 1.00 on the two problems of
  ``tests/test_itl_slo_and_max_model_len.py`` / ``tests/test_search_model.py``) and tested
  (``tests/test_search_model.py``, ``tests/test_itl_slo_and_max_model_len.py``).

Both are pure functions of the spec pytrees, exact at ``temperature == 0`` and smooth above it.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.special import ndtr, ndtri

from perfmodel import (
    COUNT_FLOOR,
    POSITIVE_FLOOR,
    SHARE_FLOOR,
    Array,
    ModelSpec,
    System,
    max_concurrent_requests,
    smooth_ceil,
    smooth_min,
    step_total_s,
)
from perfmodel.dynamics import (
    QUANTILES,
    DecodeCost,
    Workload,
    kingman_wait_s,
    lognormal_nodes,
    lognormal_params,
    mg1_conditional_wait_scv,
    open_loop_busy_probability,
    poll_wait,
    replica_arrival_scv,
    saturated_batch,
    serving_metrics,
)
from perfmodel.features import MTP_LAYERS_PER_DRAFT_TOKEN

from ._engine_args import DEFAULT_MAX_MODEL_LEN

TAIL_PROBABILITY = 0.05
"""p95: the waiting-time tail P(W > t) = rho * exp(-t / W_cond) is solved at this probability."""


class SloMetrics(eqx.Module):
    """What the chance constraints read, per replica group (seconds, fractions).

    Attributes:
        ttft_p95_s: 95th-percentile time to first token.
        tpot_p95_s: 95th-percentile time per output token.
        utilization: offered load / capacity of one replica (stable below 1).
        concurrent_requests: sequences of prompt + output tokens whose KV fits (fits at >= 1);
            with a ``Problem.max_model_len_tokens`` the evaluation caps it by the sequences of
            that context whose KV fits (an engine that cannot hold one does not start).
        ttft_quantiles_s: TTFT (p50, p95, p99).
        tpot_quantiles_s: TPOT (p50, p95, p99).
        itl_p95_s: 95th-percentile inter-token latency (one gap, over gaps).
        itl_quantiles_s: ITL (p50, p95, p99).  None where a model does not give it (the
            two-pool search model: ``optimize._evaluate.split_metrics`` fills it in).
    """

    ttft_p95_s: Array
    tpot_p95_s: Array
    utilization: Array
    concurrent_requests: Array
    ttft_quantiles_s: Array
    tpot_quantiles_s: Array
    itl_p95_s: Array | None = None
    itl_quantiles_s: Array | None = None


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
    system: System,
    spec,
    *,
    n_decode,
    prefill_tokens,
    tokens_per_prefill_seq,
    context,
    prefill_context=0.0,
    temperature=0.0,
):
    """One engine iteration: ``n_decode`` sequences decode (each verifying k draft tokens under
    ``spec``) beside ``prefill_tokens`` prompt tokens in pieces of ``tokens_per_prefill_seq``,
    each piece attending ``prefill_context`` earlier tokens of its prompt.

    The k verification tokens per sequence are charged as extra new tokens of the same pieces
    (their GEMM FLOPs exact; the context KV is read once, by the sequence's decode slot); the
    draft adds k draft forward passes over the decoding sequences (``perfmodel._speculative``).
    """
    efficiency = system.efficiency
    k = 0.0 if spec is None else spec.draft_tokens
    new = prefill_tokens + n_decode * k
    per_seq = jnp.maximum(tokens_per_prefill_seq, 1.0)
    t = step_total_s(
        system,
        prefill_tokens=new,
        prefill_seqs=new / per_seq,
        prefill_context=prefill_context,
        decode_seqs=n_decode,
        decode_context=context,
        temperature=temperature,
    )
    if spec is None:
        return t
    draft_s = step_total_s(
        dataclasses.replace(system, model=spec.draft_model),
        decode_seqs=n_decode,
        decode_context=context,
        temperature=temperature,
    )
    mtp = (
        MTP_LAYERS_PER_DRAFT_TOKEN
        * (draft_s - efficiency.step_overhead_s)
        / spec.draft_model.num_layers
    )
    return t + k * jnp.where(spec.draft_is_mtp, mtp, draft_s)


def queue_waits(
    rho: Array, mu: Array, interarrival_cv: Array, service_cv2: Array, stable: Array
) -> Array:
    """M/G/1 (Kingman) wait quantiles (p50, p95, p99): P(W > t) = rho exp(-t / W_cond)."""
    rho_s = jnp.where(stable, rho, 0.5)
    wait_cond = (interarrival_cv**2 + service_cv2) / 2.0 / mu / (1.0 - rho_s)
    tails = jnp.asarray([0.5, TAIL_PROBABILITY, 0.01])
    return wait_cond * jnp.maximum(jnp.log(jnp.maximum(rho_s, POSITIVE_FLOOR) / tails), 0.0)


def little_batch(
    lam: Array, tokens: Array, t_one: Array, t_full: Array, n_max: Array, stable: Array
):
    """Operating batch n = lam * tokens * t(n), t affine through (1, t_one) and (n_max, t_full);
    returns (n, slope, intercept)."""
    slope = (t_full - t_one) / jnp.maximum(n_max - 1.0, COUNT_FLOOR)
    intercept = t_one - slope
    denom = jnp.where(stable, 1.0 - lam * tokens * slope, 1.0)
    return jnp.clip(lam * tokens * intercept / denom, 0.0, n_max), slope, intercept


TPOT_OUTPUT_NODES = 4
"""Equal-probability output-length nodes of the search model's TPOT mixture (short outputs have
the widest per-request TPOT)."""


def ttft_quantiles(
    own_s: Array,
    packed_s: Array,
    carry_s: Array,
    decode_s: Array,
    decode_batch: Array,
    rate: Array,
    arrival_scv: Array,
    workload: Workload,
) -> Array:
    """(p50, p95, p99) of TTFT by ``perfmodel``'s law (``_serving_tail``, first order): the
    residual of the iteration in flight + the prefill server's wait + the prompt's own prefill.

    The prefill server serves a prompt in its own chunk iterations (``own_s``) or, while a backlog
    lasts (probability rho), packed into full-budget iterations (``packed_s`` per prompt), so
    rho = lambda (rho packed + (1 - rho) own), i.e. rho = lambda own / (1 - lambda (packed - own));
    its wait is Kingman's, rho / (1 - rho) (c_a^2 + c_P^2) / 2 E[S] (service proportional to the
    prompt, CV c_P), waiting with probability rho, given a wait the Takacs-shifted exponential.  An arrival waits out the
    iteration in flight while decodes keep the engine iterating (P = 1 - exp(-n)): half a
    decode-only one, or with probability rho half a chunk-carrying one.  Quantile q adds the
    wait's q-quantile to the own prefill of the prompt at its q-quantile (an upper bound: the
    parts' quantiles added); ``inf`` when rho >= 1."""
    rho = rate * own_s / jnp.maximum(1.0 - rate * (packed_s - own_s), 1e-9)
    ok = (rho < 1.0) & (rho >= 0.0)
    rho_s = jnp.where(ok, rho, 0.5)
    service = rho_s / jnp.maximum(rate, POSITIVE_FLOOR)
    cp2 = jnp.square(workload.prompt_tokens_cv)
    wait = kingman_wait_s(rho_s, arrival_scv, cp2, service)
    residual = -jnp.expm1(-decode_batch) * ((1.0 - rho_s) * decode_s + rho_s * carry_s) / 2.0
    qs = jnp.asarray(QUANTILES)
    mu, sigma = lognormal_params(1.0, workload.prompt_tokens_cv)  # the prompt / its mean
    prompt_ratio = jnp.exp(mu[..., None] + sigma[..., None] * ndtri(qs))
    # given a wait, it is less variable than exponential for less variable prompts (Takacs'
    # M/G/1 moments, service moments of the lognormal E[S^k] = E[S]^k (1 + c_P^2)^(k(k-1)/2)):
    # d + Exp(W_cond - d), d = (1 - sqrt(min(c_W^2, 1))) W_cond, as ``perfmodel`` shifts it
    m = [service**k * (1.0 + cp2) ** (k * (k - 1) / 2) for k in (1, 2, 3)]
    cw2 = mg1_conditional_wait_scv(rho_s, *m)
    w_cond = wait / rho_s
    shift = (1.0 - jnp.sqrt(jnp.clip(cw2, 0.1, 1.0))) * w_cond
    tail = jnp.log(jnp.maximum(rho_s[..., None] / (1.0 - qs), 1.0))
    waited = jnp.where(
        rho_s[..., None] > 1.0 - qs, shift[..., None] + (w_cond - shift)[..., None] * tail, 0.0
    )
    out = residual[..., None] + own_s[..., None] * prompt_ratio + waited
    return jnp.where(ok[..., None], out, jnp.inf)


def tpot_quantiles(
    gap_s: Array,
    prompt_work_s: Array,
    rate: Array,
    arrival_scv: Array,
    workload: Workload,
    tokens_per_step: Array,
) -> Array:
    """(p50, p95, p99) of a request's TPOT, its mean gap over its (O - 1) / E decode iterations,
    by ``perfmodel``'s law (``_serving_tail``, first order): the prompts whose prefill work Delta
    lands in those gaps stall it, a compound-Poisson sum with
    Var = c_a^2 lambda TPOT E[Delta^2] / (m (1 - u)^2), m = max((O - 1) / E, 1) its iterations,
    u = lambda E[Delta] the prefill share of the engine's time, E[Delta^2] = E[Delta]^2 (1 + c_P^2)
    (work proportional to the prompt); the quantiles of the equal-weight lognormal mixture over
    ``TPOT_OUTPUT_NODES`` output lengths, per token (/ E)."""
    u = jnp.clip(rate * prompt_work_s, 0.0, 0.95)
    work2 = jnp.square(prompt_work_s) * (1.0 + jnp.square(workload.prompt_tokens_cv))
    outputs = lognormal_nodes(
        workload.output_tokens_mean, workload.output_tokens_cv, TPOT_OUTPUT_NODES
    )
    iterations = jnp.maximum((outputs - 1.0) / tokens_per_step, 1.0)
    var = arrival_scv * rate * gap_s * work2 / (iterations * jnp.square(1.0 - u))
    return _mixture_quantiles(gap_s, var) / tokens_per_step


TABLE_SIGMAS_BELOW, TABLE_SIGMAS_ABOVE = 3.0, 4.0
"""A tabulated latency law spans 3 sd of its widest lognormal below the mean's log to 4 above
(p99 lies 2.3 sd above the median: the grid holds it with room for the mixture's spread)."""

TABLE_LOG_VARIANCE_FLOOR = 1e-12
"""Narrowest log-variance a tabulated law takes (sd 1e-6), so its grid never collapses to a point."""

QUANTILE_GRID = 64
"""Log-spaced points on which the search model's TPOT mixture CDF is tabulated (one vectorised
evaluation instead of a bisection loop; quantiles by interpolation, error ~0.1 sd)."""


def _mixture_quantiles(mean: Array, variances: Array) -> Array:
    """(p50, p95, p99) of an equal-weight mixture of lognormals of one ``mean`` and the given
    ``variances`` (last axis): the CDF on ``QUANTILE_GRID`` points spanning [-3, 4] sd of the
    widest component, inverted by linear interpolation in log t."""
    m = jnp.maximum(mean, POSITIVE_FLOOR)[..., None]
    s2 = jnp.log1p(jnp.maximum(variances, 0.0) / jnp.square(m))
    mu, sd = jnp.log(m) - s2 / 2.0, jnp.sqrt(jnp.maximum(s2, TABLE_LOG_VARIANCE_FLOOR))
    widest = jnp.max(sd, axis=-1, keepdims=True)
    log_t = jnp.log(m) + widest * jnp.linspace(
        -TABLE_SIGMAS_BELOW, TABLE_SIGMAS_ABOVE, QUANTILE_GRID
    )
    cdf = jnp.mean(ndtr((log_t[..., :, None] - mu[..., None, :]) / sd[..., None, :]), axis=-1)

    def invert(c, x):
        return jnp.interp(jnp.asarray(QUANTILES), c, x)

    flat = invert
    for _ in range(cdf.ndim - 1):
        flat = jax.vmap(flat)
    return jnp.exp(flat(cdf, log_t))


ITL_GRID = 128
"""Log-spaced points on which the search model's ITL law is tabulated (it spans two points,
a decode-only and a prefill-carrying gap, so twice the TPOT grid)."""


def itl_quantiles(
    short_s: Array, long_s: Array, long_share: Array, variance: Array, tokens_per_step: Array
) -> Array:
    """(p50, p95, p99) of one decode gap by ``perfmodel``'s law (``_serving_tail.gap_quantiles``):
    a gap without prefill work (``short_s``) or, with probability f = ``long_share``, with it
    (``long_s``), each a lognormal of ``variance`` (the batch's drift over one gap),
    F(t) = (1 - f) LN(t; short) + f LN(t; long), tabulated on ``ITL_GRID`` log-spaced points and
    inverted by interpolation (no bisection), per token (/ E)."""
    means = jnp.maximum(jnp.stack(jnp.broadcast_arrays(short_s, long_s), axis=-1), POSITIVE_FLOOR)
    s2 = jnp.log1p(jnp.maximum(variance, 0.0)[..., None] / jnp.square(means))
    mu, sd = jnp.log(means) - s2 / 2.0, jnp.sqrt(jnp.maximum(s2, TABLE_LOG_VARIANCE_FLOOR))
    lo = jnp.min(mu - TABLE_SIGMAS_BELOW * sd, axis=-1, keepdims=True)
    hi = jnp.max(mu + TABLE_SIGMAS_ABOVE * sd, axis=-1, keepdims=True)
    log_t = lo + (hi - lo) * jnp.linspace(0.0, 1.0, ITL_GRID)
    phi = ndtr((log_t[..., :, None] - mu[..., None, :]) / sd[..., None, :])
    f = jnp.clip(long_share, 0.0, 1.0)[..., None]
    cdf = (1.0 - f) * phi[..., 0] + f * phi[..., 1]

    def invert(c, x):
        return jnp.interp(jnp.asarray(QUANTILES), c, x)

    flat = invert
    for _ in range(cdf.ndim - 1):
        flat = jax.vmap(flat)
    return jnp.exp(flat(cdf, log_t)) / jnp.asarray(tokens_per_step)[..., None]


def _search_itl(
    *,
    t_dec: Array,
    t_dec_one: Array,
    t_mean: Array,
    t_budget: Array,
    n_op: Array,
    n_full: Array,
    lam: Array,
    i_len: Array,
    chunks: Array,
    budget: Array,
    ca2: Array,
    e: Array | float,
) -> Array:
    """ITL quantiles (p50, p95, p99) of the search model, as ``itl_quantiles`` spreads them.

    One gap is decode-only (t_dec) or, a share f of them, carries the prefill that makes the
    mean gap t: prompts in prefill per gap are Poisson with mean x = lambda t ceil(I / c),
    f = 1 - exp(-x), and the prompt tokens are conserved, so at least lambda I t / B of the gaps
    carry a full budget; a carrying gap is t_dec + (t - t_dec) / f, at most a full budget's
    iteration.  The batch
    drifts by Var(N) = n (1 + c_a^2) / 2 / (1 - g)^2, g = n t_d' / t (t_d' the decode-only
    iteration's slope in the batch, from the one-sequence one), moving the gap by
    t_d' sqrt(Var(N)), at most the headroom t_d' (n_sat - n) to the saturated batch.

    Args:
        t_dec, t_dec_one, t_mean, t_budget: the operating batch's decode-only iteration, one
            sequence's, the mean gap t and a full budget's iteration, seconds.
        n_op, n_full: the operating and the saturated batch.
        lam: arrivals per second at one replica.
        i_len, chunks, budget: uncached prompt tokens I, chunks per prompt ceil(I / c), the
            token budget B.
        ca2: squared CV of a replica's inter-arrival gaps.
        e: tokens per decode step.
    """
    x = lam * t_mean * chunks
    share = jnp.clip(jnp.maximum(-jnp.expm1(-x), x * i_len / (chunks * budget)), SHARE_FLOOR, 1.0)
    t_long = jnp.clip(t_dec + (t_mean - t_dec) / share, t_dec, jnp.maximum(t_budget, t_mean))
    slope_dec = jnp.maximum(t_dec - t_dec_one, 0.0) / jnp.maximum(n_op - 1.0, 1.0)
    gain = jnp.clip(n_op * slope_dec / jnp.maximum(t_mean, POSITIVE_FLOOR), 0.0, 0.95)
    drift = jnp.square(slope_dec) * n_op * (1.0 + ca2) / 2.0 / jnp.square(1.0 - gain)
    headroom = slope_dec * jnp.maximum(n_full - n_op, 0.0)
    drift = jnp.minimum(drift, jnp.square(headroom))
    return itl_quantiles(t_dec, t_long, share, drift, e)


def slo_metrics(
    system: System,
    workload: Workload,
    temperature: float = 0.0,
    *,
    chunk_tokens: Array | None = None,
    spec: SpecStep | None = None,
    cached_prompt_tokens: Array | float = 0.0,
) -> SloMetrics:
    """The search model: the load model's first-order laws on ``forward_step`` iterations, all
    replicas sharing the arrivals evenly.

    ``cached_prompt_tokens``: mean prompt tokens per request already in KV at admission (a prefix
    cache, ``perfmodel.features.prefix_workload``; ``workload`` then holds the uncached prompts):
    every prefill chunk and decode iteration reads their KV too (``DecodeCost``'s law).

    B = ``max_num_batched_tokens`` (iteration token budget), c = ``chunk_tokens`` (prefill chunk
    per request per iteration, default B), E tokens per decode step (1, or ``spec``'s).
    Capacity mu = n / ((O / E) t) requests/s per replica at the saturated batch-service iteration
    (``saturated_batch``: B split between n decodes and the prefill that keeps up with them,
    n at most the KV/``max_num_seqs`` seats).  The operating batch solves Little's law
    n = lambda (O / E) t(n) with t affine between n = 1 and the saturated batch; the mean gap is
    the larger of that chord and the iteration evaluated there.  TTFT: ``ttft_quantiles`` (residual
    + prefill-server wait + own ceil(I / c) chunk iterations); TPOT: ``tpot_quantiles`` (the mean
    gap spread by the prefill landing in a request's gaps), at most the gap of full-budget
    iterations.  ITL: ``itl_quantiles`` -- the share of iterations carrying prefill is the
    steady state's Poisson one, f = 1 - exp(-lambda t ceil(I / c)), at least the conserved
    lambda I t / B; a carrying gap holds the prefill the mean gap adds, t_dec + (t - t_dec) / f,
    at most a full budget's iteration; the batch drifts by Var(N) = n (1 + c_a^2) / 2 / (1 - g)^2,
    g = n t_d' / t (t_d' the decode-only iteration's slope in the batch), moving the gap by
    t_d' sqrt(Var(N)), at most the headroom t_d' (n_sat - n) to the saturated batch.
    """
    deployment, efficiency = system.deployment, system.efficiency
    lam = workload.arrival_rate_per_s / deployment.replicas
    i_len, o_len = workload.prompt_tokens_mean, workload.output_tokens_mean
    cached = jnp.asarray(cached_prompt_tokens)
    context = cached + i_len + o_len / 2.0
    budget = deployment.max_num_batched_tokens
    chunk = budget if chunk_tokens is None else chunk_tokens
    e = 1.0 if spec is None else spec.tokens_per_step
    concurrent = max_concurrent_requests(
        system.model, system.hardware, deployment, i_len + o_len, temperature
    )
    n_max = jnp.maximum(smooth_min(concurrent, deployment.max_num_seqs, temperature), 1.0)

    def iteration(n_decode, prefill_tokens, per_seq, prefill_context):
        return iteration_s(
            system,
            spec,
            n_decode=n_decode,
            prefill_tokens=prefill_tokens,
            tokens_per_prefill_seq=per_seq,
            context=context,
            prefill_context=prefill_context,
            temperature=temperature,
        )

    # the saturated and the one-sequence iteration through one (vectorised) step evaluation
    steps = o_len / e
    n_full, prefill_full = saturated_batch(budget, i_len, steps, n_max, temperature)
    t_full, t_one = iteration(
        jnp.stack(jnp.broadcast_arrays(n_full, 1.0)),
        jnp.stack(jnp.broadcast_arrays(prefill_full, i_len / steps)),
        i_len,
        cached + i_len / 2.0,
    )
    mu = n_full / (steps * t_full)
    rho = lam / mu
    stable = rho < 1.0
    n_op, slope, intercept = little_batch(lam, steps, t_one, t_full, n_full, stable)

    c_eff = smooth_min(i_len, chunk, temperature)
    chunks = smooth_ceil(i_len / chunk, temperature)
    # the operating batch's iteration with one prompt's chunk (at the mean context of its
    # chunks), without, with a full budget of prefill, and with the prefill that keeps up with
    # it; the mean gap is the larger of that and the chord through (1, t_one) and (n, t_full):
    # the chord is above a convex (dense roofline) step, below a concave one (a MoE step, as
    # more experts are touched)
    # (and a decode-only iteration of one sequence: the slope of the decode gap in the batch)
    t_with, t_dec, t_budget, t_op, t_dec_one = iteration(
        jnp.stack(jnp.broadcast_arrays(n_op, n_op, n_op, n_op, 1.0)),
        jnp.stack(jnp.broadcast_arrays(c_eff, 0.0, budget, n_op * i_len / steps, 0.0)),
        jnp.stack(jnp.broadcast_arrays(c_eff, c_eff, c_eff, i_len, c_eff)),
        jnp.stack(
            jnp.broadcast_arrays(
                *([cached + jnp.maximum(i_len - c_eff, 0.0) / 2.0] * 3),
                cached + i_len / 2,
                jnp.zeros_like(c_eff),
            )
        ),
    )
    t_mean = jnp.maximum(t_op, intercept + slope * n_op)
    own = chunks * t_with
    ca2 = replica_arrival_scv(workload.interarrival_cv, deployment.replicas)
    ttft = ttft_quantiles(
        own,
        i_len / budget * t_budget,
        t_with,
        t_dec,
        n_op,
        lam,
        ca2,
        workload,
    )  # inf where the prefill server saturates
    ttft = jnp.where(stable[..., None], ttft, jnp.inf)
    # the scheduler's poll (``perfmodel._polling``): busy while any request runs, the median
    # standing in for the mean of the first-order law
    poll = poll_wait(deployment.scheduler_polls, t_mean, open_loop_busy_probability(n_op))
    ttft = poll.quantile_s(ttft, ttft[..., 0], QUANTILES)
    tpot_q = tpot_quantiles(
        t_mean,
        chunks * jnp.maximum(t_with - t_dec, 0.0),
        lam,
        ca2,
        workload,
        e,
    )
    # a request's mean gap is at most that of iterations all carrying a full budget
    cap = jnp.maximum(t_budget, t_mean) / e
    tpot = jnp.where(stable[..., None], jnp.minimum(tpot_q, cap[..., None]), jnp.inf)
    itl = _search_itl(
        t_dec=t_dec,
        t_dec_one=t_dec_one,
        t_mean=t_mean,
        t_budget=t_budget,
        n_op=n_op,
        n_full=n_full,
        lam=lam,
        i_len=i_len,
        chunks=chunks,
        budget=budget,
        ca2=ca2,
        e=e,
    )
    itl = jnp.where(stable[..., None], itl, jnp.inf)
    # as the engine delivers them (``perfmodel.dynamics.engine_scaled``, the verdict model's)
    ttft = ttft * efficiency.ttft_scale
    tpot = tpot * efficiency.tpot_scale
    itl = itl * efficiency.tpot_scale
    return SloMetrics(
        ttft_p95_s=ttft[1],
        tpot_p95_s=tpot[1],
        utilization=rho,
        concurrent_requests=concurrent,
        ttft_quantiles_s=ttft,
        tpot_quantiles_s=tpot,
        itl_p95_s=itl[..., 1],
        itl_quantiles_s=itl,
    )


SERVED_PROMPT_QUANTILE, SERVED_OUTPUT_QUANTILE = 0.999, 0.99
"""The longest request ``served_max_model_len`` sizes the context for: the prompt law's 99.9th
plus the output law's 99th percentile."""

MAX_MODEL_LEN_STEP = 1024
"""``served_max_model_len`` rounds up to a multiple of this many tokens."""


def served_max_model_len(workload: Workload, default: float = DEFAULT_MAX_MODEL_LEN) -> Array:
    """The engine context that serves every request of ``workload`` (the optimiser's load is all
    of it: an engine rejects prompts past ``max_model_len``): the larger of ``default`` (the
    ``perfmodel.Deployment`` one) and the prompt's 99.9th plus the output's 99th lognormal
    percentile, rounded up to ``MAX_MODEL_LEN_STEP``."""

    def quantile(mean, cv, q):
        mu, sigma = lognormal_params(mean, cv)
        return jnp.exp(mu + sigma * ndtri(q))

    longest = quantile(
        workload.prompt_tokens_mean, workload.prompt_tokens_cv, SERVED_PROMPT_QUANTILE
    ) + quantile(workload.output_tokens_mean, workload.output_tokens_cv, SERVED_OUTPUT_QUANTILE)
    step = MAX_MODEL_LEN_STEP
    return jnp.maximum(jnp.asarray(default), jnp.ceil(longest / step) * step)


def serving_slo_metrics(
    system: System,
    workload: Workload,
    temperature: float = 0.0,
    *,
    chunk_tokens: Array | None = None,
    cached_prompt_tokens: Array | float = 0.0,
) -> SloMetrics:
    """The verdict model: ``perfmodel.dynamics.serving_metrics`` (chunked prefill at the token
    budget, ``chunk_tokens`` per sequence; ``cached_prompt_tokens`` of prefix KV read by every
    iteration, as in ``slo_metrics``) as ``SloMetrics``."""
    model, hardware, deployment = system.model, system.hardware, system.deployment
    m = serving_metrics(
        system,
        workload,
        temperature=temperature,
        chunk_tokens=chunk_tokens,
        decode_cost=DecodeCost(cached_prompt_tokens=cached_prompt_tokens),
    )
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
        itl_p95_s=m.itl_s.p95,
        itl_quantiles_s=jnp.stack([m.itl_s.p50, m.itl_s.p95, m.itl_s.p99]),
    )
