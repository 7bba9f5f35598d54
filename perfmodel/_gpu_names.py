"""Which catalog accelerator a GPU name names.

Result files and spreadsheets name GPUs as ``nvidia-smi`` prints them (``NVIDIA H100 80GB
HBM3``, ``NVIDIA A100-SXM4-80GB``, ``NVIDIA H100 PCIe``), as vendors market them (``AMD Instinct
MI300X``, ``NVIDIA GeForce RTX 4090``) or in short (``H100``, ``H200``).  A name is read as three
parts: the chip (``h100``, ``rtx4090``, ``tpuv6e``), the form factor (SXM, PCIe, NVL) and the
memory (``80GB``).  A catalog id with the same chip matches where the form and memory the name
states agree with it; where the name states no form, the SXM part (or a chip made in one form
only) is the one meant, as ``nvidia-smi`` names an SXM H100 or H200 without a form, and where
several parts remain, the catalog's unqualified id (``gh200`` beside ``gh200-144gb``).  A name that
leaves two parts possible (``A100``: 40 or 80 GB) or states a chip the catalog lacks reads as
nothing: a near miss must not pass for another GPU."""

from __future__ import annotations

import re
from collections.abc import Mapping

VENDOR_WORDS = frozenset(
    {"nvidia", "amd", "instinct", "geforce", "tesla", "google", "aws", "intel", "habana", "cloud"}
)
"""Words of a marketed name that name the maker or the product line, not the chip."""

MEMORY_KINDS = frozenset({"hbm", "hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x", "gddr7"})
"""Memory technologies a name may state (the chip already fixes it)."""

FORMS: dict[str, str] = {
    "sxm": "sxm",
    "sxm2": "sxm",
    "sxm4": "sxm",
    "sxm5": "sxm",
    "sxm6": "sxm",
    "hgx": "sxm",
    "oam": "sxm",
    "pcie": "pcie",
    "nvl": "nvl",
}
"""Form-factor words and the form each states (OAM is AMD's socketed module, as SXM)."""

DEFAULT_FORMS = ("sxm", None)
"""Forms read where a name states none: the SXM part, or a chip the catalog lists in one form."""

MEMORY_TOLERANCE = 0.1
"""Relative gap within which a stated size (``80GB``) matches a catalog row's HBM capacity:
vendors round (80 GB read as GiB, 94 GB vs 96 GB usable)."""

_MEMORY = re.compile(r"(\d+)(gb|g)")
_SPLIT = re.compile(r"[\s_\-/]+")


def gpu_parts(name: str) -> tuple[str, str | None, float | None]:
    """(chip, form or None, memory in GB or None) of a GPU name."""
    chip, form, memory = [], None, None
    for word in _SPLIT.split(name.strip().lower()):
        size = _MEMORY.fullmatch(word)
        if not word or word in VENDOR_WORDS or word in MEMORY_KINDS:
            continue
        if word in FORMS:
            form = FORMS[word]
        elif size:
            memory = float(size.group(1))
        else:
            chip.append(word)
    return "".join(chip), form, memory


def gpu_candidates(
    name: str, ids: Mapping[str, float | None] | list[str] | tuple[str, ...]
) -> list[str]:
    """The ids among ``ids`` (optionally mapped to their HBM bytes) that ``name`` may name: the
    exact id, the id in any case, else those whose chip, form and memory agree with the name's
    (see the module docstring), narrowed to the catalog's unqualified id where it is one."""
    hbm = dict(ids) if isinstance(ids, Mapping) else dict.fromkeys(ids)
    if name in hbm:
        return [name]
    lower = {i.lower(): i for i in hbm}
    if name.lower() in lower:
        return [lower[name.lower()]]
    chip, form, memory = gpu_parts(name)
    found = [i for i in hbm if gpu_parts(i)[0] == chip]
    if form is not None:
        found = [i for i in found if gpu_parts(i)[1] in (form, None)]
    else:
        found = [i for i in found if gpu_parts(i)[1] in DEFAULT_FORMS] or found
    if memory is not None:
        found = [i for i in found if _memory_agrees(memory, i, hbm[i])]
    bare = [i for i in found if gpu_parts(i)[1:] == (None, None)]
    return bare if len(found) > 1 and len(bare) == 1 else found


def resolve_gpu_id(
    name: str, ids: Mapping[str, float | None] | list[str] | tuple[str, ...]
) -> str | None:
    """The one catalog id ``name`` names (``gpu_candidates``), or None (none, or several)."""
    found = gpu_candidates(name, ids)
    return found[0] if len(found) == 1 else None


def _memory_agrees(stated_gb: float, gpu_id: str, hbm_bytes: float | None) -> bool:
    """The id states the same size, or its row's HBM capacity (GiB or GB) is within the
    tolerance of the stated one."""
    own = gpu_parts(gpu_id)[2]
    if own is not None:
        return own == stated_gb
    if hbm_bytes is None:
        return True
    sizes = (hbm_bytes / 2**30, hbm_bytes / 1e9)
    return any(abs(s - stated_gb) <= MEMORY_TOLERANCE * stated_gb for s in sizes)
