"""Predicted value of every measurement row, as one JAX function of per-GPU parameters.

Host side (``prepare``): each row of the tidy table (``../shared/data/SCHEMA.md``) becomes numbers
for one of seven vectorised blocks, built only from ``perfmodel`` budgets:

* ``gemm``: vidur's projection ops (M = ``num_tokens``; N, K from the model config and TP) and
  aiconfigurator ``gemm`` rows (N, K in ``notes``) -> ``perfmodel._ops.gemm_time_s``.
* ``elementwise``: norms, residual add, activation, rope, embedding -> bytes / (BW * eta), plus
  bytes / R_onchip for kernels with per-row work (all but the residual add).
* ``attention``: aiconfigurator ``attn_prefill`` / ``attn_decode`` kernels -> FLOPs and KV bytes.
* ``collective``: ring all-reduce, one-pass gather/scatter/all-to-all, send/recv
  (``perfmodel._parallel`` / ``_ops``), cross-node rows at the inter-node bandwidth.
* ``step``: ``prefill``, ``decode_step`` and ``static_batch`` rows -> ``perfmodel.prefill_step`` /
  ``decode_step`` vmapped over stacked per-row specs.
* ``closed``: ``serving`` rows at a ``concurrency`` and ``saturated`` (offline) rows ->
  ``perfmodel.dynamics.closed_loop_metrics``, one evaluation per run (its rows pick a column).
* ``open``: ``serving`` rows at a ``request_rate`` -> ``perfmodel.serving_metrics`` (open loop).

Every block's time comes from the same per-operator step (``perfmodel.forward_step`` and the
``_ops`` kernels it sums), so each fitted parameter is read by every whole-model prediction.

Device side (``predict``): gather each row's GPU parameters and evaluate the blocks; the result is
differentiable in the parameters, so NumPyro's NUTS can use it.  Rows no budget covers are returned
as ``skipped`` with a reason, never dropped silently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import perfmodel
from perfmodel import (
    Efficiency,
    Workload,
    attention_time_s,
    collective_time_s,
    elementwise_time_s,
    gemm_time_s,
)
from perfmodel.dynamics import closed_loop_metrics

from ._blocks_step import StepMetric
from ._names import OFFSET_FIELDS
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


def gather(params: dict[str, jnp.ndarray], idx: np.ndarray) -> tuple[Efficiency, Efficiency]:
    """Per-row ``Efficiency`` (every fitted field) from per-GPU parameter vectors, returned twice:
    as the step-level and the kernel-level argument of the ``_ops`` kernels (the same pytree)."""
    fields = {f: params[f][idx] for f in EFFICIENCY_FIELDS + KERNEL_FIELDS}
    # the cell offsets add to log time instead (the row's own end-to-end cell included)
    eff = Efficiency(**fields, **{f: jnp.ones(len(idx)) for f in OFFSET_FIELDS})
    return eff, eff


def _step_block(b: dict, eff: Efficiency) -> jnp.ndarray:
    """prefill / decode-step / static-batch predictions of stacked rows (vmapped ``_step``).

    A static batch of B requests: TTFT = prefill of B prompts, TPOT = a decode iteration of B
    sequences at the mean context P + O / 2, latency = TTFT + (O - 1) TPOT."""
    model, hw, dep = b["specs"]

    def one(m, h, d, e, inp, batch, ctx):
        pre = perfmodel.prefill_step(m, h, d, e, inp, batch).total_s
        dec = perfmodel.decode_step(m, h, d, e, batch, ctx).total_s
        return pre, dec

    pre, dec = jax.vmap(one)(model, hw, dep, eff, b["inp"], b["batch"], b["ctx"])
    latency = pre + (b["out"] - 1.0) * dec
    thr = b["batch"] * b["out"] / latency
    quantity = {
        StepMetric.PREFILL_TIME: pre,
        StepMetric.DECODE_ITERATION_TIME: dec,
        StepMetric.BATCH_LATENCY: latency,
        StepMetric.OUTPUT_THROUGHPUT: thr,
    }
    table = jnp.stack([quantity[m] for m in StepMetric], axis=1)
    return jnp.take_along_axis(table, b["metric"].astype(int)[:, None], axis=1)[:, 0]


def _workloads(b: dict, prompt_z: jnp.ndarray) -> Workload:
    """The runs' workloads; a prompt mean nobody recorded is drawn log-normal around its median,
    inp * exp(log_sd * z) (``MLPERF_PROMPT_LOG_SD``; z = 0 gives the median)."""
    return Workload(
        arrival_rate_per_s=b["rate"],
        concurrency=b["conc"],
        interarrival_cv=np.ones_like(b["inp"]),
        prompt_tokens_mean=b["inp"] * jnp.exp(b["inp_log_sd"] * prompt_z),
        prompt_tokens_cv=b["inp_cv"],
        output_tokens_mean=b["out"],
        output_tokens_cv=b["out_cv"],
        requests_per_client=b["rounds"],
    )


def _closed_block(b: dict, eff: Efficiency, prompt_z: jnp.ndarray) -> jnp.ndarray:
    """Closed-loop serving and saturated (offline) rows through ``closed_loop_metrics``."""
    model, hw, dep = b["specs"]

    def one(m, h, d, e, w):
        r = closed_loop_metrics(m, h, d, e, w)
        thr = jnp.stack([r.output_tokens_per_s, r.total_tokens_per_s, r.requests_per_s])
        return jnp.concatenate([r.ttft_s, r.tpot_s, r.itl_s, r.e2e_s, thr])

    return _per_row(
        b, jax.vmap(one)(model, hw, dep, _config_efficiency(b, eff), _workloads(b, prompt_z))
    )


def _per_row(b: dict, table: jnp.ndarray) -> jnp.ndarray:
    """Each row's entry of its configuration's (configurations, columns) table; an ITL row's
    gap spans ``stream`` tokens (``stream_chunk_tokens``), every other row's factor is 1."""
    return table[b["config"], b["col"].astype(int)] * b["stream"]


