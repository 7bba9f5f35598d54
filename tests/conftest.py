"""Test-wide JAX settings: 64-bit floats (exact anchors) and strict dtype promotion; the CLI's
persistent compile cache (``SERVINGMATH_CACHE``, which ``optimize``/``fleet``/``forecast`` turn
on) lives in a fresh directory per session (shared by the session's xdist workers: the suite
runs on both of CI's cores, one test file per worker at a time), so the suite neither reads programs an earlier run
left in ~/.cache (a warm cache hid most compile time from local timings; CI starts empty) nor
writes there.  Every test compiles into that same persistent cache, and a module that ends with the
process past 1.5 GB drops the in-memory programs (a later module that needs one loads it from disk
instead of recompiling): without that the session's memory grows with every program the suite compiled
(~7.5 GB max RSS on a fresh clone, against the 4 GB a command may use).

The suite is compile-bound (most programs run once or a few times on a handful of rows), so XLA's
backend optimisation is off for every program the tests compile, as ``optimize._verify.ONE_OFF``
does for the CLI's one-off programs and ``test_sharding`` for its subprocesses: about half the
compile time, the same programs (HLO) and semantics, results equal up to rounding (the full suite
9 min 26 s -> 7 min 44 s at load ~1.6, with the NUTS fits no slower).  XLA's CPU fusion emitters
(MLIR kernels per fusion) are off as well: the legacy elemental emitter compiles the relaxed
search's descent in half the time (34 -> 17 s) at the same run time, and
``test_search_model.py`` + ``test_queueing.py`` ran in 324 s instead of 434 s, results
unchanged."""

import ctypes
import gc
import os

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
"""Set before JAX starts its backend (it reads ``XLA_FLAGS`` once); a caller's own level wins."""
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(scope="session", autouse=True)
def _fresh_compile_cache(tmp_path_factory):
    # xdist workers (two on CI's two cores) share one fresh cache beside their own temp roots
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    cache = shared / "jax-cache"
    cache.mkdir(exist_ok=True)
    cache = str(cache)
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVINGMATH_CACHE", cache)
        yield


DROP_PROGRAMS_ABOVE_BYTES = 1.5 * 2**30
"""Resident size past which a module's end drops the in-memory programs.  Dropping after every
module keeps ~2.9 GB but re-traces shared programs (+60 s over the suite); past this size it
happens a few times and the largest module (the NUTS fits, ~2 GB) still ends under 4 GB."""


def _resident_bytes() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096.0
    except OSError:  # not Linux: drop every time
        return float("inf")


@pytest.fixture(scope="module", autouse=True)
def _drop_compiled_programs():
    yield
    if _resident_bytes() < DROP_PROGRAMS_ABOVE_BYTES:
        return
    jax.clear_caches()
    gc.collect()
    try:  # hand the freed heap back to the OS (glibc); elsewhere the collect is enough
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@pytest.fixture(scope="session")
def bundled_ingest():
    """``fitting.load_measurements`` of every bundled measurement file, read once per session
    (~5 s): shared by the ingest and calibration tests, which only read it."""
    from fitting.ingest import bundled_measurements, load_measurements

    return load_measurements(bundled_measurements())


SLOWEST_FILES = (
    "test_benchmarks_smoke.py",
    "test_benchmarks_smoke_fits.py",
    "test_optimize_search.py",
    "test_queueing.py",
    "test_notebooks.py",
    "test_itl_slo_and_max_model_len.py",
    "test_cli_optimize.py",
    "test_fit_update.py",
    "test_disagg.py",
    "test_speculative.py",
    "test_optimize_plots.py",
    "test_sharding.py",
    "test_predict.py",
    "test_fit_serving_update.py",
    "test_forecast.py",
    "test_search_model.py",
    "test_features_under_load.py",
    "test_cli_simulate_features.py",
)
"""The suite's test files by their total time on CI's two cores, slowest first (seconds, a run at
e5c5a3b on a machine ~1.4x slower than earlier runs: 229, 184, 135, 119, 101, 88, 74, 68, 58, 54,
52, 50, 49, 37, 37, 36, 32; every other file under 26); the benchmark smoke runs, grown to
~600 s, are split in two files that start one on each worker.  The two workers take whole files in
collection order (``--dist loadfile`` with ``--no-loadscope-reorder``), so the slow ones go first
and the short ones fill the end: longest first keeps the workers' finishing times a few seconds
apart.  xdist's own order (files with the most tests first) sent the two slowest files last: one
worker idled 46 s."""


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


class _Captured(Exception):
    """Raised by the stand-in for a command's search, carrying the problem it was handed."""


@pytest.fixture
def problem_of(monkeypatch):
    """``problem_of(argv)``: run a ``fleet`` or ``forecast`` command line up to its search and
    return the ``optimize.Problem`` its options built (the search is replaced by a stand-in that
    raises with it), so a test reads what the arguments became without the work."""
    import optimize
    from servingmath.cli import main

    def capture(problem, *args, **kwargs):
        raise _Captured(problem)

    def run(argv):
        target = "fleet_problem" if argv[0] == "fleet" else "cheapest_per_gpu"
        monkeypatch.setattr(optimize, target, capture)
        with pytest.raises(_Captured) as caught:
            main(argv)
        return caught.value.args[0]

    return run
