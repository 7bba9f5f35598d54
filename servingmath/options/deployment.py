"""Options shared by every command that describes one deployment (model, GPU, parallelism, dtypes).

``add_deployment_arguments`` declares them; ``resolve_deployment`` turns parsed arguments into
spec pytrees, raising ``UsageError`` with a one-line fix for anything a user can get wrong.
"""

from __future__ import annotations

import argparse
import functools
import math

import jax.numpy as jnp

import perfmodel as pm
from perfmodel import (
    MTP_CONFIG_KEYS,
    CatalogError,
    Deployment,
    HardwareSpec,
    ModelSpec,
    mtp_layers,
    tp_divides_heads,
)
from perfmodel.dynamics import DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS

from ..errors import UsageError
from .validators import positive_int, scheduler_polls, utilization

DEFAULT_MAX_MODEL_LEN = 8192
"""``--max-model-len`` when none is given, unless the model's own context is shorter."""


def add_scheduler_argument(parser) -> None:
    """``--scheduler-recv-interval``: the engine's poll interval the deployment runs with (an
    arrival waits for the next poll, ``perfmodel._polling``)."""
    parser.add_argument(
        "--scheduler-recv-interval",
        type=scheduler_polls,
        default=1,
        metavar="ITERATIONS",
        help="decode iterations between the scheduler's polls for new requests (SGLang "
        "--scheduler-recv-interval; default 1, every iteration as vLLM and TensorRT-LLM do): "
        "an arrival waits (k - 1) / 2 iterations on average, which TTFT and E2E include",
    )


def add_deployment_arguments(parser: argparse.ArgumentParser) -> None:
    """Model, hardware, parallelism, dtypes and engine memory knobs."""
    g = parser.add_argument_group("deployment")
    g.add_argument(
        "--model", required=True, help="Hugging Face id, short alias, or a config.json path"
    )
    g.add_argument(
        "--gpu", required=True, help="hardware id from data/hardware.csv (see `servingmath gpus`)"
    )
    g.add_argument("--hardware-csv", help="your own hardware CSV (columns of data/hardware.csv)")
    g.add_argument("--prices-csv", help="your own price list (columns of data/prices.csv)")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument(
        "--pp", type=positive_int, default=1, help="pipeline-parallel degree (default 1)"
    )
    g.add_argument(
        "--replicas", type=positive_int, default=1, help="copies of the TP x PP group (default 1)"
    )
    g.add_argument(
        "--expert-parallel",
        type=positive_int,
        default=1,
        metavar="EP",
        help="MoE models: split the routed experts whole over EP of the TP ranks (SGLang "
        "--ep-size; vLLM --enable-expert-parallel is EP = TP); must divide --tp (default 1)",
    )
    g.add_argument(
        "--attention-dp",
        type=positive_int,
        default=1,
        metavar="DP",
        help="run attention data-parallel in DP groups of the TP ranks, each with its own "
        "sequences and KV (SGLang --enable-dp-attention --dp-size); must divide --tp (default 1)",
    )
    g.add_argument("--weight-dtype", default="bf16", choices=sorted(pm.DTYPE_BYTES))
    g.add_argument("--kv-dtype", default="bf16", choices=sorted(pm.DTYPE_BYTES))
    g.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help=f"longest admitted sequence (tokens; default {DEFAULT_MAX_MODEL_LEN:,} or the "
        "model's own context if shorter; at most that context, from its config.json)",
    )
    g.add_argument(
        "--block-size", type=positive_int, default=16, help="paged-KV block size (tokens)"
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=utilization,
        default=0.9,
        help="fraction of HBM the engine may use, in (0, 1] (default 0.9)",
    )
    add_scheduler_argument(g)
    g.add_argument(
        "--kv-allocation",
        choices=("paged", "static"),
        default="paged",
        help="paged blocks, or static max_model_len reservation per sequence",
    )


