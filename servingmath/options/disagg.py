"""``--disagg P:D [--prefill-gpu --decode-gpu --transfer-bw]``: the two pools of a disaggregated
deployment (GPU counts, hardware, deployments, KV hand-off bandwidth) and each pool's efficiency.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import equinox as eqx

import perfmodel as pm
from perfmodel import CatalogError, Deployment, HardwareSpec

from ..errors import UsageError
from .posterior import resolve_efficiency


def parse_pools(text: str) -> tuple[int, int]:
    """``--disagg P:D`` -> (prefill GPUs, decode GPUs), each >= 1."""
    try:
        p, d = (int(x) for x in text.split(":"))
    except ValueError:
        raise UsageError(
            f"--disagg {text!r} is not PREFILL_GPUS:DECODE_GPUS; pass e.g. --disagg 4:4"
        ) from None
    if p < 1 or d < 1:
        raise UsageError(
            f"--disagg {text}: each pool needs at least one GPU; pass e.g. --disagg 4:4"
        )
    return p, d


def _hardware(name: str | None, default: HardwareSpec, args: argparse.Namespace) -> HardwareSpec:
    if name is None:
        return default
    try:
        return pm.load_hardware(name, hardware_csv=getattr(args, "hardware_csv", None))
    except CatalogError as exc:
        raise UsageError(str(exc)) from None


def pool_deployment(deployment: Deployment, gpus: int, flag: str) -> Deployment:
    """``deployment`` with as many TP x PP replicas as ``gpus`` holds (a whole multiple)."""
    group = int(deployment.tp) * int(deployment.pp)
    if gpus % group:
        raise UsageError(
            f"{flag}: {gpus} GPUs is not a multiple of TP x PP = {group}; pass a multiple"
        )
    return eqx.tree_at(lambda d: d.replicas, deployment, float(gpus // group))


class DisaggPools(NamedTuple):
    """The two pools ``--disagg P:D [--prefill-gpu --decode-gpu --transfer-bw]`` describe."""

    prefill_gpus: int
    decode_gpus: int
    prefill_hardware: pm.HardwareSpec
    decode_hardware: pm.HardwareSpec
    prefill: pm.Deployment
    decode: pm.Deployment
    transfer_bytes_per_s: float


def disagg_pools(args, hardware, deployment) -> DisaggPools:
    """Resolve the pools' GPU counts, hardware, deployments and KV hand-off bandwidth."""
    p_gpus, d_gpus = parse_pools(args.disagg)
    hw_p = _hardware(args.prefill_gpu, hardware, args)
    hw_d = _hardware(args.decode_gpu, hardware, args)
    pre = pool_deployment(deployment, p_gpus, "--disagg prefill pool")
    dec = pool_deployment(deployment, d_gpus, "--disagg decode pool")
    bw = args.transfer_bw if args.transfer_bw is not None else float(hw_p.internode_bytes_per_s)
    return DisaggPools(p_gpus, d_gpus, hw_p, hw_d, pre, dec, bw)


def pool_efficiency(args, hardware, efficiency, pool_hardware, resolve=None) -> pm.Efficiency:
    """A pool's efficiency: the command's own where the pool runs the command's GPU, else
    ``resolve(args, pool_hardware)`` (default: the median of that GPU's posterior draws, or the
    spec-sheet defaults under ``--prior``)."""
    if pool_hardware.name == hardware.name:
        return efficiency
    if resolve is None:
        return resolve_efficiency(args, pool_hardware, args.weight_dtype)[0]
    return resolve(args, pool_hardware)
