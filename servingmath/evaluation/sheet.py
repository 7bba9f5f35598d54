"""``explain``'s budget sheet of one deployment as a JSON-ready dict, with posterior intervals."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import perfmodel as pm
from optimize import cached_jit
from perfmodel import System

from ..options.posterior import quantiles

INTERVAL_KEYS = (
    "prefill_s",
    "decode_step_s_batch1",
    "decode_step_s_max_batch",
    "decode_tokens_per_s_max",
)
"""Sheet values reported with a posterior interval."""


# One compiled program per sheet evaluation: run op by op, the sheet and its gradient dispatch
# ~270 small XLA compiles (~35 ms each, each under the persistent cache's threshold, so every
# run paid them again); compiled whole, they are three programs the compile cache keeps, and
# their traces are kept beside it (``cached_jit``), so a second run neither traces nor compiles.
_budget_sheet = cached_jit(pm.budget_sheet)
_decode_elasticities = cached_jit(pm.decode_elasticities)


@cached_jit
def _sheets_over_draws(model, hardware, deployment, draws, input_len, output_len):
    return jax.vmap(
        lambda e: pm.budget_sheet(System(model, hardware, deployment, e), input_len, output_len)
    )(draws)


def sheet_intervals(model, hardware, deployment, draws, input_len, output_len) -> dict:
    """p05/p50/p95 over posterior draws of the sheet's time and throughput values."""
    sheets = _sheets_over_draws(
        model, hardware, deployment, draws, jnp.asarray(input_len), jnp.asarray(output_len)
    )
    return {key: quantiles(getattr(sheets, key)) for key in INTERVAL_KEYS}


def sheet_report(
    system: System,
    input_len: float,
    output_len: float,
) -> dict:
    """The static budget sheet as a JSON-ready dict (keys listed in the README's command table)."""
    model, hardware, deployment = system.model, system.hardware, system.deployment
    lengths = jnp.asarray(float(input_len)), jnp.asarray(float(output_len))
    sheet = _budget_sheet(system, *lengths)
    elasticities = _decode_elasticities(system, *lengths)
    return {
        "model": model.name,
        "gpu": hardware.name,
        "tp": int(deployment.tp),
        "pp": int(deployment.pp),
        "replicas": int(deployment.replicas),
        "ep": int(deployment.expert_parallel),
        "attention_dp": int(deployment.attention_dp),
        "input_len": int(input_len),
        "output_len": int(output_len),
        "kv_bytes_per_token": float(sheet.kv_bytes_per_token),
        "weight_bytes_per_gpu": float(sheet.weight_bytes_per_gpu),
        "kv_capacity_tokens": float(sheet.kv_capacity_tokens),
        "max_concurrent_requests": int(sheet.max_concurrent_requests),
        "max_decode_batch": int(sheet.max_decode_batch),
        "prefill_s": float(sheet.prefill_s),
        "decode_step_s_batch1": float(sheet.decode_step_s_batch1),
        "decode_step_s_max_batch": float(sheet.decode_step_s_max_batch),
        "decode_tokens_per_s_max": float(sheet.decode_tokens_per_s_max),
        "binding_budget": pm.BINDING_BUDGETS[int(sheet.binding_budget)],
        "elasticities": {
            name: round(float(e), 4) for name, e in zip(pm.HARDWARE_BUDGETS, elasticities)
        },
    }
