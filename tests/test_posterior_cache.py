"""The compact posterior cache (``load_posterior(..., cache_dir=...)``): the arrays it reads back
are bit-for-bit those ArviZ reads from the netCDF, a changed file is read afresh (and its old
entry removed), a damaged or unwritable cache falls back to the netCDF, and drawing efficiencies
from a cached posterior needs neither ArviZ, NumPyro nor pandas."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import fitting
from fitting import _posterior


@pytest.fixture(scope="module")
def bundled_copy(tmp_path_factory):
    path = tmp_path_factory.mktemp("post") / "copy.nc"
    shutil.copy2(fitting.default_posterior_path(), path)
    return path


def _entries(cache):
    return sorted(p.name for p in cache.glob("*.npz"))


def _assert_same(cached, reference):
    assert cached.gpus == reference.gpus
    assert cached.cells == reference.cells
    assert cached.noise_keys == reference.noise_keys
    assert cached.num_draws == reference.num_draws
    for var in reference.idata.posterior.data_vars:
        assert cached.has(var)
        a, b = cached.flat(var), reference.flat(var)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b, strict=True)
    assert not cached.has("no_such_variable")


def test_round_trip_equals_arviz(bundled_copy, tmp_path):
    cache = tmp_path / "cache"
    reference = fitting.load_posterior(bundled_copy)
    first = fitting.load_posterior(bundled_copy, cache_dir=cache)  # miss: reads and writes
    assert first._arrays is None and len(_entries(cache)) == 1
    cached = fitting.load_posterior(bundled_copy, cache_dir=cache)  # hit: NumPy only
    assert cached._arrays is not None and cached._idata is None
    assert cached.path == reference.path == str(bundled_copy)
    _assert_same(cached, reference)
    # the draws every command takes (a fitted GPU, a GPU drawn from the population, a source)
    for gpu, source in (("h100-sxm", None), ("my-new-gpu", None), ("h100-sxm", "vidur:sarathi")):
        a = fitting.efficiency_draws(cached, gpu, 50, seed=4, source=source)
        b = fitting.efficiency_draws(reference, gpu, 50, seed=4, source=source)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), strict=True)
    # what the arrays do not hold comes from the netCDF on demand
    assert cached.idata.attrs == reference.idata.attrs


def test_changed_file_is_read_afresh(bundled_copy, tmp_path):
    cache = tmp_path / "cache"
    path = tmp_path / "mine.nc"
    shutil.copy2(bundled_copy, path)
    fitting.load_posterior(path, cache_dir=cache)
    old = _entries(cache)
    # a refit put in its place (written beside it, then renamed over it): fewer draws
    shorter = fitting.load_posterior(path).idata.isel(draw=slice(0, 100))
    os.replace(fitting.save_posterior(shorter, tmp_path / "refit.nc"), path)
    reread = fitting.load_posterior(path, cache_dir=cache)
    assert reread._arrays is None  # a miss: the old entry does not describe this file
    new = _entries(cache)
    assert len(new) == 1 and new != old  # the stale entry went
    cached = fitting.load_posterior(path, cache_dir=cache)
    assert cached.num_draws == 2 * 100
    _assert_same(cached, fitting.load_posterior(path))
    # same bytes, new modification time (a copy, a touch): a new key, so a fresh read
    before = _posterior._cache_entry(path, cache)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert _posterior._cache_entry(path, cache) != before


def test_damaged_or_unwritable_cache_falls_back(bundled_copy, tmp_path):
    cache = tmp_path / "cache"
    fitting.load_posterior(bundled_copy, cache_dir=cache)
    (entry,) = cache.glob("*.npz")
    entry.write_bytes(b"not a zip file")
    post = fitting.load_posterior(bundled_copy, cache_dir=cache)
    assert post._arrays is None  # read from the netCDF, and the entry rewritten
    _assert_same(fitting.load_posterior(bundled_copy, cache_dir=cache), post)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    post = fitting.load_posterior(bundled_copy, cache_dir=blocked / "cache")
    assert post._arrays is None and post.num_draws > 0


def test_missing_file_and_variables_still_refused(tmp_path):
    with pytest.raises(fitting.PosteriorError, match="no posterior"):
        fitting.load_posterior(tmp_path / "absent.nc", cache_dir=tmp_path / "cache")


def test_parameter_names_match_the_model():
    from fitting import _model, _rows

    assert _posterior.PARAM_NAMES == _model.PARAM_NAMES
    assert _posterior.EFFICIENCY_FIELDS == _rows.EFFICIENCY_FIELDS


def test_cached_draws_import_no_arviz_numpyro_pandas(bundled_copy, tmp_path):
    cache = tmp_path / "cache"
    fitting.load_posterior(bundled_copy, cache_dir=cache)
    code = (
        "import sys, fitting\n"
        f"p = fitting.load_posterior({str(bundled_copy)!r}, cache_dir={str(cache)!r})\n"
        "fitting.efficiency_draws(p, 'h100-sxm', 10)\n"
        "print(sorted(m for m in ('arviz', 'xarray', 'numpyro', 'pandas', 'matplotlib')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert out.stdout.strip() == "[]", out.stderr
