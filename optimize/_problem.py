"""One decision problem: model, candidate GPUs, workload, SLO, confidence and the knob grid.

Everything the search and the exhaustive referee need is in one ``Problem`` pytree, so both are
pure functions of it and compile once per grid shape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp

from perfmodel import (
    Efficiency,
    HardwareSpec,
    ModelSpec,
    engine_prefill_first,
    load_hardware,
    unnamed,
)
from perfmodel.features import DEFAULT_ORCHESTRATION_S, DEFAULT_TRANSFER_LATENCY_S

from ._draws import efficiency_draws_for
from ._grid import Grid
from ._metrics import Workload, served_max_model_len

DEFAULT_CONFIDENCE = 0.9
"""Probability over the posterior with which every constraint must hold."""


class Problem(eqx.Module):
    """A cost-minimisation problem with chance constraints over posterior draws.

    Attributes:
        model: the served model.
        hardware: candidate GPUs, leaves stacked on a leading axis (order of ``gpus`` given to ``make_problem``).
        efficiency: posterior draws per GPU, leaves of shape (gpus, draws).
        workload: the target load (all replicas share it).
        slo_ttft_p95_s: p95 time-to-first-token bound (``inf`` = no bound).
        slo_tpot_p95_s: p95 time-per-output-token bound (``inf`` = no bound).
        confidence: required probability, over draws, that every constraint holds.
        kv_penalty_fraction: relative cost surcharge per KV dtype (quality penalty), >= 0.
        weight_penalty_fraction: relative cost surcharge per weight dtype, >= 0.
        spec_acceptance: per-token draft acceptance alpha for each ``grid.spec_k`` choice.
        draft_model: speculative draft (the target itself when drafting with MTP heads).
        draft_is_mtp: whether the draft is MTP heads.
        transfer_bytes_per_s: KV hand-off bandwidth per device between pools (<= 0: the
            prefill GPU's inter-node network).
        transfer_latency_s, orchestration_s: fixed costs of a hand-off and of the two-scheduler
            hop (``perfmodel.features`` defaults).
        grid: the discrete choices (static; GPU names live with the caller, in ``gpus`` order).
        slo_itl_p95_s: p95 inter-token latency bound, over gaps (``inf`` = no bound).
        max_model_len_tokens: the context every engine must admit (vLLM ``--max-model-len``):
            one sequence of it must fit the KV cache, or the engine does not start (0 = the
            workload's own, ``served_max_model_len``, with no further check).
        prefix_shared_fraction, prefix_tokens: a share of requests opens with a shared prefix of
            that many tokens, which a prefix cache serves from KV (the hit rate of each
            configuration's own cache at its load, ``perfmodel.features.prefix_workload``).
        prefix_cache: whether the workload has a shared prefix (static: the evaluation prices
            the cache only then).
        prefill_first: 1 when the engine prefills waiting prompts in iterations of their own
            (``perfmodel.Deployment.prefill_first``, ``perfmodel.PREFILL_FIRST_ENGINES``): every
            engine the problem prices runs that scheduler, which sets a closed loop at fixed
            lengths in lockstep (``perfmodel.dynamics.lockstep_share``).
    """

    model: ModelSpec
    hardware: HardwareSpec
    efficiency: Efficiency
    workload: Workload
    slo_ttft_p95_s: jnp.ndarray = eqx.field(converter=jnp.asarray)
    slo_tpot_p95_s: jnp.ndarray = eqx.field(converter=jnp.asarray)
    confidence: jnp.ndarray = eqx.field(converter=jnp.asarray)
    kv_penalty_fraction: jnp.ndarray = eqx.field(converter=jnp.asarray)
    weight_penalty_fraction: jnp.ndarray = eqx.field(converter=jnp.asarray)
    spec_acceptance: jnp.ndarray = eqx.field(converter=jnp.asarray)
    draft_model: ModelSpec
    draft_is_mtp: bool = eqx.field(static=True)
    transfer_bytes_per_s: jnp.ndarray = eqx.field(converter=jnp.asarray)
    transfer_latency_s: jnp.ndarray = eqx.field(converter=jnp.asarray)
    orchestration_s: jnp.ndarray = eqx.field(converter=jnp.asarray)
    grid: Grid = eqx.field(static=True)
    slo_itl_p95_s: jnp.ndarray = eqx.field(converter=jnp.asarray, default=math.inf)
    max_model_len_tokens: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    prefix_shared_fraction: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    prefix_tokens: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)
    prefix_cache: bool = eqx.field(static=True, default=False)
    prefill_first: jnp.ndarray = eqx.field(converter=jnp.asarray, default=0.0)

    @property
    def num_draws(self) -> int:
        return int(self.efficiency.bandwidth_fraction.shape[-1])


def stack_hardware(specs: list[HardwareSpec]) -> HardwareSpec:
    """Stack specs on a leading axis; a missing link bandwidth (NaN) becomes 0 so mixing stays finite."""
    stacked = jax.tree.map(
        lambda *leaves: jnp.stack([jnp.asarray(x, dtype=float) for x in leaves]),
        *(unnamed(h, "candidates") for h in specs),
    )
    return dataclasses.replace(stacked, link_bytes_per_s=jnp.nan_to_num(stacked.link_bytes_per_s))


def anonymous_model(model: ModelSpec) -> ModelSpec:
    """The same spec without its (static) name, so one compiled search serves every model."""
    return unnamed(model, "model")


def make_problem(
    model: ModelSpec,
    gpus: tuple[str, ...] | list[str],
    workload: Workload,
    *,
    slo_ttft_p95_s: float | None = None,
    slo_tpot_p95_s: float | None = None,
    slo_itl_p95_s: float | None = None,
    max_model_len: int | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    grid: Grid | None = None,
    efficiency: Efficiency | None = None,
    posterior=None,
    num_draws: int = 200,
    seed: int = 0,
    quality_penalty: Mapping[str, float] | None = None,
    hardware: list[HardwareSpec] | None = None,
    prices_csv: str | None = None,
    hardware_csv: str | None = None,
    spec_draft: ModelSpec | str | None = None,
    spec_acceptance: float | None = None,
    transfer_bytes_per_s: float | None = None,
    prefix_reuse: float | None = None,
    prefix_tokens: float | None = None,
    engine: str | None = None,
) -> Problem:
    """Assemble a ``Problem``; raises ``ValueError`` naming the fix for bad input.

    Args:
        model: served model.
        gpus: candidate hardware ids (``data/hardware.csv`` or ``hardware_csv``).
        workload: target load.
        slo_ttft_p95_s, slo_tpot_p95_s, slo_itl_p95_s: SLO bounds in seconds (ITL: one gap
            between consecutive tokens, its p95 over gaps); ``None`` = unbounded.
        max_model_len: the context the deployment must serve, tokens; the engines get
            max(it, ``served_max_model_len(workload)``) and a configuration whose KV cache
            cannot hold one sequence of that length is infeasible.  ``ValueError`` when no
            GPU in ``gpus`` holds one at the grid's largest TP x PP and smallest dtypes.
        confidence: probability in (0, 1) that all constraints hold.
        grid: knob choices (default ``Grid(len(gpus))``).
        efficiency: draws with leaves (gpus, draws); default from ``posterior`` or the prior.
        posterior: a fitted posterior for ``fitting.efficiency_draws``.
        num_draws, seed: draws per GPU and their seed.
        quality_penalty: ``{dtype: fraction}`` cost surcharge when the KV or weight dtype is used.
        hardware: already-loaded specs (skips the catalog).
        prices_csv, hardware_csv: user catalogs for ``load_hardware``.
        spec_draft: a draft ``ModelSpec`` or ``"mtp"``; required when ``grid.spec_k`` offers k > 0.
        spec_acceptance: per-token acceptance alpha in [0, 1]; default the prior (mean alpha of
            the measured acceptance lengths at each k, ``perfmodel.features.acceptance_prior``).
        transfer_bytes_per_s: KV hand-off bandwidth between pools (default: inter-node network).
        prefix_reuse, prefix_tokens: share of requests (0..1] that open with one shared prefix of
            ``prefix_tokens`` tokens, served from a prefix cache; priced for colocated engines
            without speculation (``ValueError`` when the grid offers pool splits or k > 0).
        engine: the serving engine whose fitted end-to-end offsets scale TTFT and TPOT in the
            posterior draws (``fitting.efficiency_draws``; None: pooled) and whose scheduler the
            engines run (``prefill_first``).
    """
    gpus = tuple(gpus)
    _check_question(
        gpus, confidence, (slo_ttft_p95_s, slo_tpot_p95_s, slo_itl_p95_s), max_model_len
    )
    specs = hardware or [
        load_hardware(g, prices_csv=prices_csv, hardware_csv=hardware_csv) for g in gpus
    ]
    _require_prices(gpus, specs)
    grid = grid or Grid(num_gpus=len(gpus))
    if grid.num_gpus != len(gpus):
        raise ValueError(f"grid has {grid.num_gpus} GPU slots but {len(gpus)} GPUs were given")
    if efficiency is None:
        efficiency = efficiency_draws_for(
            gpus, num_draws, posterior=posterior, seed=seed, engine=engine
        )
    prefix = _prefix(grid, prefix_reuse, prefix_tokens)
    penalty = dict(quality_penalty or {})
    draft, mtp, alphas = _speculation(model, grid, spec_draft, spec_acceptance)
    if transfer_bytes_per_s is not None and not transfer_bytes_per_s > 0:
        raise ValueError(
            f"KV transfer bandwidth {transfer_bytes_per_s} must be a positive number of bytes/s"
        )
    context = 0.0
    if max_model_len is not None:
        context = max(float(max_model_len), float(served_max_model_len(workload)))
        _require_context_fits(model, gpus, specs, grid, context)
    return Problem(
        model=anonymous_model(model),
        hardware=stack_hardware(specs),
        efficiency=efficiency,
        workload=workload,
        slo_ttft_p95_s=math.inf if slo_ttft_p95_s is None else slo_ttft_p95_s,
        slo_tpot_p95_s=math.inf if slo_tpot_p95_s is None else slo_tpot_p95_s,
        confidence=confidence,
        kv_penalty_fraction=[penalty.get(d, 0.0) for d in grid.kv_dtypes],
        weight_penalty_fraction=[penalty.get(d, 0.0) for d in grid.weight_dtypes],
        spec_acceptance=alphas,
        draft_model=anonymous_model(draft),
        draft_is_mtp=mtp,
        transfer_bytes_per_s=0.0 if transfer_bytes_per_s is None else transfer_bytes_per_s,
        transfer_latency_s=DEFAULT_TRANSFER_LATENCY_S,
        orchestration_s=DEFAULT_ORCHESTRATION_S,
        grid=grid,
        slo_itl_p95_s=math.inf if slo_itl_p95_s is None else slo_itl_p95_s,
        max_model_len_tokens=context,
        prefill_first=engine_prefill_first(engine),
        **prefix,
    )


def _check_question(
    gpus: tuple[str, ...],
    confidence: float,
    slos_s: tuple[float | None, float | None, float | None],
    max_model_len: int | None,
) -> None:
    """``ValueError`` naming the fix for a question that cannot be asked: no GPUs, a confidence
    outside (0, 1), a (TTFT, TPOT, ITL) bound that is not a positive number of seconds, a
    context that is not a positive number of tokens."""
    if not gpus:
        raise ValueError("no candidate GPUs; pass at least one hardware id")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} must be strictly between 0 and 1, e.g. 0.9")
    for label, v in zip(("TTFT", "TPOT", "ITL"), slos_s):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{label} SLO {v} must be a positive number of seconds")
    if max_model_len is not None and not (
        isinstance(max_model_len, int | float)
        and math.isfinite(max_model_len)
        and max_model_len >= 1
    ):
        raise ValueError(f"max_model_len {max_model_len} must be a positive number of tokens")


def _require_prices(gpus: tuple[str, ...], specs: list[HardwareSpec]) -> None:
    """``ValueError`` naming the fix for a candidate GPU without a price (its cost is the
    objective)."""
    for g, h in zip(gpus, specs):
        if not math.isfinite(float(h.price_per_gpu_hour)):
            raise ValueError(
                f"no price for GPU {g!r}; add a row with gpu={g},price_per_gpu_hour=... to a "
                "prices CSV and pass it with --prices"
            )


def _prefix(grid: Grid, share: float | None, tokens: float | None) -> dict:
    """``Problem`` fields of a shared prefix; ``ValueError`` naming the fix for bad values."""
    if share is None and tokens is None:
        return {}
    if share is None or tokens is None:
        raise ValueError("a shared prefix needs both its share of requests and its length")
    if not (0.0 < share <= 1.0):
        raise ValueError(f"prefix reuse {share} must be a share of requests in (0, 1]")
    if not (math.isfinite(tokens) and tokens >= 1.0):
        raise ValueError(f"prefix length {tokens} must be a positive number of tokens")
    if grid.disaggregated or max(grid.spec_k) > 0:
        raise ValueError(
            "prefix reuse is priced for colocated engines without speculation; offer no pool "
            "split (--pool-ratios none) and no draft (drop --spec-draft)"
        )
    return {"prefix_shared_fraction": share, "prefix_tokens": tokens, "prefix_cache": True}


def require_peak_capacity(problem: Problem, gpus: tuple[str, ...]) -> None:
    """``ValueError`` naming the fix when an open-loop load exceeds what every GPU the search may
    use could serve at its peak.  Each output token costs at least one forward pass over the
    active parameters other than the embedding lookup, 2 (N_active - N_embedding) FLOPs (Kaplan
    et al. 2020), with prompts and attention on top; the answer is at most ``max_replicas`` units
    of the grid's largest engine (TP x PP, times the prefill and decode engines of a pool split)
    on the fastest GPU (``gpus``: the candidates' ids) at its highest dense rate.  A necessary
    condition only: it catches loads off by orders of magnitude before anything compiles; the
    search decides the rest."""
    workload, grid, model = problem.workload, problem.grid, problem.model
    rate = float(workload.arrival_rate_per_s)
    if float(workload.concurrency) > 0 or not (math.isfinite(rate) and rate > 0):
        return
    flops_per_token = 2.0 * (float(model.active_params) - float(model.embedding_params))
    engines_per_unit = max([1] + [p + d for p, d in grid.pool_ratios])
    per_replica = engines_per_unit * max(grid.tp) * max(grid.pp)
    most_gpus = grid.max_replicas * per_replica
    most_tokens_per_s = (
        most_gpus * float(jnp.max(problem.hardware.dense_flops_per_s)) / flops_per_token
    )
    wanted = rate * float(workload.output_tokens_mean)
    if not wanted > most_tokens_per_s:
        return
    raise ValueError(
        f"--rate {rate:g}/s x {float(workload.output_tokens_mean):g} output tokens is "
        f"{wanted:.3g} tokens/s, more than {most_gpus} GPUs (--max-replicas "
        f"{grid.max_replicas} x {per_replica} per replica) could generate even at the peak "
        f"FLOPs of the fastest of {','.join(gpus)} ({most_tokens_per_s:.3g} tokens/s); lower "
        "--rate or raise --max-replicas"
    )


def _require_context_fits(model, gpus, specs, grid: Grid, context: float) -> None:
    """``ValueError`` naming the fix when no GPU of ``gpus`` holds the KV of one ``context``-token
    sequence in any grid configuration: the most room is the largest legal TP x PP (the weights
    and the KV split over most devices) with the smallest weight and KV dtypes."""
    from perfmodel import DTYPE_BYTES, Deployment, max_concurrent_requests

    kv = min(DTYPE_BYTES[d] for d in grid.kv_dtypes)
    weight = min(DTYPE_BYTES[d] for d in grid.weight_dtypes)
    heads = int(model.num_heads)
    best = None  # (tokens one sequence may hold, gpu, tp, pp)
    for g, h in zip(gpus, specs):
        for tp in (t for t in grid.tp if heads % t == 0):
            for pp in grid.pp:
                dep = Deployment(
                    tp=float(tp),
                    pp=float(pp),
                    weight_bytes_per_param=weight,
                    kv_bytes_per_elem=kv,
                    max_num_batched_tokens=float(min(grid.max_num_batched_tokens)),
                    microbatches=float(pp),
                )
                if float(max_concurrent_requests(model, h, dep, context)) >= 1.0:
                    return
                room = float(max_concurrent_requests(model, h, dep, 1.0))  # one-block sequences
                tokens = room * float(dep.block_size_tokens)
                if best is None or tokens > best[0]:
                    best = (tokens, g, tp, pp)
    tokens, g, tp, pp = best if best is not None else (0.0, gpus[0], 1, 1)
    w_name = min(grid.weight_dtypes, key=DTYPE_BYTES.get)
    kv_name = min(grid.kv_dtypes, key=DTYPE_BYTES.get)
    raise ValueError(
        f"max_model_len {int(context)}: no GPU in {','.join(gpus)} holds the KV of one sequence "
        f"that long (the most room, {g} TP{tp} PP{pp} with {w_name} weights and {kv_name} KV, "
        f"holds about {int(tokens):,} tokens); raise TP / choose a larger GPU / lower "
        "--max-model-len"
    )


def _speculation(model: ModelSpec, grid: Grid, spec_draft, acceptance: float | None):
    """(draft spec, is-MTP flag, alpha per ``grid.spec_k`` choice); ``ValueError`` naming the fix."""
    if spec_draft is None:
        if grid.speculative:
            raise ValueError("speculative k > 0 needs a draft: pass spec_draft (a model or 'mtp')")
        return model, True, [0.0] * len(grid.spec_k)
    mtp = isinstance(spec_draft, str)
    if mtp and spec_draft.lower() != "mtp":
        raise ValueError(f"spec_draft {spec_draft!r}: pass a draft ModelSpec or 'mtp'")
    draft = model if mtp else spec_draft
    if not mtp and float(draft.total_params) >= float(model.total_params):
        raise ValueError(
            f"draft {draft.name} is not smaller than {model.name}; pick a smaller draft or mtp"
        )
    if acceptance is not None:
        if not (math.isfinite(acceptance) and 0.0 <= acceptance <= 1.0):
            raise ValueError(f"speculative acceptance {acceptance} must be in [0, 1], e.g. 0.7")
        return draft, mtp, [float(acceptance)] * len(grid.spec_k)
    from perfmodel.features import acceptance_prior, load_acceptance

    records = load_acceptance()
    method = "mtp" if mtp else None
    alphas = []
    for k in grid.spec_k:
        ks = k if any(r.draft_tokens == k for r in records) else None
        alphas.append(acceptance_prior(records, method, ks)[0] if k > 0 else 0.0)
    return draft, mtp, alphas