def _config_efficiency(b: dict, eff: Efficiency) -> Efficiency:
    """Per-row parameters -> one per configuration (a configuration's rows share its GPU)."""
    first = np.zeros(int(b["config"].max()) + 1, dtype=int)
    first[b["config"][::-1]] = np.arange(len(b["config"]))[::-1]
    return jax.tree.map(lambda x: x[first], eff)


def _open_block(b: dict, eff: Efficiency, prompt_z: jnp.ndarray) -> jnp.ndarray:
    """Open-loop serving rows (Poisson arrivals at ``request_rate``) through ``serving_metrics``;
    an overloaded point predicts ``inf`` latency and its saturated throughput."""
    model, hw, dep = b["specs"]

    def one(m, h, d, e, w):
        s = perfmodel.serving_metrics(m, h, d, e, w, closed_loop=False)
        lat = [
            jnp.stack([p.mean, p.p50, p.p90, p.p95, p.p99])
            for p in (s.ttft_s, s.tpot_s, s.tpot_s, s.e2e_s)
        ]
        req = s.output_tokens_per_s / w.output_tokens_mean
        thr = jnp.stack(
            [s.output_tokens_per_s, req * (w.prompt_tokens_mean + w.output_tokens_mean), req]
        )
        return jnp.concatenate(lat + [thr])

    return _per_row(
        b, jax.vmap(one)(model, hw, dep, _config_efficiency(b, eff), _workloads(b, prompt_z))
    )


def predict_log(
    prep: Prepared,
    params: dict[str, jnp.ndarray],
    cell_offset: jnp.ndarray | None = None,
    prompt_z: jnp.ndarray | float = 0.0,
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
        prompt_z: standard-normal draw of the prompt means nobody recorded (MLPerf), 0 for
            their median.
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
        elif name in ("closed", "open"):
            # a serving engine's TP all-reduces: the latency scale of its comm cell
            eff = eff.with_collective_latency_scale(jnp.exp(comm_off[b["pos"]]))
            y = (_closed_block if name == "closed" else _open_block)(b, eff, prompt_z)
        elif name == "collective":
            # the catalog's inter-node figure is a nominal NIC rate; the fabric a lab had differs
            link = b["link"] * (1.0 + b["cross"] * (ker.internode_bandwidth_fraction - 1.0))
            lat = jnp.exp(jnp.where(lat_cell, row_off, 0.0)[b["pos"]])
            scaled = eff.with_collective_latency_scale(lat)
            y = collective_time_s(b["kind"], b["msg"], b["p"], link, scaled, ker)
        else:  # the source's collective-latency scale (COMM_GROUP)
            y = _step_block(b, eff.with_collective_latency_scale(jnp.exp(comm_off[b["pos"]])))
        out = out.at[b["pos"]].add(jnp.log(y))
    return out


def default_params(gpus: tuple[str, ...]) -> dict[str, jnp.ndarray]:
    """The default ``Efficiency`` / ``KernelEfficiency`` values, one per GPU."""
    e = Efficiency()
    vals = {f: getattr(e, f) for f in EFFICIENCY_FIELDS + KERNEL_FIELDS}
    return {f: jnp.full(len(gpus), float(v)) for f, v in vals.items()}
