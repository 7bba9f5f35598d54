"""Posterior draws of ``Efficiency`` for each candidate GPU, stacked as (gpus, draws) leaves.

With a fitted posterior (``fitting.load_posterior``) the draws are ``fitting.efficiency_draws``;
without one, ``prior_efficiency_draws`` jitters the default ``Efficiency`` with a seeded lognormal
(spread ``PRIOR_LOG_SD``), which stands for "calibrated to within ~15 %".
"""

from __future__ import annotations

import dataclasses
import zlib

import jax
import jax.numpy as jnp

from perfmodel import Efficiency

PRIOR_LOG_SD = 0.15
"""Log-scale spread of the prior draws of every efficiency field."""

_ENGINE_SCALES = ("ttft_scale", "tpot_scale")

_FRACTIONS = ("compute_fraction_max", "bandwidth_fraction", "collective_bandwidth_fraction")


def prior_efficiency_draws(num_draws: int, *, seed: int = 0) -> Efficiency:
    """``num_draws`` lognormal jitters of ``Efficiency()`` (fractions clipped to at most 1)."""
    base = Efficiency()
    # the engine scales stay 1: without a calibration the answers are the physics alone
    names = [f.name for f in dataclasses.fields(Efficiency) if f.name not in _ENGINE_SCALES]
    keys = jax.random.split(jax.random.PRNGKey(seed), len(names))
    values = {}
    for key, name in zip(keys, names):
        centre = jnp.asarray(getattr(base, name), dtype=float)
        draw = centre * jnp.exp(PRIOR_LOG_SD * jax.random.normal(key, (num_draws,)))
        values[name] = jnp.minimum(draw, 1.0) if name in _FRACTIONS else draw
    values |= {name: jnp.ones(num_draws) for name in _ENGINE_SCALES}
    return Efficiency(**values)


def prior_seed(seed: int, gpu: str) -> int:
    """The prior draws' seed for ``gpu``: ``seed`` mixed with the CRC-32 of its name, so each GPU
    has a stream of its own (independent of the others, the same wherever it sits in a list)."""
    return (seed * 1_000_003 + zlib.crc32(gpu.encode())) % 2**31


def efficiency_draws_for(
    gpus: tuple[str, ...],
    num_draws: int,
    *,
    posterior=None,
    seed: int = 0,
    engine: str | None = None,
    lockstep: bool = False,
) -> Efficiency:
    """Draws for every candidate GPU, leaves of shape (len(gpus), num_draws).

    Without a posterior each GPU's prior jitter comes from its own stream (``prior_seed``): two
    GPUs are independent, not perfectly correlated.

    Args:
        gpus: hardware ids.
        num_draws: posterior draws per GPU.
        posterior: an ArviZ ``InferenceData`` from ``fitting.load_posterior`` or ``None`` (prior).
        seed: PRNG seed (draws are reproducible).
        engine: serving engine whose fitted end-to-end offsets scale TTFT and TPOT
            (``fitting.efficiency_draws``); None: pooled over the engines measured.
        lockstep: whether the load is a lockstep loop (``perfmodel.dynamics.lockstep_share``),
            whose TTFT takes the lockstep runs' fitted scale (``fitting.efficiency_draws``).
    """
    per_gpu = []
    for g, gpu in enumerate(gpus):
        if posterior is None:
            per_gpu.append(prior_efficiency_draws(num_draws, seed=prior_seed(seed, gpu)))
        else:
            import fitting

            draws = fitting.efficiency_draws(
                posterior, gpu, num_draws, seed=seed + g, engine=engine, lockstep=lockstep
            )
            per_gpu.append(
                jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (num_draws,)), draws)
            )
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *per_gpu)
