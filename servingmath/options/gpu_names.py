"""GPU names on the command line made catalog ids before any command reads them.

``--gpu``, ``--gpus``, ``--prefill-gpu`` / ``--decode-gpu`` and the keys of ``--max-gpus`` accept
what ``perfmodel.gpu_candidates`` reads (``H100``, ``NVIDIA H100 80GB HBM3``); each becomes the
one catalog id it names, so posteriors, prices and limits are looked up by that id.  A name that
fits no part or several is left as written, for the command's own one-line refusal."""

from __future__ import annotations

import argparse

import perfmodel as pm

SINGLE_GPU_FLAGS = ("gpu", "prefill_gpu", "decode_gpu")
"""Arguments that hold one GPU name."""


def canonical_gpu_arguments(args: argparse.Namespace) -> None:
    """Rewrite the GPU names in ``args`` as catalog ids, in place."""
    names = [getattr(args, f, None) for f in SINGLE_GPU_FLAGS]
    listed = getattr(args, "gpus", None)
    limits = getattr(args, "max_gpus", None)
    if not any(names) and not listed and not limits:
        return
    try:
        known = pm.hardware_capacities(getattr(args, "hardware_csv", None))
    except pm.CatalogError:
        return  # the command refuses the hardware CSV itself

    def canonical(name: str) -> str:
        found = pm.gpu_candidates(name.strip(), known)
        return found[0] if len(found) == 1 else name

    for flag, name in zip(SINGLE_GPU_FLAGS, names):
        if isinstance(name, str) and name:
            setattr(args, flag, canonical(name))
    if isinstance(listed, str):
        args.gpus = ",".join(canonical(g) if g.strip() else g for g in listed.split(","))
    if isinstance(limits, dict) and limits:
        args.max_gpus = {canonical(g): v for g, v in limits.items()}
