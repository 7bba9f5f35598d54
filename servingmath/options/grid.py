"""The knob grid the search walks (``optimize``, ``fleet``, ``forecast``; ``pareto`` reads its
dtypes and MoE layouts): --kv-dtypes / --weight-dtypes, --chunk-sizes, --pool-ratios,
--moe-layouts and, with --spec-draft, the draft lengths.  ``grid_from_args`` builds
``optimize.Grid`` from them, with a one-line ``UsageError`` for a bad list.
"""

from __future__ import annotations

import argparse

from ..errors import UsageError
from .speculation import SPEC_K
from .validators import positive_float

DEFAULT_CHUNKS = "512,1024,2048,4096,8192"


DEFAULT_POOL_RATIOS = "1:1,2:1,3:1,1:2"


def add_chunk_argument(
    parser: argparse.ArgumentParser, default: str | None = DEFAULT_CHUNKS
) -> None:
    """--chunk-sizes: the prefill chunks the search offers (optimize, fleet, forecast; None:
    one chunk, the whole token budget)."""
    said = default if default is not None else "one chunk of max_num_batched_tokens"
    parser.add_argument(
        "--chunk-sizes",
        default=default,
        metavar="N,...",
        help=f"prefill chunk sizes to consider (<= max_num_batched_tokens; default {said})",
    )


def add_pool_ratio_argument(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """--pool-ratios and --transfer-bw: the prefill:decode engine ratios of disaggregated pools
    the search offers (optimize: None, the default ratios unless a prefix cache is priced; fleet
    and forecast: "none", colocated unless asked, and a split's two pools then share one GPU
    type, since they count GPUs per type) and the pools' KV hand-off bandwidth."""
    if default is None:
        text = f"default {DEFAULT_POOL_RATIOS}; none with --prefix-reuse"
    else:
        text = f"default {default}; both pools on one GPU type, as the fleet counts GPUs per type"
    parser.add_argument(
        "--pool-ratios",
        default=default,
        metavar="P:D,...",
        help=f"prefill:decode engine ratios of disaggregated pools to consider, or none ({text})",
    )
    parser.add_argument(
        "--transfer-bw",
        type=positive_float,
        metavar="BYTES_PER_S",
        help="KV hand-off bandwidth per GPU between pools (default: inter-node network)",
    )


def add_moe_layout_argument(parser: argparse.ArgumentParser) -> None:
    """--moe-layouts: how a MoE model's TP ranks may split its layers (optimize, fleet,
    forecast)."""
    parser.add_argument(
        "--moe-layouts",
        default=None,
        metavar="NAME,...",
        help="MoE models: layouts to consider among tp (experts split by TP), ep (whole experts "
        "per rank, EP = TP), ep/2 (EP = TP / 2, each expert split over 2 ranks) and ep+dp (also "
        "attention data-parallel on every rank); default all four for a MoE model, tp for a "
        "dense one",
    )


def check_checkpoint_weights(args: argparse.Namespace) -> None:
    """--weight-dtypes leaves room for a pre-quantized checkpoint's own dtype (before any work)."""
    model, text = getattr(args, "model", None), getattr(args, "weight_dtypes", None)
    if model and text:
        _checkpoint_weight_dtypes(model, tuple(t.strip() for t in text.split(",") if t.strip()))


def check_moe_layout_argument(args: argparse.Namespace) -> None:
    """A bad --moe-layouts is refused before any work (the model's config is enough; an
    unknown model is left to the command's own one-line refusal)."""
    if getattr(args, "moe_layouts", None) is None:
        return
    from perfmodel import CatalogError, load_model

    try:
        model = load_model(args.model)
    except CatalogError:
        return
    _moe_layouts(args, model)


def _moe_layouts(args: argparse.Namespace, model) -> tuple[str, ...]:
    from optimize import MOE_LAYOUTS

    moe = model is not None and bool(model.has_routed_experts)
    text = getattr(args, "moe_layouts", None)
    if text is None:
        return tuple(MOE_LAYOUTS) if moe else ("tp",)
    items = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in items if t not in MOE_LAYOUTS]
    if bad or not items:
        raise UsageError(
            f"--moe-layouts: unknown layout {bad[0] if bad else '(empty)'!r}; use some of "
            f"{','.join(MOE_LAYOUTS)}"
        )
    if model is not None and not moe and items != ("tp",):
        raise UsageError(
            f"--moe-layouts {text}: {model.name} has no routed experts, so only tp applies; "
            "drop --moe-layouts"
        )
    return items


