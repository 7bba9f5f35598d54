"""The budget sheet of one deployment: what ``servingmath explain`` prints.

Composes the static budgets (memory, compute, bandwidth, communication) at one prompt/output
length, names the binding budget, and differentiates decode throughput with respect to each
hardware budget (elasticities, d log tokens/s / d log budget).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp

from ._memory import (
    kv_bytes_per_token,
    kv_capacity_tokens,
    max_concurrent_requests,
    weight_bytes_per_gpu,
)
from ._specs import HardwareSpec, System
from ._step import decode_step, prefill_step
from ._types import Array, ArrayLike

BINDING_BUDGETS: tuple[str, ...] = (
    "memory_capacity",
    "compute",
    "memory_bandwidth",
    "communication",
)
"""Labels of ``binding_budget`` codes (``BudgetSheet.binding_budget``,
``ServingMetrics.binding_budget``)."""

HARDWARE_BUDGETS: tuple[str, ...] = (
    "peak_flops_per_s",
    "hbm_bytes_per_s",
    "hbm_bytes",
    "link_bytes_per_s",
)
"""Hardware budgets the elasticities are taken against, in order."""


class BudgetSheet(eqx.Module):
    """Static budgets of one deployment at one (input_len, output_len); SI units.

    ``kv_capacity_tokens`` and ``max_concurrent_requests`` are for the whole TP x PP group;
    ``decode_tokens_per_s_max`` for all replicas.  ``binding_budget`` indexes ``BINDING_BUDGETS``
    (``binding_budget``: the budget that limits decode capacity, independent of any load).
    """

    kv_bytes_per_token: Array
    weight_bytes_per_gpu: Array
    kv_capacity_tokens: Array
    max_concurrent_requests: Array
    max_decode_batch: Array
    prefill_s: Array
    decode_step_s_batch1: Array
    decode_step_s_max_batch: Array
    decode_tokens_per_s_max: Array
    binding_budget: Array
    fits: Array


def _decode_batch(model, hardware, deployment, input_len, output_len, temperature):
    concurrent = max_concurrent_requests(
        model, hardware, deployment, jnp.asarray(input_len) + output_len, temperature
    )
    return concurrent, jnp.minimum(concurrent, deployment.max_num_seqs)


def decode_tokens_per_s_max(
    system: System,
    input_len: ArrayLike,
    output_len: ArrayLike,
    temperature: float = 0.0,
) -> Array:
    """Decode tokens/s of all replicas at the largest batch memory and ``max_num_seqs`` allow,
    with the mean decode context input_len + output_len / 2."""
    model, hardware, deployment = system.model, system.hardware, system.deployment
    _, batch = _decode_batch(model, hardware, deployment, input_len, output_len, temperature)
    batch = jnp.maximum(batch, 0.0)
    context = jnp.asarray(input_len) + jnp.asarray(output_len) / 2.0
    step = decode_step(system, batch, context, temperature)
    return deployment.replicas * batch / step.total_s


def binding_budget(
    system: System,
    input_len: ArrayLike,
    output_len: ArrayLike,
) -> Array:
    """The budget that limits decode capacity: an index into ``BINDING_BUDGETS``.

    Capacity is decode tokens/s at the largest batch, b* = min(KV seats, ``max_num_seqs``)
    (KV seats = ``max_concurrent_requests`` at input_len + output_len), each sequence at the mean
    context input_len + output_len / 2.  The binding budget is

    * ``memory_capacity`` when the KV cache, not ``max_num_seqs``, sets b* and the step at b*
      is bandwidth-bound (t_mem >= t_compute): more HBM would hold a larger batch, and a larger
      batch amortises the same weight reads, so capacity grows with HBM bytes;
    * otherwise the largest of the step's times at b*: ``compute`` (t_compute),
      ``memory_bandwidth`` (t_mem) or ``communication`` (t_comm).

    A property of the deployment and the request lengths, not of the arrival rate: how close a
    load comes to that capacity is ``ServingMetrics.utilization``, whether requests queue is
    ``ServingMetrics.queue_bound``.
    """
    deployment = system.deployment
    concurrent, _, _, step = _capacity_step(system, input_len, output_len)
    return _binding_code(concurrent, deployment.max_num_seqs, step)


def _capacity_step(system: System, input_len, output_len):
    """(KV seats, largest batch b*, mean decode context, the decode step at max(b*, 1))."""
    model, hardware, deployment = system.model, system.hardware, system.deployment
    concurrent, batch = _decode_batch(model, hardware, deployment, input_len, output_len, 0.0)
    context = jnp.asarray(input_len) + jnp.asarray(output_len) / 2.0
    step = decode_step(system, jnp.maximum(batch, 1.0), context)
    return concurrent, batch, context, step


def _binding_code(concurrent, max_num_seqs, step):
    """``binding_budget``'s rule on the step at the largest batch."""
    kv_limited = concurrent < max_num_seqs
    bandwidth_bound = step.memory_s >= step.compute_s
    time_budget = jnp.argmax(jnp.stack([step.compute_s, step.memory_s, step.comm_s]), axis=0) + 1
    return jnp.where(kv_limited & bandwidth_bound, 0, time_budget)


