"""The scheduler's poll for new requests: how long an arrival waits before the engine sees it.

SGLang's scheduler (``--scheduler-recv-interval k``, ``SchedulerRecvSkipper``) reads its request
socket only after k decode iterations, at once after an iteration that carried prefill and at
once when idle; vLLM and TensorRT-LLM look at every iteration (k = 1).  A request that arrives
while the engine iterates lands uniformly among the k iterations between two polls, so beyond
the residual of the iteration it arrives in (already in the load model's TTFT) it waits

    W = 0 with probability 1 - b,  W ~ Uniform[0, c] with probability b,  c = (k - 1) tau,
    E[W] = b c / 2,  Var[W] = b c^2 / 12 + b (1 - b) c^2 / 4,

tau the mean decode iteration (a TPOT without speculation; E TPOTs when a speculative iteration
emits E tokens: SGLang counts verify iterations as it counts decodes) and b = P(busy) the chance
the engine is iterating when the request arrives: in a closed loop of n clients per replica the other n - 1 are in flight, so
min(n - 1, 1); in an open loop (Poisson arrivals see time averages) one minus the chance that
no request is in flight, 1 - exp(-L) for a Poisson running count of mean L.  Iterations that
carry prefill mostly follow a poll (they hold what it found), so they are left out of the
cycle; the simulator, which runs SGLang's counter, agrees on the mean.  W adds to the first
token and so to the whole request (TTFT and E2E); the loop's throughput is left as the state
solves it (the wait is k / 2 of a request's O iterations).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jax.scipy.special import ndtri

from ._types import Array, ArrayLike


class PollWait(eqx.Module):
    """The wait W for the scheduler's next poll (module doc): Uniform[0, ``span_s``] with
    probability ``busy_probability``, else 0; ``finite`` is False where the iteration is not
    (an overloaded point: every latency is inf)."""

    span_s: Array
    busy_probability: Array
    finite: Array

    @property
    def mean_s(self) -> Array:
        """E[W] = b c / 2 (inf where the iteration is not finite and the engine polls)."""
        mean = self.busy_probability * self.span_s / 2.0
        return jnp.where(self.finite, mean, jnp.inf)

    def quantile_s(self, base_q: Array, base_mean: Array, probs: ArrayLike) -> Array:
        """q-quantiles of X + W from X's quantiles ``base_q`` (last axis: the levels ``probs``)
        and mean, by the normal law of the added spread:

            Q(q) = Q_X(q) + E[W] + sign(z) (sqrt(d^2 + z^2 Var[W]) - |d|),  d = Q_X(q) - E[X],

        z the standard normal q-quantile, capped at Q_X(q) + c (the longest wait).  Exact for
        normal X and W, Q_X + E[W] at the median, Q_X where W = 0, and within 3 % of c for a
        uniform W beside a narrow X at p95."""
        z = ndtri(jnp.asarray(probs))
        b, c = self.busy_probability, self.span_s
        var = b * jnp.square(c) / 12.0 + b * (1.0 - b) * jnp.square(c) / 4.0
        mean = (b * c / 2.0)[..., None]
        finite_q = jnp.isfinite(base_q) & self.finite[..., None]
        q = jnp.where(finite_q, base_q, 0.0)
        d = jnp.abs(q - jnp.where(finite_q, base_mean[..., None], 0.0))
        inner = jnp.square(d) + jnp.square(z) * var[..., None]
        # no added spread (k = 1, or the median beside its mean) adds exactly 0 with a zero, not
        # NaN, gradient: sqrt is differentiated only where its argument is positive
        positive = inner > 0.0
        root = jnp.where(positive, jnp.sqrt(jnp.where(positive, inner, 1.0)), 0.0)
        spread = jnp.where(positive, jnp.sign(z) * (root - d), 0.0)
        out = jnp.minimum(q + mean + spread, q + c[..., None])
        # a quantile not computed (NaN: means only) stays so, an overloaded one is inf
        return jnp.where(finite_q, out, jnp.where(jnp.isnan(base_q), base_q, jnp.inf))


def poll_wait(scheduler_polls: Array, iteration_s: Array, busy_probability: Array) -> PollWait:
    """The ``PollWait`` of an engine polling every ``scheduler_polls`` (k) decode iterations of
    ``iteration_s`` (tau, the mean per-token gap) seconds, busy with ``busy_probability``;
    span c = (k - 1) tau, exactly 0 where k <= 1 (an infinite tau included, with a zero
    gradient there)."""
    waits = scheduler_polls > 1.0
    finite = jnp.isfinite(iteration_s)
    tau = jnp.where(waits & finite, iteration_s, 0.0)
    span = (jnp.maximum(scheduler_polls, 1.0) - 1.0) * tau
    return PollWait(
        span_s=span,
        busy_probability=jnp.clip(busy_probability, 0.0, 1.0),
        finite=finite | ~waits,
    )


def closed_loop_busy_probability(clients_per_replica: Array) -> Array:
    """P(busy) = min(n - 1, 1) for a closed loop of n clients per replica (clipped to [0, 1]):
    a lone client's next request finds the engine idle, which polls at once."""
    return jnp.clip(clients_per_replica - 1.0, 0.0, 1.0)


def open_loop_busy_probability(running_mean: Array) -> Array:
    """P(busy) = 1 - exp(-L) for Poisson arrivals and a Poisson running count of mean L."""
    return -jnp.expm1(-jnp.maximum(running_mean, 0.0))
