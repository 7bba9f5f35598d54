"""Names of the fitted parameters, importable without pandas or NumPyro (the posterior's draw
path needs only these)."""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp

from perfmodel import KERNEL_FIELDS, ArrayLike, Efficiency

OFFSET_FIELDS = ("time_scale", "ttft_scale", "tpot_scale")
"""``Efficiency`` fields that the fit carries as (source, engine) cell offsets, not per GPU."""
EFFICIENCY_FIELDS = tuple(
    f for f in Efficiency.__dataclass_fields__ if f not in KERNEL_FIELDS + OFFSET_FIELDS
)
"""Per-GPU fitted ``Efficiency`` fields."""
PARAM_NAMES = EFFICIENCY_FIELDS + KERNEL_FIELDS
"""Every fitted parameter: the per-GPU efficiencies, then the kernel efficiencies."""


def fitted_efficiency(values: Mapping[str, ArrayLike], **offsets: ArrayLike) -> Efficiency:
    """The fitted fields (``PARAM_NAMES``, e.g. a NumPyro model's sites or a posterior's draws,
    by name) as one ``Efficiency`` pytree, every leaf of the values' shape (per GPU, or draws x
    GPUs); the ``OFFSET_FIELDS`` given in ``offsets``, the others 1 (the fit adds cell offsets
    to log time instead)."""
    fields = {f: jnp.asarray(values[f]) for f in PARAM_NAMES}
    ones = jnp.ones_like(fields[EFFICIENCY_FIELDS[0]])
    scales = {f: jnp.asarray(offsets.pop(f)) if f in offsets else ones for f in OFFSET_FIELDS}
    if offsets:
        raise TypeError(f"not an offset field: {', '.join(offsets)}")
    return Efficiency(**fields, **scales)


E2E_SCENARIOS = ("serving", "saturated")
"""End-to-end scenarios: predicted through the load models, calibrated by the cut stage (their
steps' TP all-reduces at ``ENGINE_ALL_REDUCE_CELL``'s latency)."""

ENGINE_ALL_REDUCE_CELL = "aiconfigurator:vllm_graph|collective:all_reduce"
"""Cell whose latency offset prices a serving engine's TP all-reduce.  Under load vLLM, SGLang and
TensorRT-LLM replay their decode iterations as CUDA graphs and all-reduce within a node with a
peer-memory custom kernel (one or two barriers, not NCCL's ring of 2(p - 1) hops); the CUDA-graph
custom all-reduce that aiconfigurator timed costs ~0.4x the nccl-tests latency (4.3-4.7 us for
2-8 H100s at small messages), so end-to-end rows take that cell's scale on alpha and alpha_0."""

LOCKSTEP_TTFT_GROUP = "serving:lockstep:ttft"
"""Noise group of a lockstep loop's TTFT (``fitting._groups.lockstep``).  A desynchronised
loop's TTFT offset (e^0.5 to e^1.9 in every lab and engine) carries how arrivals cluster, which
its model does not price; a lockstep loop's TTFT is the wave each request waits in, which its
model prices whole, so the two regimes' offsets and noise pool apart.  Its TPOT is the same
decode iterations' and keeps ``serving:tpot``."""

STAND_IN_GROUPS = {"serving:itl": "serving:tpot", "serving:rate:itl": "serving:rate:tpot"}
"""Group -> the measured group a posterior that never fitted it takes its offsets and noise from.
A client's ITL is the per-token decode gap (times the tokens a chunk), the gap mean TPOT averages
per request; without ITL rows its spread is TPOT's, not the widest fitted group's."""


def stand_in_group(key: str) -> str | None:
    """``STAND_IN_GROUPS``' stand-in of noise group ``key``, or None."""
    return STAND_IN_GROUPS.get(key)


def noise_index(known: tuple[str, ...] | list[str], key: str) -> int | None:
    """Index in ``known`` (a posterior's noise groups) of ``key``, else of its stand-in group,
    else None (the caller then takes the widest fitted noise)."""
    for k in (key, stand_in_group(key)):
        if k is not None and k in known:
            return list(known).index(k)
    return None