def budget_sheet(
    system: System,
    input_len: ArrayLike,
    output_len: ArrayLike,
) -> BudgetSheet:
    """Evaluate every static budget at one operating point (exact: no relaxation)."""
    model, hardware, deployment = system.model, system.hardware, system.deployment
    concurrent, batch, context, step_max = _capacity_step(system, input_len, output_len)
    batch = jnp.maximum(batch, 0.0)
    step1 = decode_step(system, 1.0, context)
    prefill = prefill_step(system, input_len)
    tokens_per_s = deployment.replicas * batch / step_max.total_s
    return BudgetSheet(
        kv_bytes_per_token=kv_bytes_per_token(model, deployment.kv_bytes_per_elem),
        weight_bytes_per_gpu=weight_bytes_per_gpu(model, deployment),
        kv_capacity_tokens=kv_capacity_tokens(model, hardware, deployment),
        max_concurrent_requests=concurrent,
        max_decode_batch=batch,
        prefill_s=prefill.total_s,
        decode_step_s_batch1=step1.total_s,
        decode_step_s_max_batch=step_max.total_s,
        decode_tokens_per_s_max=tokens_per_s,
        binding_budget=_binding_code(concurrent, deployment.max_num_seqs, step_max),
        fits=concurrent >= 1.0,
    )


def _scale_hardware(hardware: HardwareSpec, log_scales: Array) -> HardwareSpec:
    s = jnp.exp(log_scales)
    return eqx.tree_at(
        lambda h: (h.dense_flops_per_s, h.hbm_bytes_per_s, h.hbm_bytes, h.link_bytes_per_s),
        hardware,
        (
            hardware.dense_flops_per_s * s[0],
            hardware.hbm_bytes_per_s * s[1],
            hardware.hbm_bytes * s[2],
            hardware.link_bytes_per_s * s[3],
        ),
    )


def decode_elasticities(
    system: System,
    input_len: ArrayLike,
    output_len: ArrayLike,
    temperature: float = 1e-3,
) -> Array:
    """d log(decode tokens/s) / d log(budget) for ``HARDWARE_BUDGETS``, by ``jax.grad``.

    The batch size is relaxed to a real number (a small ``temperature``) so that extra HBM
    capacity shows up as a larger batch; a 1.0 means tokens/s scales one-for-one with the budget.
    """
    hardware = system.hardware

    def log_tps(log_scales):
        hw = _scale_hardware(hardware, log_scales)
        return jnp.log(
            decode_tokens_per_s_max(
                dataclasses.replace(system, hardware=hw), input_len, output_len, temperature
            )
        )

    return jax.grad(log_tps)(jnp.zeros(4))
