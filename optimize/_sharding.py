"""Spread configuration sweeps, posterior draws and multi-start search across devices.

JAX's own sharding does the work: a one-axis ``jax.sharding.Mesh`` over the local devices, a
``NamedSharding`` with ``PartitionSpec("batch")`` on the batched axis (configurations, starts or
posterior draws), and ``jit`` (GSPMD) partitions the vmapped computation to match its inputs.
Each batch element is computed independently, so the sharded answer equals the one-device answer;
only reductions over the posterior draws (an SLO probability, a mean) are combined across devices.

With one device (the default on a CPU) every helper is the identity and nothing changes.  To try
several devices on one CPU, set ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before
JAX is imported.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._problem import Problem

AXIS = "batch"
"""Name of the single mesh axis."""

MeshLike = Any
"""``None`` (every local device when there are several), ``False`` (one device) or a ``Mesh``."""


def device_mesh(mesh: MeshLike = None) -> Mesh | None:
    """A one-axis mesh over the local devices, or ``None`` where sharding buys nothing.

    Args:
        mesh: ``None`` for every local device (``None`` back when there is only one), ``False``
            to force one device, or a ``Mesh`` (returned as is; its first axis is the batch axis).
    """
    if mesh is False:
        return None
    if isinstance(mesh, Mesh):
        return mesh
    devices = jax.devices()
    if len(devices) < 2:
        return None
    return Mesh(np.asarray(devices), (AXIS,))


def _axis(mesh: Mesh) -> str:
    return mesh.axis_names[0]


def num_shards(mesh: Mesh | None) -> int:
    """Devices along the batch axis (1 without a mesh)."""
    return 1 if mesh is None else int(mesh.shape[_axis(mesh)])


def pad_rows(x: np.ndarray, multiple: int) -> np.ndarray:
    """Pad the leading axis to a multiple of ``multiple`` by repeating row 0 (results of the
    padding rows are dropped by the caller)."""
    x = np.asarray(x)
    pad = (-len(x)) % multiple
    if pad == 0:
        return x
    return np.concatenate([x, np.repeat(x[:1], pad, axis=0)])


def shard_rows(x, mesh: Mesh | None, axis: int = 0):
    """Place ``x`` (array or pytree of arrays) split along ``axis`` over the mesh; the axis length
    must divide by the number of devices.  Identity without a mesh."""
    if mesh is None:
        return x
    spec = PartitionSpec(*([None] * axis), _axis(mesh))
    return _put_arrays(x, NamedSharding(mesh, spec))


def replicate(x, mesh: Mesh | None):
    """Place ``x`` whole on every device of the mesh.  Identity without a mesh."""
    if mesh is None:
        return x
    return _put_arrays(x, NamedSharding(mesh, PartitionSpec()))


def _put_arrays(tree, sharding: NamedSharding):
    """``device_put`` the array leaves of ``tree`` only (Python scalars keep their weak type)."""
    return jax.tree_util.tree_map(
        lambda a: jax.device_put(a, sharding) if eqx.is_array(a) else a, tree
    )


def shard_draws(problem: Problem, mesh: Mesh | None) -> Problem:
    """``problem`` with its posterior draws (``efficiency`` leaves, shape (gpus, draws)) split over
    the mesh and everything else replicated; unchanged when the draw count does not divide."""
    if mesh is None or problem.num_draws % num_shards(mesh):
        return problem
    problem = replicate(problem, mesh)
    return eqx.tree_at(
        lambda p: p.efficiency, problem, shard_rows(problem.efficiency, mesh, axis=1)
    )


def map_rows(fn, rows: np.ndarray, mesh: Mesh | None, *, problem: Problem | None = None):
    """``fn(problem, rows)`` (or ``fn(rows)``) with ``rows`` padded and split over the mesh; the
    outputs (pytree, leading axis = rows) come back as numpy, padding dropped."""
    n = len(rows)
    padded = pad_rows(np.asarray(rows), num_shards(mesh))
    x = shard_rows(padded, mesh)
    out = fn(x) if problem is None else fn(replicate(problem, mesh), x)
    return jax.tree_util.tree_map(lambda a: np.asarray(a)[:n], out)
