"""What every row block shares: the rows' positions, stacking from per-row numbers, and the
per-row scales a prediction reads besides the GPU parameters."""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from perfmodel import Efficiency


class RowScales(NamedTuple):
    """Per covered row (``Prepared.table`` order), the scales a block reads besides the GPU
    parameters."""

    collective_latency_log: jnp.ndarray
    """log of the scale on a collective row's latencies alpha and alpha_0 (its own latency
    cell's offset, ``latency_cells``), 0 for every other row."""
    comm_latency_log: jnp.ndarray
    """log of the scale on the collective latencies inside a whole-model prediction (the
    row's ``COMM_GROUP`` cell offset, ``Prepared.comm_idx``), 0 where it has none."""
    prompt_z: jnp.ndarray | float
    """Standard-normal draw of the prompt means nobody recorded (MLPerf), 0 for their median."""


class RowBlock(eqx.Module):
    """Rows of one kind, stacked: one array entry per row (per configuration for the
    configuration fields of end-to-end blocks); arrays are pytree leaves."""

    pos: np.ndarray
    """Each row's position in ``Prepared.table`` (int)."""

    INTEGER_FIELDS: ClassVar[frozenset[str]] = frozenset({"pos"})
    """Fields stacked as int arrays (positions, codes, indices); every other one is float."""

    @classmethod
    def from_rows(cls, rows: list[dict[str, float]], **given) -> RowBlock:
        """Stack per-row numbers (keyed by field name) into one block; ``given`` fields are
        passed as they are."""
        return cls(
            **{
                f.name: np.asarray(
                    [r[f.name] for r in rows],
                    dtype=int if f.name in cls.INTEGER_FIELDS else float,
                )
                for f in dataclasses.fields(cls)
                if f.name not in given
            },
            **given,
        )

    @abc.abstractmethod
    def predict(self, eff: Efficiency, ker: Efficiency, scales: RowScales) -> jnp.ndarray:
        """Predicted value of each row (seconds, or tokens/s for throughputs), from per-row
        parameters (``_predict.gather``: the step-level and the kernel-level argument)."""


def stack_specs(specs: list[tuple]) -> tuple:
    """Per-row (model, hardware, deployment) pytrees -> one of stacked leaves, for ``vmap``."""
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *specs)
