"""Which parallelism fits: the smallest TP (then PP) whose weights leave room for one sequence.

A Python-level search over discrete configurations (not traced); the fit test itself is the
memory budget ``max_concurrent_requests >= 1``.
"""

from __future__ import annotations

import equinox as eqx

from ._memory import max_concurrent_requests
from ._specs import Deployment, HardwareSpec, ModelSpec

TP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
PP_CHOICES = (1, 2, 3, 4, 6, 8, 16)


def tp_divides_heads(model: ModelSpec, tp: int) -> bool:
    """TP must split the attention heads evenly (vLLM's requirement)."""
    return int(model.num_heads) % tp == 0


def smallest_fitting_parallelism(
    model: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    sequence_tokens: float,
) -> tuple[int, int] | None:
    """Smallest (tp, pp), fewest devices first and TP inside a node preferred, that holds the
    weights plus one sequence of ``sequence_tokens``; ``None`` if even 512 devices do not."""
    node = int(hardware.gpus_per_node)
    candidates = sorted(
        ((tp, pp) for tp in TP_CHOICES for pp in PP_CHOICES if tp_divides_heads(model, tp)),
        key=lambda c: (c[0] * c[1], c[0] > node, c[1]),
    )
    for tp, pp in candidates:
        trial = eqx.tree_at(lambda d: (d.tp, d.pp), deployment, (float(tp), float(pp)))
        if float(max_concurrent_requests(model, hardware, trial, sequence_tokens)) >= 1.0:
            return tp, pp
    return None
