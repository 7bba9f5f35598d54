"""The steady state of an iteration-level engine under Poisson-like load (one replica).

Solves jointly, by damped fixed-point iteration, for the mean decode batch n_d (Little's law,
n_d = lambda (E[O] - 1) TPOT, capped by the running slots), the prefill server's utilisation
rho_p (time per prompt packed with the backlog's prompts while a backlog lasts, its own iterations
otherwise) and the mean gap TPOT.  Unchunked, prompts take prefill-only iterations:
TPOT = tau_d / (1 - lambda E[Delta]).  Chunked, iterations are a mixture of decode-only ones
(memory-bound) and ones carrying prefill (compute-bound); the gap is the mixture's mean, not T at
the mean tokens (the roofline max is convex, and the TPOT feedback amplifies the difference near
saturation); the share of carrying iterations is a renewal of carrying and decode-only runs,
since a long iteration gathers the prompts arriving behind it.  Decodes read the context of a
request picked in proportion to its output length.  All times are ``forward_step`` iterations (``_batching.iteration_s``); chunked
prefill follows Sarathi-Serve (Agrawal et al. OSDI 2024).  Prompts follow the lognormal truncated
at ``max_model_len`` (longer ones are rejected, as vLLM does).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.special import ndtr

from ._batching import (
    DecodeCost,
    EngineConfig,
    IterationTokens,
    decode_iterations_s,
    prefill_budget_tokens,
    seat_capacity,
)
from ._floors import COUNT_FLOOR, POSITIVE_FLOOR, SHARE_FLOOR
from ._smooth import smooth_max, smooth_min
from ._specs import System
from ._types import Array

BUSY_SHARE_CAP = 0.99
"""Largest busy share rho the mean-value formulas take (1 / (1 - rho) stays finite and its
gradient bounded); past it the stability test, not the formula, reports the overload."""

FIXED_POINT_ITERATIONS = 60
"""Damped iterations of the (n_d, rho_p, TPOT) fixed point (400 iterations change the grid's
figures by < 1e-3 relative)."""


FULL_SLOT_ITERATIONS = 8
"""Iterations of the gap at full slots (a contraction with factor lambda tau E[m] e^(-x) < 1)."""

RUN_END_FLOOR = 1e-6
"""Smallest chance 1 - p_c that a run of carrying iterations ends (the run's mean length
R = E[S] / (1 - p_c) stays finite when every group is followed by another)."""

GAMMA_SHAPE_FLOOR = 1e-6
"""Smallest shape k of the gamma law of the prefill tokens arriving in one iteration (the
Wilson-Hilferty normal divides by 9 k)."""


class MeanGap(eqx.Module):
    """The mean decode gap at one state (decode batch, prefill busy share, previous gap) and the
    prefill costs it was built from (seconds; ``own``/``busy``/``delta`` per prompt node)."""

    tau_d: Array  # a decode-only iteration
    own: Array  # a prompt's own prefill time
    busy: Array  # prefill-server time per prompt when backlogged
    delta: Array  # the prefill time a prompt adds to the decode gaps
    gap_s: Array  # the mean gap between a decoding sequence's tokens
    carry_share: Array  # share of gaps that hold prefill work
    carry_s: Array  # length of such a gap


class Steady(eqx.Module):
    """Steady state of one replica at one arrival rate (seconds, sequences)."""

    slope: Array  # d TPOT / d n_d (the gap self-consistent at each decode batch)
    n_d: Array
    tau_d: Array
    tpot: Array
    own: Array  # (K,) own prefill time at each prompt node
    busy: Array  # (K,) prefill-server time per prompt when backlogged
    delta2: Array  # E[Delta^2]
    rho_p: Array
    seats: Array
    extra: Array  # lambda E[Delta]: share of time prefill adds to the decode gaps
    tpot_full: Array  # mean gap with all ``seats`` decoding, at this arrival rate
    rate_slope: Array  # d ln c / d n_d, c = prefill tokens/s of a backlogged server (chunked)
    gap_max: Array  # longest mean gap a request can see: every iteration carries a full budget
    ctx_d: Array  # mean context a decode reads (length-biased), tokens
    carry_share: Array  # f: share of decode gaps that hold prefill work (the gap law's weight)
    carry_s: Array  # length of such a gap (chunked: an iteration carrying prefill), seconds


def prompts_present(rho_p):
    """Prompts present while the prefill server is busy: 1 / (1 - rho_p), the M/M/1 mean number
    in system given busy (E[L] / P(busy)); rho_p capped at ``BUSY_SHARE_CAP``."""
    return 1.0 / (1.0 - jnp.minimum(rho_p, BUSY_SHARE_CAP))


class Pricing(eqx.Module):
    """What prices one iteration at the steady state: the budgets, the scheduler, the decode
    cost, the arrival rate, the served prompt law and the decodes' mean context (tokens)."""

    system: System
    config: EngineConfig
    cost: DecodeCost
    rate: Array  # arrivals per second at this replica
    prompt_nodes: Array  # (K,) served prompt tokens
    prompt_mean: Array
    prompt_var: Array  # the served law's variance (the nodes' times the tail ratio)
    decode_context: Array  # mean context a decode reads (length-biased), tokens
    temperature: float = eqx.field(static=True, default=0.0)

    def iteration_s(self, **tokens) -> Array:
        """One iteration with ``tokens``' prefill and decode work (``iterations_s`` of one)."""
        (seconds,) = self.iterations_s(IterationTokens(**tokens))
        return seconds

    def iterations_s(self, *steps: IterationTokens) -> tuple[Array, ...]:
        """Several iterations' times from one forward pass (``decode_iterations_s``)."""
        return decode_iterations_s(
            self.system,
            self.cost,
            steps,
            temperature=self.temperature,
        )

    def budget_tokens(self, n_d) -> Array:
        """Prefill tokens an iteration with ``n_d`` decodes has room for."""
        return prefill_budget_tokens(self.system.deployment, self.config, n_d, self.temperature)

    def decode_only(self, n_d) -> IterationTokens:
        """tau_d's iteration: ``n_d`` sequences decoding, no prefill."""
        return IterationTokens(decode_seqs=n_d, decode_context=self.decode_context)

    def budget_step(self, n_d, prompt) -> IterationTokens:
        """Chunked: an iteration carrying a full budget of a ``prompt``-token prompt's chunks
        (at the mean context of its later chunks) and the decode batch."""
        budget = self.budget_tokens(n_d)
        return IterationTokens(
            prefill_tokens=budget,
            prefill_seqs=1.0,
            prefill_context=jnp.maximum(prompt - budget, 0.0) / 2.0,
            decode_seqs=n_d,
            decode_context=self.decode_context,
        )

    def budget_iteration_s(self, n_d, prompt) -> Array:
        """The ``budget_step`` iteration's time."""
        return self.iteration_s(**vars(self.budget_step(n_d, prompt)))


