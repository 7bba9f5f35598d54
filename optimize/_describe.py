"""A configuration index vector in words: knob values, GPU counts, speculation and pools."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from perfmodel.features import expected_tokens_per_step, kv_transfer_s

from ._evaluate import pool_gpus
from ._grid import (
    KNOBS,
    PREFILL_GPU,
    deployment_from_weights,
    grid_tables,
    layout_degrees,
    one_hot_weights,
    prefill_pool_weights,
)
from ._metrics import served_max_model_len
from ._problem import Problem


def describe_config(
    problem: Problem, gpus: tuple[str, ...], config: np.ndarray, replicas: int
) -> dict:
    """Knob values of an index vector, plus GPU counts.  A p:d pool split reports ``replicas`` as
    engines in both pools and ``disaggregation`` as {"prefill": {"gpu", "num_gpus", "tp",
    "replicas"}, "decode": {...}, "kv_transfer_s"}; ``gpu``, ``tp`` and ``pp`` are then the
    decode pool's (the prefill pool's are its own, ``prefill_tp`` and ``prefill_pp``)."""
    g = problem.grid
    idx = dict(zip(KNOBS, (int(v) for v in config)))
    tp, pp = g.tp[idx["tp"]], g.pp[idx["pp"]]
    layout = g.moe_layouts[idx["moe_layout"]]
    ep, attention_dp = layout_degrees(layout, tp)
    chunk = (
        g.chunk_sizes[idx["chunk_size"]] or g.max_num_batched_tokens[idx["max_num_batched_tokens"]]
    )
    r = int(replicas)
    prefill_gpus, decode_gpus = (int(n) for n in pool_gpus(problem, jnp.asarray(config)))
    out = {
        "gpu": gpus[idx["gpu"]],
        "tp": tp,
        "pp": pp,
        "replicas": r,
        "num_gpus": r * (prefill_gpus + decode_gpus),
        "kv_dtype": g.kv_dtypes[idx["kv_dtype"]],
        "weight_dtype": g.weight_dtypes[idx["weight_dtype"]],
        "max_num_batched_tokens": g.max_num_batched_tokens[idx["max_num_batched_tokens"]],
        "chunk_size": int(chunk),
        "max_num_seqs": g.max_num_seqs[idx["max_num_seqs"]],
        "speculative": None,
        "disaggregation": None,
        "max_model_len": served_context(problem),
        "scheduler_recv_interval": int(g.scheduler_polls),
        "prefill_first": bool(float(problem.prefill_first) > 0.5),
        "moe_layout": layout,
        "ep": ep,
        "attention_dp": attention_dp,
    }
    k = g.spec_k[idx["spec_k"]]
    if k > 0:
        alpha = float(problem.spec_acceptance[idx["spec_k"]])
        out["speculative"] = {
            "draft": "mtp" if bool(problem.draft_is_mtp) else "draft model",
            "k": int(k),
            "acceptance": alpha,
            "tokens_per_step": float(expected_tokens_per_step(alpha, float(k))),
        }
    if idx["pool_split"] > 0:
        p, d = g.pool_ratios[idx["pool_split"] - 1]
        out["replicas"] = r * (p + d)
        out["disaggregation"] = {
            "prefill": {
                "gpu": gpus[idx["prefill_gpu"]],
                "num_gpus": r * prefill_gpus,
                "tp": g.tp[idx["prefill_tp"]],
                "pp": g.pp[idx["prefill_pp"]],
                "replicas": r * p,
            },
            "decode": {
                "gpu": gpus[idx["gpu"]],
                "num_gpus": r * decode_gpus,
                "tp": tp,
                "pp": pp,
                "replicas": r * d,
            },
            "prefill_fraction": p / (p + d),
            "kv_transfer_s": _kv_transfer(problem, config),
        }
    return out


def served_context(problem: Problem) -> int:
    """The engines' ``max_model_len``: the workload's own (``served_max_model_len``), or the
    problem's ``max_model_len_tokens`` (already at least that) when it sets one."""
    served = float(served_max_model_len(problem.workload))
    return int(max(served, float(problem.max_model_len_tokens)))


def _kv_transfer(problem: Problem, config: np.ndarray) -> float:
    """KV hand-off of a mean prompt from the prefill pool (``perfmodel.features.kv_transfer_s``)."""
    weights = prefill_pool_weights(one_hot_weights(jnp.asarray(config), problem.grid))
    dep = deployment_from_weights(weights, grid_tables(problem.grid), 1.0)  # the prefill engine's
    hw = _select(problem.hardware, int(config[PREFILL_GPU]))
    bw = float(problem.transfer_bytes_per_s)
    bw = bw if bw > 0 else float(hw.internode_bytes_per_s)
    return float(
        kv_transfer_s(
            problem.model, dep, problem.workload.prompt_tokens_mean, bw, problem.transfer_latency_s
        )
    )


def _select(tree, i: int):
    return jax.tree_util.tree_map(lambda x: x[i], tree)
