"""One decision problem: model, candidate GPUs, workload, SLO, confidence and the knob grid.

Everything the search and the exhaustive referee need is in one ``Problem`` pytree, so both are
pure functions of it and compile once per grid shape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import equinox as eqx
import jax.numpy as jnp

from perfmodel import Efficiency, HardwareSpec, ModelSpec, load_hardware

from ._draws import efficiency_draws_for
from ._grid import Grid
from ._metrics import Workload

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
        grid: the discrete choices (static; GPU names live with the caller, in ``gpus`` order).
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
    grid: Grid = eqx.field(static=True)

    @property
    def num_draws(self) -> int:
        return int(self.efficiency.bandwidth_fraction.shape[-1])


def stack_hardware(specs: list[HardwareSpec]) -> HardwareSpec:
    """Stack specs on a leading axis; a missing link bandwidth (NaN) becomes 0 so mixing stays finite."""
    fields = {}
    for name in (f.name for f in dataclasses.fields(HardwareSpec) if f.name != "name"):
        fields[name] = jnp.stack([jnp.asarray(getattr(h, name), dtype=float) for h in specs])
    fields["link_bytes_per_s"] = jnp.nan_to_num(fields["link_bytes_per_s"])
    return HardwareSpec(name="candidates", **fields)


def anonymous_model(model: ModelSpec) -> ModelSpec:
    """The same spec without its (static) name, so one compiled search serves every model."""
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(ModelSpec)}
    fields["name"] = "model"
    return ModelSpec(**fields)


def make_problem(
    model: ModelSpec,
    gpus: tuple[str, ...] | list[str],
    workload: Workload,
    *,
    slo_ttft_p95_s: float | None = None,
    slo_tpot_p95_s: float | None = None,
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
) -> Problem:
    """Assemble a ``Problem``; raises ``ValueError`` naming the fix for bad input.

    Args:
        model: served model.
        gpus: candidate hardware ids (``data/hardware.csv`` or ``hardware_csv``).
        workload: target load.
        slo_ttft_p95_s, slo_tpot_p95_s: SLO bounds in seconds; ``None`` = unbounded.
        confidence: probability in (0, 1) that all constraints hold.
        grid: knob choices (default ``Grid(len(gpus))``).
        efficiency: draws with leaves (gpus, draws); default from ``posterior`` or the prior.
        posterior: a fitted posterior for ``fitting.efficiency_draws``.
        num_draws, seed: draws per GPU and their seed.
        quality_penalty: ``{dtype: fraction}`` cost surcharge when the KV or weight dtype is used.
        hardware: already-loaded specs (skips the catalog).
        prices_csv, hardware_csv: user catalogs for ``load_hardware``.
    """
    gpus = tuple(gpus)
    if not gpus:
        raise ValueError("no candidate GPUs; pass at least one hardware id")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} must be strictly between 0 and 1, e.g. 0.9")
    for label, v in (("TTFT", slo_ttft_p95_s), ("TPOT", slo_tpot_p95_s)):
        if v is not None and not v > 0:
            raise ValueError(f"{label} SLO {v} must be a positive number of seconds")
    specs = hardware or [
        load_hardware(g, prices_csv=prices_csv, hardware_csv=hardware_csv) for g in gpus
    ]
    for g, h in zip(gpus, specs):
        if not math.isfinite(float(h.price_per_gpu_hour)):
            raise ValueError(
                f"no price for GPU {g!r}; add a row with gpu={g},price_per_gpu_hour=... to a "
                "prices CSV and pass it with --prices"
            )
    grid = grid or Grid(num_gpus=len(gpus))
    if grid.num_gpus != len(gpus):
        raise ValueError(f"grid has {grid.num_gpus} GPU slots but {len(gpus)} GPUs were given")
    if efficiency is None:
        efficiency = efficiency_draws_for(gpus, num_draws, posterior=posterior, seed=seed)
    penalty = dict(quality_penalty or {})
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
        grid=grid,
    )