def add_length_arguments(parser) -> None:
    """``--input-len`` / ``--output-len``: every request's prompt and output tokens, defaulting
    to the one default request (``perfmodel.dynamics.DEFAULT_PROMPT_TOKENS`` /
    ``DEFAULT_OUTPUT_TOKENS``) that ``optimize``, ``fleet`` and ``forecast`` assume too."""
    parser.add_argument(
        "--input-len",
        type=positive_int,
        default=DEFAULT_PROMPT_TOKENS,
        help=f"prompt tokens (default {DEFAULT_PROMPT_TOKENS})",
    )
    parser.add_argument(
        "--output-len",
        type=positive_int,
        default=DEFAULT_OUTPUT_TOKENS,
        help=f"output tokens (default {DEFAULT_OUTPUT_TOKENS})",
    )


def positive(name: str, value: float) -> None:
    """Reject non-positive or non-finite numbers with a one-line fix."""
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name} must be a positive number, got {value}; pass e.g. {name} 1")


def require_mtp(model: str) -> None:
    """``--spec-draft mtp`` drafts with the model's own multi-token-prediction layers: refuse a
    model whose config has none (``UsageError`` naming the fix)."""
    try:
        layers = mtp_layers(model)
    except CatalogError as exc:
        raise UsageError(str(exc)) from None
    if layers < 1:
        raise UsageError(
            f"--spec-draft mtp needs multi-token-prediction layers, and {model}'s config has none "
            f"({MTP_CONFIG_KEYS[0]} is absent or 0); pass a smaller draft model instead, "
            "e.g. --spec-draft meta-llama/Llama-3.2-1B-Instruct"
        )


def resolve_model_and_gpu(args: argparse.Namespace) -> tuple[ModelSpec, HardwareSpec]:
    """Load the model and hardware named by ``--model`` / ``--gpu``."""
    try:
        model = pm.load_model(args.model)
        hardware = pm.load_hardware(
            args.gpu, hardware_csv=args.hardware_csv, prices_csv=args.prices_csv
        )
    except CatalogError as exc:
        raise UsageError(str(exc)) from None
    return model, hardware


def check_checkpoint_weight(args: argparse.Namespace) -> None:
    """A pre-quantized checkpoint (its id says ``-FP8``, ``-AWQ``, ...) is served in its own
    weight dtype: another ``--weight-dtype`` is refused before any work."""
    model, weights = getattr(args, "model", None), getattr(args, "weight_dtype", None)
    stated = pm.checkpoint_weight_dtype(model) if model else None
    if stated is not None and weights is not None and weights != stated:
        raise UsageError(
            f"--model {model} is a pre-quantized {stated} checkpoint (its name says so), "
            f"not {weights} weights; pass --weight-dtype {stated}, or the base "
            f"model's id for {weights} weights"
        )


def resolve_max_model_len(model: str, tokens: int | None) -> int:
    """The context the engine admits: ``tokens``, or ``DEFAULT_MAX_MODEL_LEN`` capped at the
    model's context (``pm.model_context_tokens``); a ``tokens`` above that context is a
    ``UsageError`` (vLLM refuses to start there)."""
    context = pm.model_context_tokens(model)
    if tokens is None:
        return DEFAULT_MAX_MODEL_LEN if context is None else min(DEFAULT_MAX_MODEL_LEN, context)
    if context is not None and tokens > context:
        raise UsageError(
            f"--max-model-len {tokens:,} exceeds {model}'s context of {context:,} tokens (its "
            f"config.json), above which vLLM refuses to start; pass at most {context}"
        )
    return tokens


