"""Which catalog architecture a checkpoint's Hugging Face id names.

Benchmarks name the checkpoint they served, rarely the base model: ``Llama-3.1-8B-Instruct``,
``Meta-Llama-3.1-70B-Instruct``, ``Llama-2-70b-chat-hf``, ``Llama-3.1-8B-Instruct-FP8``,
``DeepSeek-R1-0528``.  Instruction tuning, chat tuning, a dated re-release or post-training
quantisation leaves the architecture (layers, widths, heads, vocabulary) as the base model's, so
a budget can read the base model's dimensions.  A version tag (``-v0.3``) or size is part of the
architecture and is kept: ``Mistral-7B-Instruct-v0.3`` (vocabulary 32768) does not read as
``Mistral-7B-v0.1`` (32000).  Quantisation tags also say how the weights are stored, which the
budgets need (``checkpoint_weight_dtype``)."""

from __future__ import annotations

import re
from collections.abc import Collection
from functools import lru_cache

TUNING_TAGS = frozenset({"instruct", "chat", "hf", "it", "base", "thinking"})
"""Name tags of a fine-tune of the same architecture."""

QUANTISATION_TAGS: dict[str, str | None] = {
    "fp8": "fp8",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
    "fp4": "fp4",
    "awq": "int4",
    "gptq": "int4",
    "int4": "int4",
    "w4a16": "int4",
    "int8": "int8",
    "w8a8": "int8",
    "w8a16": "int8",
    "dynamic": None,
    "quantized": None,
    "kv": None,
}
"""Name tags of a post-training quantisation, with the weight dtype each states (None: a
qualifier such as ``-FP8-dynamic`` or ``.quantized.w8a8`` that states none by itself)."""

_DATE_TAG = re.compile(r"\d{4}")
"""A re-release date (``-0528``, ``-2507``): same architecture, newer weights."""

_TAG_SPLIT = re.compile(r"[-_.]")


def _tags(name: str) -> tuple[str, list[str]]:
    """(basename in lower case, its tags split on '-', '_' and '.')."""
    base = name.replace("\\", "/").rstrip("/").split("/")[-1].lower()
    return base, _TAG_SPLIT.split(base)


def architecture_key(name: str) -> str:
    """The part of a checkpoint's id that fixes its architecture: the basename in lower case,
    split into tags, its tuning, quantisation and date tags dropped (never the first),
    ``meta-llama-3`` read as ``llama-3`` (Meta's two spellings of one model family), the rest
    joined without separators (``llama2-70b`` as ``Llama-2-70b``):
    ``Mistral-7B-Instruct-v0.1`` -> ``mistral7bv01``, as ``Mistral-7B-v0.1``."""
    _, tags = _tags(name)
    kept = tags[:1] + [
        t
        for t in tags[1:]
        if not (t in TUNING_TAGS or t in QUANTISATION_TAGS or _DATE_TAG.fullmatch(t))
    ]
    if kept[:2] == ["meta", "llama"]:
        kept = kept[1:]
    return "".join(kept)


def checkpoint_weight_dtype(name: str) -> str | None:
    """The weight dtype a checkpoint's id states (``...-FP8`` -> fp8, ``-AWQ`` -> int4,
    ``-NVFP4`` -> fp4), or None when its name states none."""
    _, tags = _tags(name)
    stated = [QUANTISATION_TAGS[t] for t in tags[1:] if QUANTISATION_TAGS.get(t)]
    return stated[-1] if stated else None


@lru_cache(maxsize=8)
def _lookups(ids: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(id in lower case, basename owned by one id, architecture key -> id).  Where several
    ids share a key (a base model and its instruct variant) the shortest id is the base."""
    lower = {m.lower(): m for m in ids}
    owners: dict[str, list[str]] = {}
    for m in ids:
        owners.setdefault(m.split("/")[-1].lower(), []).append(m)
    bases = {b: found[0] for b, found in owners.items() if len(found) == 1}
    keys: dict[str, str] = {}
    for m in sorted(ids, key=lambda m: (len(m), m)):
        keys.setdefault(architecture_key(m), m)
    return lower, bases, keys


def resolve_model_id(name: str, ids: Collection[str]) -> str | None:
    """The catalog id among ``ids`` whose architecture ``name`` names, or None.

    In order: the exact id; the id in any case; ``org/model`` or the basename of a path
    (``/models/Llama-3.1-8B``) owned by one id; the id with the same ``architecture_key``
    (``meta-llama/Llama-3.1-8B-Instruct`` -> ``meta-llama/Llama-3.1-8B``)."""
    if name in ids:
        return name
    lower, bases, keys = _lookups(tuple(ids))
    if name.lower() in lower:
        return lower[name.lower()]
    parts = name.replace("\\", "/").rstrip("/").split("/")
    for candidate in ("/".join(parts[-2:]).lower(), parts[-1].lower()):
        found = lower.get(candidate) or bases.get(candidate)
        if found is not None:
            return found
    return keys.get(architecture_key(name))


def served_model_id(requested: str, resolved: str) -> str:
    """The id an engine should serve: the checkpoint the user named where it reads as a catalog
    architecture only through its name's tags or a path (``meta-llama/Llama-3.1-8B-Instruct``,
    ``/models/Llama-3.1-8B``: the base id would serve other weights), else the catalog id (the
    id in another case, a short alias such as ``llama-3.1-8b``, a ``config.json``)."""
    if "/" not in requested or requested.endswith(".json") or requested.lower() == resolved.lower():
        return resolved
    return requested