class PrefillCosts(eqx.Module):
    """Per prompt node, seconds: its own prefill, the prefill server's time while backlogged,
    and what it adds to the decode gaps; with the decode-only iteration tau_d and the times of
    the caller's ``also`` iterations priced in the same forward pass (``also_s``)."""

    tau_d: Array
    own: Array
    busy: Array
    delta: Array
    also_s: tuple[Array, ...] = ()


def prefill_costs(x: Pricing, n_d, rho_p, *also: IterationTokens) -> PrefillCosts:
    """``PrefillCosts`` at decode batch ``n_d`` and prefill busy share ``rho_p``, with the times
    of the iterations ``also`` priced in the same forward pass.

    Chunked: a prompt within the budget rides one iteration with the decodes, a longer one P /
    B budget iterations; a backlogged iteration packs the prompts present, k = 1 / (1 - rho_p)
    of them, as far as the budget holds them (not a full budget: at B = 16384 and rho_p ~ 0.75
    the backlog is ~4 prompts, not B / E[P] = 16).  Unchunked: whole prompts packed FCFS into
    prefill-only iterations, the next prompt that does not fit wasting on average half a prompt
    of the budget (first-fit bin packing, no reordering).  Either way the server's time per
    prompt is the packed one while a backlog lasts (probability rho_p), its own otherwise."""
    p, p_mean, ctx = x.prompt_nodes, x.prompt_mean, x.decode_context
    if x.config.chunked_prefill:
        budget = x.budget_tokens(n_d)
        held = smooth_min(prompts_present(rho_p) * p_mean, budget, x.temperature)
        tau_d, small, chunk, full, *extra = x.iterations_s(
            x.decode_only(n_d),
            IterationTokens(
                prefill_tokens=p, prefill_seqs=1.0, decode_seqs=n_d, decode_context=ctx
            ),
            x.budget_step(n_d, p),
            IterationTokens(
                prefill_tokens=held,
                prefill_seqs=jnp.maximum(held / p_mean, 1.0),
                decode_seqs=n_d,
                decode_context=ctx,
            ),
            *also,
        )
        fits = p <= budget
        own = jnp.where(fits, small, p / budget * chunk)
        delta = jnp.where(fits, small - tau_d, p / budget * (chunk - tau_d))
        busy = rho_p * (p / held * full) + (1.0 - rho_p) * own
        return PrefillCosts(tau_d, own, busy, delta, tuple(extra))
    b = x.system.deployment.max_num_batched_tokens
    fill = jnp.clip(b - p_mean / 2.0, jnp.minimum(p_mean, b), b)
    tau_d, own, fill_s, *extra = x.iterations_s(
        x.decode_only(n_d),
        IterationTokens(prefill_tokens=p, prefill_seqs=1.0),
        IterationTokens(prefill_tokens=fill, prefill_seqs=fill / p),
        *also,
    )
    packed = jnp.where(p <= fill, p / fill * fill_s, own)
    busy = rho_p * packed + (1.0 - rho_p) * own
    return PrefillCosts(tau_d, own, busy, busy, tuple(extra))


