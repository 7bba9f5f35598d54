"""One tidy measurement row (SCHEMA.md columns) for the calibration tests: every column present,
labels empty, counts 1, a one-second (or given) ``time`` value; keyword arguments override."""

import numpy as np

from fitting.ingest import COLUMNS


def measurement_row(**kw) -> dict:
    """A row dict with the defaults below, updated by ``kw``."""
    base = {c: np.nan for c in COLUMNS}
    base.update(
        source="test",
        engine="",
        notes="",
        tp=1,
        pp=1,
        ep=1,
        num_gpus=1,
        metric="time",
        unit="s",
        value=1e-3,
        weight_dtype="",
        kv_dtype="",
        model="",
        op="",
    )
    base.update(kw)
    return base
