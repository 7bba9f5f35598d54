"""Catalog look-ups of ingest (``_ingest``): GPU and model names made canonical catalog ids; rows
the catalog does not know become ``SkippedRow``s with the reason (never silently dropped).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

import perfmodel

from . import _formats as F


@dataclass(frozen=True)
class SkippedRow:
    """A row left out of the table: where it is and why (an unknown GPU or model)."""

    file: str
    line: int
    reason: str


def _close(name: str, options: Collection[str]) -> str:
    found = difflib.get_close_matches(name, list(options), n=3, cutoff=0.5)
    return f" (close: {', '.join(found)})" if found else ""


def _resolve_gpu(name: str, known: dict[str, str]) -> tuple[str | None, str]:
    if not name:
        return None, "gpu is empty; fill the gpu column or pass --gpu (gpu= in the API)"
    found = perfmodel.resolve_gpu_id(name, known_capacities(tuple(known.values())))
    if found is not None:
        return found, ""
    return None, (
        f"gpu {name!r} is not in the hardware catalog{_close(name, known.values())}; "
        "fix the id, or add its row to a hardware CSV (--hardware-csv; hardware_ids= in the API)"
    )


def _resolve_model(name: str, known: dict[str, str]) -> tuple[str | None, str]:
    """Catalog id (``perfmodel.resolve_model_id``: exact, any case, a unique basename such as
    ``/models/Llama-3.1-8B``, or a fine-tuned / quantised checkpoint of a catalog model)."""
    found = perfmodel.resolve_model_id(name, known.values())
    if found is not None:
        return found, ""
    if name.endswith(".json") and Path(name).is_file():
        try:
            perfmodel.load_model(name)
            return name, ""
        except perfmodel.CatalogError as exc:
            return None, f"model config {name!r} is not usable: {exc}"
    return None, (
        f"model {name!r} is not in the model catalog{_close(name, known.values())} "
        "and is not a config.json path; write a catalog id or a config path in the model column "
        "(model= in the API)"
    )


@functools.lru_cache(maxsize=4)
def known_capacities(ids: tuple[str, ...]) -> dict[str, float | None]:
    """The GPU ids with the bundled catalog's HBM bytes where it lists them (a user's own id:
    None, matched by name alone)."""
    bundled = perfmodel.hardware_capacities()
    return {i: bundled.get(i) for i in ids}


def _fill_stated_weight_dtype(frame: pd.DataFrame, codes: np.ndarray, names) -> None:
    """Rows with no weight dtype take the one their model's name states (``-FP8``, ``-AWQ``),
    read before the name becomes the base model's id (``codes`` / ``names``: the model column
    factorized)."""
    stated = np.asarray([perfmodel.checkpoint_weight_dtype(n) or "" for n in names], dtype=object)
    if len(names) and (stated != "").any():
        empty = (frame["weight_dtype"] == "").to_numpy()
        frame.loc[empty, "weight_dtype"] = stated[codes[empty]]


def catalog_filter(
    frame: pd.DataFrame,
    lines: np.ndarray,
    path: Path,
    catalog: tuple[dict[str, str], dict[str, str]],
    skipped: list[SkippedRow],
) -> pd.DataFrame:
    """Canonical GPU/model ids; rows the catalog does not know go to ``skipped``.  A row of a
    pre-quantized checkpoint (``...-FP8``, ``-AWQ``) with no weight dtype takes the one its
    model's name states, before the name becomes the base model's id."""
    gpus, models = catalog
    reasons = np.full(len(frame), "", dtype=object)
    for col, resolve in (
        ("gpu", lambda n: _resolve_gpu(n, gpus)),
        ("model", lambda n: _resolve_model(n, models)),
    ):
        codes, uniques = pd.factorize(frame[col])
        if col == "model":
            _fill_stated_weight_dtype(frame, codes, uniques)
        mapped = []
        for u, value in enumerate(uniques):
            canonical, why = (value, "") if col == "model" and value == "" else resolve(value)
            mapped.append(canonical if canonical is not None else value)
            if why:
                hit = (codes == u) & (reasons == "")
                reasons[hit] = why
        labels = np.asarray(mapped, dtype=object)[codes]
        frame[col] = pd.Series(labels, index=frame.index, dtype=str)
    needs = ~frame["scenario"].isin(F.MODEL_FREE_SCENARIOS).to_numpy()
    reasons[needs & (frame["model"] == "").to_numpy() & (reasons == "")] = (
        "model is empty; a row of this scenario needs one (fill the model column; model= in the API)"
    )
    out = reasons != ""
    skipped.extend(
        SkippedRow(str(path), int(line), str(why)) for line, why in zip(lines[out], reasons[out])
    )
    return frame.loc[~out]


def catalog_lookups(
    hardware_ids: Collection[str] | None, model_ids: Collection[str] | None
) -> tuple[dict[str, str], dict[str, str]]:
    """Lower-case look-ups of the GPU ids and the model ids."""
    gpus = hardware_ids if hardware_ids is not None else perfmodel.hardware_ids()
    ids = list(model_ids if model_ids is not None else perfmodel.model_ids())
    return {g.lower(): g for g in gpus}, {m.lower(): m for m in ids}
