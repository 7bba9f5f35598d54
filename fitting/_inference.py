"""Inference on ``calibration_model`` (``_model``): NUTS, SVI and prior draws, each returned as
ArviZ ``InferenceData`` with the sites a saved posterior keeps (``POSTERIOR_VARS``)."""

from __future__ import annotations

import jax.numpy as jnp
from numpyro import handlers

from ._model import PARAM_NAMES, calibration_model
from ._predict import Prepared

POSTERIOR_VARS = (
    tuple(f"mu_{n}" for n in PARAM_NAMES)
    + tuple(f"tau_{n}" for n in PARAM_NAMES)
    + (PARAM_NAMES + ("tau_source", "tau_kernel", "cell_offset", "sigma"))
    + ("tau_gpu_kernel", "gpu_group")
)
"""Sites kept in the saved posterior (natural units for the per-GPU parameters)."""


def _dims(prep: Prepared) -> tuple[dict, dict]:
    keys = list(prep.noise_keys)
    coords = {"gpu": list(prep.gpus), "cell": list(prep.cells), "noise_key": keys, "group": keys}
    dims = {n: ["gpu"] for n in PARAM_NAMES}
    dims |= {"cell_offset": ["cell"], "sigma": ["noise_key"], "gpu_group": ["gpu", "group"]}
    return coords, dims


def run_nuts(
    prep: Prepared,
    *,
    num_draws: int = 500,
    num_warmup: int = 500,
    num_chains: int = 2,
    seed: int = 0,
    target_accept: float = 0.9,
    progress: bool = False,
    fixed: dict | None = None,
):
    """NUTS (Hoffman & Gelman 2014) on ``calibration_model``; returns ArviZ ``InferenceData``.
    ``fixed`` pins latent sites to given values (``numpyro.handlers.condition``), e.g. the
    parameters no row depends on, whose prior-only funnels only slow the sampler down."""
    import arviz as az
    import jax
    from numpyro.infer import MCMC, NUTS

    model = calibration_model if fixed is None else handlers.condition(calibration_model, fixed)
    kernel = NUTS(model, target_accept_prob=target_accept)
    # one chain per host device when there are enough (``numpyro.set_host_device_count``, as
    # ``fitting.fit_bundled`` does): the chains then run on separate cores
    method = "parallel" if jax.local_device_count() >= num_chains > 1 else "sequential"
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_draws,
        num_chains=num_chains,
        chain_method=method,
        progress_bar=progress,
    )
    with jax.numpy_dtype_promotion("standard"):  # NumPyro's kernels rely on implicit promotion
        mcmc.run(
            jax.random.PRNGKey(seed), prep, jnp.asarray(prep.log_value), extra_fields=("diverging",)
        )
    samples = mcmc.get_samples(group_by_chain=True)
    post = {k: jax.device_get(v) for k, v in samples.items() if k in POSTERIOR_VARS}
    diverging = jax.device_get(mcmc.get_extra_fields(group_by_chain=True)["diverging"])
    coords, dims = _dims(prep)
    return az.from_dict(
        posterior=post, sample_stats={"diverging": diverging}, coords=coords, dims=dims
    )


def run_svi(
    prep: Prepared,
    *,
    num_draws: int = 1000,
    num_steps: int = 3000,
    seed: int = 0,
    learning_rate: float = 0.01,
    low_rank: bool = True,
):
    """SVI with ``AutoLowRankMultivariateNormal`` (or ``AutoNormal``) for large tables; the
    guide's draws are returned as a one-chain ``InferenceData`` (no R-hat: not a Markov chain)."""
    import arviz as az
    import jax
    import optax
    from numpyro.infer import SVI, Predictive, Trace_ELBO
    from numpyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoNormal

    guide = (AutoLowRankMultivariateNormal if low_rank else AutoNormal)(calibration_model)
    svi = SVI(calibration_model, guide, optax.adam(learning_rate), Trace_ELBO())
    k_fit, k_draw = jax.random.split(jax.random.PRNGKey(seed))
    with jax.numpy_dtype_promotion("standard"):  # NumPyro's kernels rely on implicit promotion
        result = svi.run(k_fit, num_steps, prep, jnp.asarray(prep.log_value), progress_bar=False)
        pred = Predictive(
            calibration_model,
            guide=guide,
            params=result.params,
            num_samples=num_draws,
            return_sites=list(POSTERIOR_VARS),
        )
        draws = pred(k_draw, prep, None)
    post = {k: jax.device_get(v)[None] for k, v in draws.items() if k in POSTERIOR_VARS}
    coords, dims = _dims(prep)
    idata = az.from_dict(posterior=post, coords=coords, dims=dims)
    idata.attrs["svi_final_loss"] = float(result.losses[-1])
    return idata


def sample_prior(prep: Prepared, *, num_draws: int = 1000, seed: int = 0):
    """Draws from the prior (the spec-sheet-only model) as ``InferenceData``."""
    import arviz as az
    import jax
    from numpyro.infer import Predictive

    with jax.numpy_dtype_promotion("standard"):
        draws = Predictive(
            calibration_model, num_samples=num_draws, return_sites=list(POSTERIOR_VARS)
        )(jax.random.PRNGKey(seed), prep, None)
    post = {k: jax.device_get(v)[None] for k, v in draws.items() if k in POSTERIOR_VARS}
    coords, dims = _dims(prep)
    return az.from_dict(posterior=post, coords=coords, dims=dims)