def _checkpoint_weight_dtypes(model: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A pre-quantized checkpoint (its id says ``-FP8``, ``-AWQ``, ...) is served in its own
    dtype only: the allowed list narrows to it, or is refused when it leaves it out."""
    from perfmodel import checkpoint_weight_dtype

    stated = checkpoint_weight_dtype(model)
    if stated is None:
        return allowed
    if stated not in allowed:
        raise UsageError(
            f"--model {model} is a pre-quantized {stated} checkpoint (its name says so); "
            f"pass --weight-dtypes {stated}, or the base model's id to consider "
            f"{','.join(allowed)} weights"
        )
    return (stated,)


def grid_from_args(args: argparse.Namespace, num_gpus: int, max_replicas: int, model=None):
    """The knob grid with the dtypes the user allows (``model``: the MoE layouts it may take)."""
    from optimize import Grid
    from perfmodel import DTYPE_BYTES

    dtypes = {}
    for flag, text in (("--kv-dtypes", args.kv_dtypes), ("--weight-dtypes", args.weight_dtypes)):
        items = tuple(t.strip() for t in text.split(",") if t.strip())
        bad = [t for t in items if t not in DTYPE_BYTES]
        if bad or not items:
            raise UsageError(
                f"{flag}: unknown dtype {bad[0] if bad else '(empty)'!r}; use some of "
                f"{','.join(DTYPE_BYTES)}"
            )
        dtypes[flag] = items
    dtypes["--weight-dtypes"] = _checkpoint_weight_dtypes(args.model, dtypes["--weight-dtypes"])
    if max_replicas < 1:
        raise UsageError(f"--max-replicas must be >= 1, got {max_replicas}")
    extra = {}
    if getattr(args, "chunk_sizes", None) is not None:
        extra["chunk_sizes"] = _int_list(args.chunk_sizes, "--chunk-sizes", "512,2048,8192")
        if min(extra["chunk_sizes"]) > max(Grid(1).max_num_batched_tokens):
            raise UsageError(
                f"--chunk-sizes: every chunk exceeds the largest token budget "
                f"{max(Grid(1).max_num_batched_tokens)}; pass smaller chunks, e.g. 512,2048"
            )
    if getattr(args, "pool_ratios", None) is not None:
        extra["pool_ratios"] = _ratios(args.pool_ratios)
    elif hasattr(args, "pool_ratios") and getattr(args, "prefix_reuse", None) is None:
        # a prefix cache is priced for colocated engines: no default pool split beside it
        extra["pool_ratios"] = _ratios(DEFAULT_POOL_RATIOS)
    if getattr(args, "spec_draft", None):
        extra["spec_k"] = SPEC_K
    if getattr(args, "scheduler_recv_interval", None) is not None:
        extra["scheduler_polls"] = int(args.scheduler_recv_interval)
    extra["moe_layouts"] = _moe_layouts(args, model)
    return Grid(
        num_gpus=num_gpus,
        kv_dtypes=dtypes["--kv-dtypes"],
        weight_dtypes=dtypes["--weight-dtypes"],
        max_replicas=max_replicas,
        **extra,
    )


def _int_list(text: str, flag: str, example: str) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise UsageError(
            f"{flag} {text!r} must be positive integers, comma-separated, e.g. {example}"
        )
    return tuple(sorted(set(values)))


def _ratios(text: str) -> tuple[tuple[int, int], ...]:
    """``1:1,2:1`` -> ((1, 1), (2, 1)); ``none`` -> () (colocated only)."""
    if text.strip().lower() in ("none", "off", ""):
        return ()
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            p, d = (int(x) for x in item.split(":"))
        except ValueError:
            p = d = 0
        if p < 1 or d < 1:
            raise UsageError(
                f"--pool-ratios: {item!r} is not PREFILL:DECODE engines (each >= 1); "
                "pass e.g. --pool-ratios 1:1,2:1 or none"
            )
        out.append((p, d))
    return tuple(dict.fromkeys(out))
