"""``optimize._program_cache.cached_jit``: a traced program saved to disk and loaded by a later
process gives the same numbers as ``equinox.filter_jit``; each static argument, shape and source
gets its own program; anything that cannot be keyed or saved runs as plain ``filter_jit``."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optimize._program_cache as pc
from optimize._metrics import SloMetrics


def _slo(scale: jnp.ndarray, x: jnp.ndarray, power: float, with_itl: bool) -> SloMetrics:
    """A function with a static float, a static flag and an output tree holding None fields."""
    q = jnp.stack([x, scale * x, x**power])
    return SloMetrics(
        ttft_p95_s=x**power,
        tpot_p95_s=scale * x,
        utilization=jnp.tanh(x),
        concurrent_requests=jnp.sum(x) * scale,
        ttft_quantiles_s=q,
        tpot_quantiles_s=q * 2.0,
        itl_p95_s=scale + x if with_itl else None,
    )


def _fresh():
    """A new wrapper of ``_slo``: the in-memory programs of an earlier process are gone."""
    return pc.cached_jit(_slo)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(pc, "_folder", lambda: tmp_path / "programs")
    return tmp_path / "programs"


def _equal(a, b) -> None:
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for u, v in zip(la, lb, strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


ARGS = (jnp.asarray(1.5), jnp.linspace(0.1, 2.0, 7))


def test_a_saved_program_loads_in_a_new_process_and_gives_filter_jit_numbers(cache, monkeypatch):
    want = eqx.filter_jit(_slo)(*ARGS, 3.0, True)
    first = _fresh()(*ARGS, 3.0, True)
    _equal(first, want)
    assert len(list(cache.glob("*.bin"))) == 1

    def no_trace(*a, **k):
        raise AssertionError("traced again although the program was on disk")

    monkeypatch.setattr(pc, "_export", no_trace)
    again = _fresh()
    _equal(again(*ARGS, 3.0, True), want)
    other = (jnp.asarray(0.5), jnp.linspace(-1.0, 1.0, 7))  # new values, same shapes: same program
    _equal(again(*other, 3.0, True), eqx.filter_jit(_slo)(*other, 3.0, True))


@pytest.mark.parametrize(
    "change",
    [
        lambda a: (a[0], a[1], 2.0, True),  # a static float
        lambda a: (a[0], a[1], 3.0, False),  # a static flag (the output tree loses a field)
        lambda a: (a[0], jnp.linspace(0.1, 2.0, 9), 3.0, True),  # a shape
        lambda a: (a[0], a[1].astype(jnp.float32), 3.0, True),  # a dtype
    ],
    ids=["static float", "static flag", "shape", "dtype"],
)
def test_each_static_argument_shape_and_dtype_has_its_own_program(cache, change):
    fn = _fresh()
    fn(*ARGS, 3.0, True)
    args = change(ARGS)
    _equal(_fresh()(*args), eqx.filter_jit(_slo)(*args))
    assert len(list(cache.glob("*.bin"))) == 2


def test_weakly_and_strongly_typed_arrays_share_one_program(cache):
    """``jnp.asarray(1.5)`` is weakly typed, a file's ``np.float64`` array strongly typed: the
    same values of the same shapes run one program with the same numbers."""
    weak = (jnp.asarray(1.5), jnp.linspace(0.1, 2.0, 7))
    assert weak[0].weak_type
    strong = (np.float64(1.5) * np.ones(()), np.asarray(weak[1]))
    fn = _fresh()
    _equal(fn(*weak, 3.0, True), fn(*strong, 3.0, True))
    assert len(list(cache.glob("*.bin"))) == 1


def test_an_edit_of_the_source_makes_a_new_program(cache, monkeypatch):
    _fresh()(*ARGS, 3.0, True)
    monkeypatch.setattr(pc, "_source_digest", lambda: "another source")
    _fresh()(*ARGS, 3.0, True)
    assert len(list(cache.glob("*.bin"))) == 2


def test_a_damaged_file_is_traced_again_and_replaced(cache):
    want = eqx.filter_jit(_slo)(*ARGS, 3.0, True)
    _fresh()(*ARGS, 3.0, True)
    (path,) = cache.glob("*.bin")
    path.write_bytes(b"not a program")
    _equal(_fresh()(*ARGS, 3.0, True), want)
    _equal(_fresh()(*ARGS, 3.0, True), want)  # the replaced file loads
    assert path.read_bytes() != b"not a program"


def test_a_static_lambda_is_not_keyed_and_runs_as_filter_jit(cache):
    """Two lambdas print alike once their addresses are dropped: keying them could hand one
    the other's program, so they are never saved."""

    def apply(fn, x):
        return fn(x)

    cached = pc.cached_jit(apply)
    np.testing.assert_allclose(cached(lambda v: v * 2.0, jnp.ones(3)), 2.0)
    np.testing.assert_allclose(cached(lambda v: v * 3.0, jnp.ones(3)), 3.0)
    assert not cache.exists() or not list(cache.glob("*.bin"))


def test_without_the_compile_cache_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(pc, "_folder", lambda: None)
    _equal(_fresh()(*ARGS, 3.0, True), eqx.filter_jit(_slo)(*ARGS, 3.0, True))
    assert not list(tmp_path.rglob("*.bin"))


def test_inside_another_trace_it_is_inlined(cache):
    fn = _fresh()

    def outer(s, x):
        return fn(s, x, 3.0, True).ttft_p95_s.sum()

    got = jax.jit(jax.grad(outer, argnums=1))(*ARGS)
    want = jax.grad(lambda s, x: _slo(s, x, 3.0, True).ttft_p95_s.sum(), argnums=1)(*ARGS)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert not cache.exists() or not list(cache.glob("*.bin"))
