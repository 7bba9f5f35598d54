"""The public budgets keep the shapes their jaxtyping annotations state: every ``BatchLike``
argument broadcasts against the others and the result (``BatchArray``) has the broadcast shape,
so one call prices a grid of lengths, batches or link speeds.  Each function is called with its
first two real arguments as a column (3, 1) and a row (1, 4), the rest scalar: the result must be
(3, 4), and each element must equal the function at that element's scalars."""

from __future__ import annotations

import inspect
import typing

import jax
import numpy as np
import pytest

import perfmodel
from perfmodel import COLLECTIVE_KINDS, Deployment, Efficiency, KernelEfficiency, System
from perfmodel._compute import attention_flops, compute_fraction, linear_flops
from perfmodel._memory import (
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_shard_fraction,
    weight_bytes,
)
from perfmodel._ops import (
    attention_tile_flops,
    attention_time_s,
    collective_time_s,
    elementwise_time_s,
    gemm_time_s,
    prefill_attention_flops,
)
from perfmodel._parallel import (
    pipeline_time_factor,
    point_to_point_s,
    pp_bubble_fraction,
    pp_transfer_s,
    ring_all_reduce_s,
    tp_comm_s,
)
from perfmodel._speculative import acceptance_from_length, expected_tokens_per_step
from perfmodel._step import expected_experts_touched, weight_bytes_touched
from perfmodel._types import BatchArray, BatchLike

MODEL = perfmodel.load_model("mistralai/Mixtral-8x7B-v0.1")  # MoE and GQA: every term live
HARDWARE = perfmodel.load_hardware("h100-sxm")
DEPLOYMENT = Deployment.create(tp=2)
BY_TYPE = {
    "ModelSpec": MODEL,
    "HardwareSpec": HARDWARE,
    "Deployment": DEPLOYMENT,
    "Efficiency": Efficiency(),
    "KernelEfficiency": KernelEfficiency(launch_overhead_s=3e-6, gemm_half_width=64.0),
}
BY_TYPE["System"] = System(MODEL, HARDWARE, DEPLOYMENT, BY_TYPE["Efficiency"])
VALUES = {  # a plausible value for each real argument (the rest take 2.0 scaled)
    "kind": float(COLLECTIVE_KINDS["all_reduce"]),
    "acceptance": 0.6,
    "acceptance_length": 1.8,
    "low_precision": 0.0,
    "onchip": 1.0,
    "message_bytes": 8e6,
    "link_bytes_per_s": 4.5e11,
    "peak_flops_per_s": 9.89e14,
    "hbm_bytes_per_s": 3.35e12,
    "flops": 1e12,
    "bytes_moved": 1e9,
}
BUDGETS = [
    kv_bytes_per_token,
    kv_bytes_per_sequence,
    kv_shard_fraction,
    weight_bytes,
    compute_fraction,
    linear_flops,
    attention_flops,
    ring_all_reduce_s,
    point_to_point_s,
    tp_comm_s,
    pp_transfer_s,
    pp_bubble_fraction,
    pipeline_time_factor,
    expected_experts_touched,
    weight_bytes_touched,
    gemm_time_s,
    elementwise_time_s,
    attention_time_s,
    prefill_attention_flops,
    attention_tile_flops,
    collective_time_s,
    expected_tokens_per_step,
    acceptance_from_length,
]
COLUMN = np.array([1.0, 2.0, 4.0])[:, None]  # (3, 1)
ROW = np.array([1.0, 1.5, 3.0, 8.0])[None, :]  # (1, 4)


def _real_parameters(fn) -> list[str]:
    """Names of ``fn``'s arguments annotated ``BatchLike`` that have no default."""
    hints = typing.get_type_hints(fn)
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if hints.get(p.name) == BatchLike and p.default is p.empty]


def _arguments(fn, reals: dict[str, object]) -> dict[str, object]:
    hints = typing.get_type_hints(fn)
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name in reals:
            out[p.name] = reals[p.name]
        elif p.default is p.empty:
            out[p.name] = BY_TYPE[getattr(hints[p.name], "__name__", "")]
    return out


def _scale(name: str, axis: np.ndarray) -> np.ndarray:
    """The axis's multipliers applied to the argument's value; codes and probabilities stay in
    their range (a collective kind takes one code, a probability is scaled into [0, 1))."""
    base = VALUES.get(name, 2.0)
    if name == "kind":
        return np.full_like(axis, base)
    if name in ("acceptance", "low_precision"):
        return base * axis / (1.0 + axis.max())
    if name == "acceptance_length":
        return 1.0 + 0.1 * axis
    return base * 64.0 * axis


@pytest.mark.parametrize("fn", BUDGETS, ids=lambda f: f.__name__)
def test_budget_broadcasts_its_real_arguments_as_annotated(fn):
    hints = typing.get_type_hints(fn)
    assert hints["return"] == BatchArray
    names = _real_parameters(fn)
    assert names, f"{fn.__name__} has no BatchLike argument"
    axes = [COLUMN, ROW] + [np.ones((1, 1))] * (len(names) - 2)
    reals = {n: _scale(n, a) for n, a in zip(names, axes)}
    out = np.asarray(fn(**_arguments(fn, reals)))
    expected_shape = np.broadcast_shapes(*(np.shape(v) for v in reals.values()))
    assert out.shape == expected_shape
    assert np.all(np.isfinite(out))
    i, j = (expected_shape[0] - 1, expected_shape[1] - 1) if out.ndim == 2 else (-1, -1)
    scalars = {n: float(np.broadcast_to(v, expected_shape)[i, j]) for n, v in reals.items()}
    one = float(jax.jit(lambda kw: fn(**_arguments(fn, kw)))(scalars))
    assert float(out[i, j]) == pytest.approx(one, rel=1e-9)
