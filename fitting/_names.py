"""Names of the fitted parameters, importable without pandas or NumPyro (the posterior's draw
path needs only these)."""

from __future__ import annotations

from perfmodel import KERNEL_FIELDS, Efficiency

OFFSET_FIELDS = ("time_scale",)
"""``Efficiency`` fields that the fit carries as (source, engine) cell offsets, not per GPU."""
EFFICIENCY_FIELDS = tuple(
    f for f in Efficiency.__dataclass_fields__ if f not in KERNEL_FIELDS + OFFSET_FIELDS
)
"""Per-GPU fitted ``Efficiency`` fields."""
PARAM_NAMES = EFFICIENCY_FIELDS + KERNEL_FIELDS
"""Every fitted parameter: the per-GPU efficiencies, then the kernel efficiencies."""
