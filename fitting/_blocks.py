"""The row blocks of a ``Prepared`` table, one typed block per kind of row (``None`` where the
table has none of that kind)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from ._blocks_base import RowBlock, RowScales  # noqa: F401  (re-exported)
from ._blocks_e2e import ClosedLoopRows, OpenLoopRows, ServingRows  # noqa: F401  (re-exported)
from ._blocks_kernel import AttentionRows, CollectiveRows, ElementwiseRows, GemmRows
from ._blocks_step import StepRows


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Covered rows by kind; iterating yields the blocks present, in field order."""

    gemm: GemmRows | None = None
    """GEMM kernels and vidur projection ops."""
    elementwise: ElementwiseRows | None = None
    """Norms, residual add, activation, rope, embedding."""
    attention: AttentionRows | None = None
    """Prefill and decode attention kernels."""
    collective: CollectiveRows | None = None
    """All-reduce, gather/scatter/all-to-all and send/recv."""
    step: StepRows | None = None
    """``prefill``, ``decode_step`` and ``static_batch`` rows."""
    closed: ClosedLoopRows | None = None
    """Closed-loop ``serving`` rows and ``saturated`` rows."""
    open: OpenLoopRows | None = None
    """Open-loop ``serving`` rows."""

    def __iter__(self) -> Iterator[RowBlock]:
        for f in dataclasses.fields(self):
            block = getattr(self, f.name)
            if block is not None:
                yield block


BLOCK_TYPES: dict[str, type[RowBlock]] = {
    f.name: cls
    for f, cls in zip(
        dataclasses.fields(Blocks),
        (
            GemmRows,
            ElementwiseRows,
            AttentionRows,
            CollectiveRows,
            StepRows,
            ClosedLoopRows,
            OpenLoopRows,
        ),
    )
}
"""``Blocks`` field -> the block type it holds."""
BLOCK_NAMES: dict[type[RowBlock], str] = {cls: name for name, cls in BLOCK_TYPES.items()}
"""Block type -> its ``Blocks`` field."""
