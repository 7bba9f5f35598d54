"""Test-wide JAX settings: 64-bit floats (exact anchors) and strict dtype promotion; the CLI's
persistent compile cache (``SERVINGMATH_CACHE``, which ``optimize``/``fleet``/``forecast`` turn
on) lives in a fresh directory per session, so the suite neither reads programs an earlier run
left in ~/.cache (a warm cache hid most compile time from local timings; CI starts empty) nor
writes there."""

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(scope="session", autouse=True)
def _fresh_compile_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVINGMATH_CACHE", str(tmp_path_factory.mktemp("jax-cache")))
        yield


@pytest.fixture(scope="session")
def bundled_ingest():
    """``fitting.load_measurements`` of every bundled measurement file, read once per session
    (~5 s): shared by the ingest and calibration tests, which only read it."""
    from fitting.ingest import bundled_measurements, load_measurements

    return load_measurements(bundled_measurements())