class CarryingGroup(eqx.Module):
    """Chunked: the prefill work an iteration carrying prompts holds (``_carrying_group``)."""

    need: Array  # prompt tokens arriving per iteration, lambda E[P] TPOT (in carrying ones)
    budget: Array  # prefill tokens an iteration has room for
    others: Array  # c: the tokens of the prompts sharing the group beside its first
    group: Array  # (K,) a carrying group's tokens, P + c
    k_tok: Array  # (K,) of them in its first iteration

    def first_iteration(self, x: Pricing, n_d) -> IterationTokens:
        """The group's first iteration: its share of the budget."""
        return IterationTokens(
            prefill_tokens=self.k_tok,
            prefill_seqs=(1.0 + self.others / x.prompt_mean) * self.k_tok / self.group,
            prefill_context=jnp.maximum(self.group - self.budget, 0.0) / 2.0,
            decode_seqs=n_d,
            decode_context=x.decode_context,
        )


def _carrying_group(x: Pricing, n_d, tpot) -> CarryingGroup:
    """Chunked: the carrying group a prompt heads (the first prompt P with the others at their
    mean, c = tokens - E[P]), from the M/G/inf occupancy of prompts in prefill at an iteration
    (``_carrying_share``)."""
    rate, p_nodes, p_mean, temperature = x.rate, x.prompt_nodes, x.prompt_mean, x.temperature
    budget = x.budget_tokens(n_d)
    m_mean = jnp.mean(jnp.maximum(p_nodes / budget, 1.0))
    occupancy = rate * tpot * m_mean
    small = occupancy < COUNT_FLOOR
    f = jnp.where(small, occupancy, -jnp.expm1(-jnp.where(small, 1.0, occupancy)))
    need = p_mean / m_mean * occupancy
    f = jnp.minimum(smooth_max(f, need / budget, temperature), 1.0)
    tokens = smooth_min(
        need / jnp.maximum(f, POSITIVE_FLOOR), budget, temperature
    )  # full if overloaded
    c = jnp.maximum(tokens - p_mean, 0.0)
    group = p_nodes + c
    return CarryingGroup(need, budget, c, group, jnp.minimum(group, budget))


def _carrying_share(x: Pricing, g: CarryingGroup, t_group, tau_d) -> tuple[Array, Array]:
    """Chunked: the share f of iterations that carry prefill and the prompt tokens each carries.

    A prompt spans m = max(1, P / budget) iterations; prompts in prefill at an iteration are
    Poisson(x = lambda tau E[m]) (M/G/inf occupancy), f = 1 - exp(-x), and prompt tokens are
    conserved: at least lambda E[P] TPOT / B of a full budget's iterations carry prefill
    (backlogged: all).  Arrivals cluster behind long iterations: a carrying group (the first
    prompt P with the others at their mean, c = tokens - E[P]: P + c tokens over S = (P + c) / B
    iterations, the first taking ``t_group``) is followed by another with
    p_c = E[1 - exp(-lambda T_P)], a decode-only iteration (``tau_d``) by a carrying one with
    p_d = 1 - exp(-lambda tau_d): a two-state renewal, f = R / (R + 1 / p_d),
    R = E[S] / (1 - p_c), below the Poisson 1 - exp(-x).  A carrying run goes on while prefill is
    left over: the tokens arriving during an iteration (compound Poisson: gamma with mean
    ``need``, scale the token-weighted prompt E[P^2] / E[P], shape k) exceed what the next
    iteration takes, q = P(A > B), by the Wilson-Hilferty cube-root normal (smooth to every
    order, unlike igamma's a-derivative)."""
    rate, p_mean, temperature = x.rate, x.prompt_mean, x.temperature
    need, budget = g.need, g.budget
    p_c = jnp.mean(-jnp.expm1(-rate * t_group))
    p_d = -jnp.expm1(-rate * tau_d)
    run_c = jnp.mean(g.group / g.k_tok) / jnp.maximum(1.0 - p_c, RUN_END_FLOOR)
    f_run = run_c / (run_c + 1.0 / jnp.maximum(p_d, POSITIVE_FLOOR))
    p2 = p_mean + x.prompt_var / p_mean
    k = jnp.maximum(need / p2, GAMMA_SHAPE_FLOOR)
    h = 1.0 / (9.0 * k)
    q = ndtr(-(jnp.cbrt(budget / p2 / k) - 1.0 + h) / jnp.sqrt(h))
    f_run = 1.0 - (1.0 - f_run) * (1.0 - q)
    f = jnp.minimum(smooth_max(f_run, need / budget, temperature), 1.0)
    return f, smooth_min(need / jnp.maximum(f, POSITIVE_FLOOR), budget, temperature)


