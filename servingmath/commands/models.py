"""``servingmath models``: the model catalog."""

from __future__ import annotations

import argparse
import json

import perfmodel as pm

HELP = "list models in the catalog with parameter counts and KV bytes per token"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    rows = []
    for mid in pm.model_ids():
        try:
            m = pm.load_model(mid)
        except pm.CatalogError as exc:
            rows.append({"id": mid, "error": str(exc)})
            continue
        rows.append(
            {
                "id": mid,
                "total_params": float(m.total_params),
                "active_params": float(m.active_params),
                "kv_bytes_per_token_bf16": float(pm.kv_bytes_per_token(m, 2.0)),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'id':<48}{'params B':>10}{'active B':>10}{'KV KiB/tok':>12}")
    for r in rows:
        if "error" in r:
            print(f"{r['id']:<48}  (no dimensions: {r['error']})")
            continue
        print(
            f"{r['id']:<48}{r['total_params'] / 1e9:>10.1f}{r['active_params'] / 1e9:>10.1f}"
            f"{r['kv_bytes_per_token_bf16'] / 1024:>12.1f}"
        )
    return 0
