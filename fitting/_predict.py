"""Predicted value of every measurement row, as one JAX function of per-GPU parameters.

Host side (``prepare``): each row of the tidy table (``../shared/data/SCHEMA.md``) becomes numbers
for one of five vectorised blocks, built only from ``perfmodel`` budgets:

* ``gemm``: vidur's projection ops (M = ``num_tokens``; N, K from the model config and TP) and
  aiconfigurator ``gemm`` rows (N, K in ``notes``) -> ``perfmodel._ops.gemm_time_s``.
* ``elementwise``: norms, residual add, activation, rope, embedding -> bytes / (BW * eta), plus
  bytes / R_onchip for kernels with per-row work (all but the residual add).
* ``attention``: aiconfigurator ``attn_prefill`` / ``attn_decode`` kernels -> FLOPs and KV bytes.
* ``collective``: ring all-reduce, one-pass gather/scatter/all-to-all, send/recv
  (``perfmodel._parallel`` / ``_ops``), cross-node rows at the inter-node bandwidth.
* ``step``: ``prefill``, ``decode_step`` and ``static_batch`` rows -> ``perfmodel.prefill_step`` /
  ``decode_step`` vmapped over stacked per-row specs.

Device side (``predict``): gather each row's GPU parameters and evaluate the blocks; the result is
differentiable in the parameters, so NumPyro's NUTS can use it.  Rows no budget covers are returned
as ``skipped`` with a reason, never dropped silently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import perfmodel
from perfmodel import Efficiency
from perfmodel._ops import (
    KernelEfficiency,
    attention_time_s,
    collective_time_s,
    elementwise_time_s,
    gemm_time_s,
)

from ._rows import (  # noqa: F401  (re-exported: the row-side API lives in _rows)
    EFFICIENCY_FIELDS,
    KERNEL_FIELDS,
    SERVING_REASON,
    Prepared,
    has_offset,
    latency_cells,
    noise_key,
    notes_dict,
    prepare,
    source_key,
)


def gather(params: dict[str, jnp.ndarray], idx: np.ndarray) -> tuple[Efficiency, KernelEfficiency]:
    """Per-row ``Efficiency`` and ``KernelEfficiency`` from per-GPU parameter vectors."""
    eff = Efficiency(**{f: params[f][idx] for f in EFFICIENCY_FIELDS})
    ker = KernelEfficiency(**{f: params[f][idx] for f in KERNEL_FIELDS})
    return eff, ker


def _step_block(b: dict, eff: Efficiency, ker: KernelEfficiency) -> jnp.ndarray:
    """prefill / decode-step / static-batch predictions of stacked rows (vmapped ``_step``)."""
    # FP8/FP4 GEMMs reach a smaller share of their (2x) peak: same derate as single kernels.
    derate = 1.0 + b["low"] * (ker.low_precision_compute_ratio - 1.0)
    eff = eqx_replace(eff, compute_fraction_max=eff.compute_fraction_max * derate)
    model, hw, dep = b["specs"]

    def one(m, h, d, e, inp, batch, ctx):
        pre = perfmodel.prefill_step(m, h, d, e, inp, batch).total_s
        dec = perfmodel.decode_step(m, h, d, e, batch, ctx).total_s
        return pre, dec

    pre, dec = jax.vmap(one)(model, hw, dep, eff, b["inp"], b["batch"], b["ctx"])
    latency = pre + (b["out"] - 1.0) * dec
    thr = b["batch"] * b["out"] / latency
    code = b["metric"]
    return jnp.where(code == 0, pre, jnp.where(code == 1, dec, jnp.where(code == 2, latency, thr)))


def _serving_block(b: dict, eff: Efficiency, ker: KernelEfficiency) -> jnp.ndarray:
    """Serving rows through ``perfmodel.serving_metrics`` (agent A's dynamics), vmapped."""
    from perfmodel._serving import serving_metrics
    from perfmodel._workload import Workload

    derate = 1.0 + b["low"] * (ker.low_precision_compute_ratio - 1.0)
    eff = eqx_replace(eff, compute_fraction_max=eff.compute_fraction_max * derate)
    model, hw, dep = b["specs"]
    zeros = np.zeros_like(b["inp"])  # fixed lengths (the aiperf runs use ignore_eos, no spread)
    work = Workload(
        arrival_rate_per_s=b["rate"],
        concurrency=b["conc"],
        interarrival_cv=zeros + 1.0,
        prompt_tokens_mean=b["inp"],
        prompt_tokens_cv=zeros,
        output_tokens_mean=b["out"],
        output_tokens_cv=zeros,
    )

    # rows that all score a mean (the bundled ones) skip the percentile quadrature
    stat = b["stat"]
    means_only = isinstance(stat, np.ndarray) and not np.any(stat)

    def one(m, h, d, e, w):
        s = serving_metrics(m, h, d, e, w, means_only=means_only)
        lat = [jnp.stack([p.mean, p.p50, p.p95, p.p99]) for p in (s.ttft_s, s.tpot_s, s.e2e_s)]
        return jnp.concatenate(lat + [jnp.broadcast_to(s.output_tokens_per_s, (4,))])

    table = jax.vmap(one)(model, hw, dep, eff, work)  # (rows, 16): metric-major, stat-minor
    col = (b["metric"] * 4 + b["stat"]).astype(int)
    return jnp.take_along_axis(table, col[:, None], axis=1)[:, 0]


def eqx_replace(module, **changes):
    """A copy of an ``equinox`` module with some array fields replaced."""
    import equinox as eqx

    names = list(changes)
    return eqx.tree_at(
        lambda m: [getattr(m, n) for n in names], module, [changes[n] for n in names]
    )


def predict_log(
    prep: Prepared, params: dict[str, jnp.ndarray], cell_offset: jnp.ndarray | None = None
) -> jnp.ndarray:
    """log of the predicted value of every covered row (seconds, or tokens/s for throughputs).

    Args:
        prep: output of ``prepare``.
        params: each ``Efficiency`` and ``KernelEfficiency`` field as an array of shape
            ``(len(prep.gpus),)`` in natural units.
        cell_offset: log offsets of ``prep.cells`` (None: zero).  A collective cell's offset
            scales its latencies alpha and alpha_0 (``latency_cells``), a ``comm:latency`` cell
            those inside its source's multi-GPU steps (``prep.comm_idx``); any other adds to
            log time.
    """
    n = len(prep.log_value)
    lat_cell = np.concatenate([latency_cells(prep.cells), [False]])[prep.cell_idx]
    if cell_offset is None:
        row_off = comm_off = jnp.zeros(n)
    else:
        full = jnp.concatenate([jnp.asarray(cell_offset), jnp.zeros(1)])
        row_off = full[prep.cell_idx]
        comm_off = full[prep.comm_idx] if prep.comm_idx is not None else jnp.zeros(n)
    out = jnp.where(lat_cell, 0.0, row_off)
    for name, b in prep.blocks.items():
        eff, ker = gather(params, prep.gpu_idx[b["pos"]])
        if name == "gemm":
            y = gemm_time_s(
                b["m"], b["n"], b["k"], b["in_bytes"], b["peak"], b["bw"], eff, ker, b["low"]
            )
        elif name == "elementwise":
            y = elementwise_time_s(b["bytes"], b["bw"], ker, b["onchip"])
        elif name == "attention":
            y = attention_time_s(
                b["flops"],
                b["bytes"],
                b["q"],
                b["peak"],
                b["bw"],
                eff,
                ker,
                0.0,
                b["units"],
                b.get("tile", 0.0),
            )
        elif name == "serving":
            y = _serving_block(b, eff, ker)
        elif name == "collective":
            # the catalog's inter-node figure is a nominal NIC rate; the fabric a lab had differs
            link = b["link"] * (1.0 + b["cross"] * (ker.internode_bandwidth_fraction - 1.0))
            lat = jnp.exp(jnp.where(lat_cell, row_off, 0.0)[b["pos"]])
            y = collective_time_s(
                b["kind"],
                b["msg"],
                b["p"],
                link,
                eqx_replace(
                    eff,
                    collective_latency_s=eff.collective_latency_s * lat,
                    collective_base_latency_s=eff.collective_base_latency_s * lat,
                ),
                ker,
            )
        else:
            lat = jnp.exp(comm_off[b["pos"]])  # the source's collective-latency scale (COMM_GROUP)
            eff = eqx_replace(
                eff,
                collective_latency_s=eff.collective_latency_s * lat,
                collective_base_latency_s=eff.collective_base_latency_s * lat,
            )
            y = _step_block(b, eff, ker)
        out = out.at[b["pos"]].add(jnp.log(y))
    return out


def default_params(gpus: tuple[str, ...]) -> dict[str, jnp.ndarray]:
    """The default ``Efficiency`` / ``KernelEfficiency`` values, one per GPU."""
    e, k = Efficiency(), KernelEfficiency()
    vals = {f: getattr(e, f) for f in EFFICIENCY_FIELDS} | {f: getattr(k, f) for f in KERNEL_FIELDS}
    return {f: jnp.full(len(gpus), float(v)) for f, v in vals.items()}