def resolve_deployment(
    args: argparse.Namespace,
    *,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
) -> tuple[ModelSpec, HardwareSpec, Deployment]:
    """Specs for the deployment the arguments describe; bad combinations raise ``UsageError``."""
    model, hardware = resolve_model_and_gpu(args)
    args.max_model_len = resolve_max_model_len(args.model, args.max_model_len)
    for flag in ("tp", "pp", "replicas", "max_model_len", "block_size"):
        positive(f"--{flag.replace('_', '-')}", getattr(args, flag))
    if not 0 < args.gpu_memory_utilization <= 1:
        raise UsageError(
            f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}"
        )
    if not tp_divides_heads(model, args.tp):
        heads = int(model.num_heads)
        ok = [t for t in (1, 2, 4, 8, 16, 32, 64) if heads % t == 0]
        raise UsageError(
            f"--tp {args.tp} does not divide {model.name}'s {heads} attention heads; "
            f"use one of {', '.join(map(str, ok))}"
        )
    _check_group_split(args, model)
    if args.tp > 1 and not math.isfinite(float(hardware.link_bytes_per_s)):
        raise UsageError(
            f"{hardware.name} has no link bandwidth in the catalog, needed for --tp {args.tp}; "
            "pass --hardware-csv with link_bytes_per_s_unidir filled in"
        )
    knobs: dict[str, float | str] = {
        "max_model_len": float(args.max_model_len),
        "block_size_tokens": float(args.block_size),
        "gpu_memory_utilization": float(args.gpu_memory_utilization),
        "kv_allocation": args.kv_allocation,
        "scheduler_polls": float(args.scheduler_recv_interval),
        "expert_parallel": float(args.expert_parallel),
        "attention_dp": float(args.attention_dp),
        # the scheduler of the engine named (SGLang prefills first: a fixed-length closed loop
        # runs in lockstep, ``perfmodel._closed_loop``)
        "prefill_first": pm.engine_prefill_first(getattr(args, "engine", None)),
    }
    if max_num_batched_tokens is not None:
        knobs["max_num_batched_tokens"] = float(max_num_batched_tokens)
    if max_num_seqs is not None:
        knobs["max_num_seqs"] = float(max_num_seqs)
    deployment = Deployment.create(
        tp=args.tp,
        pp=args.pp,
        replicas=args.replicas,
        weight_dtype=args.weight_dtype,
        kv_dtype=args.kv_dtype,
        **knobs,
    )
    return model, hardware, deployment


def _check_group_split(args: argparse.Namespace, model: ModelSpec) -> None:
    """``--expert-parallel`` and ``--attention-dp`` split the TP ranks: each must divide ``--tp``,
    and expert parallelism needs routed experts."""
    for flag, value in (
        ("--expert-parallel", args.expert_parallel),
        ("--attention-dp", args.attention_dp),
    ):
        if args.tp % value:
            raise UsageError(
                f"{flag} {value} does not divide --tp {args.tp}: it splits the TP ranks; "
                f"pass a divisor of {args.tp} or raise --tp"
            )
    if args.expert_parallel > 1 and not bool(model.has_routed_experts):
        raise UsageError(
            f"--expert-parallel {args.expert_parallel} needs a mixture-of-experts model and "
            f"{model.name} has no routed experts; drop --expert-parallel"
        )


@functools.cache
def _seats_program():
    """``max_concurrent_requests`` as one program kept on disk (op by op: ~15 small compiles)."""
    from optimize import cached_jit  # optimize imports optax; only commands that price need it

    return cached_jit(pm.max_concurrent_requests)


def require_fit(
    model: ModelSpec, hardware: HardwareSpec, deployment: Deployment, sequence_tokens: float
) -> None:
    """Raise a ``UsageError`` naming the smallest TP x PP that fits when this one does not."""
    concurrent = float(
        _seats_program()(model, hardware, deployment, jnp.asarray(float(sequence_tokens)))
    )
    if concurrent >= 1.0:
        return
    tp, pp = int(deployment.tp), int(deployment.pp)
    need = pm.smallest_fitting_parallelism(model, hardware, deployment, sequence_tokens)
    weights_gib = float(pm.weight_bytes_per_gpu(model, deployment)) / pm.GiB
    usable_gib = float(hardware.hbm_bytes * deployment.gpu_memory_utilization) / pm.GiB
    what = (
        f"{model.name} does not fit on {hardware.name} at --tp {tp} --pp {pp}: "
        f"{weights_gib:.1f} GiB of weights per GPU against {usable_gib:.1f} GiB usable, "
        f"leaving no room for one {int(sequence_tokens)}-token sequence"
    )
    if need is None:
        raise UsageError(f"{what}; even 512 GPUs are not enough: use a smaller weight dtype")
    raise UsageError(f"{what}; the smallest that fits is --tp {need[0]} --pp {need[1]}")
