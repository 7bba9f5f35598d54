"""The offered load: arrival process and request-length distributions (ARCHITECTURE.md, "Workload").

Lengths are lognormal, parameterised by mean and coefficient of variation (CV): with
sigma^2 = ln(1 + cv^2) and mu = ln(mean) - sigma^2 / 2, a lognormal has exactly that mean and CV
(Johnson, Kotz & Balakrishnan, *Continuous Univariate Distributions* vol. 1, ch. 14).  Inter-arrival
times are a renewal process with CV ``interarrival_cv`` (1 = Poisson; the simulator draws gamma
gaps, the closed forms use only the first two moments, as Kingman's formula does).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from ._types import Array, ArrayLike

DEFAULT_PROMPT_TOKENS = 1024
"""The prompt length every command assumes when none is given (``--input-len``) and
``Workload()``'s: a chat-length request, one 1-2k-token context of a conversation or a short
document."""
DEFAULT_OUTPUT_TOKENS = 256
"""The output length every command assumes when none is given (``--output-len``) and
``Workload()``'s: a chat answer of a few paragraphs."""


def _arr(default: float):
    return eqx.field(converter=jnp.asarray, default=default)


class Workload(eqx.Module):
    """Offered load on the whole deployment (all replicas); SI units.

    Attributes:
        arrival_rate_per_s: open-loop request arrival rate lambda (requests/s).
        concurrency: closed-loop requests kept in flight (a new one is sent as one finishes);
            0 means open loop at ``arrival_rate_per_s``.
        interarrival_cv: coefficient of variation of inter-arrival gaps c_a (1 = Poisson).
        prompt_tokens_mean: mean prompt length E[P] in tokens.
        prompt_tokens_cv: CV of prompt length (lognormal).
        output_tokens_mean: mean generated tokens E[O] (the first comes from the prefill).
        output_tokens_cv: CV of output length (lognormal).
        requests_per_client: closed loop only: requests each client sends (a benchmark's
            prompts / concurrency; InferenceMAX and ``vllm bench serve`` runs use 10).  The
            first round starts as a burst, so 1 / R of requests see the whole wave of prefills;
            inf = a loop long past its start.
    """

    arrival_rate_per_s: Array = _arr(1.0)
    concurrency: Array = _arr(0.0)
    interarrival_cv: Array = _arr(1.0)
    prompt_tokens_mean: Array = _arr(float(DEFAULT_PROMPT_TOKENS))
    prompt_tokens_cv: Array = _arr(0.0)
    output_tokens_mean: Array = _arr(float(DEFAULT_OUTPUT_TOKENS))
    output_tokens_cv: Array = _arr(0.0)
    requests_per_client: Array = _arr(float("inf"))


def lognormal_params(mean: ArrayLike, cv: ArrayLike) -> tuple[Array, Array]:
    """(mu, sigma) of the lognormal with this mean and CV: sigma^2 = ln(1 + cv^2), mu = ln m - sigma^2/2."""
    sigma2 = jnp.log1p(jnp.square(jnp.asarray(cv)))
    return jnp.log(jnp.asarray(mean)) - sigma2 / 2.0, jnp.sqrt(sigma2)


def sample_lengths(rng, mean: float, cv: float, n: int, minimum: int = 1):
    """``n`` integer lengths from the lognormal (mean, cv), rounded, at least ``minimum``.

    Args:
        rng: a ``numpy.random.Generator`` (explicit seed; no global state).
    """
    import numpy as np

    mean, cv = float(mean), float(cv)
    if cv <= 0.0:
        x = np.full(n, mean)
    else:
        s2 = np.log1p(cv * cv)
        x = rng.lognormal(np.log(mean) - s2 / 2.0, np.sqrt(s2), n)
    return np.maximum(np.rint(x), minimum).astype(np.int64)


def sample_arrivals(rng, rate_per_s: float, cv: float, n: int):
    """``n`` arrival times (s, from 0) of a renewal process with gamma gaps of mean 1/rate and CV ``cv``."""
    import numpy as np

    rate_per_s, cv = float(rate_per_s), float(cv)
    if cv <= 0.0:
        gaps = np.full(n, 1.0 / rate_per_s)
    else:
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), n)
    return np.cumsum(gaps) - gaps[0]