def mean_gap(x: Pricing, n_d, rho_p, tpot) -> MeanGap:
    """Mean iteration gap at decode batch ``n_d``, busy share ``rho_p`` and previous gap ``tpot``.

    Unchunked: prompts get their own iterations, tau_d / (1 - lambda E[Delta]); prompts
    arriving during a gap get prefill-only iterations before the next decode, so a share
    f = 1 - exp(-lambda TPOT) of the gaps hold some (Poisson arrivals), each longer than tau_d by
    the prefill that makes the mean gap, (gap - tau_d) / f.  Chunked: a mixture of decode-only
    iterations (memory-bound, tau_d) and iterations carrying prefill (compute-bound,
    ``_carrying_share``); the mean of the two is what a decode waits, not T at the mean tokens
    (Jensen: the roofline max is convex): gap = f T(tokens, n_d) + (1 - f) tau_d.  Attention is
    quadratic in the prompt, so k prompts sharing an iteration, priced at their mean length
    (``forward_step``'s per-prompt = tokens / seqs), count E[P] + Var(P) / (k E[P]) each."""
    if not x.config.chunked_prefill:
        pc = prefill_costs(x, n_d, rho_p)
        tau_d = pc.tau_d
        extra = jnp.minimum(x.rate * jnp.mean(pc.delta), BUSY_SHARE_CAP)
        gap = tau_d / (1.0 - extra)
        f_u = jnp.maximum(-jnp.expm1(-x.rate * tpot), SHARE_FLOOR)
        return MeanGap(tau_d, pc.own, pc.busy, pc.delta, gap, f_u, tau_d + (gap - tau_d) / f_u)
    group = _carrying_group(x, n_d, tpot)
    pc = prefill_costs(x, n_d, rho_p, group.first_iteration(x, n_d))
    (t_group,) = pc.also_s
    tau_d = pc.tau_d
    f, tokens = _carrying_share(x, group, t_group, tau_d)
    shared = jnp.maximum(tokens / x.prompt_mean, 1.0)
    p_eff = x.prompt_mean + x.prompt_var / (shared * x.prompt_mean)
    carry = x.iteration_s(
        prefill_tokens=tokens,
        prefill_seqs=tokens / p_eff,
        decode_seqs=n_d,
        decode_context=x.decode_context,
    )
    return MeanGap(tau_d, pc.own, pc.busy, pc.delta, f * carry + (1.0 - f) * tau_d, f, carry)


def _gap_slope(x: Pricing, n_d, rho_p, tpot) -> Array:
    """d TPOT / d n_d at state n_d with the gap self-consistent in itself: partial slopes in n_d
    and in the gap (through the share of iterations carrying prefill), slope = dn / (1 - dt)."""
    one = jnp.ones_like(n_d)
    _, d_n = jax.jvp(lambda n: mean_gap(x, n, rho_p, tpot).gap_s, (n_d,), (one,))
    _, d_t = jax.jvp(lambda t: mean_gap(x, n_d, rho_p, t).gap_s, (tpot,), (one,))
    return d_n / jnp.maximum(1.0 - d_t, 0.05)


