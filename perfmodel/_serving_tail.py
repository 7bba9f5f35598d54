"""Latency laws of one replica at one arrival rate: TTFT, TPOT and E2E means and quantiles.

Given the engine's steady state (``_steady_state``: decode batch n_d, mean gap TPOT, prefill
server load rho_p, slope dTPOT/dn_d):

* Prefill path: a G/G/1 queue whose backlogged server packs the prompts present (Kingman 1961).
* Running slots: the number of running sequences N is a birth-death process whose departure rate
  N / (E[O] TPOT(N)) grows more slowly than N (more sequences, slower iterations).  Its
  diffusion approximation (an Ornstein-Uhlenbeck process, Halfin & Whitt 1981 generalised) has
  restoring rate r = (1 - g) / (E[O] TPOT), g = n_d TPOT'(n_d) / TPOT the feedback gain, and noise
  from arrivals (c_a^2 lambda), departures (lambda) and the compound-Poisson prefill work that
  stalls every decode; an arrival and the departures its prefill delays are one jump
  1 + X, X = lambda Delta / (1 - u), u = lambda E[Delta], so
  Var(N) = n [(1 + c_a^2) / 2 + c_a^2 u / (1 - u) + c_a^2 E[X^2] / 2] / (1 - g)^2, with n from
  Little's law at the requests' own mean gaps.
  Near saturation g -> 1 and N swings wide: slots fill long before the mean batch reaches them,
  which a G/G/c law with independent servers (Allen-Cunneen) misses.  The seat wait is the
  diffusion's (``diffusion_seat_wait``), with the restoring force weakening from the mean to the
  seats as g and TPOT grow with N (``_running_count``: past the roofline's kink, fast).
* TPOT of a request: the prefill work landing in its own gaps (compound Poisson through
  TPOT = tau_d / (1 - u), u = lambda E[Delta]: Var = c_a^2 lambda TPOT E[Delta^2] / ((O - 1)(1 - u)^2))
  plus its mean gap drifting with N's own noise (variance slope^2 n (1 + c_a^2) / 2 / (1 - g)^2
  averaged over its (O - 1) gaps against the correlation time 1 / r); slow deviations are
  amplified by the loop, 1 / (1 - g)^2.  Over a life N roams its spread, which can straddle the
  roofline's kink: there g is the gain averaged over the spread, and the mean gap gains the
  iteration time's Jensen excess E[tau(N)] - tau(n_d) (``_running_count.averaged_gain``).
* Unchunked, a prompt's prefill-only iteration also carries the prompts that arrive behind it
  while it waits, as far as the budget holds them: the wait and the residual are stretched by
  1 + lambda E[P] t_tok share (t_tok the marginal prefill time per token, share the part of
  them that fits after it and the queue ahead, whole prompts first fit).
* ITL (inter-token latency) is one gap, not a request's mean of (O - 1) of them: a decode gap
  holds prefill work with probability f (chunked: the iteration carries a prompt's chunk;
  unchunked: prefill-only iterations run before the next decode), so gaps follow the two-point
  law (1 - f) tau_d + f tau_carry (``_steady_state``: the same f and tau_carry that make the mean
  gap), each point spread by the running batch's drift over one gap (``gap_quantiles``).
* Waits have the tail P(W > t) = p exp(-t p / W), shifted where the prefill queue's wait given a
  wait is less variable than exponential (Takacs' M/G/1 moments); quantiles of TTFT and E2E come
  from equal-probability nodes of the lognormal lengths convolved with it (``wait_plus_quantile_s``).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jax.scipy.special import ndtr

from ._batching import (
    DecodeCost,
    EngineConfig,
    decode_iteration_s,
    prefill_budget_tokens,
    saturated_output_tokens_per_s,
)
from ._floors import COUNT_FLOOR, LOG_VARIANCE_FLOOR, POSITIVE_FLOOR, SHARE_FLOOR
from ._prompt_law import prompt_nodes, tail_ratio, truncated_lognormal
from ._queueing import (
    QUANTILE_BRACKET_SIGMAS,
    diffusion_seat_wait,
    kingman_wait_s,
    lognormal_mixture_quantile,
    lognormal_nodes,
    mg1_conditional_wait_scv,
    modulated_wait_s,
    solve_quantile,
    wait_plus_quantile_s,
    window_mean_variance_factor,
)
from ._running_count import Feedback, averaged_gain, running_stiffness
from ._smooth import smooth_max, smooth_min
from ._specs import System
from ._steady_state import Steady, prompts_present, steady_state
from ._types import Array
from ._workload import Workload

QUANTILES: tuple[float, float, float] = (0.5, 0.95, 0.99)
"""Quantiles the search's SLO checks interpolate (``SloMetrics``' ``*_quantiles_s``)."""
PERCENTILE_QUANTILES: tuple[float, float, float, float] = (0.5, 0.9, 0.95, 0.99)
"""Quantiles a ``Percentiles`` carries after its mean, in the order p50, p90, p95, p99."""

PROMPT_NODES = 64
"""Equal-probability nodes of the prompt-length lognormal (p99 lies inside the last node)."""
OUTPUT_NODES = 32
"""Equal-probability nodes of the output-length lognormal."""
FIRST_FIT_WASTE_PROMPTS = 0.5
"""Budget a first-fit packing of whole prompts leaves unused: on average half a prompt (the one
that does not fit)."""
GAIN_MAX = 0.95
"""Cap on the slot-feedback gain g (g >= 1 only beyond saturation, where latencies are inf)."""
CORRECTIONS: tuple[float, ...] = (
    -0.0018,
    -0.0015,
    1.0,
    1.0,
    0.0938,
    0.0393,
    -0.8209,
    -0.7921,
    0.7374,
    0.2028,
)
"""Discrepancy terms against the simulator (Kennedy & O'Hagan 2001 style), in order:

* ``wait_cs2_gain`` a and ``wait_load_gain`` b (prompts in prefill-only iterations): the prefill
  queue's wait (mean and tail) is scaled by 1 + a c_s^2 + b rho / (1 - rho) (c_s^2 the
  prefill-service SCV, rho the prefill server's utilisation);
* ``tpot_var_gain`` c: weight of Var(TPOT | O) (1 = the model's own variance);
* ``tpot_jensen_gain`` d: weight of the second-order (Jensen) shift of the mean TPOT;
* ``chunked_wait_cs2_gain``, ``chunked_wait_load_gain``: a and b under chunked prefill;
* ``seat_var_log_gain`` (unchunked) and ``chunked_seat_var_log_gain``: the running count's
  variance in the seat wait is scaled by exp(.) (the diffusion's spread; 0 = as modelled);
* ``chunked_seat_clump_exponent`` e: chunked, that variance is further scaled by k^e, k the
  prompts a backlogged iteration packs (they start decoding together; 0 = not);
* ``running_jensen_gain``: weight of the Jensen shift of the requests' mean gaps in the running
  count's Little law (0 = the steady gap TPOT*, 1 = the reported mean TPOT).

(0, 0, 1, 1, 0, 0, 0, 0, 0, 0) is the uncorrected model
(``python -m fitting.queueing_corrections`` fits them)."""


class Corrections(eqx.Module):
    """``CORRECTIONS`` by name (the order above); ``from_array`` reads the flat vector a fit
    optimises."""

    wait_cs2_gain: Array
    wait_load_gain: Array
    tpot_var_gain: Array
    tpot_jensen_gain: Array
    chunked_wait_cs2_gain: Array
    chunked_wait_load_gain: Array
    seat_var_log_gain: Array
    chunked_seat_var_log_gain: Array
    chunked_seat_clump_exponent: Array
    running_jensen_gain: Array

    @classmethod
    def from_array(cls, values) -> Corrections:
        """The named terms of a ``CORRECTIONS``-shaped vector (None: ``CORRECTIONS``)."""
        corr = jnp.asarray(CORRECTIONS if values is None else values)
        if corr.shape != (len(CORRECTIONS),):
            raise ValueError(
                f"corrections: {len(CORRECTIONS)} terms (CORRECTIONS), got {corr.shape}"
            )
        return cls(*(corr[i] for i in range(len(CORRECTIONS))))

    def wait_gains(self, chunked: bool) -> tuple[Array, Array]:
        """(c_s^2 gain a, load gain b) of the prefill queue's wait for the scheduling mode."""
        if chunked:
            return self.chunked_wait_cs2_gain, self.chunked_wait_load_gain
        return self.wait_cs2_gain, self.wait_load_gain


class Percentiles(eqx.Module):
    """Summary of a latency distribution across requests, seconds: the mean and the
    ``PERCENTILE_QUANTILES``."""

    mean: Array
    p50: Array
    p90: Array
    p95: Array
    p99: Array

    def at(self, probs) -> Array:
        """The quantiles ``probs`` (each one of ``PERCENTILE_QUANTILES``) on a new last axis."""
        by_prob = dict(zip(PERCENTILE_QUANTILES, (self.p50, self.p90, self.p95, self.p99)))
        return jnp.stack([by_prob[p] for p in probs], axis=-1)


def percentiles(mean, quantiles, stable):
    """``quantiles``: last axis is (p50, p90, p95, p99) (``PERCENTILE_QUANTILES``); ``inf``
    everywhere when not ``stable``."""
    inf = jnp.inf
    p50, p90, p95, p99 = (jnp.where(stable, quantiles[..., i], inf) for i in range(4))
    return Percentiles(mean=jnp.where(stable, mean, inf), p50=p50, p90=p90, p95=p95, p99=p99)


def gap_quantiles(short_s, long_s, long_share, variance, qs):
    """Quantiles ``qs`` (last axis) of one decode gap: the two-point law of a gap without
    (``short_s``) and with (``long_s``, probability f = ``long_share``) prefill work, each point
    a lognormal of its value and ``variance`` (the batch's drift over one gap):
    F(t) = (1 - f) LN(t; short) + f LN(t; long), inverted by bisection (``solve_quantile``)."""
    qs = jnp.asarray(qs)
    means = jnp.stack(jnp.broadcast_arrays(short_s, long_s), axis=-1)[..., None, :]
    f = jnp.clip(long_share, 0.0, 1.0)[..., None, None]
    m = jnp.maximum(means, POSITIVE_FLOOR)
    s2 = jnp.log1p(jnp.maximum(variance, 0.0)[..., None, None] / jnp.square(m))
    mu = jnp.log(m) - s2 / 2.0
    sd = jnp.sqrt(jnp.maximum(s2, LOG_VARIANCE_FLOOR))

    def cdf(t):
        z = ndtr((jnp.log(jnp.maximum(t[..., None], POSITIVE_FLOOR)) - mu) / sd)
        return (1.0 - f[..., 0]) * z[..., 0] + f[..., 0] * z[..., 1]

    hi = jnp.max(jnp.exp(mu + QUANTILE_BRACKET_SIGMAS * sd), axis=-1) * jnp.ones_like(qs)
    return solve_quantile(cdf, qs, jnp.zeros_like(hi), hi)


class LoadPoint(eqx.Module):
    """Everything ``open_loop`` needs besides the arrival rate (one replica).

    Attributes:
        system: the model, GPU, deployment and efficiencies served.
        workload: lengths and burstiness (its rate is not read here).
        config: scheduler knobs (``EngineConfig``).
        cost: decode-iteration cost and tokens per iteration (``DecodeCost``; plain by default).
        ca2: squared CV of one replica's inter-arrival gaps.
        corrections: ``CORRECTIONS``-shaped discrepancy terms (None = ``CORRECTIONS``).
        temperature: smoothing of the hard min/max laws (static; 0 = exact).
        nodes: equal-probability (prompt, output) length nodes of the quadrature (static); the
            search evaluates the same laws on fewer (``optimize.SEARCH_NODES``).
    """

    system: System
    workload: Workload
    config: EngineConfig
    cost: DecodeCost
    ca2: Array
    corrections: Array | None = None
    temperature: float = eqx.field(static=True, default=0.0)
    nodes: tuple[int, int] = eqx.field(static=True, default=(PROMPT_NODES, OUTPUT_NODES))


class OpenLoop(eqx.Module):
    """One replica's open-loop figures at one arrival rate (seconds, requests/s)."""

    ttft_s: Percentiles
    tpot_s: Percentiles
    itl_s: Percentiles
    e2e_s: Percentiles
    utilization: Array  # the bottleneck's load (>= 1: overloaded)
    seat_load: Array  # rho_s: seat-seconds offered per seat-second
    stable: Array
    steady: Steady
    wait_s: Array  # mean wait before a prompt's prefill starts
    rate_per_s: Array  # offered arrival rate
    capacity_per_s: Array  # the rate at which the bottleneck saturates
    accepted_share: Array  # share of prompts within max_model_len
    running_mean: Array  # running count: mean (Little's law)
    running_var: Array  # and variance (the seat wait's diffusion)
    seat_wait_prob: Array  # P(wait for a seat)
    seat_wait_s: Array  # E[W | wait]


class LengthLaws(eqx.Module):
    """The request lengths one replica serves, as quadrature nodes.

    Prompts longer than ``max_model_len`` are rejected (vLLM), so the engine serves the truncated
    prompt law; a request decodes (O - 1) / E iterations, E tokens each (E = 1 when plain).
    """

    accepted_share: Array  # share of prompts within max_model_len
    prompt_mean: Array  # E[P] of the served (truncated) law, tokens
    prompt_nodes: Array  # (K,) equal-probability prompt lengths, tokens
    tail: Array  # the served law's variance against the nodes' (``tail_ratio``)
    gap_nodes: Array  # (M,) decode gaps per request, O - 1, at the output nodes
    iteration_nodes: Array  # (M,) decode iterations per request, (O - 1) / E
    iterations_mean: Array  # their mean
    tokens_per_step: Array  # E


def length_laws(point: LoadPoint) -> LengthLaws:
    """``LengthLaws`` of ``point``'s workload and deployment (``truncated_lognormal``,
    ``prompt_nodes``, ``lognormal_nodes``)."""
    workload, max_len, cost = point.workload, point.system.deployment.max_model_len, point.cost
    p_args = (workload.prompt_tokens_mean, workload.prompt_tokens_cv, max_len)
    accept, p_mean, p_var = truncated_lognormal(*p_args)
    p_nodes = prompt_nodes(*p_args[:2], point.nodes[0], max_len)
    o_nodes = lognormal_nodes(
        workload.output_tokens_mean, workload.output_tokens_cv, point.nodes[1]
    )
    gaps = jnp.maximum(o_nodes - 1.0, 0.0)
    e_step = cost.tokens_per_step()
    iterations = gaps / e_step if cost.speculative else gaps
    return LengthLaws(
        accepted_share=accept,
        prompt_mean=p_mean,
        prompt_nodes=p_nodes,
        tail=tail_ratio(p_nodes, p_var),
        gap_nodes=gaps,
        iteration_nodes=iterations,
        iterations_mean=jnp.mean(iterations),
        tokens_per_step=e_step,
    )


def _decode_time(point: LoadPoint, s: Steady):
    """Decode-only iteration time at n running sequences (the roofline the slot feedback and
    the running count's restoring force read), at the steady state's decode context."""

    def decode_s(n):
        return decode_iteration_s(
            point.system,
            point.cost,
            decode_seqs=n,
            decode_context=s.ctx_d[..., None],
            temperature=point.temperature,
        )

    return decode_s


class Utilisation(eqx.Module):
    """Loads of one replica's three servers, and the prefill queue's wait (Kingman)."""

    utilization: Array  # the bottleneck's load (>= 1: overloaded)
    stable: Array
    seat_load: Array  # rho_s: seat-seconds offered per seat-second
    capacity_per_s: Array  # the rate at which the bottleneck saturates
    prefill_load: Array  # rho_p (0.5 where unstable, keeping the laws finite)
    prefill_busy_s: Array  # E[prefill-server time per prompt]
    prefill_scv: Array  # its squared CV (the prompt law's tail included)
    seats: Array  # running slots (>= COUNT_FLOOR)
    prefill_wait_s: Array  # Kingman's G/G/1 wait
    gain: Array  # slot-feedback gain g = n_d TPOT'(n_d) / TPOT, at most GAIN_MAX


def utilisation(point: LoadPoint, s: Steady, lengths: LengthLaws, rate) -> Utilisation:
    """The prefill server (G/G/1, Kingman), the running slots and the token capacity.

    Slot utilisation counts a residence with every slot busy (TPOT at n_d = seats), so that
    rho_s = 1 where the slots saturate; with the TPOT feedback n_d / seats reaches 0.7 only a few
    per cent of the rate below that point."""
    workload, temperature = point.workload, point.temperature
    busy_mean = jnp.mean(s.busy)
    cs2_p = jnp.var(s.busy) * lengths.tail / jnp.square(busy_mean)
    seats = jnp.maximum(s.seats, COUNT_FLOOR)
    rho_s = rate * (jnp.mean(s.own) + lengths.iterations_mean * s.tpot_full) / seats
    capacity = saturated_output_tokens_per_s(
        point.system,
        lengths.prompt_mean,
        workload.output_tokens_mean,
        temperature,
        point.cost,
    )
    rho_w = rate * workload.output_tokens_mean / capacity
    utilization = smooth_max(smooth_max(s.rho_p, rho_s, temperature), rho_w, temperature)
    stable = (utilization < 1.0) & (s.seats >= 1.0)
    rho_p = jnp.where(stable, s.rho_p, 0.5)
    return Utilisation(
        utilization=utilization,
        stable=stable,
        seat_load=rho_s,
        capacity_per_s=capacity,
        prefill_load=rho_p,
        prefill_busy_s=busy_mean,
        prefill_scv=cs2_p,
        seats=seats,
        prefill_wait_s=kingman_wait_s(rho_p, point.ca2, cs2_p, busy_mean),
        gain=jnp.clip(s.n_d * s.slope / jnp.maximum(s.tpot, POSITIVE_FLOOR), 0.0, GAIN_MAX),
    )


class RunningCount(eqx.Module):
    """The number of running sequences N: its noise, the slot feedback over its spread, and
    its mean and variance (module doc: an Ornstein-Uhlenbeck diffusion)."""

    noise: Array  # Var(N) per unit n before the loop's amplification
    seat_gain: Array  # calibrated scale of that spread at the seats
    feedback: Feedback
    averaged_gain: Array  # g_bar: the gain averaged over N's spread
    gap_excess_s: Array  # the gaps' Jensen excess over N's spread, amplified by the loop
    loop: Array  # (1 - g_bar)^2
    stalls: Array  # (M,) Var of a request's mean gap from the prefill in its own gaps
    jensen_shift: Array  # (M,) second-order shift of the mean gap, relative
    mean: Array  # n (Little's law)
    var: Array  # Var(N)


def running_count(
    point: LoadPoint, s: Steady, lengths: LengthLaws, load: Utilisation, rate, corr: Corrections
) -> RunningCount:
    """``RunningCount`` at ``rate``.

    One arrival enters (+1) and its prefill work Delta delays the departures by
    X = lambda Delta / (1 - u): one jump 1 + X, E[(1 + X)^2] = 1 + 2 u / (1 - u) + E[X^2], so
    Var(N) = n [(1 + c_a^2) / 2 + c_a^2 u / (1 - u) + c_a^2 E[X^2] / 2] / (1 - g)^2 (the cross
    term: the entry and the stall it causes move N together, not independently).  Over a
    request's life the batch roams that spread, which can straddle the roofline's kink: its gaps
    see the gain averaged over the spread and the iteration time's Jensen excess
    E[tau(N)] - tau(n_d), amplified by the loop, 1 / (1 - g_bar) (``averaged_gain``).  The mean
    is Little's law with the requests' own mean gaps, n = lambda (E[own prefill] +
    E[(O - 1) TPOT(O)]), the Jensen shift weighted by ``running_jensen_gain``."""
    config, ca2, temperature = point.config, point.ca2, point.temperature
    jump2 = jnp.square(rate) * s.delta2 / jnp.square(1.0 - s.extra)  # E[X^2]
    noise = (1.0 + ca2) / 2.0 + ca2 * s.extra / (1.0 - s.extra) + ca2 * jump2 / 2.0
    if config.chunked_prefill:
        # prompts a backlogged iteration packs (those present, as far as the budget holds them,
        # as ``_steady_state`` prices it) start decoding together: the spread at the seats grows
        # with that clump k as k^e (``chunked_seat_clump_exponent`` e)
        budget = prefill_budget_tokens(point.system.deployment, config, s.n_d, temperature)
        clump = smooth_min(
            prompts_present(load.prefill_load), budget / lengths.prompt_mean, temperature
        )
        seat_gain = jnp.exp(
            corr.chunked_seat_var_log_gain
            + corr.chunked_seat_clump_exponent * jnp.log(jnp.maximum(clump, 1.0))
        )
    else:
        seat_gain = jnp.exp(corr.seat_var_log_gain)
    decode_s = _decode_time(point, s)
    feedback = Feedback.at_mean(
        decode_s, s.n_d, s.tpot, load.gain, s.extra, config.chunked_prefill, GAIN_MAX
    )
    o_bar = lengths.iterations_mean
    spread = rate * (jnp.mean(s.own) + o_bar * s.tpot) * noise * seat_gain
    g_bar, tau_excess = averaged_gain(decode_s, feedback, spread)
    share = 1.0 - s.extra if config.chunked_prefill else 1.0 / (1.0 - s.extra)
    gap_excess = share * tau_excess / (1.0 - g_bar)
    # a request's mean gap: the prefill work landing in its own gaps (compound Poisson, through
    # TPOT = tau_d / (1 - u), u = lambda E[Delta]); Jensen: TPOT is convex in the prefill share
    # u seen over a life, so its mean is TPOT* (1 + Var(TPOT_stall) / TPOT*^2) to second order
    # (bounded as j / (1 + j))
    gaps = jnp.maximum(lengths.iteration_nodes, 1.0)
    loop = jnp.square(1.0 - g_bar)
    stalls = ca2 * rate * s.tpot * s.delta2 / (gaps * jnp.square(1.0 - s.extra) * loop)
    jensen = stalls / jnp.square(jnp.maximum(s.tpot, POSITIVE_FLOOR))
    jensen_shift = jensen / (1.0 + jensen)
    own_gaps = s.tpot * (1.0 + corr.running_jensen_gain * jensen_shift) + gap_excess
    resid_time = jnp.mean(s.own) + jnp.mean(lengths.iteration_nodes * own_gaps)
    n_run = jnp.where(load.stable, rate * resid_time, 0.5 * load.seats)
    return RunningCount(
        noise=noise,
        seat_gain=seat_gain,
        feedback=feedback,
        averaged_gain=g_bar,
        gap_excess_s=gap_excess,
        loop=loop,
        stalls=stalls,
        jensen_shift=jensen_shift,
        mean=n_run,
        var=n_run * noise / jnp.square(1.0 - load.gain),
    )


class Waits(eqx.Module):
    """What a prompt waits before its prefill starts, and for the iteration in flight."""

    wait_s: Array  # mean wait (prefill queue, its modulation by N, a seat), stretched
    wait_prob: Array  # P(wait)
    conditional_wait_s: Array  # E[W | wait]
    queue_share: Array  # share of the wait that is the prefill queue's (not the seat's)
    residual_s: Array  # the iteration in flight an arrival waits out
    seat_wait_prob: Array  # P(wait for a seat)
    seat_wait_s: Array  # E[W | wait for a seat]


def _unchunked_stretch(point: LoadPoint, s: Steady, lengths: LengthLaws, rate, wait_s):
    """Unchunked, a prompt's prefill-only iteration also takes the prompts that arrive while it
    waits (lambda (W + R) E[P] tokens behind it), as far as the budget left after it and the
    queue ahead of it (lambda W E[P]) holds them (whole prompts, first fit: the one that does not
    fit wastes half a prompt); each costs the marginal prefill time per token (the iteration's
    weight read is shared): the wait is stretched by 1 + lambda E[P] t_tok share."""
    p_nodes, p_mean = lengths.prompt_nodes, lengths.prompt_mean
    width = jnp.max(p_nodes) - jnp.min(p_nodes)
    slope = (jnp.max(s.own) - jnp.min(s.own)) / jnp.maximum(width, 1.0)
    per_token = jnp.where(width > 1.0, slope, jnp.mean(s.own) / p_mean)
    behind = rate * (wait_s + s.tau_d / 2.0) * p_mean
    own_and_waste = (1.0 + FIRST_FIT_WASTE_PROMPTS) * p_mean
    left = point.system.deployment.max_num_batched_tokens - own_and_waste - rate * wait_s * p_mean
    room = jnp.maximum(left, 0.0)
    share = room / jnp.maximum(room + behind, COUNT_FLOOR)
    return 1.0 + rate * per_token * p_mean * share


def waits(
    point: LoadPoint,
    s: Steady,
    lengths: LengthLaws,
    load: Utilisation,
    running: RunningCount,
    rate,
    corr: Corrections,
) -> Waits:
    """``Waits``: the prefill queue's (Kingman, modulated by N's noise, scaled by the fitted
    discrepancy 1 + a c_s^2 + b rho / (1 - rho)) plus the seat's (the diffusion's, with the
    restoring force weakening towards the seats), and the residual of the iteration in flight."""
    config, temperature = point.config, point.temperature
    a, b = corr.wait_gains(config.chunked_prefill)
    rho_p, w_p = load.prefill_load, load.prefill_wait_s
    # the force pulling N back weakens towards the seats (g and TPOT grow with N, by a jump
    # past the roofline's kink): the seats fill more often than the Gaussian says
    stiffness = running_stiffness(
        _decode_time(point, s), running.feedback, running.mean, load.seats
    )
    p_seat, w_seat_cond = diffusion_seat_wait(
        running.mean, running.var * running.seat_gain, s.seats, rate, stiffness
    )
    w_s = p_seat * w_seat_cond
    w_m = modulated_wait_s(
        w_p,
        rho_p,
        jnp.square(s.rate_slope) * running.var,
        lengths.iterations_mean * s.tpot / (1.0 - load.gain),
    )
    if config.chunked_prefill:
        stretch = 1.0
    else:
        stretch = _unchunked_stretch(point, s, lengths, rate, w_p + w_m + w_s)
    wait = ((w_p + w_m) * (1.0 + a * load.prefill_scv + b * rho_p / (1.0 - rho_p)) + w_s) * stretch
    p_wait = jnp.clip(jnp.maximum(rho_p, p_seat), SHARE_FLOOR, 1.0)
    # an arrival waits out the iteration in flight while decodes keep the engine iterating
    # (P ~ 1 - exp(-n_d)): a decode-only one or, chunked, with probability rho_p one carrying a
    # prompt's chunk (it cannot join an iteration in flight; with no decodes, as in a prefill
    # pool, the prompt in flight is Kingman's residual already)
    residual = -jnp.expm1(-s.n_d) * s.tau_d / 2.0 * stretch
    if config.chunked_prefill:
        budget = prefill_budget_tokens(point.system.deployment, config, s.n_d, temperature)
        t_carry = jnp.mean(s.own / jnp.maximum(lengths.prompt_nodes / budget, 1.0))
        residual = (1.0 - rho_p) * residual - jnp.expm1(-s.n_d) * rho_p * t_carry / 2.0
    return Waits(
        wait_s=wait,
        wait_prob=p_wait,
        conditional_wait_s=wait / p_wait,
        queue_share=(w_p + w_m) * stretch / jnp.maximum(wait, POSITIVE_FLOOR),
        residual_s=residual,
        seat_wait_prob=p_seat,
        seat_wait_s=w_seat_cond,
    )


class GapLaws(eqx.Module):
    """A request's mean decode gap (per iteration) and one gap's two-point law."""

    tpot_nodes: Array  # (M,) a request's mean gap at each output node, seconds
    tpot_var: Array  # (M,) its variance across requests
    itl_short_s: Array  # a gap without prefill work
    itl_long_s: Array  # a gap holding prefill work (probability ``Steady.carry_share``)
    itl_var: Array  # one gap's spread from the batch's drift


def gap_laws(
    point: LoadPoint, s: Steady, lengths: LengthLaws, running: RunningCount, corr: Corrections
) -> GapLaws:
    """A request's TPOT spread: the prefill in its own gaps (``RunningCount.stalls``) and the
    batch's drift (N's own noise, OU with correlation time E[O] TPOT / (1 - g_bar), averaged
    over its (O - 1) gaps; slow deviations amplified by the loop, 1 / (1 - g_bar)^2).  The loop
    cannot push a gap past the slots' cap: its amplified part is at most the headroom
    TPOT(n_d = seats) - TPOT, squared; the prefill in its own gaps stays.  ITL is one gap: without
    prefill work (tau_d) or, with probability f, with it; both see the batch's Jensen excess and
    its drift over one gap, at most the headroom."""
    g_bar, loop, o_bar = running.averaged_gain, running.loop, lengths.iterations_mean
    gaps = jnp.maximum(lengths.iteration_nodes, 1.0)
    window = gaps * (1.0 - g_bar) / jnp.maximum(o_bar, 1.0)
    var_own = running.mean * (1.0 + point.ca2) / 2.0 / loop
    drift = jnp.square(s.slope) * var_own * window_mean_variance_factor(window)
    headroom = jnp.square(jnp.maximum(s.tpot_full - s.tpot, 0.0))
    stalls = running.stalls
    tpot_var = corr.tpot_var_gain * (
        stalls * loop + jnp.minimum(stalls * (1.0 - loop) + drift, headroom)
    )
    one_gap = (1.0 - g_bar) / jnp.maximum(o_bar, 1.0)
    return GapLaws(
        tpot_nodes=s.tpot * (1.0 + corr.tpot_jensen_gain * running.jensen_shift)
        + running.gap_excess_s,
        tpot_var=tpot_var,
        itl_short_s=s.tau_d + running.gap_excess_s,
        itl_long_s=jnp.maximum(s.carry_s, s.tau_d) + running.gap_excess_s,
        itl_var=jnp.minimum(
            jnp.square(s.slope) * var_own * window_mean_variance_factor(one_gap), headroom
        ),
    )


class LatencyQuantiles(eqx.Module):
    """(p50, p90, p95, p99) on the last axis (``PERCENTILE_QUANTILES``), seconds; TPOT and ITL
    per token."""

    ttft_s: Array
    tpot_s: Array
    itl_s: Array
    e2e_s: Array


def latency_quantiles(
    point: LoadPoint,
    s: Steady,
    lengths: LengthLaws,
    load: Utilisation,
    waits_: Waits,
    gaps: GapLaws,
) -> LatencyQuantiles:
    """Quantiles of TTFT and E2E (the wait's tail convolved with equal-probability length
    nodes, ``wait_plus_quantile_s``), of TPOT (a lognormal mixture over the output nodes, capped
    by the longest mean gap) and of ITL (``gap_quantiles``).

    The prefill queue's wait given a wait has squared CV 2 rho - 1 + 4 (1 - rho) E[S] E[S^3] /
    (3 E[S^2]^2) (M/G/1 moments, Takacs): 1 for M/M/1, < 1 for less variable prompts; below 1
    the exponential is shifted to match it (its share of the wait only).  Speculative: per token
    the gap / E, plus the accepted-token spread (renewal CLT: the iterations m tokens take have
    variance m Var(T) / E^3, so TPOT's squared CV grows by Var(T) / (m E))."""
    cost, e_step = point.cost, lengths.tokens_per_step
    qs = jnp.asarray(PERCENTILE_QUANTILES)
    ttft_nodes = waits_.residual_s + s.own
    e2e_nodes = (
        ttft_nodes[:, None] + (lengths.iteration_nodes * gaps.tpot_nodes)[None, :]
    ).reshape(-1)
    moments = [jnp.mean(s.busy**k) for k in (1, 2, 3)]
    cw2 = mg1_conditional_wait_scv(load.prefill_load, *moments)
    w_cond = waits_.conditional_wait_s
    shift = (
        waits_.queue_share
        * (1.0 - jnp.sqrt(smooth_min(jnp.maximum(cw2, 0.1), 1.0, point.temperature)))
        * w_cond
    )
    p_wait = waits_.wait_prob[..., None]

    def with_wait(nodes):
        return wait_plus_quantile_s(nodes, p_wait, w_cond[..., None], qs, shift[..., None])

    tpot_nodes, tpot_var = gaps.tpot_nodes, gaps.tpot_var
    gap_max = s.gap_max
    if cost.speculative:
        tpot_nodes = tpot_nodes / e_step
        cv2_accept = cost.tokens_per_step_var() / (jnp.maximum(lengths.gap_nodes, 1.0) * e_step)
        tpot_var = tpot_var / jnp.square(e_step) + jnp.square(tpot_nodes) * cv2_accept
        gap_max = gap_max / e_step
    # chunked: a request's mean gap is at most that of iterations all carrying a full budget
    # (with a backlog, the budget paces the prefill landing in the gaps)
    tpot_q = jnp.minimum(lognormal_mixture_quantile(tpot_nodes, tpot_var, qs), gap_max[..., None])
    itl_q = gap_quantiles(gaps.itl_short_s, gaps.itl_long_s, s.carry_share, gaps.itl_var, qs)
    return LatencyQuantiles(
        ttft_s=with_wait(ttft_nodes),
        tpot_s=tpot_q,
        itl_s=itl_q / e_step if cost.speculative else itl_q,
        e2e_s=with_wait(e2e_nodes),
    )


def open_loop(point: LoadPoint, rate, means_only=False) -> OpenLoop:
    """TTFT/TPOT/E2E (``Percentiles``), utilisation and stability of one replica at ``rate``
    (module doc): the lengths, the steady state, the servers' loads, the running count, the
    waits, the gap laws and, unless ``means_only``, the quantiles.

    ``means_only`` leaves p50/p95/p99 NaN (no quadrature: callers that read means, such as the
    closed-loop rate solve and calibration rows); every other field is computed as usual.

    Under a speculative ``point.cost`` the queueing runs in decode iterations ((O - 1) / E per
    request, each iteration's gap from the steady state); TPOT and ITL per token are the gap / E.
    """
    corr = Corrections.from_array(point.corrections)  # read (and a wrong length refused) first
    workload = point.workload
    lengths = length_laws(point)
    offered, rate = rate, rate * lengths.accepted_share
    s = steady_state(
        point.system,
        point.config,
        rate,
        lengths.prompt_nodes,
        o_mean=workload.output_tokens_mean,
        temperature=point.temperature,
        tail=lengths.tail,
        cost=point.cost,
        o_cv=workload.output_tokens_cv,
    )
    load = utilisation(point, s, lengths, rate)
    running = running_count(point, s, lengths, load, rate, corr)
    waited = waits(point, s, lengths, load, running, rate, corr)
    gaps = gap_laws(point, s, lengths, running, corr)

    ttft_mean = waited.residual_s + waited.wait_s + jnp.mean(s.own)
    e2e_mean = ttft_mean + jnp.mean(lengths.iteration_nodes * gaps.tpot_nodes)
    tpot = jnp.mean(gaps.tpot_nodes)
    itl = (1.0 - s.carry_share) * gaps.itl_short_s + s.carry_share * gaps.itl_long_s
    if point.cost.speculative:  # the mean per token: gap / E
        tpot, itl = tpot / lengths.tokens_per_step, itl / lengths.tokens_per_step
    if means_only:  # no quadrature: the percentiles are not computed (NaN)
        nan = jnp.full(jnp.shape(ttft_mean) + (len(PERCENTILE_QUANTILES),), jnp.nan)
        q = LatencyQuantiles(ttft_s=nan, tpot_s=nan, itl_s=nan, e2e_s=nan)
    else:
        q = latency_quantiles(point, s, lengths, load, waited, gaps)
    stable = load.stable
    return OpenLoop(
        ttft_s=percentiles(ttft_mean, q.ttft_s, stable),
        tpot_s=percentiles(tpot, q.tpot_s, stable),
        itl_s=percentiles(itl, q.itl_s, stable),
        e2e_s=percentiles(e2e_mean, q.e2e_s, stable),
        utilization=load.utilization,
        seat_load=load.seat_load,
        stable=stable,
        steady=s,
        wait_s=waited.wait_s,
        rate_per_s=offered,
        capacity_per_s=load.capacity_per_s,
        accepted_share=lengths.accepted_share,
        running_mean=running.mean,
        running_var=running.var,
        seat_wait_prob=waited.seat_wait_prob,
        seat_wait_s=waited.seat_wait_s,
    )
