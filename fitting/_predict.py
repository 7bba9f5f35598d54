"""Predicted value of every measurement row, as one JAX function of per-GPU parameters.

Host side (``prepare``): each row of the tidy table (``../shared/data/SCHEMA.md``) becomes numbers
for one of seven vectorised blocks (``Blocks``' fields; the block types live in ``_blocks_kernel``,
``_blocks_step`` and ``_blocks_e2e``, each with its ``predict``), built only from ``perfmodel``
budgets:

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

Device side (``predict_log``): gather each row's GPU parameters and evaluate the blocks; the result is
differentiable in the parameters, so NumPyro's NUTS can use it.  Rows no budget covers are returned
as ``skipped`` with a reason, never dropped silently.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from perfmodel import Efficiency

from ._blocks_base import RowScales
from ._names import OFFSET_FIELDS, PARAM_NAMES, fitted_efficiency
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


def gather(params: Efficiency, idx: np.ndarray) -> tuple[Efficiency, Efficiency]:
    """Per-row ``Efficiency`` from per-GPU leaves (``fitted_efficiency``), returned twice: as
    the step-level and the kernel-level argument of the ``_ops`` kernels (the same pytree)."""
    eff = jax.tree.map(lambda v: v[idx], params)
    # the cell offsets add to log time instead (the row's own end-to-end cell included)
    ones = jnp.ones(len(idx))
    eff = dataclasses.replace(eff, **{f: ones for f in OFFSET_FIELDS})
    return eff, eff


def predict_log(
    prep: Prepared,
    params: Efficiency,
    cell_offset: jnp.ndarray | None = None,
    prompt_z: jnp.ndarray | float = 0.0,
) -> jnp.ndarray:
    """log of the predicted value of every covered row (seconds, or tokens/s for throughputs).

    Args:
        prep: output of ``prepare``.
        params: the fitted fields, each leaf of shape ``(len(prep.gpus),)`` in natural units
            (``fitted_efficiency``; its offset fields are not read).
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
    scales = RowScales(jnp.where(lat_cell, row_off, 0.0), comm_off, prompt_z)
    for b in prep.blocks:
        eff, ker = gather(params, prep.gpu_idx[b.pos])
        out = out.at[b.pos].add(jnp.log(b.predict(eff, ker, scales)))
    return out


def compiled_predict_log(prep: Prepared) -> Callable[..., jnp.ndarray]:
    """``predict_log`` of ``prep``'s rows as one compiled program of (params, cell offsets,
    prompt draw), the rows its constants.  NumPyro initialises a sampler by running the model
    and its gradient outside any trace (before the sampler compiles), where every operation of
    the load model would otherwise compile on its own; inside a trace the program inlines."""
    return jax.jit(functools.partial(predict_log, prep))


def default_params(gpus: tuple[str, ...]) -> Efficiency:
    """The default ``Efficiency`` / ``KernelEfficiency`` values, one per GPU."""
    e = Efficiency()
    return fitted_efficiency({f: jnp.full(len(gpus), float(getattr(e, f))) for f in PARAM_NAMES})