def _prefill_rate_slope(x: Pricing, n_d) -> Array:
    """d ln c / d n_d of the prefill tokens/s while backlogged, c(n) = (B - n) / T(B - n prefill
    tokens, n decodes): chunked, the decodes go first, so the prefill server slows as the decode
    batch grows; unchunked, prefill-only iterations go first and their speed does not depend on
    the batch (0)."""
    if not x.config.chunked_prefill:
        return jnp.zeros_like(n_d)

    def prefill_rate(n):
        budget = x.budget_tokens(n)
        return budget / x.budget_iteration_s(n, budget)

    c0, dc = jax.jvp(prefill_rate, (n_d,), (jnp.ones_like(n_d),))
    return dc / c0


def steady_state(
    system: System,
    config,
    rate,
    p_nodes,
    o_mean,
    temperature,
    tail=1.0,
    cost: DecodeCost | None = None,
    o_cv=0.0,
):
    """Fixed point of decode batch and iteration gap at arrival rate ``rate`` (one replica).

    ``cost`` (``DecodeCost``) prices every iteration (cached prefix read by decodes and chunks;
    speculative draft + verify) and sets the tokens E a sequence emits per decode iteration, so
    a request decodes for (E[O] - 1) / E iterations; ``tpot`` is then the iteration gap, and
    ``p_nodes`` are the served (uncached) prompt tokens; ``o_cv`` is the output-length CV (a
    decode's context is length-biased: long outputs stay in the batch longer; 0 = E[P] + E[O] / 2).
    """
    cost = DecodeCost() if cost is None else cost
    p_mean = jnp.mean(p_nodes)
    # a decode at a random iteration belongs to a request picked in proportion to its output
    # length O (it decodes for O iterations), at a uniform point of it: the mean context is
    # E[P] + E[O (O - 1) / 2] / E[O] = E[P] + (E[O] (1 + cv_O^2) - 1) / 2
    ctx_d = p_mean + jnp.maximum(o_mean * (1.0 + jnp.square(o_cv)) - 1.0, 0.0) / 2.0
    x = Pricing(
        system=system,
        config=config,
        cost=cost,
        rate=rate,
        prompt_nodes=p_nodes,
        prompt_mean=p_mean,
        prompt_var=jnp.var(p_nodes) * tail,
        decode_context=ctx_d,
        temperature=temperature,
    )
    o_dec = jnp.maximum(o_mean - 1.0, 0.0)
    if cost.speculative:
        o_dec = o_dec / cost.tokens_per_step()
    seats = seat_capacity(system.model, system.hardware, system.deployment, ctx_d, temperature)

    def step(_, state):
        n_d, rho_p, tpot = state
        g = mean_gap(x, n_d, rho_p, tpot)
        rho_new = jnp.minimum(rate * jnp.mean(g.busy), 1.0)
        n_new = smooth_min(rate * o_dec * g.gap_s, seats, temperature)
        return 0.5 * (n_d + n_new), 0.5 * (rho_p + rho_new), 0.5 * (tpot + g.gap_s)

    zero = jnp.zeros_like(rate)
    n_d, rho_p, tpot = jax.lax.fori_loop(0, FIXED_POINT_ITERATIONS, step, (zero, zero, zero))
    g = mean_gap(x, n_d, rho_p, tpot)
    # the gap with every running slot decoding: what sets the rate at which the slots saturate
    full = jax.lax.fori_loop(
        0,
        FULL_SLOT_ITERATIONS,
        lambda _, t: mean_gap(x, seats, rho_p, t).gap_s,
        jnp.maximum(g.gap_s, g.tau_d),
    )
    # chunked, an iteration carries at most one budget of prefill, so no request's mean gap can
    # exceed the gap of iterations that all carry a full one (unchunked: no such cap)
    if config.chunked_prefill:
        gap_max = x.budget_iteration_s(n_d, p_mean)
    else:
        gap_max = jnp.full_like(n_d, jnp.inf)
    return Steady(
        slope=_gap_slope(x, n_d, rho_p, g.gap_s),
        n_d=n_d,
        tau_d=g.tau_d,
        tpot=g.gap_s,
        own=g.own,
        busy=g.busy,
        delta2=jnp.mean(g.delta) ** 2 + jnp.var(g.delta) * tail,
        rho_p=rate * jnp.mean(g.busy),
        seats=seats,
        extra=jnp.minimum(rate * jnp.mean(g.delta), BUSY_SHARE_CAP),
        tpot_full=full,
        rate_slope=_prefill_rate_slope(x, n_d),
        gap_max=gap_max,
        ctx_d=ctx_d,
        carry_share=g.carry_share,
        carry_s=g.carry_s,
    )
