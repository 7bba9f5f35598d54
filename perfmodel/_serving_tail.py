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
from ._prompt_law import prompt_nodes, tail_ratio, truncated_lognormal
from ._queueing import (
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
from ._specs import Deployment, Efficiency, HardwareSpec, ModelSpec
from ._steady_state import Steady, prompts_present, steady_state
from ._types import Array
from ._workload import Workload

QUANTILES: tuple[float, float, float] = (0.5, 0.95, 0.99)
"""Quantiles of the disaggregated comparison's (mean, p50, p95, p99) arrays."""
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
(``benchmarks/fit_queueing_corrections.py`` fits them)."""


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
    """Summary of a latency distribution across requests, seconds."""

    mean: Array
    p50: Array
    p90: Array
    p95: Array
    p99: Array


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
    m = jnp.maximum(means, 1e-30)
    s2 = jnp.log1p(jnp.maximum(variance, 0.0)[..., None, None] / jnp.square(m))
    mu = jnp.log(m) - s2 / 2.0
    sd = jnp.sqrt(jnp.maximum(s2, 1e-24))

    def cdf(t):
        z = ndtr((jnp.log(jnp.maximum(t[..., None], 1e-30)) - mu) / sd)
        return (1.0 - f[..., 0]) * z[..., 0] + f[..., 0] * z[..., 1]

    hi = jnp.max(jnp.exp(mu + 6.0 * sd), axis=-1) * jnp.ones_like(qs)
    return solve_quantile(cdf, qs, jnp.zeros_like(hi), hi)


class LoadPoint(eqx.Module):
    """Everything ``open_loop`` needs besides the arrival rate (one replica).

    Attributes:
        model, hardware, deployment, efficiency: the static budgets.
        workload: lengths and burstiness (its rate is not read here).
        config: scheduler knobs (``EngineConfig``).
        cost: decode-iteration cost and tokens per iteration (``DecodeCost``; plain by default).
        ca2: squared CV of one replica's inter-arrival gaps.
        corrections: ``CORRECTIONS``-shaped discrepancy terms (None = ``CORRECTIONS``).
        temperature: smoothing of the hard min/max laws (static; 0 = exact).
        nodes: equal-probability (prompt, output) length nodes of the quadrature (static); the
            search evaluates the same laws on fewer (``optimize.SEARCH_NODES``).
    """

    model: ModelSpec
    hardware: HardwareSpec
    deployment: Deployment
    efficiency: Efficiency
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


def open_loop(point: LoadPoint, rate, means_only=False) -> OpenLoop:
    """TTFT/TPOT/E2E (``Percentiles``), utilisation and stability of one replica at ``rate``.

    ``means_only`` leaves p50/p95/p99 NaN (no quadrature: callers that read means, such as the
    closed-loop rate solve and calibration rows); every other field is computed as usual.

    Under a speculative ``point.cost`` the queueing runs in decode iterations ((O - 1) / E per
    request, each iteration's gap from the steady state); TPOT per token is the gap / E, widened
    by the randomness of accepted tokens (renewal CLT: the iterations m tokens take have
    variance m Var(T) / E^3, so TPOT's squared CV grows by Var(T) / (m E)).
    """
    model, hardware, deployment = point.model, point.hardware, point.deployment
    efficiency, workload, config = point.efficiency, point.workload, point.config
    cost, ca2, temperature, corrections = (
        point.cost,
        point.ca2,
        point.temperature,
        point.corrections,
    )
    corr = Corrections.from_array(corrections)
    a, b = corr.wait_gains(config.chunked_prefill)
    c, d = corr.tpot_var_gain, corr.tpot_jensen_gain
    # prompts longer than max_model_len are rejected (vLLM): the engine serves the truncated law
    p_args = (workload.prompt_tokens_mean, workload.prompt_tokens_cv, deployment.max_model_len)
    accept, p_mean, p_var = truncated_lognormal(*p_args)
    p_nodes = prompt_nodes(*p_args[:2], point.nodes[0], deployment.max_model_len)
    tail = tail_ratio(p_nodes, p_var)
    o_nodes = lognormal_nodes(
        workload.output_tokens_mean, workload.output_tokens_cv, point.nodes[1]
    )
    offered, rate = rate, rate * accept
    s = steady_state(
        model,
        hardware,
        deployment,
        efficiency,
        config,
        rate,
        p_nodes,
        o_mean=workload.output_tokens_mean,
        temperature=temperature,
        tail=tail,
        cost=cost,
        o_cv=workload.output_tokens_cv,
    )
    o_tok_nodes = jnp.maximum(o_nodes - 1.0, 0.0)
    e_step = cost.tokens_per_step()
    # decode iterations per request (E tokens each when speculative)
    o_dec_nodes = o_tok_nodes / e_step if cost.speculative else o_tok_nodes
    o_bar = jnp.mean(o_dec_nodes)

    # prefill server (G/G/1, Kingman); running slots: busy count n_run = lambda E[residence]
    busy_mean = jnp.mean(s.busy)
    cs2_p = jnp.var(s.busy) * tail / jnp.square(busy_mean)
    # slot utilisation: residence with every slot busy (TPOT at n_d = seats), so that rho_s = 1
    # where the slots saturate; with the TPOT feedback n_d / seats reaches 0.7 only a few per cent
    # of the rate below that point
    seats = jnp.maximum(s.seats, 1e-9)
    rho_s = rate * (jnp.mean(s.own) + o_bar * s.tpot_full) / seats
    capacity = saturated_output_tokens_per_s(
        model,
        hardware,
        deployment,
        efficiency,
        p_mean,
        workload.output_tokens_mean,
        temperature,
        cost,
    )
    rho_w = rate * workload.output_tokens_mean / capacity
    utilization = smooth_max(smooth_max(s.rho_p, rho_s, temperature), rho_w, temperature)
    stable = (utilization < 1.0) & (s.seats >= 1.0)
    seat_load = rho_s
    rho_p = jnp.where(stable, s.rho_p, 0.5)
    rho_s = jnp.where(stable, rho_s, 0.5)
    w_p = kingman_wait_s(rho_p, ca2, cs2_p, busy_mean)
    gain = jnp.clip(s.n_d * s.slope / jnp.maximum(s.tpot, 1e-30), 0.0, GAIN_MAX)

    def decode_s(n):
        return decode_iteration_s(
            model,
            hardware,
            deployment,
            efficiency,
            cost,
            decode_seqs=n,
            decode_context=s.ctx_d[..., None],
            temperature=temperature,
        )

    # the running count's noise: one arrival enters (+1) and its prefill work Delta delays the
    # departures by X = lambda Delta / (1 - u): one jump 1 + X, E[(1 + X)^2] = 1 + 2 u / (1 - u)
    # + E[X^2], so Var(N) = n [(1 + c_a^2) / 2 + c_a^2 u / (1 - u) + c_a^2 E[X^2] / 2] / (1 - g)^2
    # (the cross term: the entry and the stall it causes move N together, not independently)
    jump2 = jnp.square(rate) * s.delta2 / jnp.square(1.0 - s.extra)  # E[X^2]
    noise = (1.0 + ca2) / 2.0 + ca2 * s.extra / (1.0 - s.extra) + ca2 * jump2 / 2.0
    if config.chunked_prefill:
        # prompts a backlogged iteration packs (those present, as far as the budget holds them,
        # as ``_steady_state`` prices it) start decoding together: the spread at the seats grows
        # with that clump k as k^e (``chunked_seat_clump_exponent`` e)
        budget = prefill_budget_tokens(deployment, config, s.n_d, temperature)
        clump = smooth_min(prompts_present(rho_p), budget / p_mean, temperature)
        seat_gain = jnp.exp(
            corr.chunked_seat_var_log_gain
            + corr.chunked_seat_clump_exponent * jnp.log(jnp.maximum(clump, 1.0))
        )
    else:
        seat_gain = jnp.exp(corr.seat_var_log_gain)
    # over a request's life the decode batch roams its spread, which can straddle the
    # roofline's kink: its gaps see the feedback gain averaged over the spread, g_bar, and the
    # iteration time's Jensen excess E[tau(N)] - tau(n_d) (a convex roofline), amplified by the
    # loop, 1 / (1 - g_bar) (``_running_count.averaged_gain``)
    feedback = Feedback.at_mean(
        decode_s, s.n_d, s.tpot, gain, s.extra, config.chunked_prefill, GAIN_MAX
    )
    spread = rate * (jnp.mean(s.own) + o_bar * s.tpot) * noise * seat_gain
    g_bar, tau_excess = averaged_gain(decode_s, feedback, spread)
    share = 1.0 - s.extra if config.chunked_prefill else 1.0 / (1.0 - s.extra)
    gap_excess = share * tau_excess / (1.0 - g_bar)

    # a request's mean gap: the prefill work landing in its own gaps (compound Poisson, through
    # TPOT = tau_d / (1 - u), u = lambda E[Delta]) and the batch it shares drifting (own noise of
    # N, OU with correlation time E[O] TPOT / (1 - g_bar), averaged over its (O - 1) gaps); slow
    # deviations are amplified by the slot feedback, 1 / (1 - g_bar)^2
    gaps = jnp.maximum(o_dec_nodes, 1.0)
    loop = jnp.square(1.0 - g_bar)
    stalls = ca2 * rate * s.tpot * s.delta2 / (gaps * jnp.square(1.0 - s.extra) * loop)
    # Jensen: TPOT is convex in the prefill share u seen over a life, so its mean is
    # TPOT* (1 + Var(TPOT_stall) / TPOT*^2) to second order (bounded as j / (1 + j))
    jensen = stalls / jnp.square(jnp.maximum(s.tpot, 1e-30))
    jensen_shift = jensen / (1.0 + jensen)

    # running count: Little's law with the requests' own mean gaps (the Jensen shift weighted by
    # ``running_jensen_gain``), n = lambda (E[own prefill] + E[(O - 1) TPOT(O)])
    own_gaps = s.tpot * (1.0 + corr.running_jensen_gain * jensen_shift) + gap_excess
    resid_time = jnp.mean(s.own) + jnp.mean(o_dec_nodes * own_gaps)
    n_run = jnp.where(stable, rate * resid_time, 0.5 * seats)
    # its diffusion (the noise above), and at the seats the calibrated spread
    var_run = n_run * noise / jnp.square(1.0 - gain)

    # the force pulling N back weakens towards the seats (g and TPOT grow with N, by a jump
    # past the roofline's kink): the seats fill more often than the Gaussian says
    stiffness = running_stiffness(decode_s, feedback, n_run, seats)
    p_seat, w_seat_cond = diffusion_seat_wait(n_run, var_run * seat_gain, s.seats, rate, stiffness)
    w_s = p_seat * w_seat_cond
    w_m = modulated_wait_s(
        w_p, rho_p, jnp.square(s.rate_slope) * var_run, o_bar * s.tpot / (1.0 - gain)
    )
    if not config.chunked_prefill:
        # a prompt's prefill-only iteration also takes the prompts that arrive while it waits
        # (lambda (W + R) E[P] tokens behind it), as far as the budget left after it and the
        # queue ahead of it (lambda W E[P]) holds them (whole prompts, first fit: the one that
        # does not fit wastes half a prompt); each costs the marginal prefill time
        # per token (the iteration's weight read is shared)
        spread = jnp.max(p_nodes) - jnp.min(p_nodes)
        slope = (jnp.max(s.own) - jnp.min(s.own)) / jnp.maximum(spread, 1.0)
        per_token = jnp.where(spread > 1.0, slope, jnp.mean(s.own) / p_mean)
        w_0 = w_p + w_m + w_s
        behind = rate * (w_0 + s.tau_d / 2.0) * p_mean
        own_and_waste = (1.0 + FIRST_FIT_WASTE_PROMPTS) * p_mean
        left = deployment.max_num_batched_tokens - own_and_waste - rate * w_0 * p_mean
        room = jnp.maximum(left, 0.0)
        share = room / jnp.maximum(room + behind, 1e-9)
        stretch = 1.0 + rate * per_token * p_mean * share
    else:
        stretch = 1.0
    wait = ((w_p + w_m) * (1.0 + a * cs2_p + b * rho_p / (1.0 - rho_p)) + w_s) * stretch
    p_wait = jnp.clip(jnp.maximum(rho_p, p_seat), 1e-9, 1.0)
    w_cond = wait / p_wait
    # an arrival waits out the iteration in flight while decodes keep the engine iterating
    # (P ~ 1 - exp(-n_d)): a decode-only one or, chunked, with probability rho_p one carrying a
    # prompt's chunk (it cannot join an iteration in flight; with no decodes, as in a prefill
    # pool, the prompt in flight is Kingman's residual already)
    residual = -jnp.expm1(-s.n_d) * s.tau_d / 2.0 * stretch
    if config.chunked_prefill:
        t_carry = jnp.mean(s.own / jnp.maximum(p_nodes / budget, 1.0))
        residual = (1.0 - rho_p) * residual - jnp.expm1(-s.n_d) * rho_p * t_carry / 2.0

    # a request's TPOT spread: the prefill in its own gaps (``stalls`` above) and the batch's drift
    window = gaps * (1.0 - g_bar) / jnp.maximum(o_bar, 1.0)
    var_own = n_run * (1.0 + ca2) / 2.0 / loop
    drift = jnp.square(s.slope) * var_own * window_mean_variance_factor(window)
    # the loop cannot push a request's gap past the slots' cap: its amplified part is at most
    # the headroom TPOT(n_d = seats) - TPOT, squared; the prefill in its own gaps stays
    headroom = jnp.square(jnp.maximum(s.tpot_full - s.tpot, 0.0))
    tpot_var = c * (stalls * loop + jnp.minimum(stalls * (1.0 - loop) + drift, headroom))
    tpot_nodes = s.tpot * (1.0 + d * jensen_shift) + gap_excess
    tpot = jnp.mean(tpot_nodes)

    ttft_mean = residual + wait + jnp.mean(s.own)
    e2e_mean = ttft_mean + jnp.mean(o_dec_nodes * tpot_nodes)
    # ITL: one gap -- without prefill work (tau_d) or, with probability f, with it; both see the
    # batch's Jensen excess, and the batch's drift over one gap (the TPOT drift's window at one
    # gap), at most the slots' headroom
    itl_short = s.tau_d + gap_excess
    itl_long = jnp.maximum(s.carry_s, s.tau_d) + gap_excess
    itl_var = jnp.minimum(
        jnp.square(s.slope)
        * var_own
        * window_mean_variance_factor((1.0 - g_bar) / jnp.maximum(o_bar, 1.0)),
        headroom,
    )
    itl = (1.0 - s.carry_share) * itl_short + s.carry_share * itl_long
    if means_only:  # no quadrature: the percentiles are not computed (NaN)
        ttft_q = e2e_q = tpot_q = itl_q = jnp.full(
            jnp.shape(ttft_mean) + (len(PERCENTILE_QUANTILES),), jnp.nan
        )
    else:
        ttft_nodes = residual + s.own
        e2e_nodes = (ttft_nodes[:, None] + (o_dec_nodes * tpot_nodes)[None, :]).reshape(-1)
        qs = jnp.asarray(PERCENTILE_QUANTILES)
        # shape of the prefill queue's wait given a wait (M/G/1 moments, Takacs): squared CV
        # 2 rho - 1 + 4 (1 - rho) E[S] E[S^3] / (3 E[S^2]^2), 1 for M/M/1, < 1 for less variable
        # prompts; below 1 the exponential is shifted to match it (its share of the wait only)
        moments = [jnp.mean(s.busy**k) for k in (1, 2, 3)]
        cw2 = mg1_conditional_wait_scv(rho_p, *moments)
        share = (w_p + w_m) * stretch / jnp.maximum(wait, 1e-30)
        shift = (
            share * (1.0 - jnp.sqrt(smooth_min(jnp.maximum(cw2, 0.1), 1.0, temperature))) * w_cond
        )
        ttft_q = wait_plus_quantile_s(
            ttft_nodes, p_wait[..., None], w_cond[..., None], qs, shift[..., None]
        )
        e2e_q = wait_plus_quantile_s(
            e2e_nodes, p_wait[..., None], w_cond[..., None], qs, shift[..., None]
        )
        if cost.speculative:  # per token: gap / E, plus the accepted-token spread (renewal CLT)
            tpot_nodes = tpot_nodes / e_step
            cv2_accept = cost.tokens_per_step_var() / (jnp.maximum(o_tok_nodes, 1.0) * e_step)
            tpot_var = tpot_var / jnp.square(e_step) + jnp.square(tpot_nodes) * cv2_accept
        tpot_q = lognormal_mixture_quantile(tpot_nodes, tpot_var, qs)
        # chunked: a request's mean gap is at most that of iterations all carrying a full budget
        # (with a backlog, the budget paces the prefill landing in the gaps)
        gap_max = s.gap_max / e_step if cost.speculative else s.gap_max
        tpot_q = jnp.minimum(tpot_q, gap_max[..., None])
        itl_q = gap_quantiles(itl_short, itl_long, s.carry_share, itl_var, qs)
        if cost.speculative:  # per token, as TPOT: the iteration's gap / E
            itl_q = itl_q / e_step
    if cost.speculative:  # the mean per token: gap / E
        tpot = tpot / e_step
        itl = itl / e_step
    return OpenLoop(
        ttft_s=percentiles(ttft_mean, ttft_q, stable),
        tpot_s=percentiles(tpot, tpot_q, stable),
        itl_s=percentiles(itl, itl_q, stable),
        e2e_s=percentiles(e2e_mean, e2e_q, stable),
        utilization=utilization,
        seat_load=seat_load,
        stable=stable,
        steady=s,
        wait_s=wait,
        rate_per_s=offered,
        capacity_per_s=capacity,
        accepted_share=accept,
        running_mean=n_run,
        running_var=var_run,
        seat_wait_prob=p_seat,
        seat_wait_s=w_seat_cond,
    )
