"""Test-wide JAX settings: 64-bit floats (exact anchors) and strict dtype promotion."""

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(scope="session")
def bundled_ingest():
    """``fitting.load_measurements`` of every bundled measurement file, read once per session
    (~5 s): shared by the ingest and calibration tests, which only read it."""
    from fitting.ingest import bundled_measurements, load_measurements

    return load_measurements(bundled_measurements())
