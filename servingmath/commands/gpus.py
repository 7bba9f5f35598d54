"""``servingmath gpus``: the hardware catalog."""

from __future__ import annotations

import argparse
import json
import math

import perfmodel as pm

from ..errors import UsageError

HELP = "list accelerators in the hardware catalog with their peak budgets and price"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware-csv", help="your own hardware CSV instead of the bundled one")
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    rows = []
    try:
        for gid in pm.hardware_ids(args.hardware_csv):
            try:
                hw = pm.load_hardware(gid, hardware_csv=args.hardware_csv)
            except pm.CatalogError as exc:
                rows.append({"id": gid, "error": str(exc)})
                continue
            price = float(hw.price_per_gpu_hour)
            rows.append(
                {
                    "id": gid,
                    "hbm_bytes": float(hw.hbm_bytes),
                    "hbm_bytes_per_s": float(hw.hbm_bytes_per_s),
                    "dense_bf16_flops_per_s": float(hw.dense_flops_per_s[0]),
                    "price_per_gpu_hour": None if math.isnan(price) else price,
                }
            )
    except pm.CatalogError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'id':<16}{'HBM GiB':>9}{'TB/s':>7}{'bf16 TFLOP/s':>14}{'$/GPU-h':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['id']:<16}  (incomplete row: {r['error']})")
            continue
        price = "-" if r["price_per_gpu_hour"] is None else f"{r['price_per_gpu_hour']:.2f}"
        print(
            f"{r['id']:<16}{r['hbm_bytes'] / pm.GiB:>9.0f}{r['hbm_bytes_per_s'] / 1e12:>7.2f}"
            f"{r['dense_bf16_flops_per_s'] / 1e12:>14.0f}{price:>9}"
        )
    return 0
