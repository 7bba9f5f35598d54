"""Traced programs kept on disk: ``cached_jit`` is ``equinox.filter_jit`` whose traced and
lowered program (a ``jax.export.Exported``) is saved beside the persistent compile cache.

JAX's persistent compile cache skips XLA's compile on a second run but not the Python trace and
the lowering that come before it: for the search and its verdict (the serving model ``vmap``-ed
over posterior draws and configurations, under ``grad`` and ``fori_loop``) those take most of a
warm command's time on two cores.  A program is keyed by the function, the source of the
packages it traces (any edit makes a new key), the static part of its arguments, the shapes and
dtypes of their arrays and JAX's settings; a later process with the same key deserialises the
program and calls it, and XLA's compile of it comes from the compile cache as before.

Only on one device with the compile cache on (``jax_compilation_cache_dir`` set, which the CLI
does): elsewhere, inside another trace, and for anything ``jax.export`` cannot serialise, it is
``filter_jit``.  What a program reads from files (catalogs, posteriors, prices) reaches it as
array arguments, never as constants baked into the trace, so the key need not hash the data.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np

from perfmodel import strongly_typed

PACKAGES = ("perfmodel", "fitting", "optimize")
"""Packages whose source is part of every key: the programs trace code from all three."""

FORMAT = 1
"""Bumped when what a cache entry holds changes."""

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
"""Memory addresses in the repr of a static function argument differ between processes."""


@functools.cache
def _source_digest() -> str:
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(f"{FORMAT} {jax.__version__}".encode())
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _folder() -> Path | None:
    """``<compile cache>/programs`` when the compile cache is on and JAX sees one device."""
    cache = jax.config.jax_compilation_cache_dir
    if not cache or jax.device_count() != 1:
        return None
    return Path(cache) / "programs"


def _key(name: str, static: Any, leaves: list) -> str | None:
    """The cache key; None when a static argument is not named by its text (a lambda, a closure,
    an object printed by address), whose program cannot be told apart from another's."""
    text = str(static)
    if "<locals>" in text or "<lambda>" in text or " object at 0x" in text:
        return None
    settings = (
        jax.default_backend(),
        jax.config.jax_enable_x64,
        jax.config.jax_numpy_dtype_promotion,
        jax.config.jax_default_matmul_precision,
    )
    shapes = [(np.shape(x), str(x.dtype), _weak(x)) for x in leaves]
    text = _ADDRESS.sub("", f"{name}|{settings}|{text}|{shapes}")
    return hashlib.sha256(f"{_source_digest()}|{text}".encode()).hexdigest()[:32]


def _weak(x) -> bool:
    return bool(getattr(x, "weak_type", False))


class _Program(eqx.Module):
    """A deserialised program: called on the array leaves, its flat outputs put back in the
    output tree (``positions``: that tree with each leaf's position among the outputs; a tree
    of plain objects pickles, where a ``PyTreeDef`` of equinox modules does not)."""

    call: Callable
    positions: Any = eqx.field(static=True)

    def __call__(self, leaves: list):
        outputs = self.call(*leaves)
        return jax.tree.map(lambda i: outputs[i], self.positions)


def _load(path: Path, compiler_options) -> _Program | None:
    try:
        with path.open("rb") as f:
            blob, positions = pickle.load(f)
        exported = jax.export.deserialize(blob)
    except Exception:  # noqa: BLE001 (a partial or foreign file: trace again, overwrite it)
        return None
    return _Program(_named_jit(exported, compiler_options), positions)


def _named_jit(exported, compiler_options) -> Callable:
    """``jax.jit`` of the exported program under the traced function's own name (compile logs
    and profiles then say which program compiled, not ``call``)."""

    def run(*arrays):
        return exported.call(*arrays)

    run.__name__ = run.__qualname__ = exported.fun_name
    return jax.jit(run, compiler_options=compiler_options)


def _export(fn: Callable, treedef, static, leaves: list, path: Path, compiler_options):
    """Trace ``fn`` on ``leaves``' shapes, save the program at ``path`` and return it."""
    out_trees = []

    def flat(*arrays):
        args, kwargs = eqx.combine(jax.tree.unflatten(treedef, arrays), static)
        out, out_tree = jax.tree.flatten(fn(*args, **kwargs))
        out_trees.append(out_tree)
        return out

    flat.__name__ = flat.__qualname__ = getattr(fn, "__name__", "flat")

    shapes = [jax.ShapeDtypeStruct(np.shape(x), x.dtype, weak_type=_weak(x)) for x in leaves]
    try:
        exported = jax.export.export(jax.jit(flat))(*shapes)
        positions = jax.tree.unflatten(out_trees[0], range(out_trees[0].num_leaves))
        payload = pickle.dumps((exported.serialize(), positions))
    except Exception:  # noqa: BLE001 (callbacks, unserialisable nodes: plain filter_jit)
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(payload)
        tmp.replace(path)
    except OSError:
        pass
    return _Program(_named_jit(exported, compiler_options), positions)


def cached_jit(fn: Callable | None = None, *, compiler_options: dict | None = None):
    """``eqx.filter_jit(fn, compiler_options=...)`` with its traced program kept on disk.

    Arrays (JAX or NumPy) in the arguments are traced; everything else is static, as in
    ``filter_jit``.  Usable bare (``@cached_jit``) or with options.
    """
    if fn is None:
        return functools.partial(cached_jit, compiler_options=compiler_options)
    jitted = eqx.filter_jit(fn, compiler_options=compiler_options)
    name = f"{fn.__module__}.{fn.__qualname__}"
    programs: dict[str, _Program | None] = {}

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args, kwargs = strongly_typed((args, kwargs))  # one program whatever built the arrays
        folder = _folder()
        if folder is None:
            return jitted(*args, **kwargs)
        dynamic, static = eqx.partition((args, kwargs), eqx.is_array)
        leaves, treedef = jax.tree.flatten(dynamic)
        if any(isinstance(x, jax.core.Tracer) for x in leaves):  # called inside a trace
            return jitted(*args, **kwargs)
        key = _key(name, (treedef, static), leaves)
        if key is None:
            return jitted(*args, **kwargs)
        if key not in programs:
            path = folder / f"{key}.bin"
            program = _load(path, compiler_options) if path.exists() else None
            programs[key] = program or _export(fn, treedef, static, leaves, path, compiler_options)
        program = programs[key]
        if program is None:
            return jitted(*args, **kwargs)
        return program(leaves)

    return wrapper
