"""The discrete knob grid and one configuration on it.

A configuration is a vector of integer indices into ``Grid``'s choice tuples plus a replica count;
the grid is static (Python tuples), so every array built from it has a static shape and the search
and the exhaustive referee compile once.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from perfmodel import DTYPE_BYTES, Deployment, ModelSpec
from perfmodel._constants import COMPUTE_DTYPES, WEIGHT_DTYPE_COMPUTE

KNOBS: tuple[str, ...] = (
    "gpu", "tp", "pp", "kv_dtype", "weight_dtype", "max_num_batched_tokens", "max_num_seqs"
)
"""Index columns of a configuration array, in order; the replica count is kept beside them."""


class Grid(NamedTuple):
    """Legal discrete values of each knob (static).

    Holds shapes and numbers only (no names), so problems with different GPUs or models share one
    compiled search.

    Attributes:
        num_gpus: candidate GPU types (order of the stacked ``HardwareSpec``).
        tp: tensor-parallel degrees; only those dividing the attention heads are used.
        pp: pipeline-parallel degrees.
        kv_dtypes: KV-cache storage dtypes (``DTYPE_BYTES`` names).
        weight_dtypes: weight storage dtypes.
        max_num_batched_tokens: iteration token budgets (= the prefill chunk size, as in vLLM).
        max_num_seqs: caps on sequences in one iteration.
        max_replicas: the largest replica count searched.
    """

    num_gpus: int
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4)
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8", "int8", "int4")
    weight_dtypes: tuple[str, ...] = ("bf16", "fp8", "int4")
    max_num_batched_tokens: tuple[int, ...] = (1024, 2048, 4096, 8192)
    max_num_seqs: tuple[int, ...] = (64, 128, 256, 512)
    max_replicas: int = 64

    def sizes(self) -> tuple[int, ...]:
        """Number of choices per index column (``KNOBS`` order)."""
        return (
            self.num_gpus,
            len(self.tp),
            len(self.pp),
            len(self.kv_dtypes),
            len(self.weight_dtypes),
            len(self.max_num_batched_tokens),
            len(self.max_num_seqs),
        )

    def legal_tp(self, model: ModelSpec) -> np.ndarray:
        """Boolean mask over ``tp``: TP must divide the attention heads (vLLM's requirement)."""
        heads = int(model.num_heads)
        return np.asarray([heads % t == 0 for t in self.tp])

    def all_configs(self, model: ModelSpec) -> np.ndarray:
        """Every legal index vector, shape (n, len(KNOBS)), int32."""
        legal = self.legal_tp(model)
        rows = [
            c for c in itertools.product(*(range(n) for n in self.sizes())) if legal[c[1]]
        ]
        return np.asarray(rows, dtype=np.int32)


def grid_tables(grid: Grid) -> dict[str, jnp.ndarray]:
    """Numeric value of every choice, as arrays the traced code indexes or mixes with weights."""
    compute_mix = [
        [1.0 if c == WEIGHT_DTYPE_COMPUTE[w] else 0.0 for c in COMPUTE_DTYPES]
        for w in grid.weight_dtypes
    ]
    return {
        "tp": jnp.asarray(grid.tp, dtype=float),
        "pp": jnp.asarray(grid.pp, dtype=float),
        "kv_bytes": jnp.asarray([DTYPE_BYTES[d] for d in grid.kv_dtypes]),
        "weight_bytes": jnp.asarray([DTYPE_BYTES[d] for d in grid.weight_dtypes]),
        "compute_mix": jnp.asarray(compute_mix),
        "mnbt": jnp.asarray(grid.max_num_batched_tokens, dtype=float),
        "mnseq": jnp.asarray(grid.max_num_seqs, dtype=float),
    }


def one_hot_weights(config: jnp.ndarray, grid: Grid) -> tuple[jnp.ndarray, ...]:
    """The discrete configuration as the relaxed representation's weights (one-hot per choice)."""
    return tuple(
        jnp.eye(n)[config[..., i]] for i, n in enumerate(grid.sizes())
    )


def deployment_from_weights(
    weights: tuple[jnp.ndarray, ...], tables: dict[str, jnp.ndarray], replicas: jnp.ndarray
) -> Deployment:
    """A (relaxed) ``Deployment``: each numeric knob is the weight-average of its choices.

    TP and PP mix in log2 (so a 50/50 mix of 2 and 8 is 4); at one-hot weights this is exact.
    """
    _, w_tp, w_pp, w_kv, w_w, w_mnbt, w_seq = weights
    tp = jnp.exp2(w_tp @ jnp.log2(tables["tp"]))
    pp = jnp.exp2(w_pp @ jnp.log2(tables["pp"]))
    mnbt = jnp.exp2(w_mnbt @ jnp.log2(tables["mnbt"]))
    mnseq = jnp.exp2(w_seq @ jnp.log2(tables["mnseq"]))
    return Deployment(
        tp=tp,
        pp=pp,
        replicas=replicas,
        weight_bytes_per_param=w_w @ tables["weight_bytes"],
        kv_bytes_per_elem=w_kv @ tables["kv_bytes"],
        compute_dtype_mix=w_w @ tables["compute_mix"],
        max_num_batched_tokens=mnbt,
        max_num_seqs=mnseq,
        microbatches=pp,
    )
