"""Closed-loop load: N requests kept in flight by clients that send a new one as one finishes.

This is how serving benchmarks are run (vLLM ``bench serve --max-concurrency N``, SGLang
``bench_serving``, aiperf, InferenceMAX) and how offline throughput is measured (every request
queued at t = 0: a closed loop whose N exceeds the engine's seats).  A closed loop cannot be
overloaded: its rate is whatever the engine's iterations allow.

Mean-value analysis of an iteration-level engine (Orca; vLLM; Sarathi-Serve chunked prefill),
per replica with n = min(N / replicas, seats) requests admitted:

* each request needs one prefill of P tokens and O' = (O - 1) / a decode iterations
  (a = tokens per decode iteration, > 1 with speculative decoding / MTP);
* with q prompts entering per iteration, Little's law on the running set gives the decode
  batch d = q O' and, over the whole cycle, n = X (TTFT + O' tau) with X = q / tau;
* prefill tokens per iteration p = q P fit in the token budget B beside the decodes:
  p <= B - d (when the budget binds, prompts queue for it and TTFT grows by Little's law);
* an iteration with a prompt costs tau_with = T(p / f prefill tokens, d decodes), one without
  tau_0 = T(0, d); f = min(q, 1) of iterations carry one, so the mean iteration is
  tau = f tau_with + (1 - f) tau_0 (``forward_step``, the one step model);
* TTFT (desynchronised) = residual of the running iteration E[tau^2] / (2 E[tau]) + the
  prompt's own prefill iterations (ceil(P / (B - d)) of them) + the budget queue; TPOT = tau / a;
  the inter-token gaps are tau_with (share f) or tau_0.

On an engine that mixes prompt chunks into decode iterations (vLLM, TensorRT-LLM) clients are
taken as desynchronised, fixed output lengths included: the prompts of a burst that share a
chunk finish together, but each chunk's requests start decoding as their chunk ends, so the
chunks stay staggered (pricing a lockstep there made one lab's fixed-length runs disagree with
every other lab's closed loops, ``BENCHMARKS.md``).  An engine that prefills waiting prompts
first, in iterations of their own (``Deployment.prefill_first``: SGLang), holds every decode
until the whole burst is prefilled; with fixed prompt and output lengths every request then
finishes in the same iteration and the clients re-enter together: a lockstep loop.  Each cycle
is a wave of n P tokens in k = max(n P / B, 1) prefill-only iterations of t_k, then O' decode
iterations of d = n sequences (tau_n):

* X = n / (k t_k + O' tau_n);
* TTFT uniform over the wave's chunk ends [t_k, k t_k];
* a request whose chunk ends at t waits k t_k - t for the wave's end, so TPOT is
  tau_n / a + (k t_k - t) / (O - 1), uniform from tau_n / a up; ITL is tau_n / a;
* E2E = k t_k + O' tau_n for every request.

Any spread in the lengths staggers the finishes and the loop drifts out of step, so the
lockstep share is ``prefill_first`` at zero length CVs and 0 otherwise.

Requests beyond the seats wait for one to free: (N / replicas - n) / X more TTFT.  The first
round starts as a burst (all N sent at t = 0): its prompts are prefilled as one wave of
n P tokens at the full budget, the j-th finishing about j / n of the way through it; with R
requests per client a share 1 / R of requests see the wave (``Workload.requests_per_client``).
The fixed point in q is solved by damped iteration (``CLOSED_LOOP_ITERATIONS``), smooth in every
continuous input.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri

from ._batching import iteration_s
from ._floors import COUNT_FLOOR, RATE_FLOOR_PER_S, SHARE_FLOOR, TIME_FLOOR_S
from ._memory import max_concurrent_requests
from ._polling import closed_loop_busy_probability, poll_wait
from ._serving_tail import PERCENTILE_QUANTILES
from ._specs import Deployment, HardwareSpec, ModelSpec, System
from ._types import Array
from ._workload import Workload, lognormal_params

CLOSED_LOOP_ITERATIONS = 40
"""Damped fixed-point steps of the prompts-per-iteration rate q (each halves the error at worst:
2^-40 leaves Little's law N = X E[E2E] exact to rounding; each step is two step evaluations)."""

DAMPING = 0.5
"""Weight of the new iterate in q <- (1 - w) q + w g(q)."""

QUANTILE_BISECTIONS = 40
"""Bisection steps of a TTFT mixture quantile on [0, upper]."""


class ClosedLoopState(eqx.Module):
    """Steady state of one replica's closed loop (seconds, tokens, requests).

    Attributes:
        admitted: requests holding a seat, n = min(N / replicas, seats).
        waiting: requests queued for a seat beyond them.
        prompts_per_iteration: q, prompts entering the running set per iteration.
        decode_batch: d, sequences decoding per iteration.
        prefill_tokens_per_iteration: p = q P (capped by the budget beside the decodes).
        iteration_s: mean iteration time tau.
        prefill_iteration_s: tau_with, an iteration carrying a prompt.
        decode_iteration_s: tau_0, a decode-only iteration.
        prompt_share: f, share of iterations that carry a prompt.
        completion_rate_per_s: X, requests finished per second.
        ttft_steady_s: mean TTFT once the loop is desynchronised.
        wave_s: time to prefill the first round's burst of n prompts.
        wave_chunks: iterations that burst spans (>= 1).
        lockstep_share: L, 1 for a lockstep loop (a prefill-first engine, fixed lengths), else 0.
        lockstep_decode_s: tau_n, a decode iteration of all n admitted requests.
    """

    admitted: Array
    waiting: Array
    prompts_per_iteration: Array
    decode_batch: Array
    prefill_tokens_per_iteration: Array
    iteration_s: Array
    prefill_iteration_s: Array
    decode_iteration_s: Array
    prompt_share: Array
    completion_rate_per_s: Array
    ttft_steady_s: Array
    wave_s: Array
    wave_chunks: Array
    lockstep_share: Array
    lockstep_decode_s: Array


def _iterations(system: System, q, prompt, decodes_per_request, ctx, budget):
    """(tau, tau_with, tau_0, f, d, p, chunks) at q prompts per iteration; a prompt's prefill
    spans ``chunks`` iterations of the budget left beside the decodes."""
    d = q * decodes_per_request
    room = jnp.maximum(budget - d, 1.0)
    chunks = jnp.maximum(prompt / room, 1.0)  # iterations one prompt's prefill spans
    p = jnp.minimum(q * prompt, room)
    f = jnp.clip(q * chunks, SHARE_FLOOR, 1.0)  # share of iterations that carry prefill
    tokens = p / f
    seqs = jnp.maximum(tokens / prompt, q * chunks / f)

    def step_s(prefill_tokens, prefill_seqs):
        return iteration_s(
            system,
            prefill_tokens=prefill_tokens,
            prefill_seqs=prefill_seqs,
            decode_seqs=d,
            decode_context=ctx,
        )

    # the iteration with a prefill chunk and the one without, as two rows of one traced step
    with_s, without_s = jax.vmap(step_s)(
        jnp.stack([tokens, jnp.zeros_like(tokens)]), jnp.stack([seqs, jnp.zeros_like(seqs)])
    )
    tau = f * with_s + (1.0 - f) * without_s
    return tau, with_s, without_s, f, d, p, chunks


def loop_seats(
    model: ModelSpec, hardware: HardwareSpec, deployment: Deployment, workload: Workload
) -> tuple[Array, Array]:
    """(KV seats, seats) of one replica's closed loop: ``max_concurrent_requests`` at a whole
    request's tokens P + O, and that capped by ``max_num_seqs`` (the n = min(N, seats) above)."""
    prompt = jnp.maximum(workload.prompt_tokens_mean, 1.0)
    output = jnp.maximum(workload.output_tokens_mean, 1.0)
    kv = max_concurrent_requests(model, hardware, deployment, prompt + output)
    return kv, jnp.minimum(kv, deployment.max_num_seqs)


def lockstep_share(deployment: Deployment, workload: Workload) -> Array:
    """L of the module docstring: ``prefill_first`` for a closed loop (``concurrency`` > 0) whose
    prompt and output lengths are fixed (both CVs 0), else 0 (the desynchronised loop)."""
    fixed = (workload.prompt_tokens_cv == 0.0) & (workload.output_tokens_cv == 0.0)
    closed = workload.concurrency > 0.0
    return jnp.where(fixed & closed, jnp.clip(deployment.prefill_first, 0.0, 1.0), 0.0)


def closed_loop_state(
    system: System,
    workload: Workload,
    *,
    tokens_per_decode: Array | float = 1.0,
) -> ClosedLoopState:
    """Solve the closed loop of one replica (see the module docstring for the equations)."""
    model, hardware, deployment = system.model, system.hardware, system.deployment
    replicas = jnp.maximum(deployment.replicas, 1.0)
    clients = jnp.maximum(workload.concurrency, 1.0) / replicas
    prompt = jnp.maximum(workload.prompt_tokens_mean, 1.0)
    output = jnp.maximum(workload.output_tokens_mean, 1.0)
    ctx = prompt + output / 2.0
    _, seats = loop_seats(model, hardware, deployment, workload)
    n = jnp.clip(jnp.minimum(clients, seats), COUNT_FLOOR, None)
    waiting = jnp.maximum(clients - n, 0.0)
    decodes = jnp.maximum(output - 1.0, 0.0) / jnp.maximum(tokens_per_decode, 1.0)
    budget = deployment.max_num_batched_tokens

    def ttft_and_q(q):
        tau, with_s, without_s, f, d, p, chunks = _iterations(
            system, q, prompt, decodes, ctx, budget
        )
        residual = (f * with_s**2 + (1.0 - f) * without_s**2) / (
            2.0 * jnp.maximum(tau, TIME_FLOOR_S)
        )
        ttft = residual + chunks * with_s
        q_new = n * tau / (ttft + decodes * tau)
        q_cap = (budget - COUNT_FLOOR) / (prompt + decodes)  # p + d <= B
        return ttft, jnp.minimum(q_new, q_cap), (tau, with_s, without_s, f, d, p, chunks)

    def body(q, _):
        _, q_new, _ = ttft_and_q(q)
        return (1.0 - DAMPING) * q + DAMPING * q_new, None

    q0 = jnp.minimum(n / (1.0 + decodes), (budget - COUNT_FLOOR) / (prompt + decodes))
    q, _ = jax.lax.scan(body, q0, None, length=CLOSED_LOOP_ITERATIONS)
    ttft_own, _, (tau, with_s, without_s, f, d, p, _) = ttft_and_q(q)
    rate_desynchronised = q / jnp.maximum(tau, TIME_FLOOR_S)
    # Little's law on the admitted requests: the time not spent decoding is spent before the
    # first token (own prefill, or waiting for the budget when it binds)
    ttft_little = n / rate_desynchronised - decodes * tau
    ttft_steady = jnp.maximum(ttft_own, ttft_little) + waiting / rate_desynchronised

    wave_tokens = n * prompt
    wave_chunks = jnp.maximum(wave_tokens / budget, 1.0)
    full = iteration_s(
        system, prefill_tokens=wave_tokens / wave_chunks, prefill_seqs=n / wave_chunks
    )
    lockstep_decode_s = iteration_s(system, decode_seqs=n, decode_context=ctx)
    lockstep = lockstep_share(deployment, workload)
    rate_lockstep = n / (full * wave_chunks + decodes * lockstep_decode_s)
    rate = lockstep * rate_lockstep + (1.0 - lockstep) * rate_desynchronised
    return ClosedLoopState(
        admitted=n,
        waiting=waiting,
        prompts_per_iteration=q,
        decode_batch=d,
        prefill_tokens_per_iteration=p,
        iteration_s=tau,
        prefill_iteration_s=with_s,
        decode_iteration_s=without_s,
        prompt_share=f,
        completion_rate_per_s=rate,
        ttft_steady_s=ttft_steady,
        wave_s=full * wave_chunks,
        wave_chunks=wave_chunks,
        lockstep_share=lockstep,
        lockstep_decode_s=lockstep_decode_s,
    )


class ClosedLoopMetrics(eqx.Module):
    """Request-level statistics of a closed-loop benchmark (seconds; throughputs of all replicas).

    Each latency is (mean, p50, p90, p95, p99) on the last axis (``PERCENTILE_QUANTILES``).
    """

    ttft_s: Array
    tpot_s: Array
    itl_s: Array
    e2e_s: Array
    output_tokens_per_s: Array
    total_tokens_per_s: Array
    requests_per_s: Array
    state: ClosedLoopState


def _ttft_quantile(prob, wave_share, steady_lo, steady_hi, wave_lo, wave_hi):
    """Quantile of the mixture: share w uniform on [wave_lo, wave_hi] (the burst's prompts),
    1 - w uniform on [steady_lo, steady_hi] (residual of the running iteration)."""

    def cdf(t):
        def u(lo, hi):
            return jnp.clip((t - lo) / jnp.maximum(hi - lo, TIME_FLOOR_S), 0.0, 1.0)

        return wave_share * u(wave_lo, wave_hi) + (1.0 - wave_share) * u(steady_lo, steady_hi)

    def step(bounds, _):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < prob
        return (jnp.where(below, mid, lo), jnp.where(below, hi, mid)), None

    upper = jnp.maximum(steady_hi, wave_hi)
    (lo, hi), _ = jax.lax.scan(
        step, (jnp.zeros_like(upper), upper), None, length=QUANTILE_BISECTIONS
    )
    return 0.5 * (lo + hi)


def _summary(mean: Array, quantiles: Array) -> Array:
    """(mean, ``PERCENTILE_QUANTILES``...) of one latency, the layout ``ClosedLoopMetrics`` holds."""
    return jnp.concatenate([jnp.reshape(mean, (1,)), quantiles])


class _Lockstep(eqx.Module):
    """(mean, ``PERCENTILE_QUANTILES``) of a lockstep loop's latencies (seconds)."""

    ttft_s: Array
    tpot_s: Array
    itl_s: Array
    e2e_s: Array


def _lockstep_summaries(s: ClosedLoopState, output: Array, a: Array, probs: Array) -> _Lockstep:
    """The lockstep loop's latencies (module docstring): TTFT uniform on [t_k, k t_k] plus the
    wait of clients beyond the seats; TPOT at probability p is tau_n / a + p (k t_k - t_k) /
    (O - 1) (a late chunk's request waits least); every request's E2E is the whole cycle.  No
    poll wait: the burst arrives as the engine empties, and an idle scheduler takes it at once."""
    chunk_s = s.wave_s / s.wave_chunks
    seat_wait_s = s.waiting / jnp.maximum(s.completion_rate_per_s, RATE_FLOOR_PER_S)
    ttft_q = chunk_s + probs * (s.wave_s - chunk_s) + seat_wait_s
    ttft_mean = 0.5 * (chunk_s + s.wave_s) + seat_wait_s
    gaps = jnp.maximum(output - 1.0, 1.0)
    decode_s = s.lockstep_decode_s / a
    tail_s = (s.wave_s - chunk_s) / gaps  # the wave's remainder spread over a request's gaps
    tpot_q = decode_s + probs * tail_s
    tpot_mean = decode_s + 0.5 * tail_s
    e2e_s = s.wave_s + jnp.maximum(output - 1.0, 0.0) / a * s.lockstep_decode_s + seat_wait_s

    return _Lockstep(
        ttft_s=_summary(ttft_mean, ttft_q),
        tpot_s=_summary(tpot_mean, tpot_q),
        itl_s=_summary(tpot_mean, jnp.full_like(probs, decode_s)),
        e2e_s=_summary(e2e_s, jnp.full_like(probs, e2e_s)),
    )


def closed_loop_metrics(
    system: System,
    workload: Workload,
    *,
    tokens_per_decode: Array | float = 1.0,
) -> ClosedLoopMetrics:
    """TTFT / TPOT / ITL / E2E (mean and ``PERCENTILE_QUANTILES``) and throughputs of a closed loop.

    TTFT mixes the burst's wave (share 1 / ``requests_per_client``, uniform over the wave's
    chunks) with the steady TTFT (uniform over one iteration's residual).  A request's TPOT
    averages O' gaps, each tau_with with probability f: mean tau / a, variance
    (tau_with - tau_0)^2 f (1 - f) / O' (normal).  ITL quantiles are those of the two-point gap
    law.  E2E = TTFT + (O - 1) TPOT over the lognormal output law (``Workload``).  TTFT and E2E
    add the wait for the scheduler's poll (``poll_wait``: mean P(busy) (k - 1) / 2 iterations, a
    TPOT each without speculation).  A lockstep loop (a prefill-first engine at fixed lengths,
    ``ClosedLoopState.lockstep_share``) takes ``_lockstep_summaries`` instead.
    """
    deployment = system.deployment
    s = closed_loop_state(system, workload, tokens_per_decode=tokens_per_decode)
    a = jnp.maximum(tokens_per_decode, 1.0)
    output = jnp.maximum(workload.output_tokens_mean, 1.0)
    prompt = jnp.maximum(workload.prompt_tokens_mean, 1.0)
    decodes = jnp.maximum(output - 1.0, 0.0) / a
    probs = jnp.asarray(PERCENTILE_QUANTILES)

    w = jnp.clip(1.0 / jnp.maximum(workload.requests_per_client, 1.0), 0.0, 1.0)
    spread = s.iteration_s
    steady_lo = jnp.maximum(s.ttft_steady_s - spread / 2.0, 0.0)
    steady_hi = steady_lo + spread
    wave_lo = s.wave_s / s.wave_chunks
    wave_hi = s.wave_s
    wave_mean = 0.5 * (wave_lo + wave_hi)
    tpot_mean = s.iteration_s / a
    ttft_mean = w * wave_mean + (1.0 - w) * s.ttft_steady_s
    ttft_q = jax.vmap(lambda pr: _ttft_quantile(pr, w, steady_lo, steady_hi, wave_lo, wave_hi))(
        probs
    )
    # the scheduler's poll (``_polling``): every request but a lone client's waits for it
    clients = workload.concurrency / jnp.maximum(deployment.replicas, 1.0)
    busy = closed_loop_busy_probability(clients)
    poll = poll_wait(deployment.scheduler_polls, s.iteration_s, busy)  # polls count iterations
    ttft_q = poll.quantile_s(ttft_q, ttft_mean, probs)
    ttft_mean = ttft_mean + poll.mean_s

    gap = s.prefill_iteration_s - s.decode_iteration_s
    f = s.prompt_share
    tpot_sd = jnp.abs(gap) * jnp.sqrt(f * (1.0 - f) / jnp.maximum(decodes, 1.0)) / a
    z = ndtri(probs)
    tpot_q = jnp.maximum(tpot_mean + z * tpot_sd, s.decode_iteration_s / a)
    itl_q = jnp.where(probs > 1.0 - f, s.prefill_iteration_s, s.decode_iteration_s) / a

    mu, sigma = lognormal_params(output, workload.output_tokens_cv)
    out_q = jnp.exp(mu + sigma * z)
    e2e_mean = ttft_mean + (output - 1.0) * tpot_mean
    e2e_q = ttft_mean + jnp.maximum(out_q - 1.0, 0.0) * tpot_mean

    lock = _lockstep_summaries(s, output, a, probs)
    share = s.lockstep_share

    def blend(lockstep, desynchronised):
        # the share is 0 or 1 at a real run (``ClosedLoopState.lockstep_share``)
        return share * lockstep + (1.0 - share) * desynchronised

    replicas = jnp.maximum(deployment.replicas, 1.0)
    requests = replicas * s.completion_rate_per_s
    return ClosedLoopMetrics(
        ttft_s=blend(lock.ttft_s, _summary(ttft_mean, ttft_q)),
        tpot_s=blend(lock.tpot_s, _summary(tpot_mean, tpot_q)),
        itl_s=blend(lock.itl_s, _summary(tpot_mean, itl_q)),
        e2e_s=blend(lock.e2e_s, _summary(e2e_mean, e2e_q)),
        output_tokens_per_s=requests * output,
        total_tokens_per_s=requests * (output + prompt),
        requests_per_s=requests,
        state=s,
    )
