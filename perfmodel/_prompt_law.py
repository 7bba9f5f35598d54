"""The prompt-length law an engine serves: a lognormal truncated at ``max_model_len`` (longer
prompts are rejected, as vLLM does), its equal-probability nodes, and the share of its variance
the nodes cut."""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.special import ndtr, ndtri

from ._floors import LOG_SD_FLOOR, PROBABILITY_FLOOR


def truncated_lognormal(mean, cv, max_len):
    """(P(X <= L), E[X | X <= L], Var(X | X <= L)) of the lognormal (mean, cv): the prompts an
    engine accepts (vLLM rejects prompts longer than ``max_model_len``).  With a = (ln L - mu) / s:
    P = Phi(a), E = mean Phi(a - s) / Phi(a), E[X^2 | .] = mean^2 (1 + cv^2) Phi(a - 2 s) / Phi(a)."""
    mean, cv = jnp.asarray(mean), jnp.asarray(cv)
    s = jnp.maximum(jnp.sqrt(jnp.log1p(jnp.square(cv))), LOG_SD_FLOOR)
    a = (jnp.log(max_len) - jnp.log(mean) + jnp.square(s) / 2.0) / s
    accept = jnp.maximum(ndtr(a), PROBABILITY_FLOOR)
    m = mean * ndtr(a - s) / accept
    second = jnp.square(mean) * (1.0 + jnp.square(cv)) * ndtr(a - 2.0 * s) / accept
    return accept, m, jnp.maximum(second - jnp.square(m), 0.0)


def prompt_nodes(mean, cv, count, max_len=jnp.inf):
    """Equal-probability nodes of the lognormal truncated at ``max_len``, rescaled to the exact
    truncated mean (the nodes cut the far tail)."""
    accept, m, _ = truncated_lognormal(mean, cv, max_len)
    s = jnp.sqrt(jnp.log1p(jnp.square(jnp.asarray(cv))))
    mu = jnp.log(jnp.asarray(mean)) - jnp.square(s) / 2.0
    u = (jnp.arange(count, dtype=float) + 0.5) / count * accept[..., None]
    x = jnp.exp(mu[..., None] + s[..., None] * ndtri(u))
    return x * (m / jnp.mean(x, axis=-1))[..., None]


def tail_ratio(nodes, true_var):
    """Var(X) / Var(nodes) >= 1: the far tail the nodes cut carries much of a lognormal's variance
    (cv = 2: about half), so second moments (Kingman's c_s^2, E[Delta^2]) are scaled by it."""
    node_var = jnp.var(nodes)
    ok = node_var > 0
    return jnp.where(ok, true_var / jnp.where(ok, node_var, 1.0), 1.0)
