"""TP vs PP vs replicas for a fixed GPU count, decided by the budgets themselves.

Every split tp * pp * replicas = G that holds the weights is scored with the static budgets: decode
throughput at the largest batch memory and ``max_num_seqs`` allow (``decode_tokens_per_s_max``:
TP all-reduces over the node fabric or, once the group spans nodes, the inter-node network; PP
bubbles (p - 1) / (m + p - 1) with m microbatches, GPipe) and the batch-1 decode step (latency).
Nothing here encodes the rule of thumb "one GPU -> replicas, one node -> TP, several nodes -> PP";
tests check that it emerges from these numbers.  A Python-level search (not traced), like
``smallest_fitting_parallelism``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import equinox as eqx

from ._fit_check import PP_CHOICES, TP_CHOICES, tp_divides_heads
from ._memory import max_concurrent_requests
from ._sheet import decode_tokens_per_s_max
from ._specs import Deployment, System
from ._step import decode_step

OBJECTIVES = ("throughput", "latency")
"""What ``best_parallelism`` maximises: decode tokens/s of all replicas, or minus the batch-1 TPOT."""


class ParallelOption(NamedTuple):
    """One split of the GPUs and its budgets (tokens/s for all replicas; seconds)."""

    tp: int
    pp: int
    replicas: int
    microbatches: int
    max_concurrent_per_replica: float
    tokens_per_s: float
    tpot_s_batch1: float
    spans_nodes: bool


def with_parallelism(
    deployment: Deployment, tp: int, pp: int, replicas: int, microbatches: int | None = None
) -> Deployment:
    """A copy of ``deployment`` with a new split (microbatches default to pp)."""
    m = pp if microbatches is None else microbatches
    return eqx.tree_at(
        lambda d: (d.tp, d.pp, d.replicas, d.microbatches),
        deployment,
        (float(tp), float(pp), float(replicas), float(m)),
    )


def parallelism_options(
    system: System,
    num_gpus: int,
    input_len: float,
    output_len: float,
    microbatches: int | None = None,
) -> list[ParallelOption]:
    """Every fitting split of ``num_gpus`` into tp * pp * replicas, with its budgets.

    TP must divide the attention heads and PP must not exceed the layer count.  A split fits when
    one replica holds the weights plus one sequence of input_len + output_len tokens.
    """
    model, hardware, deployment = system.model, system.hardware, system.deployment
    if num_gpus < 1:
        raise ValueError(f"num_gpus = {num_gpus}; give at least one GPU")
    node = int(hardware.gpus_per_node)
    seq = input_len + output_len
    out = []
    for tp in TP_CHOICES:
        for pp in PP_CHOICES:
            if (
                num_gpus % (tp * pp)
                or not tp_divides_heads(model, tp)
                or pp > int(model.num_layers)
            ):
                continue
            dep = with_parallelism(deployment, tp, pp, num_gpus // (tp * pp), microbatches)
            concurrent = float(max_concurrent_requests(model, hardware, dep, seq))
            if concurrent < 1.0:
                continue
            tps = float(
                decode_tokens_per_s_max(
                    dataclasses.replace(system, deployment=dep), input_len, output_len
                )
            )
            step1 = decode_step(
                dataclasses.replace(system, deployment=dep), 1.0, input_len + output_len / 2.0
            )
            out.append(
                ParallelOption(
                    tp,
                    pp,
                    num_gpus // (tp * pp),
                    int(dep.microbatches),
                    concurrent,
                    tps,
                    float(step1.total_s),
                    tp * pp > node,
                )
            )
    return out


def best_parallelism(
    system: System,
    num_gpus: int,
    input_len: float,
    output_len: float,
    objective: str = "throughput",
) -> ParallelOption | None:
    """The split with the most decode tokens/s (or the lowest batch-1 TPOT); ``None`` if nothing fits."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
    options = parallelism_options(system, num_gpus, input_len, output_len)
    if not options:
        return None
    if objective == "throughput":
        return max(options, key=lambda o: o.tokens_per_s)
    return min(options, key=lambda o: o.tpot_s_batch1)
